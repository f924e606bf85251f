"""The round's defences applied to the fixed-weight game's second-order values
(``ads_fixed_second_order_defended``): free-riders paid 0, each near-duplicate cluster paid as one claim, every
other client paid what the plain book pays it.

The plain book (:mod:`fedvalue.rounds.kinds.fixed_second_order`, [ADS] Remark 4.1 on the expansion) pays

    φ_k = u_k·w,   w = g + ½ H s,   u_k = p_k Δ_k,   p_k = n_k / N,   s = Σ_{j∈I_t} u_j,

with N = Σ_{j∈I_t} n_j, g and H the utility's gradient and Hessian at A_{t−1}. The round's screen (the tests and
clusters the defended ADS book applies, :func:`fedvalue.rounds.defences.quotient.screen`) gives the free-riders F
and the near-duplicate clusters of the others. The defended book pays φ^D_k = c_k φ_k with

    c_k = 0 (k ∈ F),   c_k = n_max(C) / n_C (k ∈ C),   n_max(C) = max_{j∈C} n_j,   n_C = Σ_{j∈C} n_j,

the step s and the total claim N left the round's realized ones.

**Proposition.** (a) A cluster C is paid, in sum, what one client claiming C's largest claim and replying C's
claim-weighted mean update Δ̄_C = Σ_{j∈C} n_j Δ_j / n_C is paid in the round; each member is paid its share
φ_k / Σ_{j∈C} φ_j of that (the payment scales every member's plain value alike). (b) K exact replicas of one
reply are paid, together, what one of them is paid by the plain book. (c) A client that is neither flagged nor in a
cluster of two or more is paid exactly φ_k.

*Proof.* (a) That client's weighted update is (n_max / N) Δ̄_C = (n_max / n_C) Σ_{j∈C} u_j, and w does not depend
on whom the book pays, so it is paid (n_max / n_C) Σ_{j∈C} u_j·w = Σ_{j∈C} c_j φ_j. (b) The replicas' claims n
and updates are equal, so their φ are equal, c = n / (K n) = 1 / K, and they are paid K φ / K = φ. (c) A singleton has c_k = n_k / n_k = 1,
booked as 1 exactly. ∎

A split whose claims add up to one participant's (Σ_{k∈C} n_k = n_D, Σ_{k∈C} n_k Δ_k = n_D Δ_D) and whose shards
happen to cluster is paid (n_max / n_D) φ_D: 1/K of the whole for K equal shards, so clustering never pays a split.
Honest clients whose updates happen to fall within τ of each other lose the same factor: the defence's honest cost.
What it leaves open: identities whose updates sit just outside τ are not clustered, and perturbations that cancel
across them leave their summed plain value that of exact replicas, so they are paid as one claim inflated to their
summed claims, as under the plain book.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

from fedvalue.rounds.defences.free_riders import FreeRiderFlag


def one_claim_factors(weights: Mapping[Hashable, float], flags: Mapping[Hashable, FreeRiderFlag],
                      clusters: Sequence[Sequence[Hashable]]) -> dict[Hashable, float]:
    """Client -> c_k (module docstring): 0 for a free-rider, n_max(C) / n_C in a cluster C of two or more, 1.0
    alone (exactly, so that the client's defended value is its plain one bit for bit).

    Parameters
    ----------
    weights
        Client -> n_k, the claim its reply was aggregated with.
    flags, clusters
        The round's free-riders and the near-duplicate clusters of the others
        (:func:`fedvalue.rounds.defences.quotient.screen`).
    """
    factors: dict[Hashable, float] = {client: 0.0 for client in flags}
    for cluster in clusters:
        if len(cluster) == 1:
            factors[cluster[0]] = 1.0
            continue
        claims = [float(weights[member]) for member in cluster]
        total = sum(claims)
        # Claims of 0 weigh no update (u_k = 0, φ_k = 0): any factor pays them 0; share as equal claims would.
        factor = max(claims) / total if total > 0 else 1.0 / len(cluster)
        factors.update(dict.fromkeys(cluster, factor))
    return factors
