"""Every strategy Flower ships, run bare and wrapped on the same real ClientApps.

The suite is parametrized over EVERY Strategy class found in ``flwr.serverapp.strategy``
when the tests run, so a new Flower release's strategies are tested without an edit (a
new class whose constructor needs an argument this file does not know fails, naming
it). Each strategy runs twice in-process (no Ray) from the same global random state:
bare, then wrapped by :class:`strategies.ValuingStrategy` valuing every round by exact
ADS and LOO. The wrapper must leave the run untouched and its books must be sound:

* no error, and per-round group efficiency |Σφ − (v(I_t) − v(∅))| < 1e-9;
* ``utility_after == utility_realized`` exactly (v_t(I_t) is U(A_t), noise included);
* the final global arrays are bit-identical to the bare run's;
* the inner strategy's state (optimizer moments, QFedAvg's arrays, adaptive clipping
  norm, ...) is identical to the bare run's.

Clients train a small torch MLP for real; DP strategies clip actively and add noise.
"""

from __future__ import annotations

import inspect
import math
import random

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord
from flwr.clientapp.mod import adaptiveclipping_mod, fixedclipping_mod
from flwr.serverapp import strategy as flower_strategies
from flwr.serverapp.strategy import FedAvg, Strategy

from clients.app import ClientData, make_client_app
from fedvalue.utilities import TorchModelUtility
from simulations.models import make_mlp
from strategies import ValuingStrategy
from strategies.records import numpy_to_arrays

from .clientapp_grid import ClientAppGrid

NUM_CLIENTS, ROUNDS, FEATURES, CLASSES = 6, 3, 6, 3
NODES = {4000 + 13 * pid: pid for pid in range(NUM_CLIENTS)}
LEARNING_RATE = 0.2
TRAIN_CONFIG = {"lr": LEARNING_RATE, "local-epochs": 3, "seed": 0}
#: Tree-ensemble strategies aggregate serialized XGBoost boosters, not a model's arrays.
XGBOOST = ("FedXgbBagging", "FedXgbCyclic")
#: Constructor arguments a strategy may require, by parameter name.
KNOWN_ARGUMENTS = {
    "strategy": lambda: FedAvg(fraction_evaluate=0.0),
    "noise_multiplier": lambda: 0.5,
    "clipping_norm": lambda: 0.05,  # below the clients' update norms: clipping is active
    "num_sampled_clients": lambda: NUM_CLIENTS,
    "client_learning_rate": lambda: LEARNING_RATE,
}
#: Settings beyond the defaults, so each rule really does its work.
EXTRA_ARGUMENTS = {
    "QFedAvg": {"train_loss_key": "train-loss"},  # the key our ClientApp reports
    "DifferentialPrivacyServerSideAdaptiveClipping": {"initial_clipping_norm": 0.05, "clipped_count_stddev": 1.0},
    "DifferentialPrivacyClientSideAdaptiveClipping": {"initial_clipping_norm": 0.05, "clipped_count_stddev": 1.0},
    "MultiKrum": {"num_nodes_to_select": 3},
    "FedAvgM": {"server_momentum": 0.9},
}
#: Client mods a strategy needs (Flower's client-side DP pairs).
CLIENT_MODS = {
    "DifferentialPrivacyClientSideFixedClipping": [fixedclipping_mod],
    "DifferentialPrivacyClientSideAdaptiveClipping": [adaptiveclipping_mod],
}


def shipped_strategies() -> list[str]:
    return sorted(
        name for name, value in vars(flower_strategies).items()
        if inspect.isclass(value) and issubclass(value, Strategy) and not inspect.isabstract(value)
    )


def build_strategy(name: str) -> Strategy:
    cls = getattr(flower_strategies, name)
    kwargs = dict(EXTRA_ARGUMENTS.get(name, {}))
    for parameter in list(inspect.signature(cls.__init__).parameters.values())[1:]:
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD) or parameter.name in kwargs:
            continue
        if parameter.name == "fraction_evaluate":
            kwargs["fraction_evaluate"] = 0.0
        elif parameter.default is inspect.Parameter.empty:
            if parameter.name not in KNOWN_ARGUMENTS:
                pytest.fail(f"{name} needs constructor argument {parameter.name!r}, unknown to the conformance "
                            "suite: add a value for it to KNOWN_ARGUMENTS.")
            kwargs[parameter.name] = KNOWN_ARGUMENTS[parameter.name]()
    return cls(**kwargs)


