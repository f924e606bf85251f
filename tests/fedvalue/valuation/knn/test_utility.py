"""The KNN utility and its neighbour order: brute-force utility, scikit-learn's majority vote,
the tie rule, and chunking."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.neighbors import KNeighborsClassifier

from fedvalue.valuation.knn.utility import KnnUtility, neighbour_orders, neighbour_ranks


def test_utility_is_the_mean_share_of_right_labels_among_the_k_nearest():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(30, 3)), rng.integers(0, 3, size=30)
    x_test, y_test = rng.normal(size=(12, 3)), rng.integers(0, 3, size=12)
    utility = KnnUtility(x, y, x_test, y_test, 4)
    for members in ([], [5], [1, 2, 3], list(range(0, 30, 2))):
        expected = 0.0
        for point, label in zip(x_test, y_test):
            distances = np.linalg.norm(x[members] - point, axis=1) if members else np.array([])
            nearest = np.array(members, dtype=int)[np.argsort(distances, kind="stable")[:4]]
            expected += np.sum(y[nearest] == label) / 4  # 1/K even with fewer than K neighbours
        assert utility(members) == pytest.approx(expected / len(y_test), abs=1e-15)


@pytest.mark.parametrize("k", [1, 4, 5])
def test_accuracy_is_scikit_learns_majority_vote(k):
    rng = np.random.default_rng(k)
    x, y = rng.normal(size=(200, 4)), rng.integers(0, 3, size=200)
    x_test, y_test = rng.normal(size=(300, 4)), rng.integers(0, 3, size=300)
    members = rng.choice(200, size=120, replace=False)
    model = KNeighborsClassifier(n_neighbors=k, algorithm="brute").fit(x[members], y[members])
    assert KnnUtility(x, y, x_test, y_test, k).accuracy(members) == model.score(x_test, y_test)


def test_ties_go_to_the_lower_index_and_copies_tie_exactly():
    x = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [3.0, 3.0], [0.0, 1.0]])
    ranks = neighbour_ranks(x, np.array([[0.0, 0.0], [1.0, 0.0]]))
    # From (0, 0), rows 0, 1, 2, 4 are at distance 1: index order; row 3 last.
    assert ranks[0].tolist() == [0, 1, 2, 4, 3]
    assert ranks[1].tolist() == [0, 2, 1, 4, 3]


def test_chunking_does_not_change_the_order():
    rng = np.random.default_rng(1)
    x = rng.integers(0, 3, size=(50, 2)).astype(float)
    x_test = rng.integers(0, 3, size=(9, 2)).astype(float)
    whole = np.vstack([order for _, order in neighbour_orders(x, x_test, chunk_size=9)])
    pieces = np.vstack([order for _, order in neighbour_orders(x, x_test, chunk_size=2)])
    np.testing.assert_array_equal(whole, pieces)
    keys = ((x[None, :, :] - x_test[:, None, :]) ** 2).sum(axis=2)
    np.testing.assert_array_equal(whole, np.lexsort((np.broadcast_to(np.arange(50), keys.shape), keys), axis=1))


def test_coalition_outside_the_training_set_is_refused():
    utility = KnnUtility(np.zeros((3, 1)), np.array([0, 1, 0]), np.zeros((2, 1)), np.array([0, 1]), 2)
    with pytest.raises(ValueError, match=r"coalition: expected training indices in \[0, 3\)"):
        utility([0, 7])
