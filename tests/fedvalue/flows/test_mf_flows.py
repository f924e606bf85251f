"""Matrix-factorization TracIn flows against the pairwise sum of full parameter gradients."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedvalue.flows.mf_flows import MfTraining, Ratings, mf_fit, mf_flows, mf_step_flows
from fedvalue.flows.reciprocity_measures import reciprocity

NUM_USERS, NUM_ITEMS, DIM, LAMBDA, ETA = 5, 6, 3, 0.7, 0.01


def _training(**changes) -> MfTraining:
    return MfTraining(**{**dict(dimension=DIM, regularization=LAMBDA, learning_rate=ETA, steps=10, init_scale=0.5),
                         **changes})


def _toy(seed: int = 0):
    """Each (user, item) pair rated at most once; ~60% of the pairs rated, a random 70:30 split."""
    rng = np.random.default_rng(seed)
    pairs = [(u, i) for u in range(NUM_USERS) for i in range(NUM_ITEMS) if rng.random() < 0.6]
    rng.shuffle(pairs)
    cut = int(0.7 * len(pairs))
    ratings = rng.integers(1, 6, len(pairs)).astype(np.float64)
    sides = []
    for rows in (slice(0, cut), slice(cut, None)):
        u, i = np.array([p[0] for p in pairs[rows]]), np.array([p[1] for p in pairs[rows]])
        sides.append(Ratings.of(u, i, ratings[rows], num_users=NUM_USERS, num_items=NUM_ITEMS))
    return sides[0], sides[1], rng.normal(0, 0.5, (NUM_USERS, DIM)), rng.normal(0, 0.5, (NUM_ITEMS, DIM))


def _example_gradients(users, items, data: Ratings, train: Ratings | None):
    """Full (P, Q) gradient vector of every example by autograd: training examples carry their
    share of the regularizer (App. A), inference examples the squared error alone."""
    user_count = np.bincount(train.users, minlength=NUM_USERS) if train is not None else None
    item_count = np.bincount(train.items, minlength=NUM_ITEMS) if train is not None else None
    rows = []
    for u, i, r in zip(data.users, data.items, data.ratings):
        p = torch.tensor(users, requires_grad=True)
        q = torch.tensor(items, requires_grad=True)
        loss = (p[u] @ q[i] - r) ** 2
        if train is not None:
            loss = loss + LAMBDA / user_count[u] * p[u] @ p[u] + LAMBDA / item_count[i] * q[i] @ q[i]
        (0.5 * loss).backward()
        rows.append(torch.cat([p.grad.ravel(), q.grad.ravel()]).numpy())
    return np.array(rows)


def test_step_flows_equal_the_pairwise_tracin_sum():
    train, infer, users, items = _toy()
    flows = mf_step_flows(users, items, train, infer, regularization=LAMBDA, learning_rate=ETA)
    g_train = _example_gradients(users, items, train, train)
    g_infer = _example_gradients(users, items, infer, None)
    pairwise = ETA * g_train @ g_infer.T  # TracIn(z, z') of every pair (Eq. 4, one step)
    same = train.users[:, None] == infer.users[None, :]
    outflow = np.array([pairwise[(train.users == u)][:, infer.users != u].sum() for u in range(NUM_USERS)])
    inflow = np.array([pairwise[train.users != u][:, infer.users == u].sum() for u in range(NUM_USERS)])
    own = np.array([pairwise[train.users == u][:, infer.users == u].sum() for u in range(NUM_USERS)])
    np.testing.assert_allclose(flows.outflow, outflow, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(flows.inflow, inflow, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(flows.self_influence, own, rtol=1e-12, atol=1e-15)
    assert flows.total == pytest.approx(pairwise.sum(), rel=1e-12)
    assert pairwise[~same].sum() == pytest.approx(flows.outflow.sum(), rel=1e-12)
    # The step's gradient is the sum of the examples' gradients: the regularizer split loses nothing.
    np.testing.assert_allclose(np.concatenate([flows.user_gradient.ravel(), flows.item_gradient.ravel()]),
                               g_train.sum(axis=0), rtol=1e-12, atol=1e-14)


def test_flows_pass_through_shared_items_only():
    """Remark A.1: a user's outflow reaches only users who infer on an item it trained on."""
    train, infer, users, items = _toy(3)
    flows = mf_step_flows(users, items, train, infer, regularization=LAMBDA, learning_rate=ETA)
    for u in range(NUM_USERS):
        trained_items = set(train.items[train.users == u])
        others_items = set(infer.items[infer.users != u])
        if not trained_items & others_items:
            assert flows.outflow[u] == 0.0


def test_training_run_sums_its_steps_and_matches_a_plain_fit():
    train, infer, _, _ = _toy(1)
    training = _training(steps=30)
    run = mf_flows(train, infer, num_users=NUM_USERS, num_items=NUM_ITEMS, training=training, seed=7,
                   checkpoint_every=10)
    users, items = mf_fit(train, num_users=NUM_USERS, num_items=NUM_ITEMS, training=training, seed=7)
    np.testing.assert_array_equal(run.user_embeddings, users)
    np.testing.assert_array_equal(run.item_embeddings, items)
    # Step by step from the same start, summed by hand.
    rng = np.random.default_rng(7)
    p, q = rng.normal(0, 0.5, (NUM_USERS, DIM)), rng.normal(0, 0.5, (NUM_ITEMS, DIM))
    total_in, cumulative = np.zeros(NUM_USERS), []
    for t in range(30):
        step = mf_step_flows(p, q, train, infer, regularization=LAMBDA, learning_rate=ETA)
        total_in += step.inflow
        p, q = p - ETA * step.user_gradient, q - ETA * step.item_gradient
        if (t + 1) % 10 == 0:
            cumulative.append(total_in.copy())
    np.testing.assert_allclose(run.inflow, total_in, rtol=1e-12)
    np.testing.assert_allclose(run.cumulative_inflow, np.array(cumulative), rtol=1e-12)
    assert run.checkpoints.tolist() == [10, 20, 30]
    assert run.inflow.sum() == pytest.approx(run.outflow.sum(), rel=1e-10)


