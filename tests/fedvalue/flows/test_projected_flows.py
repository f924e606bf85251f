"""Flows of a round from projected vectors (fedvalue.flows.projected_flows): the projection a run
notes, the vectors a record keeps, and flows that are exact flows of those vectors (the identity
for k ≥ p, bit for bit)."""

from __future__ import annotations

import numpy as np
import pytest

from fedvalue.flows.projected_flows import FlowsProjection, project_round, projected_round_flows
from fedvalue.flows.round_flows import fedavg_round_flows
from fedvalue.scoring.projection import RandomProjection

from tests.fedvalue.flows.test_round_flows import as_frame, brute_force_flows


def model_round(rng: np.random.Generator, clients, trained):
    """A two-array model's A_{t−1}, the trained clients' float32 arrays and every client's float32 gradient."""
    start = {"w": rng.normal(size=(5, 3)).astype(np.float32), "b": rng.normal(size=3).astype(np.float32)}
    replies = {c: {k: (v + 0.1 * rng.normal(size=v.shape)).astype(np.float32) for k, v in start.items()}
               for c in trained}
    gradients = {c: {k: rng.normal(size=v.shape).astype(np.float32) for k, v in start.items()} for c in clients}
    return start, replies, gradients


def flat(arrays, keys) -> np.ndarray:
    return np.concatenate([np.asarray(arrays[k], dtype=np.float64).ravel() for k in keys])


def test_the_run_projection_is_derived_from_the_run_seed_and_drawn_afresh_each_round():
    first = FlowsProjection.of_run(8, 3)
    assert first == FlowsProjection.of_run(8, 3) and first.seed != FlowsProjection.of_run(8, 4).seed
    assert first.kind == "count-sketch" and first.chunk_size == RandomProjection.default_chunk_size(8, "count-sketch")
    assert FlowsProjection.from_json(first.as_json()) == first
    vector = np.random.default_rng(0).normal(size=50)
    np.testing.assert_array_equal(first.for_round(50, 2)(vector), first.for_round(50, 2)(vector))
    assert not np.array_equal(first.for_round(50, 2)(vector), first.for_round(50, 3)(vector))


@pytest.mark.parametrize(("written", "named"), [
    ({"dim": 0, "seed": 1, "kind": "count-sketch", "chunk_size": 4}, r"^flows_projection\.dim: expected a positive"),
    ({"dim": 4, "seed": 1, "kind": "count-sketch"}, r"^flows_projection: expected an object with the keys"),
    ({"dim": True, "seed": 1, "kind": "count-sketch", "chunk_size": 4}, r"^flows_projection\.dim: expected an integer"),
    ({"dim": 4, "seed": 1.5, "kind": "count-sketch", "chunk_size": 4}, r"^flows_projection\.seed: expected an integer"),
    ({"dim": 4, "seed": 1, "kind": "sparse", "chunk_size": 4}, r"^flows_projection\.kind: expected one of"),
    ([4, 1], r"^flows_projection: expected an object"),
])
def test_a_noted_projection_is_read_as_untrusted_input(written, named):
    with pytest.raises(ValueError, match=named):
        FlowsProjection.from_json(written)


@pytest.mark.parametrize("dim", [0, -2, 2.5, True])
def test_a_projection_dimension_that_is_not_a_positive_integer_is_refused(dim):
    with pytest.raises(ValueError, match=r"^dim: expected a positive integer"):
        FlowsProjection(dim=dim, seed=0)


@pytest.mark.parametrize("kind", RandomProjection.KINDS)
def test_the_recorded_vectors_are_r_applied_to_the_gradients_and_updates(kind):
    rng = np.random.default_rng(21)
    start, replies, gradients = model_round(rng, ["a", "b", "c", "d"], ["b", "d"])
    keys = list(start)
    projection = FlowsProjection(dim=6, seed=5, kind=kind, chunk_size=7).for_round(18, 4)
    r = projection.project_many(np.eye(18)).T  # R column by column
    projected_g, projected_u = project_round(projection, start, gradients, replies)
    assert list(projected_g) == ["a", "b", "c", "d"] and list(projected_u) == ["b", "d"]
    assert all(v.dtype == np.float32 and v.shape == (6,) for v in projected_g.values())
    assert all(v.dtype == np.float64 and v.shape == (6,) for v in projected_u.values())
    for c, g in gradients.items():
        np.testing.assert_allclose(projected_g[c], r @ flat(g, keys), rtol=1e-6, atol=1e-6)
    for c, w in replies.items():
        np.testing.assert_allclose(projected_u[c], r @ (flat(w, keys) - flat(start, keys)), rtol=1e-12, atol=1e-12)


def test_projected_flows_are_the_flows_of_the_projected_vectors_by_hand():
    rng = np.random.default_rng(22)
    start, replies, gradients = model_round(rng, ["a", "b", "c", "d", "e"], ["a", "c", "e"])
    projection = FlowsProjection.of_run(5, 9).for_round(18, 1)
    projected_g, projected_u = project_round(projection, start, gradients, replies)
    weights = {"a": 10.0, "c": 30.0, "e": 60.0}
    flows, missing = projected_round_flows(projected_u, projected_g, weights)
    assert missing == frozenset()
    by_hand = brute_force_flows(projected_u, projected_g, {c: w / 100.0 for c, w in weights.items()})
    np.testing.assert_allclose(as_frame(flows).to_numpy(), by_hand.to_numpy(), rtol=1e-12, atol=1e-12)
    # A trained client without a gradient keeps its outflow and is named (its inflow is unknown).
    without_c = {k: v for k, v in projected_g.items() if k != "c"}
    flows, missing = projected_round_flows(projected_u, without_c, weights)
    assert missing == frozenset({"c"}) and flows.clients[-1] == "c"


def test_with_k_at_least_p_the_projected_flows_are_the_unprojected_ones_bit_for_bit():
    rng = np.random.default_rng(23)
    start, replies, gradients = model_round(rng, ["a", "b", "c", "d"], ["d", "b"])
    weights = {"b": 12.0, "d": 7.0}
    exact, _ = fedavg_round_flows(start, replies, weights, gradients)
    for dim in (18, 19, 1000):
        projection = FlowsProjection.of_run(dim, 1).for_round(18, 2)
        assert projection.identity
        projected_g, projected_u = project_round(projection, start, gradients, replies)
        flows, _ = projected_round_flows(projected_u, projected_g, weights)
        assert flows.clients == exact.clients
        for name in ("inflow", "outflow", "self_influence"):
            np.testing.assert_array_equal(getattr(flows, name), getattr(exact, name))
        assert flows.total == exact.total


def test_a_vector_of_another_model_is_refused_naming_it():
    rng = np.random.default_rng(24)
    start, replies, gradients = model_round(rng, ["a", "b"], ["a"])
    projection = FlowsProjection.of_run(4, 0).for_round(18, 1)
    gradients["b"] = {"w": gradients["b"]["w"]}
    with pytest.raises(ValueError, match=r"^gradients\['b'\]: expected arrays under exactly the keys"):
        project_round(projection, start, gradients, replies)
    with pytest.raises(ValueError, match=r"^projection: expected a projection of dim 18"):
        project_round(FlowsProjection.of_run(4, 0).for_round(17, 1), start, {}, replies)
