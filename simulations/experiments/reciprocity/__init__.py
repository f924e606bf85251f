"""Inflow, outflow and reciprocity ([RECIP] §5): centralized reproductions and TracIn between federated clients."""