def test_first_order_gap_shrinks_with_the_step_size():
    """Remark 2.5: Σ flows predicts the inference-loss reduction up to O(η²)."""
    train, infer, _, _ = _toy(2)
    gaps = []
    for eta in (1e-2, 1e-3, 1e-4):
        run = mf_flows(train, infer, num_users=NUM_USERS, num_items=NUM_ITEMS,
                       training=_training(learning_rate=eta, steps=1), seed=0)
        gaps.append(run.first_order_discrepancy()[0])
    assert gaps[0] > 5 * gaps[1] > 25 * gaps[2]


def test_federated_per_user_with_one_local_step_is_the_centralized_run():
    """Each user a client with a private p_u: one local step per round and summed updates are GD."""
    train, infer, _, _ = _toy(5)
    common = dict(num_users=NUM_USERS, num_items=NUM_ITEMS, training=_training(steps=25), seed=3)
    central = mf_flows(train, infer, **common)
    federated = mf_flows(train, infer, local_steps=1, **common)
    for name in ("inflow", "outflow", "self_influence", "user_embeddings", "item_embeddings", "predicted_reduction"):
        np.testing.assert_allclose(getattr(federated, name), getattr(central, name), rtol=1e-10, atol=1e-15)
    # More local steps: a different trajectory, still every cross flow one's in and another's out.
    local = mf_flows(train, infer, local_steps=4, **common)
    assert not np.allclose(local.inflow, central.inflow)
    assert local.inflow.sum() == pytest.approx(local.outflow.sum(), rel=1e-10)


def test_federated_round_flows_are_the_pairwise_client_sum():
    """F(u→v) = −s_u · g_v with s_u the client's item update and g_v its inference gradient at Q."""
    from fedvalue.flows.mf_flows import _federated_round, _regularizers, _Side

    train, infer, users, items = _toy(6)
    sides = _Side.of(train, NUM_USERS, NUM_ITEMS), _Side.of(infer, NUM_USERS, NUM_ITEMS)
    user_reg, item_reg = _regularizers(train, NUM_USERS, NUM_ITEMS, LAMBDA)
    flows, _ = _federated_round(users, items, *sides, user_reg, item_reg, ETA, 3)
    counts = np.bincount(train.items, minlength=NUM_ITEMS)
    updates, gradients = [], []
    for u in range(NUM_USERS):  # client u alone, by autograd: 3 local GD steps on its share of App. A's loss
        p = torch.tensor(users[u], requires_grad=True)
        q = torch.tensor(items, requires_grad=True)
        mine = train.users == u
        for _ in range(3):
            loss = sum(0.5 * ((p @ q[i] - r) ** 2 + LAMBDA / mine.sum() * p @ p + LAMBDA / counts[i] * q[i] @ q[i])
                       for i, r in zip(train.items[mine], train.ratings[mine]))
            gp, gq = torch.autograd.grad(loss, (p, q))
            p = (p - ETA * gp).detach().requires_grad_(True)
            q = (q - ETA * gq).detach().requires_grad_(True)
        updates.append((q.detach().numpy() - items).ravel())
        g = np.zeros_like(items)
        for j, r in zip(infer.items[infer.users == u], infer.ratings[infer.users == u]):
            g[j] += (users[u] @ items[j] - r) * users[u]
        gradients.append(g.ravel())
    pairwise = -np.array(updates) @ np.array(gradients).T  # F(u→v)
    np.testing.assert_allclose(flows.outflow, pairwise.sum(axis=1) - np.diag(pairwise), rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(flows.inflow, pairwise.sum(axis=0) - np.diag(pairwise), rtol=1e-9, atol=1e-15)


def test_reciprocity_of_a_run_is_computable():
    train, infer, _, _ = _toy(4)
    run = mf_flows(train, infer, num_users=NUM_USERS, num_items=NUM_ITEMS, training=_training(steps=20), seed=1)
    report = reciprocity(run.inflow, run.outflow)
    assert 0.0 <= report.alpha <= 1.0


def test_bad_inputs_name_the_parameter():
    train, infer, users, items = _toy()
    with pytest.raises(ValueError, match="users: expected indices in"):
        Ratings.of([0, 9], [0, 1], [1.0, 2.0], num_users=3, num_items=3)
    repeated = Ratings(np.concatenate([infer.users, train.users[:1]]), np.concatenate([infer.items, train.items[:1]]),
                       np.concatenate([infer.ratings, train.ratings[:1]]))
    with pytest.raises(ValueError, match="at most once"):
        mf_step_flows(users, items, train, repeated)
    with pytest.raises(ValueError, match="learning_rate"):
        MfTraining(learning_rate=0.0)
    with pytest.raises(TypeError, match="training: expected an MfTraining"):
        mf_flows(train, infer, num_users=NUM_USERS, num_items=NUM_ITEMS, training={"steps": 3})