def model_factory() -> torch.nn.Module:
    return make_mlp(FEATURES, CLASSES, hidden=(16,), seed=0)


def load_client(partition_id: int) -> ClientData:
    rng = np.random.default_rng([11, partition_id])
    n = 24 + 6 * partition_id  # unequal weights
    x = rng.normal(size=(n, FEATURES)).astype(np.float32)
    y = ((x[:, 0] + (partition_id % 3) * x[:, 1] > 0).astype(np.int64) + (x[:, 2] > 1)).clip(0, CLASSES - 1)
    return ClientData(partition_id=partition_id, x_train=x, y_train=y, x_infer=x[:0], y_infer=y[:0])


def holdout_utility() -> TorchModelUtility:
    rng = np.random.default_rng(5)
    x = rng.normal(size=(300, FEATURES)).astype(np.float32)
    y = ((x[:, 0] > 0).astype(np.int64) + (x[:, 2] > 1)).clip(0, CLASSES - 1)
    return TorchModelUtility(model_factory(), x, y, metric="neg_loss")


def initial_arrays() -> ArrayRecord:
    return numpy_to_arrays({k: v.detach().numpy() for k, v in model_factory().state_dict().items()})


def run(name: str, wrapped: bool):
    """One run of ``name`` on fresh clients, from the same global random state every time."""
    random.seed(1234)
    np.random.seed(1234)
    torch.manual_seed(1234)
    inner = build_strategy(name)
    grid = ClientAppGrid(make_client_app(load_client, model_factory, mods=CLIENT_MODS.get(name, [])), NODES)
    outer = ValuingStrategy(inner, holdout_utility(), methods=("ads", "loo"), ads_method="exact") if wrapped else inner
    result = outer.start(grid, initial_arrays(), num_rounds=ROUNDS, timeout=60, train_config=ConfigRecord(TRAIN_CONFIG))
    return inner, result, outer


def comparable(value, path: str = "strategy"):
    """A strategy's state as plain data: records as arrays, nested strategies as their state."""
    if isinstance(value, ArrayRecord):
        return {k: v.numpy() for k, v in value.items()}
    if isinstance(value, Array):
        return value.numpy()
    if isinstance(value, (MetricRecord, ConfigRecord)):
        return dict(value)
    if isinstance(value, dict):
        return {k: comparable(v, f"{path}[{k!r}]") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [comparable(v, f"{path}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, Strategy) or (hasattr(value, "__dict__") and not callable(value)):
        return {k: comparable(v, f"{path}.{k}") for k, v in vars(value).items()}
    if callable(value):
        return ("callable", getattr(value, "__qualname__", type(value).__name__))
    return value


def assert_same(a, b, path: str = "strategy") -> None:
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


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Tiny models on a busy 2-core machine: a second OpenMP thread only spins (as on a Ray actor)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("name", shipped_strategies())
def test_wrapping_leaves_the_run_untouched_and_books_the_rounds_soundly(name):
    if name in XGBOOST:
        pytest.skip("XGBoost strategies aggregate serialized boosters, not a model's arrays: there is no "
                    "torch model state for a utility to score.")
    bare_inner, bare, _ = run(name, wrapped=False)
    wrapped_inner, wrapped, valuing = run(name, wrapped=True)

    assert len(valuing.rounds) == ROUNDS
    # Bulyan (f = 0) aggregates nothing below 3 replies: the 6 + 15 smaller coalitions keep A_{t−1}.
    too_small = math.comb(NUM_CLIENTS, 1) + math.comb(NUM_CLIENTS, 2) if name == "Bulyan" else 0
    for row in valuing.rounds:
        assert row["num_failed"] == 0, row
        assert abs(row["efficiency_gap"]) < 1e-9, row
        assert row["utility_after"] == row["utility_realized"], row
        assert row["num_unaggregatable"] == too_small, row
    game = valuing.last_valuation.game
    for coalition, value in game.cached_values().items():
        if name == "Bulyan" and 0 < len(coalition) < 3:
            assert value == valuing.rounds[-1]["utility_before"], coalition
    assert list(bare.arrays) == list(wrapped.arrays)
    for key in bare.arrays:
        assert_same(bare.arrays[key].numpy(), wrapped.arrays[key].numpy(), f"final arrays[{key!r}]")
    assert_same(comparable(bare_inner), comparable(wrapped_inner))
    # The run moved: a conformance check on a frozen model would prove nothing.
    first = initial_arrays()
    assert any(not np.array_equal(first[k].numpy(), wrapped.arrays[k].numpy()) for k in first)
