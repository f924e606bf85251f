"""Batched and linearized coalition evaluation equal the plain one-state-at-a-time path.

The reference is ``TorchModelUtility.__call__`` on the state that FedAvg's own rule
(``weighted_mean``) builds for each coalition.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from fedvalue.valuation.settings import AdsSettings
from fedvalue.valuation.round_game import fedavg_aggregator, fedavg_round_game, round_game, value_round, weighted_mean
from fedvalue.scoring.torch_utilities import TorchModelUtility
from simulations.datasets.models import make_mlp
from tests.fedvalue.fedavg_rounds import all_coalition_rows, model_state, round_around


def _held_out(seed: int, num: int, dim: int, classes: int):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(num, dim)).astype(np.float32)
    y = rng.integers(0, classes, num)
    return x, y


@pytest.mark.parametrize("metric", ["accuracy", "neg_loss"])
@pytest.mark.parametrize("batch_size", [7, 64, 1000])
@pytest.mark.parametrize("hidden", [(), (16,), (24, 12)])
def test_linear_states_equal_plain_evaluation_of_every_fedavg_coalition(metric, batch_size, hidden):
    model = make_mlp(10, 4, hidden=hidden, seed=1)
    x, y = _held_out(2, 300, 10, 4)
    utility = TorchModelUtility(model, x, y, metric=metric, batch_size=batch_size)
    start, clients, weights = round_around(3, 4, model)
    coalitions, rows = all_coalition_rows(4, weights)
    fast = utility.linear([start, *clients]).values(rows)
    plain = [utility(weighted_mean([clients[k] for k in c], weights[list(c)])) for c in coalitions]
    np.testing.assert_allclose(fast, plain, rtol=0, atol=1e-6)
    if metric == "accuracy":
        np.testing.assert_array_equal(fast, plain)


@pytest.mark.parametrize("chunk", [1, 3, 16, 64])
def test_linear_chunk_sizes_give_identical_values(chunk, monkeypatch):
    model = make_mlp(12, 3, hidden=(20,), seed=4)
    x, y = _held_out(5, 257, 12, 3)
    utility = TorchModelUtility(model, x, y, metric="neg_loss", batch_size=50)
    start, clients, weights = round_around(6, 5, model)
    coalitions, rows = all_coalition_rows(5, weights)
    plain = [utility(weighted_mean([clients[k] for k in c], weights[list(c)])) for c in coalitions]
    states = utility.linear([start, *clients])
    monkeypatch.setattr(states, "chunk", chunk)
    np.testing.assert_allclose(states.values(rows), plain, rtol=0, atol=1e-6)


@pytest.mark.parametrize("chunk_size", [1, 2, 5, 32])
@pytest.mark.parametrize("metric", ["accuracy", "neg_loss"])
def test_batch_equals_plain_for_arbitrary_states(chunk_size, metric):
    model = make_mlp(8, 5, hidden=(16, 16), seed=7)
    x, y = _held_out(8, 200, 8, 5)
    utility = TorchModelUtility(model, x, y, metric=metric, batch_size=64, chunk_size=chunk_size)
    _, states, _ = round_around(9, 7, model, spread=1.0)
    plain = [utility(s) for s in states]
    np.testing.assert_allclose(utility.batch(states), plain, rtol=0, atol=1e-6)


def test_regression_utility_in_batches_and_combinations():
    model = make_mlp(6, 1, hidden=(8,), seed=10)
    rng = np.random.default_rng(11)
    x = rng.normal(size=(150, 6)).astype(np.float32)
    y = rng.normal(size=150).astype(np.float32)
    utility = TorchModelUtility(model, x, y, metric="neg_mse", batch_size=40, chunk_size=3)
    start, clients, weights = round_around(12, 3, model)
    coalitions, rows = all_coalition_rows(3, weights)
    plain = [utility(weighted_mean([clients[k] for k in c], weights[list(c)])) for c in coalitions]
    np.testing.assert_allclose(utility.linear([start, *clients]).values(rows), plain, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(utility.batch(clients), [utility(c) for c in clients], rtol=1e-6, atol=1e-6)


def test_exact_ties_are_scored_as_the_plain_path_scores_them():
    """A last layer of zeros makes every row an exact tie; plain argmax picks class 0."""
    model = make_mlp(5, 3, hidden=(6,), seed=13)
    x, y = _held_out(14, 120, 5, 3)
    utility = TorchModelUtility(model, x, y, batch_size=32)
    start, clients, weights = round_around(15, 3, model)
    for state in (start, *clients):
        state["2.weight"][:] = 0.0
        state["2.bias"][:] = 0.25
    coalitions, rows = all_coalition_rows(3, weights)
    expected = float(np.mean(y == 0))
    plain = [utility(weighted_mean([clients[k] for k in c], weights[list(c)])) for c in coalitions]
    assert plain == [expected] * len(coalitions)
    np.testing.assert_array_equal(utility.linear([start, *clients]).values(rows), plain)
    assert utility.batch(clients) == pytest.approx([expected] * 3, abs=0)
    chunked = TorchModelUtility(model, x, y, batch_size=32, chunk_size=2)
    np.testing.assert_array_equal(chunked.batch(clients), [expected] * 3)


def test_models_without_a_leading_linear_layer_use_combined_states():
    class TwoBranch(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(4, 3)
            self.b = torch.nn.Linear(4, 3)

        def forward(self, x):
            return self.a(x) * torch.tanh(self.b(x))

    torch.manual_seed(0)
    model = TwoBranch()
    x, y = _held_out(16, 90, 4, 3)
    utility = TorchModelUtility(model, x, y, metric="neg_loss", batch_size=25)
    assert utility.first_linear is None
    start, clients, weights = round_around(17, 3, model)
    coalitions, rows = all_coalition_rows(3, weights)
    plain = [utility(weighted_mean([clients[k] for k in c], weights[list(c)])) for c in coalitions]
    np.testing.assert_allclose(utility.linear([start, *clients]).values(rows), plain, rtol=0, atol=1e-6)


def test_flatten_before_the_first_linear_layer_is_cut_correctly():
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    torch.nn.init.normal_(model[1].weight, generator=torch.Generator().manual_seed(0))
    rng = np.random.default_rng(18)
    x = rng.normal(size=(70, 3, 4)).astype(np.float32)
    y = rng.integers(0, 3, 70)
    utility = TorchModelUtility(model, x, y, metric="neg_loss", batch_size=16)
    assert utility.first_linear is not None and utility.first_linear.weight_key == "1.weight"
    start, clients, weights = round_around(19, 4, model)
    coalitions, rows = all_coalition_rows(4, weights)
    plain = [utility(weighted_mean([clients[k] for k in c], weights[list(c)])) for c in coalitions]
    np.testing.assert_allclose(utility.linear([start, *clients]).values(rows), plain, rtol=0, atol=1e-6)


@pytest.mark.parametrize("metric", ["accuracy", "neg_loss"])
def test_fedavg_round_game_values_equal_the_plain_round_game(metric):
    model = make_mlp(10, 4, hidden=(16,), seed=20)
    x, y = _held_out(21, 400, 10, 4)
    utility = TorchModelUtility(model, x, y, metric=metric, batch_size=128)
    start, clients, weights = round_around(22, 6, model)
    ids = [f"c{k}" for k in range(6)]
    fast_game = fedavg_round_game(ids, start, clients, weights, utility)
    plain_game = round_game(ids, start, fedavg_aggregator(ids, clients, weights), utility)
    fast = value_round(fast_game, ("ads", "loo"))
    plain = value_round(plain_game, ("ads", "loo"))
    for method in ("ads", "loo"):
        np.testing.assert_allclose(fast.results[method].values, plain.results[method].values, rtol=0, atol=1e-6)
    # The anchors are plain-path values: bit for bit what anyone recomputes.
    assert fast.utility_before == utility(start)
    assert fast.utility_after == utility(weighted_mean(clients, weights))
    # ADS and LOO share one cache: exactly the 2^n distinct coalitions, each once.
    assert fast_game.num_evaluations == fast_game.num_cached == 2**6


def test_fedavg_round_game_with_a_utility_without_linear_uses_materialized_states():
    calls = []

    def utility(arrays):
        calls.append(1)
        return float(arrays["w"].sum())

    start = {"w": np.zeros(3)}
    clients = [{"w": np.full(3, float(k))} for k in range(1, 4)]
    game = fedavg_round_game(["a", "b", "c"], start, clients, [1.0, 1.0, 2.0], utility)
    assert game.value(game.mask_of(["a", "c"])) == pytest.approx(3 * (1 * 1 + 2 * 3) / 3)
    assert game.value(0) == 0.0 and len(calls) == 2


def test_linear_rejects_bad_coefficients_and_integer_buffers():
    model = make_mlp(3, 2, hidden=(), seed=0)
    x, y = _held_out(0, 10, 3, 2)
    utility = TorchModelUtility(model, x, y)
    states = utility.linear([model_state(model)])
    with pytest.raises(ValueError, match="coefficients: expected an array of shape"):
        states.values(np.ones((2, 3)))
    with pytest.raises(ValueError, match="coefficients: expected finite"):
        states.values(np.array([[np.nan]]))
    with pytest.raises(ValueError, match="basis: expected at least one state"):
        utility.linear([])
    bn = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    with_buffers = TorchModelUtility(bn.eval(), x, y)
    assert not with_buffers.supports_linear
    with pytest.raises(TypeError, match="integer buffers"):
        with_buffers.linear([model_state(bn)])
    for name, kwargs in (("batch_size", {"batch_size": 0}), ("chunk_size", {"chunk_size": -1}),
                         ("tie_tolerance", {"tie_tolerance": 2.0})):
        with pytest.raises(ValueError, match=name):
            TorchModelUtility(model, x, y, **kwargs)


def test_near_ties_that_rounding_could_flip_are_rescored_on_the_plain_path():
    """Two output rows equal up to 1e-6: their logits differ by about the rounding
    noise between the fast and the plain path, so unchecked argmaxes would flip."""
    model = make_mlp(20, 3, hidden=(32,), seed=23)
    x, y = _held_out(24, 600, 20, 3)
    y = np.where(y == 2, 1, y)
    utility = TorchModelUtility(model, x, y, batch_size=128)
    start, clients, weights = round_around(25, 5, model)
    rng = np.random.default_rng(26)
    for state in (start, *clients):
        state["2.weight"][1] = state["2.weight"][0] * (1 + 1e-6 * rng.normal(size=32)).astype(np.float32)
        state["2.bias"][1] = state["2.bias"][0]
        state["2.weight"][2] = -10.0
    coalitions, rows = all_coalition_rows(5, weights)
    plain = [utility(weighted_mean([clients[k] for k in c], weights[list(c)])) for c in coalitions]
    states = utility.linear([start, *clients])
    scores = states.scores(rows)
    assert scores.near, "the construction should produce near ties"
    unchecked = scores.sums.sum(axis=1) / len(x)
    checked = states.resolve(rows, scores, lambda c: weighted_mean([clients[k] for k in coalitions[c]],
                                                                   weights[list(coalitions[c])]))
    np.testing.assert_array_equal(checked, plain)
    # Without the re-scoring the fast path would not have matched (this is what the check buys).
    assert np.any(unchecked != np.asarray(plain))


# --- random MLPs, several chunk sizes, through the round game --------------------------------

# Every chunk size meets every metric, and every seed's random model appears twice
# (6 cases instead of the 18 of the full product: each extra case re-ran the same paths).
@pytest.mark.parametrize(("seed", "linear_chunk", "metric"), [
    (30, 1, "accuracy"), (31, 7, "accuracy"), (32, 64, "accuracy"),
    (31, 1, "neg_loss"), (32, 7, "neg_loss"), (30, 64, "neg_loss"),
])
def test_round_game_paths_equal_plain_on_random_mlps(seed, linear_chunk, metric, monkeypatch):
    """Linearized (first-layer reuse, ``linear_chunk`` states per matmul), vmapped batches
    (several ``chunk_size``) and the plain path give the same v_t on every coalition of a
    FedAvg round with unequal weights."""
    rng = np.random.default_rng(seed)
    hidden = tuple(int(h) for h in rng.integers(4, 40, rng.integers(1, 3)))
    model = make_mlp(9, 5, hidden=hidden, seed=seed)
    x, y = _held_out(seed + 1, 333, 9, 5)
    batch_size = int(rng.choice([50, 128, 1000]))
    plain_utility = TorchModelUtility(model, x, y, metric=metric, batch_size=batch_size, device="cpu")
    start, clients, weights = round_around(seed + 2, 5, model, spread=float(rng.uniform(0.1, 1.0)))
    assert len(set(weights)) > 1  # unequal weights
    ids = list(range(5))
    masks = range(2**5)
    plain_game = round_game(ids, start, fedavg_aggregator(ids, clients, weights), plain_utility)
    plain = plain_game.values(masks)
    # Accuracy: equal (and exactly so below). Losses: equal to float32 rounding, 1e-6 of
    # the loss (losses of these random, widely spread states reach 25 nats).
    rtol = 0 if metric == "accuracy" else 1e-6
    monkeypatch.setattr("fedvalue.scoring.linear.LinearStates.chunk", linear_chunk)
    linear_game = fedavg_round_game(ids, start, clients, weights, plain_utility)
    np.testing.assert_allclose(linear_game.values(masks), plain, rtol=rtol, atol=1e-6)
    for chunk_size in (2, 5, 32):  # 32: the CUDA default, here on the CPU
        vmapped = TorchModelUtility(model, x, y, metric=metric, batch_size=batch_size, chunk_size=chunk_size)
        batched_game = round_game(ids, start, fedavg_aggregator(ids, clients, weights), vmapped,
                                  batch_utility=vmapped.batch)
        np.testing.assert_allclose(batched_game.values(masks), plain, rtol=rtol, atol=1e-6)
    if metric == "accuracy":
        np.testing.assert_array_equal(linear_game.values(masks), plain)


@pytest.mark.parametrize("ads_method, options", [
    ("exact", {}), ("mc", {"epsilon": 0.3}), ("mc", {"epsilon": 0.05}), ("tmc", {"epsilon": 0.2}),
])
def test_round_game_cache_counts_the_distinct_coalitions(ads_method, options):
    """ADS and LOO on one round game: each distinct coalition is scored once, at most 2^n."""
    model = make_mlp(6, 3, hidden=(8,), seed=40)
    x, y = _held_out(41, 120, 6, 3)
    scored: list[int] = []
    utility = TorchModelUtility(model, x, y, batch_size=50)

    class Counting(TorchModelUtility):
        def __call__(self, arrays):
            scored.append(1)
            return super().__call__(arrays)

    counting = Counting(model, x, y, batch_size=50)
    start, clients, weights = round_around(42, 6, model)
    ids = [f"c{k}" for k in range(6)]
    game = fedavg_round_game(ids, start, clients, weights, counting)
    requested: list[int] = []
    values = game.values

    def recording(masks):
        masks = [int(m) for m in masks]
        requested.extend(masks)
        return values(masks)

    game.values = recording
    valuation = value_round(game, ("ads", "loo"), AdsSettings(method=ads_method, **options), seed=0)
    distinct = set(requested)
    assert valuation.num_evaluations == game.num_cached == len(distinct) <= 2**6
    if ads_method == "exact" or options.get("epsilon") == 0.05:
        assert len(distinct) == 2**6
    # Only ∅ and I_t go through the plain path; the rest are linear combinations.
    assert len(scored) == 2
    # Cached values are what the plain path gives each coalition.
    plain_game = round_game(ids, start, fedavg_aggregator(ids, clients, weights), utility)
    cached = np.array([game._cache[m] for m in sorted(distinct)])
    np.testing.assert_array_equal(cached, plain_game.values(sorted(distinct)))


# --- devices ----------------------------------------------------------------------------------

def _device_round():
    model = make_mlp(10, 4, hidden=(16, 12), seed=50)
    x, y = _held_out(51, 300, 10, 4)
    start, clients, weights = round_around(52, 5, model)
    return model, x, y, start, clients, weights


def test_device_argument_places_data_and_defaults_the_chunk_size():
    model, x, y, start, clients, weights = _device_round()
    for device in (None, "cpu", torch.device("cpu")):
        utility = TorchModelUtility(model, x, y, device=device)
        assert utility.device == torch.device("cpu") and utility.x.device.type == "cpu"
        assert utility.chunk_size == 1  # a loop of large matmuls on the CPU; 32 on CUDA


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("metric", ["accuracy", "neg_loss"])
def test_cuda_paths_equal_the_cuda_plain_path(metric):
    """On a GPU: linearized and vmapped (default chunk 32) scoring equal the plain path on
    the same device, and ADS/LOO equal the CPU's to the accuracy of float32."""
    model, x, y, start, clients, weights = _device_round()
    ids = list(range(5))
    cuda = TorchModelUtility(model, x, y, metric=metric, batch_size=128, device="cuda")
    assert cuda.chunk_size == 32 and cuda.x.is_cuda
    plain = round_game(ids, start, fedavg_aggregator(ids, clients, weights), cuda).values(range(32))
    linear = fedavg_round_game(ids, start, clients, weights, cuda).values(range(32))
    vmapped = round_game(ids, start, fedavg_aggregator(ids, clients, weights), cuda,
                         batch_utility=cuda.batch).values(range(32))
    np.testing.assert_allclose(linear, plain, rtol=0, atol=1e-6)
    np.testing.assert_allclose(vmapped, plain, rtol=0, atol=1e-6)
    if metric == "accuracy":
        np.testing.assert_array_equal(linear, plain)
    cpu = TorchModelUtility(model, x, y, metric=metric, batch_size=128)
    on_cpu = value_round(fedavg_round_game(ids, start, clients, weights, cpu), ("ads", "loo"))
    on_gpu = value_round(fedavg_round_game(ids, start, clients, weights, cuda), ("ads", "loo"))
    for method in ("ads", "loo"):
        np.testing.assert_allclose(on_gpu.results[method].values, on_cpu.results[method].values,
                                   rtol=0, atol=1e-5 if metric == "neg_loss" else 2 / len(x))


