from __future__ import annotations

from pathlib import Path

import pytest

from simulations.experiments.noisy_federation.noisy_federation import run_benchmark
from tests.simulations.experiments.noisy_federation.tiny import TINY


@pytest.fixture(scope="package")
def benchmark(tmp_path_factory) -> tuple[Path, dict]:
    """``TINY`` run once on one engine (Ray, real Fashion-MNIST training), shared by this folder's tests:
    (its folder, its tables)."""
    out = tmp_path_factory.mktemp("noisy-federation")
    done = []
    tables = run_benchmark(TINY, out, on_cell=done.append)
    assert [c.policy for c in done] == ["clean", *TINY.policies]
    return out, tables
