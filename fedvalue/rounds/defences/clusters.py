"""Near-duplicate updates of a round, clustered: the evidence that several identities are one player.

Replies i and j are linked when their updates are near-duplicates,

    ‖Δ_i − Δ_j‖ ≤ τ · min(‖Δ_i‖, ‖Δ_j‖),

and clusters are the connected components of the links (single linkage): a copy of a copy is
in its original's cluster. Two zero updates are duplicates (0 ≤ 0). Honest clients train on
different data, so their updates differ by a good part of their norm; Sybils that submit one
update under several identities (with or without a little noise) fall into one cluster.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

import numpy as np


def near_duplicate_clusters(updates: Mapping[Hashable, np.ndarray], tolerance: float) -> list[tuple[Hashable, ...]]:
    """Clusters of the clients of ``updates`` (flat update vectors, in reply order).

    Returns
    -------
    list of tuple
        Every client in exactly one cluster; clusters in the order of their first member,
        members in reply order (singletons included).
    """
    clients = list(updates)
    vectors = [np.asarray(updates[c], dtype=np.float64) for c in clients]
    norms = [float(np.linalg.norm(v)) for v in vectors]
    parent = list(range(len(clients)))

    def root(k: int) -> int:
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    for i in range(len(clients)):
        for j in range(i + 1, len(clients)):
            if float(np.linalg.norm(vectors[i] - vectors[j])) <= tolerance * min(norms[i], norms[j]):
                low, high = sorted((root(i), root(j)))
                parent[high] = low
    members: dict[int, list[Hashable]] = {}
    for k, client in enumerate(clients):
        members.setdefault(root(k), []).append(client)
    return [tuple(group) for _, group in sorted(members.items())]


def representatives(clusters: Sequence[Sequence[Hashable]]) -> list[Hashable]:
    """The player that stands for each cluster: its first member in reply order."""
    return [cluster[0] for cluster in clusters]
