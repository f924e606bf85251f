"""The seeded random projection: reproducible, the identity in expectation, the JL variance,
and projected flows are exact flows of the projected vectors."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedvalue.flows.round_flows import round_flows, tracin_round_flows
from fedvalue.scoring.projection import RandomProjection

from tests.fedvalue.flows.test_round_flows import as_frame, brute_force_flows, python_dot, random_round



def projection_matrix(projection: RandomProjection) -> np.ndarray:
    """R (k × p) recovered column by column: R e_i is column i."""
    return projection.project_many(np.eye(projection.dim)).T


def test_same_seed_same_projection_and_different_seed_different():
    p, k = 30, 7
    first = projection_matrix(RandomProjection(p, k, seed=5))
    np.testing.assert_array_equal(first, projection_matrix(RandomProjection(p, k, seed=5)))
    np.testing.assert_array_equal(first, projection_matrix(RandomProjection(p, k, seed=np.random.SeedSequence(5))))
    assert not np.allclose(first, projection_matrix(RandomProjection(p, k, seed=6)))
    from_generator = projection_matrix(RandomProjection(p, k, seed=np.random.default_rng(1)))
    np.testing.assert_array_equal(from_generator, projection_matrix(RandomProjection(p, k, seed=np.random.default_rng(1))))
    generator = np.random.default_rng(1)
    one, two = (projection_matrix(RandomProjection(p, k, seed=generator)) for _ in range(2))
    assert not np.allclose(one, two)  # the generator advances: two draws, two matrices
    # Rademacher entries are exactly ±1/√k.
    np.testing.assert_array_equal(np.abs(projection_matrix(RandomProjection(p, k, kind="rademacher", seed=0))),
                                  np.full((k, p), 1 / math.sqrt(k)))


def test_projected_round_flows_are_exact_flows_of_the_projected_vectors():
    # The SAME R must be applied to updates and gradients.
    rng = np.random.default_rng(12)
    updates, gradients = random_round(rng, ["a", "b", "c"], ["a", "c"], p=20)
    for kind in RandomProjection.KINDS:
        projection = RandomProjection(20, 6, kind=kind, seed=3)
        r = projection_matrix(projection)
        flows = round_flows(updates, gradients, weights={"a": 0.4, "c": 0.6}, projection=projection)
        expected = brute_force_flows({c: r @ u for c, u in updates.items()},
                                     {c: r @ g for c, g in gradients.items()}, {"a": 0.4, "c": 0.6})
        np.testing.assert_allclose(as_frame(flows).to_numpy(), expected.to_numpy(), rtol=1e-10, atol=1e-12)
        # tracin_round_flows projects per-individual sums: linear, so equal to projecting rows.
        x, y = rng.normal(size=(4, 20)), rng.normal(size=(3, 20))
        projected = tracin_round_flows(x, y, step_size=0.1, projection=projection)
        exact_of_projected = tracin_round_flows(x @ r.T, y @ r.T, step_size=0.1)
        np.testing.assert_allclose(as_frame(projected).to_numpy(), as_frame(exact_of_projected).to_numpy(),
                                   rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind", RandomProjection.KINDS)
def test_projection_gram_matrix_is_the_identity_in_expectation(kind):
    # E[RᵀR] = I, columns from different chunks included: a chunk that repeated another
    # would give an off-diagonal mean of 1.
    p, k, seeds = 21, 4, 300
    matrices = [projection_matrix(RandomProjection(p, k, kind=kind, seed=s, chunk_size=5)) for s in range(seeds)]
    gram = np.mean([r.T @ r for r in matrices], axis=0)
    standard_error = 1 / math.sqrt(k * seeds)  # of one entry (variance ≤ 2/k per seed on the diagonal)
    off_diagonal = gram[~np.eye(p, dtype=bool)]
    assert np.abs(off_diagonal).max() < 6 * standard_error
    assert np.abs(np.diag(gram) - 1).max() < 6 * math.sqrt(2) * standard_error


@pytest.mark.parametrize("chunk_size", [None, 20])  # 20: two chunks, which must be independent
@pytest.mark.parametrize("kind", RandomProjection.KINDS)
def test_projected_dot_products_are_unbiased_with_jl_variance(kind, chunk_size):
    rng = np.random.default_rng(13)
    p, k, seeds = 40, 4, 1500
    x = rng.normal(size=p)
    y = x + rng.normal(size=p)  # correlated: a clearly non-zero target
    exact = python_dot(x, y)
    estimates = np.empty(seeds)
    for seed in range(seeds):
        rx, ry = RandomProjection(p, k, kind=kind, seed=seed, chunk_size=chunk_size).project_many([x, y])
        estimates[seed] = rx @ ry
    standard_error = estimates.std(ddof=1) / math.sqrt(seeds)
    assert abs(estimates.mean() - exact) < 4 * standard_error
    # The variance of one estimate has a closed form (entries of scale 1/√k; the count sketch's too).
    variance = (x @ x) * (y @ y) + exact**2
    if kind != "gaussian":
        variance -= 2 * np.sum(x**2 * y**2)
    assert estimates.var(ddof=1) == pytest.approx(variance / k, rel=0.25)


def test_a_count_sketch_column_is_one_signed_unit_vector_and_its_sums_do_not_depend_on_the_batch():
    p, k = 57, 6
    projection = RandomProjection(p, k, kind="count-sketch", seed=4, chunk_size=20)
    r = projection_matrix(projection)
    np.testing.assert_array_equal(np.count_nonzero(r, axis=0), np.ones(p))
    np.testing.assert_array_equal(np.abs(r).sum(axis=0), np.ones(p))
    # A vector projected alone or among others gives the same bits (one bincount per vector).
    vectors = np.random.default_rng(17).normal(size=(5, p))
    together = projection.project_many(vectors)
    for i, vector in enumerate(vectors):
        np.testing.assert_array_equal(projection(vector), together[i])
    np.testing.assert_array_equal(projection.project_many(vectors[2:4]), together[2:4])


def test_projected_flow_error_shrinks_like_one_over_sqrt_k():
    rng = np.random.default_rng(14)
    p = 2048
    common = rng.normal(size=p)  # shared direction: flows of order p, not √p
    gradients = {c: common + rng.normal(size=p) for c in "abcde"}
    updates = {c: -0.01 * (common + rng.normal(size=p)) for c in "abd"}
    exact = as_frame(round_flows(updates, gradients)).to_numpy()

    def mean_relative_error(k: int) -> float:
        relative = [
            np.linalg.norm(as_frame(round_flows(updates, gradients, projection=RandomProjection(p, k, seed=s))).to_numpy()
                           - exact) / np.linalg.norm(exact)
            for s in range(12)
        ]
        return float(np.mean(relative))

    errors = [mean_relative_error(k) for k in (16, 64, 256, 1024)]
    assert all(a > 1.2 * b for a, b in zip(errors, errors[1:])), errors
    # 64 times more dimensions: √64 = 8 times less error, up to the noise of 12 seeds
    # (one seed's error is dominated by the distortion of the shared direction: few dof).
    assert 4.0 < errors[0] / errors[-1] < 16.0, errors


def test_projecting_a_step_without_training_rows_gives_zero_flows():
    projection = RandomProjection(6, 3, seed=0)
    assert projection.project_many(np.zeros((0, 6))).shape == (0, 3)
    flows = tracin_round_flows(np.zeros((0, 6)), np.ones((2, 6)), step_size=0.1, projection=projection)
    np.testing.assert_array_equal(as_frame(flows).to_numpy(), np.zeros((2, 3)))


@pytest.mark.parametrize("k", [10, 11, 50])
def test_projection_with_k_at_least_p_is_the_identity(k):
    rng = np.random.default_rng(15)
    updates, gradients = random_round(rng, ["a", "b", "c"], ["b"], p=10)
    projection = RandomProjection(10, k, seed=0)
    assert projection.identity and projection.output_dim == 10
    vector = rng.normal(size=10)
    np.testing.assert_array_equal(projection(vector), vector)
    np.testing.assert_array_equal(as_frame(round_flows(updates, gradients, projection=projection)).to_numpy(),
                                  as_frame(round_flows(updates, gradients)).to_numpy())
    below = RandomProjection(10, 9, seed=0)
    assert not below.identity and below.output_dim == 9


@pytest.mark.parametrize("kind", RandomProjection.KINDS)
def test_chunked_projection_does_not_depend_on_the_cache(kind):
    p, k = 103, 8  # 103 is not a multiple of the chunk: the last chunk is partial
    cached = RandomProjection(p, k, kind=kind, seed=2, chunk_size=10)
    uncached = RandomProjection(p, k, kind=kind, seed=2, chunk_size=10, max_cache_bytes=0)
    vectors = np.random.default_rng(16).normal(size=(4, p))
    first = cached.project_many(vectors)
    np.testing.assert_array_equal(first, uncached.project_many(vectors))
    np.testing.assert_array_equal(first, cached.project_many(vectors))  # served from the cache
    np.testing.assert_array_equal(first, uncached.project_many(list(vectors)))
    np.testing.assert_allclose(first, vectors @ projection_matrix(uncached).T, rtol=1e-12, atol=1e-12)
    # One chunk covering every column is a valid projection too (same statistics, other draw).
    whole = RandomProjection(p, k, kind=kind, seed=2, chunk_size=p)
    assert whole.project_many(vectors).shape == (4, k)


