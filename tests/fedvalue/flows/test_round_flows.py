"""TracIn flows between clients (fedvalue.flows.round_flows; [RECIP], Eqs. 1–6, §4, Remark 2.5).

References used, none of them the O(n·p) code under test:

* **Brute-force pairwise flows.** F(u→v) = −(p_u Δ_u)·g_v with explicit Python loops over
  pairs of clients and over coordinates; inflow_v = Σ_{u≠v} F(u→v), outflow_u =
  Σ_{v≠u} F(u→v), self_u = F(u→u) (fedvalue.flows.round_flows, "Federated form"). On
  small-integer inputs with dyadic weights every float is exact, so the comparison is exact.
* **Centralized per-example TracIn** (Eq. 4): Σ_{z∈Z_u} Σ_{z'∈Z'_v} (η/|B|) ∇ℓ_z·∇ℓ_{z'} by
  loops over example pairs of a numpy logistic regression trained by full-batch gradient
  descent on the mean loss. FedSGD (one local GD step per round, FedAvg with p_u = n_u/N)
  must give the same flows ([RECIP] Eq. 4 with one step per round).
* **The real loss change** (Remark 2.5): the flows' total predicts the change of the summed
  inference loss to first order, so the prediction error shrinks like η².
* **Johnson–Lindenstrauss statistics**: mean and variance of projected dot products over
  many seeds against their closed forms, and error ∝ 1/√k.
* **Def. 2.1** re-implemented here for the reciprocity ratio.
"""

from __future__ import annotations

import contextlib
import math
import re

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fedvalue.flows.flow_totals import FlowTotals
from fedvalue.flows.round_flows import (
    RoundFlows,
    flow_matrix,
    flows_from_arrays,
    round_flows,
    tracin_round_flows,
)
from fedvalue.scoring.projection import RandomProjection, flatten

# --------------------------------------------------------------------------- references


def one_blas_thread():
    """Limit BLAS to one thread where threadpoolctl (a scikit-learn dependency) is present."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - speed only
        return contextlib.nullcontext()
    return threadpool_limits(limits=1, user_api="blas")


@pytest.fixture(autouse=True, scope="module")
def _small_products_on_one_blas_thread():
    # Every product here is small: on a busy 2-core machine threaded BLAS only adds waits.
    with one_blas_thread():
        yield


def python_dot(x, y) -> float:
    """Dot product by a Python loop (independent of numpy's BLAS)."""
    return sum(float(a) * float(b) for a, b in zip(x, y, strict=True))


def reference_flat(vector, keys=None) -> list[float]:
    if isinstance(vector, dict):
        order = sorted(vector) if keys is None else keys
        return [float(x) for k in order for x in np.asarray(vector[k], dtype=float).ravel()]
    return [float(x) for x in np.asarray(vector, dtype=float).ravel()]


def brute_force_matrix(updates, gradients, weights=None, keys=None) -> dict:
    """F[(u, v)] = −(p_u Δ_u)·g_v for every pair; zero rows for clients that did not train."""
    flows = {}
    for u in gradients:
        for v in gradients:
            if u in updates:
                weight = 1.0 if weights is None else float(weights[u])
                step = [weight * x for x in reference_flat(updates[u], keys)]
                flows[u, v] = -python_dot(step, reference_flat(gradients[v], keys))
            else:
                flows[u, v] = 0.0
    return flows


def brute_force_flows(updates, gradients, weights=None, keys=None) -> pd.DataFrame:
    """Inflow, outflow, self per client from the pairwise matrix (Eqs. 1–2)."""
    matrix = brute_force_matrix(updates, gradients, weights, keys)
    clients = list(gradients)
    return pd.DataFrame({
        "inflow": [sum(matrix[u, v] for u in clients if u != v) for v in clients],
        "outflow": [sum(matrix[u, v] for v in clients if v != u) for u in clients],
        "self": [matrix[u, u] for u in clients],
    }, index=pd.Index(clients, name="client"))


def as_frame(flows: RoundFlows) -> pd.DataFrame:
    return flows.to_frame()[["inflow", "outflow", "self"]]


def reference_ratio(inflow: float, outflow: float) -> float:
    """Def. 2.1: min(I/O, O/I), 0 when the signs differ (a zero has no sign)."""
    if inflow * outflow <= 0:
        return 0.0
    return min(inflow / outflow, outflow / inflow)


def random_round(rng: np.random.Generator, clients, trained, p: int):
    gradients = {c: rng.normal(size=p) for c in clients}
    updates = {c: rng.normal(size=p) for c in trained}
    return updates, gradients


# --- a tiny logistic regression (numpy): the model of the TracIn references ------------


def sigmoid(t: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-t))


