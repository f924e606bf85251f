"""Exact KNN-ADS against references: brute force over σ-respecting permutations of the KNN
utility, Theorem 5.1 of [ADS] as printed, brute-force KNN-Shapley, group efficiency,
duplicates, totals per source and contributor, and input errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedvalue.valuation.knn.exact import knn_ads, knn_shapley
from fedvalue.valuation.knn.utility import KnnUtility, neighbour_orders

from tests.fedvalue.reference_games import ordered_permutation_values, shapley_subset_formula


def small_problem(seed: int, n: int, num_groups: int, *, levels: int = 3, n_test: int = 3):
    """Integer features on a small grid, so distance ties and duplicate rows are common."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, levels, size=(n, 2)).astype(float)
    y = rng.integers(0, 2, size=n)
    x_test = rng.integers(0, levels, size=(n_test, 2)).astype(float)
    y_test = rng.integers(0, 2, size=n_test)
    order = rng.permutation(n)
    cuts = np.sort(rng.choice(np.arange(1, n), num_groups - 1, replace=False)) if num_groups > 1 else []
    groups = [part.tolist() for part in np.split(order, cuts)]
    return x, y, x_test, y_test, groups


def assert_matches_brute_force(x, y, x_test, y_test, groups, k) -> None:
    expected = ordered_permutation_values(KnnUtility(x, y, x_test, y_test, k), groups)
    result = knn_ads(x, y, x_test, y_test, groups, k=k, chunk_size=2).instances
    players = [p for g in groups for p in g]
    assert list(result.values.index) == players
    np.testing.assert_allclose(result.values.loc[players].to_numpy(float), [expected[p] for p in players],
                               rtol=0, atol=1e-13)
    assert result.max_efficiency_gap < 1e-13


@pytest.mark.parametrize("num_groups", [1, 2, 3])
@pytest.mark.parametrize("k", [1, 2, 3, 7])
def test_equals_brute_force_permutation_ads(num_groups, k):
    # 6 instances on a 3×3 grid: ties and duplicates; k = 7 exceeds every group and the data.
    for seed in range(3):
        assert_matches_brute_force(*small_problem(seed, 6, num_groups), k)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 6), num_groups=st.integers(1, 3), k=st.integers(1, 8),
       levels=st.integers(1, 4))
def test_equals_brute_force_property(seed, n, num_groups, k, levels):
    assert_matches_brute_force(*small_problem(seed, n, min(num_groups, n), levels=levels), k)


def test_one_group_is_brute_force_knn_shapley():
    x, y, x_test, y_test, _ = small_problem(4, 6, 1, levels=4, n_test=5)
    utility = KnnUtility(x, y, x_test, y_test, 3)
    expected = shapley_subset_formula(utility, list(range(6)))
    result = knn_shapley(x, y, x_test, y_test, k=3)
    np.testing.assert_allclose(result.values.loc[list(range(6))].to_numpy(float), [expected[i] for i in range(6)],
                               atol=1e-13)


def test_later_exact_duplicates_with_one_neighbour_are_worth_nothing():
    # With K = 1 a copy sorts right after its original (tie broken by index), so once the
    # original is in (always, in σ = (originals, copies)) the copy never is the nearest.
    rng = np.random.default_rng(0)
    x = rng.normal(size=(5, 3))
    y = rng.integers(0, 2, size=5)
    x_test, y_test = rng.normal(size=(20, 3)), rng.integers(0, 2, size=20)
    doubled, labels = np.vstack([x, x]), np.concatenate([y, y])
    result = knn_ads(doubled, labels, x_test, y_test, [range(5), range(5, 10)], k=1)
    assert np.all(result.instances.values.loc[list(range(5, 10))].to_numpy(float) == 0.0)
    alone = knn_ads(x, y, x_test, y_test, [range(5)], k=1).instances.values
    np.testing.assert_allclose(result.instances.values.loc[list(range(5))].to_numpy(float), alone.to_numpy(float),
                               atol=1e-15)


def test_duplicates_within_a_group_get_equal_values():
    # Axiom 4.1 (same group): mutually dependent instances, here exact copies, share one value.
    rng = np.random.default_rng(1)
    x = rng.normal(size=(6, 2))
    x[4] = x[1]
    x[5] = x[1]
    y = np.array([0, 1, 0, 1, 1, 1])
    x_test, y_test = rng.normal(size=(30, 2)), rng.integers(0, 2, size=30)
    for k in (1, 2, 4):
        values = knn_ads(x, y, x_test, y_test, [[0, 1, 2], [3, 4, 5]], k=k).instances.values
        assert values[4] == pytest.approx(values[5], abs=1e-15)
        expected = ordered_permutation_values(KnnUtility(x, y, x_test, y_test, k), [[0, 1, 2], [3, 4, 5]])
        assert values[4] == pytest.approx(expected[4], abs=1e-13)


