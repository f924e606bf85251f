"""Runnable experiments: data, partitions, models, the simulation engine and the CLI.

The only package that starts Ray / the Flower simulation engine (:mod:`simulations.runner.engine`).

Importing it before torch sets ``OMP_WAIT_POLICY=PASSIVE`` (unless set already): torch's
OpenMP threads then sleep at the end of a parallel region instead of spinning. On a
machine whose cores are busy with other work (Ray's clients, other jobs), spinning
threads made identical valuation rounds take 2.0–45 s (17–132 s beside two extra busy processes) instead of
0.8–3.0 s (``python -m bench.valuation --spread``, docs/results/valuation_spread.txt). Ray's workers inherit it.
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # read once, when torch loads its OpenMP runtime

from simulations.runner.api import simulate  # noqa: E402 - after the OpenMP setting

__all__ = ["simulate"]
