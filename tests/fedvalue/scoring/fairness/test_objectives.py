"""Fairness gaps, their relaxations' gradients, client fairness influence and reweighting rules."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from fedvalue.scoring.fairness.objectives import (
    GAPS,
    GroupFairness,
    client_fairness_influences,
    drop_k,
    fedavg_weight_derivatives,
    gap_of_scores,
    ijack_factors,
    joint_gap_of_scores,
)
from fedvalue.valuation.round_game import fedavg_round_game, value_round, weighted_mean


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def mlp(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))


def heldout(seed: int = 1, n: int = 200):
    rng = np.random.default_rng(seed)
    z = rng.integers(0, 2, n)
    y = rng.integers(0, 2, n)
    x = np.column_stack([rng.normal(0.8 * y + 0.5 * z, 1.0), z, rng.normal(size=n)])
    return x, y, z


def state_of(model: torch.nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().numpy().astype(np.float64) for k, v in model.state_dict().items()}


def mlp_objective(gap: str) -> tuple[GroupFairness, dict[str, np.ndarray]]:
    """A small MLP's relaxed ``gap`` on the held-out rows, and the MLP's state."""
    model = mlp()
    x, y, z = heldout()
    return GroupFairness(model, x, y, z, gap=gap), state_of(model)


def flat(arrays, keys):
    return np.concatenate([np.ravel(arrays[k]) for k in keys])


def test_hard_gaps_are_differences_of_group_rates():
    h = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0])
    y = torch.tensor([1, 1, 0, 0, 1, 1, 0, 0])
    z = torch.tensor([1, 1, 1, 1, 0, 0, 0, 0])
    # P(ŷ=1|z=1) = 3/4, P(ŷ=1|z=0) = 1/4; TPR 1/2 vs 1/2; FPR 1 vs 0.
    assert float(gap_of_scores(h, y, z, "dp")) == pytest.approx(0.5)
    assert float(gap_of_scores(h, y, z, "eop")) == pytest.approx(0.0)
    assert float(gap_of_scores(h, y, z, "eo")) == pytest.approx(1.0)


@pytest.mark.parametrize("gap", GAPS)
def test_relaxed_gap_gradient_matches_finite_differences(gap):
    fairness, arrays = mlp_objective(gap)
    grad = fairness.gradient(arrays)
    keys = list(arrays)
    rng = np.random.default_rng(3)
    checked = 0
    for key in keys:
        for index in itertools.islice(np.ndindex(arrays[key].shape), 0, None, 3):
            eps = 1e-6
            up = {k: v.copy() for k, v in arrays.items()}
            down = {k: v.copy() for k, v in arrays.items()}
            up[key][index] += eps
            down[key][index] -= eps
            numeric = (fairness.relaxed_gap(up) - fairness.relaxed_gap(down)) / (2 * eps)
            assert grad[key][index] == pytest.approx(numeric, rel=1e-5, abs=1e-8)
            checked += 1
    assert checked > 10
    # A random direction too: the directional derivative.
    direction = {k: rng.normal(size=v.shape) for k, v in arrays.items()}
    eps = 1e-6
    plus = {k: arrays[k] + eps * direction[k] for k in keys}
    minus = {k: arrays[k] - eps * direction[k] for k in keys}
    numeric = (fairness.relaxed_gap(plus) - fairness.relaxed_gap(minus)) / (2 * eps)
    assert flat(grad, keys) @ flat(direction, keys) == pytest.approx(numeric, rel=1e-5)


def test_one_logit_models_use_the_sigmoid():
    x, y, z = heldout()
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    fairness = GroupFairness(model, x, y, z)
    arrays = state_of(model)
    with torch.no_grad():
        h = torch.sigmoid(model(torch.as_tensor(x, dtype=torch.float32)))[:, 0].double().numpy()
    expected = abs(h[z == 1].mean() - h[z == 0].mean())
    assert fairness.relaxed_gap(arrays) == pytest.approx(expected, rel=1e-6)
    assert fairness(arrays) == -fairness.relaxed_gap(arrays)


@pytest.mark.parametrize("gap", GAPS)
def test_first_order_influence_matches_the_actual_change_for_small_steps(gap):
    fairness, start = mlp_objective(gap)
    rng = np.random.default_rng(5)
    replies = {c: {k: v + rng.normal(scale=0.3, size=v.shape) for k, v in start.items()} for c in "abcd"}
    weights = {"a": 10, "b": 30, "c": 5, "d": 55}
    gradient = fairness.gradient(start)
    base = fairness.relaxed_gap(start)
    for scale in (1e-2, 1e-3, 1e-4):
        small = {c: {k: start[k] + scale * (r[k] - start[k]) for k in start} for c, r in replies.items()}
        influences = client_fairness_influences(gradient, start, small, weights)
        # Each client's share alone, and the whole FedAvg step.
        total = sum(weights.values())
        for c in small:
            moved = {k: start[k] + weights[c] / total * (small[c][k] - start[k]) for k in start}
            actual = fairness.relaxed_gap(moved) - base
            assert influences[c] == pytest.approx(actual, rel=20 * scale, abs=1e-12)
        realized = weighted_mean(list(small.values()), list(weights.values()))
        assert sum(influences.values()) == pytest.approx(fairness.relaxed_gap(realized) - base, rel=20 * scale)


def local_training(model_factory, start, x, y, epochs=30, lr=0.5):
    model = model_factory()
    model.load_state_dict({k: torch.as_tensor(v, dtype=torch.float32) for k, v in start.items()})
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    xt, yt = torch.as_tensor(x, dtype=torch.float32), torch.as_tensor(y)
    for _ in range(epochs):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(xt), yt).backward()
        optimizer.step()
    return {k: v.detach().numpy().astype(np.float64) for k, v in model.state_dict().items()}


def test_a_client_holding_only_one_groups_positives_raises_the_gap_most():
    # Gaussian example of [FAIRINFL] §5: x ~ N(μ_{z,y}, 1), μ_{0,0} < μ_{1,0} < 0 < μ_{0,1} < μ_{1,1}.
    rng = np.random.default_rng(0)
    means = {(0, 0): -2.0, (1, 0): -0.5, (0, 1): 0.5, (1, 1): 2.0}

    def draw(pairs, n):
        cells = [pairs[i % len(pairs)] for i in range(n)]
        z = np.array([c[0] for c in cells])
        y = np.array([c[1] for c in cells])
        x = np.column_stack([rng.normal([means[c] for c in cells], 1.0), z])
        return x, y, z

    everyone = list(means)
    x_test, y_test, z_test = draw(everyone, 800)

    def factory():
        torch.manual_seed(0)
        return torch.nn.Linear(2, 2)

    fairness = GroupFairness(factory(), x_test, y_test, z_test, gap="dp")
    start = local_training(factory, state_of(factory()), *draw(everyone, 400)[:2], epochs=50)
    clients = {
        "mixed-1": draw(everyone, 60), "mixed-2": draw(everyone, 60), "mixed-3": draw(everyone, 60),
        "negatives-only": draw([(0, 0), (1, 0)], 60),
        "group1-positives": draw([(1, 1)], 60),
        "group0-positives": draw([(0, 1)], 60),
    }
    replies = {c: local_training(factory, start, x, y) for c, (x, y, _) in clients.items()}
    influences = client_fairness_influences(fairness.gradient(start), start, replies, {c: 60 for c in clients})
    assert max(influences, key=influences.get) == "group1-positives"
    assert influences["group1-positives"] > 0
    # The actual gap moves the same way when that client's share of the step is taken alone.
    share = {k: start[k] + (replies["group1-positives"][k] - start[k]) / len(clients) for k in start}
    assert fairness.relaxed_gap(share) > fairness.relaxed_gap(start)


def test_fairness_ads_satisfies_group_efficiency():
    x, y, z = heldout(n=120)
    model = mlp()
    fairness = GroupFairness(model, x, y, z, gap="eo")
    start = state_of(model)
    rng = np.random.default_rng(2)
    ids = [0, 1, 2, 3, 4]
    arrays = [{k: v + rng.normal(scale=0.5, size=v.shape) for k, v in start.items()} for _ in ids]
    weights = [3, 1, 4, 1, 5]
    valuation = value_round(fedavg_round_game(ids, start, arrays, weights, fairness), ("ads", "loo"))
    phi = valuation.results["ads"].values
    gain = fairness(weighted_mean(arrays, weights)) - fairness(start)
    assert float(phi.sum()) == pytest.approx(gain, abs=1e-12)
    assert valuation.utility_after - valuation.utility_before == pytest.approx(gain, abs=1e-15)


def test_drop_k_drops_the_largest_positive_influences():
    influences = {"a": 0.3, "b": -1.0, "c": 0.5, "d": 0.3, "e": 0.0}
    assert drop_k(influences, 2) == {"c", "a"}
    assert drop_k(influences, 10) == {"a", "c", "d"}  # only positive ones
    assert drop_k(influences, 0) == set()
    with pytest.raises(ValueError, match="k: expected a non-negative integer"):
        drop_k(influences, -1)


def test_ijack_factors():
    influences = {"a": 0.5, "b": -1.0, "c": 2.0}
    assert ijack_factors(influences, 0.0) == {"a": 1.0, "b": 1.0, "c": 1.0}
    factors = ijack_factors(influences, 1.0)  # raw 0.5, 2, 0
    assert factors == pytest.approx({"a": 0.6, "b": 2.4, "c": 0.0})
    assert ijack_factors({"a": 1.0}, 5.0) == {"a": 0.0}
    with pytest.raises(ValueError, match="lam: expected a finite number ≥ 0"):
        ijack_factors(influences, -0.1)


def test_bad_input_is_named():
    x, y, z = heldout(n=10)
    with pytest.raises(ValueError, match="gap: expected one of"):
        GroupFairness(mlp(), x, y, z, gap="parity")
    with pytest.raises(ValueError, match="sensitive: expected 0/1"):
        GroupFairness(mlp(), x, y, z + 2)
    with pytest.raises(ValueError, match="x, y, sensitive"):
        GroupFairness(mlp(), x, y[:5], z)


def test_the_two_relaxations_differ_where_groups_differ_in_size():
    """[FAIRIJ] Eq. 5 (conditional means) and [FAIRINFL] Eq. 14 (joint expectations) agree only
    up to the group shares: with P(z=1) = 1/4, E[f·1[z=1]] = E[f | z=1] / 4."""
    f = torch.tensor([2.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0], dtype=torch.float64)
    y = torch.tensor([1, 0, 1, 0, 1, 0, 1, 0])
    z = torch.tensor([1, 1, 0, 0, 0, 0, 0, 0])
    # Conditional: |E[f|z=1] − E[f|z=0]| = |1 − 2/3|; joint: |(2 − 4)/8|.
    assert float(gap_of_scores(f, y, z, "dp")) == pytest.approx(1 / 3)
    assert float(joint_gap_of_scores(f, y, z, "dp")) == pytest.approx(0.25)
    # Equal TPR (Eq. 20) and FPR (Eq. 23) terms; EO is their sum (Eq. 25); covariance (Eq. 27).
    assert float(joint_gap_of_scores(f, y, z, "eop")) == pytest.approx(abs(2 - 1 - 1 - 0) / 8 + 0.0, abs=1e-15)
    assert float(joint_gap_of_scores(f, y, z, "fpr")) == pytest.approx(abs(0 - (0 + 1 + 1)) / 8)
    assert float(joint_gap_of_scores(f, y, z, "eo")) == pytest.approx(0.25)
    centred = z.double() - 0.25
    assert float(joint_gap_of_scores(f, y, z, "cov")) == pytest.approx(abs(float((f * centred).mean())))
    with pytest.raises(ValueError, match="gap"):
        joint_gap_of_scores(f, y, z, "tpr")


def test_fedavg_renormalization_matches_finite_differences_of_the_weighted_mean():
    fairness, start = mlp_objective("dp")
    rng = np.random.default_rng(11)
    replies = {c: {k: v + 0.3 * rng.normal(size=v.shape) for k, v in start.items()} for c in "abcd"}
    counts = {"a": 5.0, "b": 1.0, "c": 3.0, "d": 2.0}

    def gap_at(multipliers):
        return fairness.relaxed_gap(weighted_mean(list(replies.values()),
                                                  [counts[c] * multipliers[c] for c in replies]))

    realized = weighted_mean(list(replies.values()), list(counts.values()))
    at_end = client_fairness_influences(fairness.gradient(realized), start, replies, counts)
    derivatives = fedavg_weight_derivatives(at_end, counts)
    assert sum(derivatives.values()) == pytest.approx(0.0, abs=1e-12)
    for c in replies:
        eps = 1e-5
        up = {d: 1.0 + (eps if d == c else 0.0) for d in replies}
        down = {d: 1.0 - (eps if d == c else 0.0) for d in replies}
        numeric = (gap_at(up) - gap_at(down)) / (2 * eps)
        # Exact with the gradient at A_t; I(u) alone is not the derivative.
        assert derivatives[c] == pytest.approx(numeric, rel=1e-5, abs=1e-10)
        assert abs(at_end[c] - numeric) > 10 * abs(derivatives[c] - numeric)
    with pytest.raises(ValueError, match="weights"):
        fedavg_weight_derivatives(at_end, {"a": 1.0})
