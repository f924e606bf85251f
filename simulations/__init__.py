"""Runnable experiments: data, partitions, models, the simulation engine and the CLI.

The only package that starts Ray / the Flower simulation engine (:mod:`simulations.engine`).
"""

from simulations.api import simulate

__all__ = ["simulate"]
