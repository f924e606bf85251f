"""Marginal influence ([RECIP] Eq. 3) summed into flows, against hand-computed and brute-force cases."""

from __future__ import annotations

import numpy as np
import pytest

from fedvalue.flows.marginal import marginal_flows, marginal_losses


def _mean_model_case(seed: int = 0):
    rng = np.random.default_rng(seed)
    y_train, y_infer = rng.normal(3, 1, 7), rng.normal(3, 1, 5)
    train_owner = np.array([0, 0, 1, 2, 2, 2, 3])
    infer_owner = np.array([0, 1, 1, 3, 4])
    return y_train, y_infer, train_owner, infer_owner


def test_mean_predictor_matches_the_hand_computed_marginals():
    """M_S predicts mean(y_S); ℓ = (prediction − y')². Removing z gives mean (S − y_z)/(n − 1)."""
    y_train, y_infer, train_owner, infer_owner = _mean_model_case()
    n, total = len(y_train), y_train.sum()
    full, removed = marginal_losses(lambda kept: y_train[kept].mean(), lambda m: (m - y_infer) ** 2, n,
                                    [[k] for k in range(n)])
    by_hand = np.array([[((total - y_train[k]) / (n - 1) - y) ** 2 - (total / n - y) ** 2 for y in y_infer]
                        for k in range(n)])
    np.testing.assert_allclose(removed - full, by_hand, rtol=1e-12, atol=1e-14)
    inflow, outflow, own = marginal_flows(full, removed, train_owner, infer_owner, num_individuals=5)
    for u in range(5):
        mine, theirs = train_owner == u, infer_owner == u
        assert outflow[u] == pytest.approx(by_hand[mine][:, ~theirs].sum(), abs=1e-12)
        assert inflow[u] == pytest.approx(by_hand[~mine][:, theirs].sum(), abs=1e-12)
        assert own[u] == pytest.approx(by_hand[mine][:, theirs].sum(), abs=1e-12)
    assert inflow.sum() == pytest.approx(outflow.sum(), rel=1e-12)
    assert inflow[4] != 0 and outflow[4] == 0  # individual 4 only infers


def test_removing_an_individual_at_once_is_one_retraining():
    """App. C.2's variant: the unit is all of u's training rows; a lone-example unit is Eq. 3 itself."""
    y_train, y_infer, train_owner, infer_owner = _mean_model_case(1)
    units = [np.flatnonzero(train_owner == u) for u in range(4)]
    fit = lambda kept: y_train[kept].mean()  # noqa: E731
    loss = lambda m: (m - y_infer) ** 2  # noqa: E731
    full, removed = marginal_losses(fit, loss, len(y_train), units)
    inflow, outflow, _ = marginal_flows(full, removed, np.arange(4), infer_owner, num_individuals=5)
    for u, unit in enumerate(units):
        without = y_train[np.setdiff1d(np.arange(len(y_train)), unit)].mean()
        change = (without - y_infer) ** 2 - (y_train.mean() - y_infer) ** 2
        assert outflow[u] == pytest.approx(change[infer_owner != u].sum(), abs=1e-12)
    # Individual 1 (rows 2 only) is a single example: its unit is Eq. 3's removal.
    singles = marginal_flows(*marginal_losses(fit, loss, len(y_train), [[2]]), [1], infer_owner, num_individuals=5)
    assert singles[1][1] == pytest.approx(outflow[1], abs=1e-14)


def test_flows_equal_the_pairwise_brute_force_for_least_squares():
    """Every Marginal(z, z') by its own least-squares refit, summed pair by pair."""
    rng = np.random.default_rng(2)
    x, x_infer = rng.normal(size=(12, 3)), rng.normal(size=(6, 3))
    w_true = np.array([1.0, -2.0, 0.5])
    y, y_infer = x @ w_true + rng.normal(0, 0.3, 12), x_infer @ w_true + rng.normal(0, 0.3, 6)
    fit = lambda kept: np.linalg.lstsq(x[kept], y[kept], rcond=None)[0]  # noqa: E731
    loss = lambda w: (x_infer @ w - y_infer) ** 2  # noqa: E731
    owner_train = np.arange(12) % 4
    owner_infer = np.array([0, 1, 2, 3, 4, 4])
    full, removed = marginal_losses(fit, loss, 12, [[k] for k in range(12)])
    inflow, outflow, _ = marginal_flows(full, removed, owner_train, owner_infer, num_individuals=5)
    base = loss(fit(np.arange(12)))
    pair = np.array([[loss(fit(np.delete(np.arange(12), k)))[j] - base[j] for j in range(6)] for k in range(12)])
    for v in range(5):
        assert inflow[v] == pytest.approx(pair[owner_train != v][:, owner_infer == v].sum(), abs=1e-12)
        assert outflow[v] == pytest.approx(pair[owner_train == v][:, owner_infer != v].sum(), abs=1e-12)


def test_bad_inputs_name_the_parameter():
    with pytest.raises(ValueError, match="removed_losses: expected 3 columns"):
        marginal_flows([1.0, 2.0, 3.0], np.zeros((2, 2)), [0, 1], [0, 1, 1], num_individuals=2)
    with pytest.raises(ValueError, match="unit_owner: expected indices in"):
        marginal_flows([1.0], np.zeros((1, 1)), [5], [0], num_individuals=2)
    with pytest.raises(ValueError, match="units: expected non-empty"):
        marginal_losses(lambda kept: 0.0, lambda m: np.zeros(1), 3, [[]])