# --- the tail after the first layer: in-place steps or functional_call ----------------------------

def _tails():
    torch.manual_seed(60)
    return {
        "relu-mlp": torch.nn.Sequential(torch.nn.Linear(7, 9), torch.nn.ReLU(), torch.nn.Linear(9, 9),
                                        torch.nn.ReLU(inplace=True), torch.nn.Linear(9, 4)),
        "tanh-sigmoid-dropout-nobias": torch.nn.Sequential(
            torch.nn.Flatten(), torch.nn.Linear(7, 8), torch.nn.Tanh(), torch.nn.Dropout(0.5),
            torch.nn.Linear(8, 6, bias=False), torch.nn.Sigmoid(), torch.nn.Identity(), torch.nn.Linear(6, 4)),
        "activation-last": torch.nn.Sequential(torch.nn.Linear(7, 4), torch.nn.ReLU()),
        "single-linear": torch.nn.Sequential(torch.nn.Linear(7, 4)),
        "unsupported-module": torch.nn.Sequential(torch.nn.Linear(7, 8), torch.nn.LeakyReLU(0.1),
                                                  torch.nn.Linear(8, 4)),
    }


@pytest.mark.parametrize("name", list(_tails()))
@pytest.mark.parametrize("metric", ["accuracy", "neg_loss"])
def test_every_kind_of_tail_gives_the_plain_values(name, metric):
    model = _tails()[name]
    x, y = _held_out(61, 250, 7, 4)
    utility = TorchModelUtility(model, x, y, metric=metric, batch_size=60)
    assert utility.first_linear is not None
    start, clients, weights = round_around(62, 4, model, spread=0.5)
    states = utility.linear([start, *clients])
    plan = states._tail_plan()
    assert (plan is None) == (name == "unsupported-module")
    if name == "single-linear":
        assert plan == []
    coalitions, rows = all_coalition_rows(4, weights)
    plain = [utility(weighted_mean([clients[k] for k in c], weights[list(c)])) for c in coalitions]
    np.testing.assert_allclose(states.values(rows), plain, rtol=0, atol=1e-6)
    np.testing.assert_allclose(states.values(rows), plain, rtol=0, atol=1e-6)  # reused buffers: same again
    if metric == "accuracy":
        np.testing.assert_array_equal(states.values(rows), plain)


