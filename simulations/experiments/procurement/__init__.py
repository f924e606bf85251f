"""Staged data procurement ([ADS] §6.3 / App. C.3): conjoint data, the buyer's model and its figures."""