def test_group_efficiency_and_totals_on_a_larger_problem():
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(300, 5)), rng.integers(0, 3, size=300)
    x_test, y_test = rng.normal(size=(70, 5)), rng.integers(0, 3, size=70)
    groups = [range(0, 150), range(150, 250), range(250, 300)]
    sources = [f"s{i // 5}" for i in range(300)]  # sources of 5 instances, never across groups
    contributors = [f"c{(i // 5) % 7}" for i in range(300)]
    result = knn_ads(x, y, x_test, y_test, groups, k=5, sources=sources, contributors=contributors, chunk_size=16)
    instances = result.instances
    assert instances.max_efficiency_gap < 1e-12
    full = KnnUtility(x, y, x_test, y_test, 5)
    assert instances.prefix_utilities[-1] == full(range(300))
    assert instances.prefix_utilities[1] == full(range(150))
    values = instances.values
    assert result.sources["s7"] == pytest.approx(values.loc[list(range(35, 40))].sum(), abs=1e-15)
    assert result.contributors.sum() == pytest.approx(values.sum(), abs=1e-12)
    for name in ("c0", "c3"):
        mine = [i for i in range(300) if contributors[i] == name]
        assert result.contributors[name] == pytest.approx(values[mine].sum(), abs=1e-12)
    # Chunking changes only the order of the sums.
    one_chunk = knn_ads(x, y, x_test, y_test, groups, k=5, chunk_size=1000).instances.values
    np.testing.assert_allclose(one_chunk.to_numpy(float), values.to_numpy(float), rtol=0, atol=1e-14)


# --- Theorem 5.1 as printed ----------------------------------------------------------------

def theorem_5_1_as_printed(c: list[int], a: list[int], b: list[int], k: int, base: float) -> list[float]:
    """φ(q_1..q_m) from the base value by [ADS] Thm 5.1, cases 1–4 with their double sums.

    c, a: c_{t,i} and 1[y_{q_i} = y] for i = 1..m; b: P's labels-correct, nearest first."""
    m = len(c)
    phi = [0.0] * m
    phi[-1] = base
    for i in range(m - 1, 0, -1):  # 1-based i; q_i is phi[i-1]
        ci, cn, ai, an = c[i - 1], c[i], a[i - 1], a[i]

        def tail(lower: int) -> float:
            total = 0.0
            for s in range(lower, m - 1):
                for u in range(lower, min(k - ci - 1, s) + 1):
                    weight = math.comb(s, u) * (math.comb(m - 2 - s, i - 1 - u) if i - 1 - u >= 0 else 0) \
                        / math.comb(m - 2, i - 1)
                    total += weight * (ai - b[k - u - 1]) / k
            return total / (m - 1)

        if k <= ci:
            diff = 0.0
        elif cn == ci:
            diff = (ai - an) / k * min(k - ci, i) / i
        elif k > cn:
            diff = (ai - an) / k * min(k - cn, i) / i + tail(k - cn)
        else:
            diff = tail(0)
        phi[i - 1] = phi[i] + diff
    return phi


def base_case_as_printed(c_max: int, a_max: int, b: list[int], k: int, m: int, size_p: int, *, cap: bool) -> float:
    """[ADS] App. B.6's base value; ``cap`` replaces K − c_max by min(K − c_max, m)."""
    if k <= c_max:
        return 0.0
    count = min(k - c_max, m) if cap else k - c_max
    value = count / (k * m) * a_max
    if size_p > c_max:
        value -= sum(b[k - s - 1] if k - s <= size_p else 0 for s in range(count)) / (k * m)
    return value