def test_a_tail_in_training_mode_is_not_run_in_place():
    """Dropout is the identity only in eval mode; TorchModelUtility puts the model in it."""
    model = _tails()["tanh-sigmoid-dropout-nobias"].train()
    x, y = _held_out(63, 40, 7, 4)
    utility = TorchModelUtility(model, x, y)
    assert not model.training
    start, clients, _ = round_around(64, 2, model)
    assert utility.linear([start, *clients])._tail_plan() is not None
    model.train()  # someone flips it back: the plan falls back to functional_call
    assert utility.linear([start, *clients])._tail_plan() is None


def _flushing() -> bool:
    return float(torch.tensor(1e-39, dtype=torch.float32) * 1.0) == 0.0


@pytest.mark.parametrize("caller_flushes", [False, True])
def test_subnormal_activations_score_alike_on_every_path_and_the_setting_is_restored(caller_flushes):
    """Hidden activations ~1e-39 (subnormal in float32) are flushed on every path, so the
    paths agree with each other and with the float64 answer (the flush costs < 1.2e-38
    per activation); the caller's flush setting is what it was after every call."""
    torch.manual_seed(5)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    with torch.no_grad():
        model[0].weight.mul_(1e-38)
        model[0].bias.zero_()
    start, clients, weights = round_around(5, 4, model, spread=0.0)
    for c in clients:  # clients differ in their output layer only, so hidden stays subnormal
        c["2.weight"] = c["2.weight"] + np.random.default_rng(len(c)).normal(size=c["2.weight"].shape).astype(np.float32)
    x, y = _held_out(5, 300, 6, 3)
    utility = TorchModelUtility(model, x, y, metric="neg_loss", batch_size=128)
    torch.set_flush_denormal(caller_flushes)
    try:
        masks = [m for m in itertools.product([0, 1], repeat=4) if any(m)]
        coefficients = np.array([np.asarray(m) * weights / (np.asarray(m) * weights).sum() for m in masks])
        states = [weighted_mean(clients, c) for c in coefficients]
        plain = np.array([utility(s) for s in states])
        assert _flushing() == caller_flushes
        batched = np.array(utility.batch(states))
        assert _flushing() == caller_flushes
        linear = utility.linear(clients).values(coefficients)
        assert _flushing() == caller_flushes
    finally:
        torch.set_flush_denormal(False)
    # float64 reference: hidden ≈ 0 exactly as the flushed paths see it
    reference = []
    for s in states:
        w2, b2 = torch.as_tensor(s["2.weight"], dtype=torch.float64), torch.as_tensor(s["2.bias"], dtype=torch.float64)
        logits = torch.zeros(len(x), 8, dtype=torch.float64) @ w2.T + b2
        reference.append(-float(torch.nn.functional.cross_entropy(logits, torch.as_tensor(y), reduction="mean")))
    np.testing.assert_allclose(plain, reference, rtol=0, atol=1e-5)
    np.testing.assert_allclose(batched, plain, rtol=0, atol=1e-6)
    np.testing.assert_allclose(linear, plain, rtol=0, atol=1e-6)


