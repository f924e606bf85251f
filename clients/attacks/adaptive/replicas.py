"""An adaptive replica: one participant's update under K identities, each moved off the others by
(1 + margin) times the near-duplicate threshold τ (``DUPLICATE_TOLERANCE``), so that no two are
linked into a cluster (:mod:`fedvalue.rounds.defences.clusters`) and each is valued as a player.

Every identity trains on the participant's whole data (full-batch local training gives the same
update Δ bit for bit) and claims its full size, as :class:`clients.attacks.SybilReplica` does.
Identity j then replies Δ + ν_j, the ν_j the vertices of a regular simplex centred at 0 in K
directions orthogonal to Δ, drawn from the participant's shared secret and the round:

    ν_j ⟂ Δ,   Σ_j ν_j = 0,   ‖ν_i − ν_j‖ = d,   ‖ν_j‖ = d √((K − 1) / (2K)),

the least norm that K perturbations at pairwise distance d can have. Every identity's update has
the norm √(‖Δ‖² + ‖ν_j‖²), so with q = (1 + margin) τ,

    d = q ‖Δ‖ / √(1 − q² (K − 1) / (2K))

puts every two identities at ‖Δ_i − Δ_j‖ = q · min(‖Δ_i‖, ‖Δ_j‖) exactly (in float64; the reply
is cast to the model's dtype). Their mean is Δ: with equal claims FedAvg moves the model as K
exact copies would.
"""

from __future__ import annotations

import math

import numpy as np

from clients.attacks.adaptive.margin import check_margin, float_keys, moved_by
from clients.attacks.memory import RoundAware
from fedvalue._checks import check_integer, check_positive
from fedvalue.rounds.defences.quotient import flat_update
from fedvalue.rounds.defences.settings import DUPLICATE_TOLERANCE


def simplex_perturbations(update: np.ndarray, identities: int, distance: float,
                          rng: np.random.Generator) -> np.ndarray:
    """K × d: the vertices of a regular simplex centred at 0, pairwise ``distance`` apart, in
    directions orthogonal to ``update`` drawn from ``rng`` (module docstring)."""
    if update.size < identities + 1:
        raise ValueError(f"identities: expected fewer than the update's {update.size} entries; got {identities}.")
    norm = float(np.linalg.norm(update))
    columns = np.column_stack([update / norm if norm > 0 else update,
                               rng.standard_normal((update.size, identities))])
    basis, _ = np.linalg.qr(columns)
    directions = basis[:, 1:].T  # orthonormal, each orthogonal to the update
    vertices = directions - directions.mean(axis=0)  # pairwise √2 apart, centred at 0
    return vertices * (distance / math.sqrt(2.0))


class AdaptiveReplica(RoundAware):
    """Identity ``identity`` of ``identities`` replicas spread just past the clustering threshold
    (module docstring).

    Parameters
    ----------
    identity, identities
        Which identity, and K ≥ 2.
    margin
        The identities sit (1 + margin) τ apart, relative to the smaller norm of each two.
    secret
        The participant's shared seed (every identity draws the same directions).
    tolerance
        τ, the clustering threshold it reads (default: the defences' own).
    """

    history_length = 0  # it needs the round, not past models

    def __init__(self, identity: int, identities: int, *, margin: float, secret: int = 0,
                 tolerance: float = DUPLICATE_TOLERANCE) -> None:
        self.identities = check_integer("identities", identities, 2)
        self.identity = check_integer("identity", identity, 0)
        if self.identity >= self.identities:
            raise ValueError(f"identity: expected an identity in [0, {self.identities}); got {identity}.")
        self.margin = check_margin(margin)
        self.tolerance = check_positive("tolerance", tolerance)
        self.secret = check_integer("secret", secret, 0)
        ratio = (1 + self.margin) * self.tolerance
        if ratio ** 2 * (self.identities - 1) / (2 * self.identities) >= 1:
            raise ValueError(f"margin: expected (1 + margin) τ below √(2K / (K − 1)) = "
                             f"{math.sqrt(2 * self.identities / (self.identities - 1)):.3f} for K = {self.identities} "
                             f"identities; got {self.margin} (τ = {self.tolerance}).")

    def distance(self, update_norm: float) -> float:
        """d, the identities' pairwise distance for an honest update of norm ``update_norm``."""
        ratio = (1 + self.margin) * self.tolerance
        return ratio * update_norm / math.sqrt(1 - ratio ** 2 * (self.identities - 1) / (2 * self.identities))

    def perturbation(self, update: np.ndarray) -> np.ndarray:
        """ν of this identity for the flat honest update ``update``."""
        rng = np.random.default_rng([self.secret, getattr(self, "server_round", 0)])
        distance = self.distance(float(np.linalg.norm(update)))
        return simplex_perturbations(update, self.identities, distance, rng)[self.identity]

    def transform_reply(self, global_arrays, trained_arrays, num_examples, rng):
        keys = float_keys(global_arrays)
        update = flat_update(trained_arrays, global_arrays, keys)
        if not np.any(update):  # nothing trained: nothing to spread
            return trained_arrays, num_examples
        return moved_by(global_arrays, update + self.perturbation(update), keys, trained_arrays), num_examples
