"""Near-duplicate updates judged against the round's own spread: a threshold the attacker cannot
move by the shape of its updates.

The fixed test (:mod:`.clusters`) links replies i and j when r_ij ≤ τ, with the scale-free distance

    r_ij = ‖Δ_i − Δ_j‖ / min(‖Δ_i‖, ‖Δ_j‖),

so replicas placed just past τ are never linked (:mod:`clients.attacks.adaptive.replicas`). Here the
threshold is a fraction κ of the median of the round's own distances, never below τ,

    t = max(τ, κ · median_{i<j} r_ij),   link i and j when r_ij ≤ t,

and clusters are the connected components of the links (single linkage, as in :mod:`.clusters`).
Honest clients train on different data, so their distances spread about a median set by the round
(the model, the data, the state A_{t−1}); two identities are linked unless they lie at least κ
times that median apart. While fewer than half of the round's pairs involve the attacker's
identities, the median lies between two quantiles of the honest pairs' distances, whatever the
attacker's pairs are (docs/faults-and-audit.md, *Relative clusters*): a bound by the honest
clients, not by a constant the attacker can read.

κ = 0.25 (:data:`~.settings.DUPLICATE_MEDIAN_FRACTION`) was fixed from attack-free rounds only,
before any attack was measured: Fashion-MNIST softmax regression, 250 images a client, one local
epoch of SGD (batch 32, learning rate 0.1), 8, 12 and 20 clients on IID and Dirichlet (α = 0.5)
shards, 4 seeds, rounds 1 to 5 of FedAvg (120 rounds). The smallest honest distance of a round was
at least 0.62 of its median on IID shards and at least 0.42 on Dirichlet shards (0.42 with 20
clients in round 5); κ = 0.25 leaves a factor 1.7 below the smallest.

Small rounds, deliberately: zero updates have no direction; a zero update is linked to another
zero update only (as by τ: 0 ≤ t · 0) and its pairs are left out of the median. With fewer than
3 non-zero updates (fewer than 3 pairs: no spread to judge by) the threshold is τ alone. Updates
that are all equal have median 0, so the threshold is τ and they are one cluster, as by τ.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping

import numpy as np

from fedvalue.rounds.defences.clusters import near_duplicate_clusters

#: The fewest non-zero updates whose pairwise distances have a spread to judge by (3 of them give 3 pairs).
MIN_SPREAD_REPLIES = 3


def _non_zero(updates: Mapping[Hashable, np.ndarray]) -> list[np.ndarray]:
    """The updates of norm > 0 (float64, reply order): the ones that have a direction."""
    vectors = [np.asarray(u, dtype=np.float64) for u in updates.values()]
    return [v for v in vectors if float(np.linalg.norm(v)) > 0.0]


def scale_free_distances(updates: Mapping[Hashable, np.ndarray]) -> np.ndarray:
    """r_ij for the pairs i < j (reply order) of the non-zero updates of ``updates``."""
    vectors = _non_zero(updates)
    norms = [float(np.linalg.norm(v)) for v in vectors]
    return np.array([float(np.linalg.norm(vectors[i] - vectors[j])) / min(norms[i], norms[j])
                     for i in range(len(vectors)) for j in range(i + 1, len(vectors))], dtype=np.float64)


def relative_threshold(updates: Mapping[Hashable, np.ndarray], tolerance: float, median_fraction: float) -> float:
    """t = max(τ, κ · median r_ij) over the non-zero updates; τ when fewer than 3 of them (module docstring)."""
    if len(_non_zero(updates)) < MIN_SPREAD_REPLIES:
        return float(tolerance)
    return max(float(tolerance), float(median_fraction) * float(np.median(scale_free_distances(updates))))


def relative_duplicate_clusters(updates: Mapping[Hashable, np.ndarray], tolerance: float,
                                median_fraction: float) -> list[tuple[Hashable, ...]]:
    """Clusters of the clients of ``updates`` (flat updates, reply order) linked at :func:`relative_threshold`:
    every client in exactly one cluster, clusters in the order of their first member, as
    :func:`~.clusters.near_duplicate_clusters` returns them."""
    return near_duplicate_clusters(updates, relative_threshold(updates, tolerance, median_fraction))