class _FlushProbe(torch.nn.Module):
    """Identity that notes whether denormals are flushed while the model runs."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[bool] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(_flushing())
        return x


def test_models_run_with_denormals_flushed():
    probe = _FlushProbe()
    model = torch.nn.Sequential(torch.nn.Linear(4, 5), probe, torch.nn.Linear(5, 2))
    start, clients, weights = round_around(7, 3, model)
    x, y = _held_out(7, 50, 4, 2)
    utility = TorchModelUtility(model, x, y)
    utility(start)
    utility.linear(clients).values(np.eye(3))
    assert probe.seen and all(probe.seen)
    assert not _flushing()


def test_round_game_materializes_a_large_batch_a_chunk_of_states_at_a_time():
    """MC asks for every permutation prefix in one batch: the states reach the batch utility in
    chunks of STATES_PER_BATCH (bounded memory) and the values equal the one-at-a-time path."""
    from fedvalue.valuation.round_game import STATES_PER_BATCH

    model = make_mlp(5, 3, hidden=(8,), seed=1)
    start, clients, weights = round_around(4, 8, model)
    utility = TorchModelUtility(model, *_held_out(5, 60, 5, 3), metric="neg_loss")
    ids = list(range(8))
    sizes = []

    def batch(arrays_list):
        sizes.append(len(arrays_list))
        return utility.batch(arrays_list)

    batched = round_game(ids, start, fedavg_aggregator(ids, clients, weights), utility, batch_utility=batch)
    plain = round_game(ids, start, fedavg_aggregator(ids, clients, weights), utility)
    masks = list(range(2 ** 8))
    np.testing.assert_array_equal(batched.values(masks), plain.values(masks))
    assert max(sizes) == STATES_PER_BATCH and sum(sizes) == 2 ** 8 and len(sizes) == 2 ** 8 // STATES_PER_BATCH
