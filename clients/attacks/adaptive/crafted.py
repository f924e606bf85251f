"""An adaptive crafted update: the ACE-style crafted update (:mod:`clients.attacks.crafted_update`)
kept within the norm cap c of the defended game (``DefenceSettings(norm_cap=c)``, ``--norm-cap``).

The cap clips a representative's update to c × the round's median update norm
(:mod:`fedvalue.rounds.defences.quotient`). The attacker does not see the other updates; it takes
its own honest update's norm ‖Δ_h‖ for the median (honest updates of a round are of one order),
crafts as :class:`~clients.attacks.CraftedUpdate` does while projecting every Adam step onto
‖Δ‖ ≤ c ‖Δ_h‖ / (1 + margin) too (after the budget ball: the cap wins), and then spends that
allowance: its reply's norm is c ‖Δ_h‖ / (1 + margin) exactly, its direction the crafted one. Where
the round's median is ‖Δ_h‖ its update is 1 / (1 + margin) of the cap: not clipped for margin ≥ 0.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from clients.attacks.adaptive.margin import check_margin
from clients.attacks.crafted_update import CraftedUpdate, _norm
from fedvalue._checks import check_positive


class AdaptiveCraftedUpdate(CraftedUpdate):
    """A crafted update of norm c ‖Δ_h‖ / (1 + margin) (module docstring).

    Parameters
    ----------
    model_factory, others, budget, steps, step_size
        As :class:`~clients.attacks.CraftedUpdate`'s.
    norm_cap
        c > 0, the cap of the run's defences (a multiple of the round's median update norm).
    margin
        Its update's norm is 1 / (1 + margin) of the cap (its honest norm standing for the median).
    """

    def __init__(self, model_factory: Callable[[], torch.nn.Module], *, others: int, norm_cap: float,
                 margin: float, budget: float = 0.5, steps: int = 50, step_size: float = 0.1) -> None:
        super().__init__(model_factory, others=others, budget=budget, steps=steps, step_size=step_size)
        self.norm_cap = check_positive("norm_cap", norm_cap)
        self.margin = check_margin(margin)

    def __repr__(self) -> str:
        return super().__repr__()[:-1].replace("CraftedUpdate(", "AdaptiveCraftedUpdate(", 1) + \
            f", norm_cap={self.norm_cap}, margin={self.margin})"

    def limit(self, honest: dict) -> float:
        """c ‖Δ_h‖ / (1 + margin), the norm it replies with."""
        return self.norm_cap * _norm(honest) / (1 + self.margin)

    def project(self, delta: dict, honest: dict) -> None:
        super().project(delta, honest)
        norm, limit = _norm(delta), self.limit(honest)
        if norm > limit:
            for k in delta:
                delta[k].mul_(limit / norm)

    def _craft(self, start: dict, honest: dict, others: dict) -> dict:
        crafted = super()._craft(start, honest, others)
        norm, limit = _norm(crafted), self.limit(honest)
        return {k: v * (limit / norm) for k, v in crafted.items()} if norm > 0 else crafted