def per_test_point_inputs(x, y, x_test, y_test, groups, k, t):
    """c, a, b for every test point, from the same neighbour order the estimator uses."""
    group_of = np.empty(len(y), dtype=int)
    for index, group in enumerate(groups):
        group_of[list(group)] = index
    (_, order), = list(neighbour_orders(x, x_test, chunk_size=len(x_test)))
    for row in range(len(x_test)):
        ranked = order[row]
        earlier = [i for i in ranked if group_of[i] < t]
        members = [i for i in ranked if group_of[i] == t]
        position = {i: p for p, i in enumerate(ranked)}
        c = [sum(position[j] < position[q] for j in earlier) for q in members]
        a = [int(y[q] == y_test[row]) for q in members]
        b = [int(y[j] == y_test[row]) for j in earlier[:k]] + [0] * k
        yield members, c, a, b, len(earlier)


@pytest.mark.parametrize("k", [1, 2, 4, 6])
def test_closed_form_equals_theorem_5_1_as_printed(k):
    rng = np.random.default_rng(k)
    x, y = rng.normal(size=(40, 2)), rng.integers(0, 2, size=40)
    x_test, y_test = rng.normal(size=(8, 2)), rng.integers(0, 2, size=8)
    groups = [list(range(0, 12)), list(range(12, 40))]
    values = knn_ads(x, y, x_test, y_test, groups, k=k).instances.values
    totals = np.zeros(40)
    for t in range(2):
        for members, c, a, b, size_p in per_test_point_inputs(x, y, x_test, y_test, groups, k, t):
            base = base_case_as_printed(c[-1], a[-1], b, k, len(members), size_p, cap=True)
            totals[members] += theorem_5_1_as_printed(c, a, b, k, base)
    np.testing.assert_allclose(values.loc[list(range(40))].to_numpy(float), totals / 8, atol=1e-13)


def test_base_case_needs_the_cap_when_k_exceeds_the_group():
    # K − c_max > |C_t|: App. B.6 as printed counts K − c_max subset sizes where only |C_t| exist.
    x = np.array([[0.0], [1.0], [2.0]])
    y = np.array([1, 1, 1])
    x_test, y_test = np.array([[0.0]]), np.array([1])
    expected = ordered_permutation_values(KnnUtility(x, y, x_test, y_test, 5), [[0, 1, 2]])
    assert expected[2] == pytest.approx(1 / 5)  # always adds one correct neighbour of five slots
    assert base_case_as_printed(0, 1, [0] * 5, 5, 3, 0, cap=True) == pytest.approx(expected[2])
    assert base_case_as_printed(0, 1, [0] * 5, 5, 3, 0, cap=False) == pytest.approx(5 / 15)  # ≠ 1/5


# --- input errors --------------------------------------------------------------------------

def test_input_errors_name_the_parameter():
    x, y = np.zeros((4, 2)), np.array([0, 1, 0, 1])
    xt, yt = np.zeros((2, 2)), np.array([0, 1])
    cases = [
        (dict(groups=[[0, 1], [2]]), "groups: expected the groups to cover every training instance"),
        (dict(groups=[[0, 1], [1, 2, 3]]), "groups: expected each training index in exactly one group; 1"),
        (dict(groups=[[0, 1, 2, 9]]), r"groups: expected indices in \[0, 4\)"),
        (dict(groups=[[0, 1, 2, 3], []]), "groups: expected group 1 to be a non-empty"),
        (dict(groups="abc"), "groups: expected a non-empty sequence"),
        (dict(k=0), "k: expected a positive integer"),
        (dict(chunk_size=0), "chunk_size: expected a positive integer"),
        (dict(sources=["a", "b"]), r"sources: expected one label per training instance \(4\); got 2"),
        (dict(groups=[[0, 1], [2, 3]], sources=["a", "a", "a", "b"]), "sources: expected each source's instances"),
    ]
    for overrides, message in cases:
        kwargs = dict(groups=[[0, 1, 2, 3]], k=2) | overrides
        with pytest.raises(ValueError, match=message):
            knn_ads(x, y, xt, yt, **kwargs)
    with pytest.raises(ValueError, match="x_test: expected 2 features like x_train; got 3"):
        knn_ads(x, y, np.zeros((2, 3)), yt, [[0, 1, 2, 3]])
    with pytest.raises(ValueError, match="y_train: expected a 1-D array of 4 labels"):
        knn_ads(x, y[:3], xt, yt, [[0, 1, 2, 3]])
    with pytest.raises(ValueError, match="y_test: expected integer class labels; got dtype float64"):
        knn_ads(x, y, xt, np.array([0.5, 1.0]), [[0, 1, 2, 3]])
    with pytest.raises(ValueError, match="x_train: expected finite numbers"):
        knn_ads(np.full((4, 2), np.nan), y, xt, yt, [[0, 1, 2, 3]])
