"""Valuing synthetic data: augmentations ([ADS] §6.1.1) and the replication market ([ADS] §6.1.2)."""