def example_gradients(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Row i: ∇_w of the log-loss of example i, (σ(x_i·w) − y_i) x_i."""
    return (sigmoid(x @ w) - y)[:, None] * x


def summed_loss(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> float:
    t = x @ w
    return float(np.sum(np.logaddexp(0.0, t) - y * t))


def make_clients(rng: np.random.Generator, train_sizes: dict, inference_sizes: dict, d: int = 3):
    """Clients sharing one distribution: labels from a fixed logistic model plus noise."""
    w_true = np.array([2.0, -1.5, 1.0][:d])

    def draw(n: int):
        x = rng.normal(size=(n, d))
        y = (rng.uniform(size=n) < sigmoid(x @ w_true)).astype(float)
        return x, y

    train = {c: draw(n) for c, n in train_sizes.items()}
    inference = {c: draw(n) for c, n in inference_sizes.items()}
    return train, inference


# --------------------------------------------------------------------------- 1. brute force


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 6),
    p=st.integers(1, 7),
    data=st.data(),
)
def test_round_flows_equal_brute_force_exactly_on_integer_vectors(n, p, data):
    # Small integers and dyadic weights: every product and sum is exact in float64, so the
    # O(n·p) rewrite (−s·G − self) must match the pairwise loops bit for bit.
    clients = [f"c{i}" for i in range(n)]
    trained = data.draw(st.lists(st.sampled_from(clients), unique=True), label="trained")
    vector = hnp.arrays(np.float64, p, elements=st.integers(-20, 20).map(float))
    gradients = {c: data.draw(vector, label=f"g[{c}]") for c in clients}
    updates = {c: data.draw(vector, label=f"s[{c}]") for c in trained}
    weights = {c: data.draw(st.sampled_from([0.0, 0.25, 0.5, 1.0, 3.0]), label=f"w[{c}]") for c in trained}

    for w in (None, weights):
        flows = round_flows(updates, gradients, weights=w)
        expected = brute_force_flows(updates, gradients, w)
        assert flows.clients == tuple(clients)
        np.testing.assert_array_equal(as_frame(flows).to_numpy(), expected.to_numpy())
        np.testing.assert_array_equal(flows.trained, [c in updates for c in clients])
        matrix = flow_matrix(updates, gradients, weights=w)
        reference = brute_force_matrix(updates, gradients, w)
        assert list(matrix.index) == clients and list(matrix.columns) == clients
        np.testing.assert_array_equal(matrix.to_numpy(), [[reference[u, v] for v in clients] for u in clients])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_round_flows_equal_brute_force_on_random_floats_with_and_without_weights(seed):
    rng = np.random.default_rng(seed)
    clients = ["a", "b", "c", "d", "e"]
    updates, gradients = random_round(rng, clients, ["b", "d", "e"], p=9)
    weights = {"b": 0.2, "d": 0.5, "e": 0.3}
    for w in (None, weights):
        flows = round_flows(updates, gradients, weights=w)
        expected = brute_force_flows(updates, gradients, w)
        np.testing.assert_allclose(as_frame(flows).to_numpy(), expected.to_numpy(), rtol=1e-12, atol=1e-12)
    # Weights are applied as given: weighting equals pre-multiplying the updates.
    premultiplied = round_flows({c: weights[c] * u for c, u in updates.items()}, gradients)
    np.testing.assert_allclose(as_frame(round_flows(updates, gradients, weights=weights)).to_numpy(),
                               as_frame(premultiplied).to_numpy(), rtol=1e-12, atol=1e-14)


def test_clients_that_did_not_train_get_inflow_and_no_outflow_or_self():
    rng = np.random.default_rng(5)
    updates, gradients = random_round(rng, ["a", "b", "c", "d"], ["a", "c"], p=6)
    flows = round_flows(updates, gradients)
    frame = flows.to_frame()
    expected = brute_force_flows(updates, gradients)
    for idle in ("b", "d"):
        assert frame.loc[idle, "outflow"] == 0.0 and frame.loc[idle, "self"] == 0.0
        assert not frame.loc[idle, "trained"]
        # Its inflow is everything the trained clients sent it.
        assert frame.loc[idle, "inflow"] == pytest.approx(expected.loc[idle, "inflow"], rel=1e-12)
        assert frame.loc[idle, "inflow"] != 0.0
    assert frame["trained"].tolist() == [True, False, True, False]


def test_dict_of_arrays_vectors_follow_keys_order():
    rng = np.random.default_rng(7)
    shapes = {"w": (2, 3), "b": (3,)}
    model_order = ["w", "b"]  # not sorted: the model's own order

    def as_dict(flat):
        return {"w": flat[:6].reshape(2, 3), "b": flat[6:]}

    flat_gradients = {c: rng.normal(size=9) for c in "xyz"}
    flat_updates = {c: rng.normal(size=9) for c in "xy"}
    dict_updates = {c: as_dict(v) for c, v in flat_updates.items()}
    assert {k: v.shape for k, v in dict_updates["x"].items()} == shapes

    # Updates as dicts, gradients as flat vectors in the model's order: keys must be honoured.
    flows = round_flows(dict_updates, flat_gradients, keys=model_order)
    expected = brute_force_flows(flat_updates, flat_gradients)
    np.testing.assert_allclose(as_frame(flows).to_numpy(), expected.to_numpy(), rtol=1e-12, atol=1e-12)
    matrix = flow_matrix(dict_updates, flat_gradients, keys=model_order)
    reference = brute_force_matrix(flat_updates, flat_gradients)
    np.testing.assert_allclose(matrix.to_numpy(), [[reference[u, v] for v in "xyz"] for u in "xyz"], rtol=1e-12)
    # The default (sorted keys: b before w) flattens differently, so the flows differ.
    default = round_flows(dict_updates, flat_gradients)
    assert not np.allclose(as_frame(default).to_numpy(), expected.to_numpy())
    # Both sides as dicts: same numbers as the flat vectors.
    both_dicts = round_flows(dict_updates, {c: as_dict(v) for c, v in flat_gradients.items()})
    np.testing.assert_allclose(as_frame(both_dicts).to_numpy(), expected.to_numpy(), rtol=1e-12, atol=1e-12)

    np.testing.assert_array_equal(flatten(dict_updates["x"], keys=model_order), flat_updates["x"])
    np.testing.assert_array_equal(flatten(dict_updates["x"]), np.concatenate([flat_updates["x"][6:], flat_updates["x"][:6]]))


def test_updates_and_gradients_with_different_dict_keys_are_rejected():
    # updates flatten as [a, w] = [5, 1], gradients as [w, z] = [1, 0]: 'a' is paired with 'w'.
    updates = {"u": {"a": [5.0], "w": [1.0]}}
    gradients = {"u": {"w": [1.0], "z": [0.0]}, "v": {"w": [1.0], "z": [0.0]}}
    with pytest.raises(ValueError, match="keys"):  # once accepted, pairing 'a' with 'w': self of u = −5
        round_flows(updates, gradients)


def test_flows_from_arrays_equal_brute_force_with_unordered_trained_rows():
    rng = np.random.default_rng(11)
    g = rng.normal(size=(5, 4))
    s = rng.normal(size=(3, 4))
    trained = [4, 0, 2]  # row i of s belongs to unit trained[i]
    inflow, outflow, self_influence = flows_from_arrays(s, g, trained)
    expected = brute_force_flows(dict(zip(trained, s)), dict(enumerate(g)))
    np.testing.assert_allclose(inflow, expected["inflow"], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(outflow, expected["outflow"], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(self_influence, expected["self"], rtol=1e-12, atol=1e-12)
    assert outflow[1] == outflow[3] == self_influence[1] == self_influence[3] == 0.0


def test_no_update_at_all_gives_zero_flows():
    flows = round_flows({}, {"a": [1.0, 2.0], "b": [3.0, -1.0]})
    np.testing.assert_array_equal(as_frame(flows).to_numpy(), np.zeros((2, 3)))
    assert flows.total == 0.0 and not flows.trained.any()


# --------------------------------------------------------------------------- 2. consistency


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 7), p=st.integers(1, 12), data=st.data())
def test_flow_identities_hold_per_round(seed, n, p, data):
    rng = np.random.default_rng(seed)
    clients = list(range(n))
    trained = data.draw(st.lists(st.sampled_from(clients), unique=True), label="trained")
    updates, gradients = random_round(rng, clients, trained, p)
    weights = {c: float(rng.uniform(0.1, 2.0)) for c in trained}
    flows = round_flows(updates, gradients, weights=weights)

    # D and G summed coordinate by coordinate with Python loops.
    big_d = [sum(weights[u] * float(updates[u][j]) for u in trained) for j in range(p)]
    big_g = [sum(float(gradients[v][j]) for v in clients) for j in range(p)]
    scale = 1.0 + sum(weights[u] * np.abs(updates[u]).sum() for u in trained) * max(np.abs(g).sum() for g in gradients.values())

    assert flows.inflow.sum() == pytest.approx(flows.outflow.sum(), abs=1e-12 * scale * n)
    assert abs(flows.balance_gap) <= 1e-12 * scale * n
    everything = flows.inflow.sum() + flows.self_influence.sum()
    assert everything == pytest.approx(-python_dot(big_d, big_g), abs=1e-12 * scale * n)
    assert flows.total == pytest.approx(-python_dot(big_d, big_g), abs=1e-12 * scale * n)
    # −(inflow_v + self_v) = D·g_v: v's first-order loss change (Remark 2.5).
    change = flows.predicted_loss_change()
    assert list(change.index) == clients
    np.testing.assert_allclose(change.to_numpy(), [python_dot(big_d, gradients[v]) for v in clients],
                               rtol=0, atol=1e-12 * scale)


def test_flow_identities_hold_in_a_book_over_rounds_with_changing_clients():
    rng = np.random.default_rng(21)
    book = FlowTotals()
    totals = []
    for clients, trained in [("abc", "ab"), ("bcd", "bcd"), ("ad", "d"), ("abcde", "ace")]:
        updates, gradients = random_round(rng, list(clients), list(trained), p=5)
        totals.append(book.add_round(updates, gradients).total)
    frame = book.totals()
    assert frame["inflow"].sum() == pytest.approx(frame["outflow"].sum(), abs=1e-12)
    assert abs(book.balance_gap) < 1e-12
    assert book.total == pytest.approx(sum(totals), abs=1e-12)
    assert book.total == pytest.approx(frame["inflow"].sum() + frame["self"].sum(), abs=1e-12)


# --------------------------------------------------------------------------- 3. FedSGD = TracIn


TRAIN_SIZES = {"a": 3, "b": 5, "c": 2, "d": 6}
INFERENCE_SIZES = {"a": 2, "b": 3, "c": 4, "d": 1, "observer": 3}  # observer never trains


def centralized_tracin(train, inference, *, rounds: int, eta: float, w0: np.ndarray):
    """Per-example TracIn (Eq. 4) by loops over example pairs, and the GD trajectory."""
    owners = list(INFERENCE_SIZES)
    pairwise = {(u, v): 0.0 for u in owners for v in owners}
    x_all = np.concatenate([train[c][0] for c in train])
    y_all = np.concatenate([train[c][1] for c in train])
    batch = len(x_all)
    w = w0.copy()
    trajectory = [w.copy()]
    for _ in range(rounds):
        for u, (xu, yu) in train.items():
            for xz, yz in zip(xu, yu):
                grad_z = example_gradients(w, xz[None, :], np.array([yz]))[0]
                for v, (xv, yv) in inference.items():
                    for xq, yq in zip(xv, yv):
                        grad_q = example_gradients(w, xq[None, :], np.array([yq]))[0]
                        pairwise[u, v] += eta / batch * python_dot(grad_z, grad_q)
        w = w - eta * example_gradients(w, x_all, y_all).mean(axis=0)  # GD on the mean loss
        trajectory.append(w.copy())
    frame = pd.DataFrame({
        "inflow": [sum(pairwise[u, v] for u in owners if u != v) for v in owners],
        "outflow": [sum(pairwise[u, v] for v in owners if v != u) for u in owners],
        "self": [pairwise[u, u] for u in owners],
    }, index=pd.Index(owners, name="client"))
    return frame, trajectory


def test_fedsgd_flows_equal_centralized_per_example_tracin():
    rng = np.random.default_rng(3)
    train, inference = make_clients(rng, TRAIN_SIZES, INFERENCE_SIZES)
    eta, rounds = 0.7, 4
    w0 = np.array([0.3, -0.2, 0.1])
    reference, trajectory = centralized_tracin(train, inference, rounds=rounds, eta=eta, w0=w0)

    total_train = sum(len(y) for _, y in train.values())
    federated = FlowTotals()
    centralized = FlowTotals()
    global_model = w0.copy()
    for t in range(rounds):
        # FedSGD: one full-batch GD step locally, FedAvg with p_u = n_u / N.
        local = {u: global_model - eta * example_gradients(global_model, x, y).mean(axis=0) for u, (x, y) in train.items()}
        updates = {u: local[u] - global_model for u in train}
        weights = {u: len(train[u][1]) / total_train for u in train}
        gradients = {v: example_gradients(global_model, x, y).sum(axis=0) for v, (x, y) in inference.items()}
        federated.add_round(updates, gradients, weights=weights)

        train_rows = np.concatenate([example_gradients(global_model, x, y) for x, y in train.values()])
        train_owners = [u for u, (_, y) in train.items() for _ in y]
        inference_rows = np.concatenate([example_gradients(global_model, x, y) for x, y in inference.values()])
        inference_owners = [v for v, (_, y) in inference.items() for _ in y]
        centralized.add_tracin_step(train_rows, inference_rows, step_size=eta / total_train,
                                    train_owners=train_owners, inference_owners=inference_owners)

        global_model = sum(weights[u] * local[u] for u in train)
        np.testing.assert_allclose(global_model, trajectory[t + 1], rtol=0, atol=1e-13)

    for book in (federated, centralized):
        got = book.totals().loc[reference.index, ["inflow", "outflow", "self"]]
        np.testing.assert_allclose(got.to_numpy(), reference.to_numpy(), rtol=0, atol=1e-10)
        assert book.totals().loc["observer", "outflow"] == 0.0
        assert book.totals().loc["observer", "rounds_trained"] == 0
    assert abs(reference.to_numpy()).max() > 0.1  # the comparison is not between zeros


def test_tracin_round_flows_default_owners_are_per_example_tracin():
    rng = np.random.default_rng(4)
    train_rows, inference_rows, eta = rng.normal(size=(3, 4)), rng.normal(size=(2, 4)), 0.05
    flows = tracin_round_flows(train_rows, inference_rows, step_size=eta)
    # Individuals 0..2 own one training example each, 3..4 one inference example each.
    assert flows.clients == (0, 1, 2, 3, 4)
    assert flows.trained.tolist() == [True, True, True, False, False]
    for z in range(3):
        outflow = sum(eta * python_dot(train_rows[z], q) for q in inference_rows)
        assert flows.outflow[z] == pytest.approx(outflow, rel=1e-12)
        assert flows.inflow[z] == 0.0 and flows.self_influence[z] == 0.0
    for q in range(2):
        inflow = sum(eta * python_dot(z, inference_rows[q]) for z in train_rows)
        assert flows.inflow[3 + q] == pytest.approx(inflow, rel=1e-12)


def test_tracin_individual_owning_several_training_and_inference_rows():
    rng = np.random.default_rng(6)
    train_rows, inference_rows, eta = rng.normal(size=(5, 3)), rng.normal(size=(4, 3)), 0.1
    train_owners = ["u", "v", "u", "w", "v"]
    inference_owners = ["v", "x", "u", "v"]
    flows = tracin_round_flows(train_rows, inference_rows, step_size=eta,
                               train_owners=train_owners, inference_owners=inference_owners)
    assert flows.clients == ("u", "v", "w", "x")  # first appearance, training owners first
    pairwise = {(a, b): 0.0 for a in flows.clients for b in flows.clients}
    for z, a in zip(train_rows, train_owners):
        for q, b in zip(inference_rows, inference_owners):
            pairwise[a, b] += eta * python_dot(z, q)
    for i, c in enumerate(flows.clients):
        assert flows.inflow[i] == pytest.approx(sum(pairwise[a, c] for a in flows.clients if a != c), rel=1e-12)
        assert flows.outflow[i] == pytest.approx(sum(pairwise[c, b] for b in flows.clients if b != c), rel=1e-12)
        assert flows.self_influence[i] == pytest.approx(pairwise[c, c], rel=1e-12)


def test_predicted_loss_change_is_first_order_in_the_step_size():
    # Remark 2.5: D·g_v is the first-order change of v's summed inference loss, so its error
    # against the real change is O(η²): halving η divides it by about 4. Catches a wrong
    # sign or scale of the flows against the model itself, not against our own formula.
    rng = np.random.default_rng(8)
    train, inference = make_clients(rng, {"a": 20, "b": 30, "c": 10}, {"a": 15, "b": 10, "c": 20})
    w = np.array([0.5, 0.5, -0.5])
    total_train = sum(len(y) for _, y in train.values())
    errors = []
    for eta in (0.02, 0.01):
        updates = {u: -eta * example_gradients(w, x, y).mean(axis=0) for u, (x, y) in train.items()}
        weights = {u: len(y) / total_train for u, (_, y) in train.items()}
        gradients = {v: example_gradients(w, x, y).sum(axis=0) for v, (x, y) in inference.items()}
        flows = round_flows(updates, gradients, weights=weights)
        w_next = w + sum(weights[u] * updates[u] for u in train)
        real = np.array([summed_loss(w_next, x, y) - summed_loss(w, x, y) for x, y in inference.values()])
        predicted = flows.predicted_loss_change().to_numpy()
        assert np.all(np.sign(predicted) == np.sign(real))
        assert flows.total == pytest.approx(-real.sum(), rel=0.05)
        errors.append(np.abs(predicted - real).max())
    assert 3.0 < errors[0] / errors[1] < 5.0


# --------------------------------------------------------------------------- 4. free rider


def test_free_rider_has_zero_outflow_and_self_and_positive_inflow():
    # A convex model, all clients from one distribution, starting far from the optimum:
    # the others' step lowers the free rider's inference loss, so its inflow is > 0.
    rng = np.random.default_rng(9)
    train, inference = make_clients(rng, {"a": 40, "b": 40, "rider": 40}, {"a": 20, "b": 20, "rider": 30})
    sizes = {u: len(y) for u, (_, y) in train.items()}
    weights = {u: n / sum(sizes.values()) for u, n in sizes.items()}
    eta, global_model = 0.5, np.zeros(3)
    book = FlowTotals()
    for _ in range(3):
        updates = {u: -eta * example_gradients(global_model, x, y).mean(axis=0) for u, (x, y) in train.items()}
        updates["rider"] = np.zeros(3)  # returns the global model unchanged
        gradients = {v: example_gradients(global_model, x, y).sum(axis=0) for v, (x, y) in inference.items()}
        flows = book.add_round(updates, gradients, weights=weights)
        frame = flows.to_frame()
        assert frame.loc["rider", "outflow"] == 0.0
        assert frame.loc["rider", "self"] == 0.0
        assert frame.loc["rider", "trained"]  # it did reply: a weighted, empty step
        assert frame.loc["rider", "inflow"] > 0.0
        new_model = global_model + sum(weights[u] * updates[u] for u in updates)
        x, y = inference["rider"]
        assert summed_loss(new_model, x, y) < summed_loss(global_model, x, y)  # the construction holds
        global_model = new_model
    summary = book.summary()
    assert summary.loc["rider", "outflow"] == 0.0 and summary.loc["rider", "inflow"] > 0.0
    assert summary.loc["rider", "ratio"] == 0.0  # takes, never gives: 0-reciprocal
    assert summary.loc["rider", "rounds_trained"] == 3


# --------------------------------------------------------------------------- 7. bad input


G2 = {"a": [1.0, 2.0], "b": [0.5, -1.0]}
U1 = {"a": [0.1, 0.2]}
X = np.ones((3, 2))
Y = np.ones((2, 2))

BAD_INPUTS = [
    # round_flows / flow_matrix
    (lambda: round_flows(U1, {"a": [1.0, np.nan], "b": [0, 0]}), ValueError, r"^gradients\['a'\]: expected finite"),
    (lambda: round_flows({"a": [np.inf, 0]}, G2), ValueError, r"^updates\['a'\]: expected finite"),
    (lambda: round_flows(U1, {"a": [1.0, 2.0], "b": [1.0]}), ValueError, r"^gradients\['b'\]: expected a vector of length 2"),
    (lambda: round_flows({"a": [0.1, 0.2, 0.3]}, G2), ValueError, r"^updates\['a'\]: expected a vector of length 2"),
    (lambda: round_flows({"z": [0.1, 0.2]}, G2), ValueError, r"^updates: unknown client"),
    (lambda: round_flows([0.1, 0.2], G2), TypeError, r"^updates"),
    (lambda: round_flows(U1, {}), ValueError, r"^gradients"),
    (lambda: round_flows(U1, G2, weights={}), ValueError, r"^weights: .*missing \['a'\]"),
    (lambda: round_flows(U1, G2, weights={"a": 1.0, "b": 1.0}), ValueError, r"^weights: .*unknown client\(s\) \['b'\]"),
    (lambda: round_flows(U1, G2, weights={"a": np.nan}), ValueError, r"^weights\['a'\]"),
    (lambda: round_flows(U1, G2, weights={"a": True}), ValueError, r"^weights\['a'\]"),
    (lambda: round_flows(U1, G2, weights=[1.0]), TypeError, r"^weights"),
    (lambda: round_flows({}, {"a": {"w": [1.0], "b": [1.0]}, "b": {"w": [1.0], "c": [1.0]}}), ValueError,
     r"^gradients\['b'\]: expected arrays under exactly the keys"),
    (lambda: round_flows({"a": {"w": [1.0]}}, G2, keys=["w", "b"]), ValueError,
     r"^updates\['a'\]: expected arrays under exactly the keys"),
    (lambda: round_flows(U1, G2, projection=RandomProjection(3, 2, seed=0)), ValueError, r"^projection"),
    (lambda: round_flows(U1, G2, projection="gaussian"), TypeError, r"^projection"),
    (lambda: flow_matrix(U1, {i: [0.0] for i in range(2001)}), ValueError, r"^gradients: flow_matrix is for at most"),
    (lambda: flow_matrix({"z": [0.1, 0.2]}, G2), ValueError, r"^updates: unknown client"),
    (lambda: flatten({"a": ["x"]}), ValueError, r"^vector: expected numeric"),
    # flows_from_arrays
    (lambda: flows_from_arrays(np.ones((2, 2)), np.ones((3, 2)), [0]), ValueError, r"^trained"),
    (lambda: flows_from_arrays(np.ones((2, 2)), np.ones((3, 2)), [0, 3]), ValueError, r"^trained: expected indices in \[0, 3\)"),
    (lambda: flows_from_arrays(np.ones((2, 2)), np.ones((3, 2)), [-1, 0]), ValueError, r"^trained: expected indices"),
    (lambda: flows_from_arrays(np.ones((2, 2)), np.ones((3, 2)), [1, 1]), ValueError, r"^trained: expected distinct"),
    (lambda: flows_from_arrays(np.ones((2, 2)), np.ones((3, 2)), [0.0, 1.0]), ValueError, r"^trained"),
    (lambda: flows_from_arrays(np.ones((2, 2)), np.ones((3, 2)), [True, False]), ValueError, r"^trained"),
    (lambda: flows_from_arrays(np.ones((2, 2)), np.ones((3, 2)), [[0, 1]]), ValueError, r"^trained"),
    (lambda: flows_from_arrays(np.ones((2, 3)), np.ones((3, 2)), [0, 1]), ValueError, r"^updates: expected 2 columns"),
    (lambda: flows_from_arrays(np.ones(2), np.ones((3, 2)), [0]), ValueError, r"^updates: expected a 2-D"),
    (lambda: flows_from_arrays(np.ones((1, 2)), [[1.0, np.nan]], [0]), ValueError, r"^gradients: expected finite"),
    # tracin_round_flows
    *[(lambda bad=bad: tracin_round_flows(X, Y, step_size=bad), ValueError, r"^step_size")
      for bad in (0.0, -0.1, math.nan, math.inf, True, "0.1", None)],
    (lambda: tracin_round_flows(X, np.ones((2, 3)), step_size=0.1), ValueError, r"^inference_gradients: expected 2 columns"),
    (lambda: tracin_round_flows(np.ones(3), Y, step_size=0.1), ValueError, r"^train_gradients: expected a 2-D"),
    (lambda: tracin_round_flows(X, [[1.0, np.inf], [0, 0]], step_size=0.1), ValueError, r"^inference_gradients: expected finite"),
    (lambda: tracin_round_flows(X, Y, step_size=0.1, train_owners=["a", "b"]), ValueError, r"^train_owners: expected 3"),
    (lambda: tracin_round_flows(X, Y, step_size=0.1, inference_owners=["a"]), ValueError, r"^inference_owners: expected 2"),
    (lambda: tracin_round_flows(X, Y, step_size=0.1, projection=RandomProjection(5, 2, seed=0)), ValueError,
     r"^train_gradients: expected vectors of length 5"),
    # RandomProjection
    (lambda: RandomProjection(0, 2), ValueError, r"^dim"),
    (lambda: RandomProjection(4.0, 2), ValueError, r"^dim"),
    (lambda: RandomProjection(4, 0), ValueError, r"^k"),
    (lambda: RandomProjection(4, -3), ValueError, r"^k"),
    (lambda: RandomProjection(4, 2.5), ValueError, r"^k"),
    (lambda: RandomProjection(4, True), ValueError, r"^k"),
    (lambda: RandomProjection(4, 2, kind="uniform"), ValueError, r"^kind"),
    (lambda: RandomProjection(4, 2, seed=-1), ValueError, r"^seed"),
    (lambda: RandomProjection(4, 2, seed=1.5), ValueError, r"^seed"),
    (lambda: RandomProjection(4, 2, seed="7"), ValueError, r"^seed"),
    (lambda: RandomProjection(4, 2, seed=True), ValueError, r"^seed"),
    (lambda: RandomProjection(4, 2, chunk_size=0), ValueError, r"^chunk_size"),
    (lambda: RandomProjection(4, 2, seed=0).project_many([np.ones(3)]), ValueError, r"^vectors: expected length 4"),
]


PARAMETER = re.compile(r"\^(\w+)")  # the parameter a message starts with, for test ids


@pytest.mark.parametrize(("call", "error", "message"), BAD_INPUTS,
                         ids=[f"{i}-{PARAMETER.match(m).group(1)}" for i, (_, _, m) in enumerate(BAD_INPUTS)])
def test_bad_input_names_the_parameter(call, error, message):
    with pytest.raises(error, match=message):
        call()
