"""Run one strategy bare and wrapped by ValuingStrategy on the same real ClientApps, in
process (no Ray), from the same global random state, and compare what matters.

Shared by the conformance suite (every shipped strategy) and the any-model tests.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord
from flwr.serverapp.strategy import Strategy

from clients.app import ClientData, make_client_app
from strategies import ValuingStrategy
from strategies.arrays import numpy_to_arrays
from fedvalue.valuation.settings import AdsSettings, ValuationSettings

from tests.strategies.harness.clientapp_grid import ClientAppGrid


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Tiny models on a busy 2-core machine: a second OpenMP thread only spins (as on a Ray
    actor, which runs one). Import it into a test module to use it there."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@dataclass
class Setup:
    """A federation: how to build its model, data, utility and clients."""

    model_factory: Callable[[], torch.nn.Module]
    load_client: Callable[[int], ClientData]
    make_utility: Callable[[], object]
    num_clients: int
    rounds: int
    train_config: dict

    def initial_arrays(self) -> ArrayRecord:
        return numpy_to_arrays({k: v.detach().numpy() for k, v in self.model_factory().state_dict().items()})


@dataclass
class Outcome:
    inner: Strategy
    result: object
    valuing: ValuingStrategy | None


def run(setup: Setup, build_strategy: Callable[[], Strategy], *, wrapped: bool,
        mods: Sequence = (), valuing_options: dict | None = None) -> Outcome:
    """One run on fresh clients, from the same global random state every time
    (``valuing_options``: more keywords for the wrapper; ``utility`` replaces the setup's)."""
    random.seed(1234)
    np.random.seed(1234)
    torch.manual_seed(1234)
    inner = build_strategy()
    nodes = {4000 + 13 * pid: pid for pid in range(setup.num_clients)}
    grid = ClientAppGrid(make_client_app(setup.load_client, setup.model_factory, mods=list(mods)), nodes)
    options = dict(valuing_options or {})
    utility = options.pop("utility", None) or setup.make_utility()
    valuing = (ValuingStrategy(
        inner, utility, valuation=ValuationSettings(methods=("ads", "loo"), ads=AdsSettings(method="exact")),
        **options
    )
               if wrapped else None)
    result = (valuing or inner).start(grid, setup.initial_arrays(), num_rounds=setup.rounds, timeout=60,
                                      train_config=ConfigRecord(setup.train_config))
    return Outcome(inner, result, valuing)


def comparable(value):
    """A strategy's state as plain data: records as arrays, nested strategies as their state."""
    if isinstance(value, ArrayRecord):
        return {k: v.numpy() for k, v in value.items()}
    if isinstance(value, Array):
        return value.numpy()
    if isinstance(value, (MetricRecord, ConfigRecord)):
        return dict(value)
    if isinstance(value, dict):
        return {k: comparable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [comparable(v) for v in value]
    if isinstance(value, Strategy) or (hasattr(value, "__dict__") and not callable(value)):
        return {k: comparable(v) for k, v in vars(value).items()}
    if callable(value):
        return ("callable", getattr(value, "__qualname__", type(value).__name__))
    return value


def assert_same(a, b, path: str = "strategy") -> None:
    """Equal as data; arrays bit for bit, dtype and shape included."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        assert isinstance(a, np.ndarray) and isinstance(b, np.ndarray), path
        assert a.dtype == b.dtype and a.shape == b.shape, path
        assert np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"), f"{path} differs"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), f"{path}: keys {list(a)} vs {list(b)}"
        for key in a:
            assert_same(a[key], b[key], f"{path}[{key!r}]")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and math.isnan(a):
        assert isinstance(b, float) and math.isnan(b), path
    else:
        assert a == b, f"{path}: {a!r} vs {b!r}"


def assert_untouched_and_sound(setup: Setup, bare: Outcome, wrapped: Outcome, *, unaggregatable: int = 0) -> None:
    """The wrapped run is the bare run bit for bit, and its books are sound (see the
    conformance suite's docstring)."""
    rounds = wrapped.valuing.rounds
    assert len(rounds) == setup.rounds
    for row in rounds:
        assert row["num_failed"] == 0, row
        assert abs(row["efficiency_gap"]) < 1e-9, row
        assert row["utility_after"] == row["utility_realized"], row
        assert row["num_unaggregatable"] == unaggregatable, row
    assert list(bare.result.arrays) == list(wrapped.result.arrays)
    for key in bare.result.arrays:
        assert_same(bare.result.arrays[key].numpy(), wrapped.result.arrays[key].numpy(), f"final arrays[{key!r}]")
    assert_same(comparable(bare.inner), comparable(wrapped.inner))
    # The run moved: a check on a frozen model would prove nothing.
    first = setup.initial_arrays()
    assert any(not np.array_equal(first[k].numpy(), wrapped.result.arrays[k].numpy()) for k in first)
