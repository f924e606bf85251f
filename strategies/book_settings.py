"""Which books a valued round keeps besides ADS and LOO (:class:`BookSettings`): TracIn flows,
fairness and its curvature, defences, the fixed-weight game's second-order expansion, and the
clients known to be noisy. Checked once when
made (errors name the parameter); the strategy's hooks (:mod:`strategies.hooks`) read it whole."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING

from flwr.serverapp.strategy import (
    DifferentialPrivacyClientSideAdaptiveClipping,
    DifferentialPrivacyClientSideFixedClipping,
    Strategy,
)

from fedvalue._checks import check_integer, check_positive
from fedvalue.flows.projected_flows import FlowsProjection
from fedvalue.rounds.defences.settings import DefenceSettings

if TYPE_CHECKING:  # a torch module: loaded by whoever builds a fairness objective
    from fedvalue.scoring.fairness.objectives import GroupFairness

#: Flower's strategies that clip on the clients (their mods allow one ArrayRecord a reply).
CLIENT_SIDE_DP = (DifferentialPrivacyClientSideFixedClipping, DifferentialPrivacyClientSideAdaptiveClipping)


@dataclass(frozen=True)
class BookSettings:
    """Books a round keeps besides ADS and LOO.

    Parameters
    ----------
    flows
        Book TracIn flows between clients ([RECIP]): sampled clients return their inference
        gradient at A_{t−1} with their update; every other client is asked for it with a
        query carrying A_{t−1} (one forward and backward pass, no training), so it receives
        inflow too (:mod:`strategies.hooks.flows`).
    flows_projection_dim
        k, a positive integer, or None (default): book the flows through a seeded random
        projection to k numbers (a count sketch drawn afresh each round from the run's seed,
        :mod:`fedvalue.flows.projected_flows`). The server projects every inference gradient and
        every valid update as the round's record is made; the record keeps the k numbers of each
        in place of its p, and the flows are those of the recorded vectors (an unbiased estimate,
        standard deviation at most p_u ‖Δ_u‖ ‖g_v‖ √(2/k) a flow; exact for k ≥ p). Needs
        ``flows``; not with ``defences``, whose defended outflow takes the full gradients.
    fairness
        A :class:`fedvalue.scoring.fairness.objectives.GroupFairness` objective on held-out data with a sensitive
        attribute: each round then also books ``ads_fairness`` / ``loo_fairness`` (the round
        game with U = −gap) and ``fairness_influence`` (:mod:`strategies.hooks.fairness`).
    fair_curvature
        The damping δ > 0 of fairness influence with curvature (None: off); sampled clients
        then send their training loss gradient and Fisher diagonal at A_{t−1}. Needs
        ``fairness``.
    noisy_clients
        Client ids known to be noisy (simulations know it): the run's ground truth, joined
        into the ledger's ``noisy`` column as rows are written (no round's books use it).
    defences
        A :class:`fedvalue.rounds.defences.settings.DefenceSettings`: each round also books its
        defended values (near-duplicate clusters as one player, free-riders at 0, arrivals by
        size) beside the plain ones (:mod:`fedvalue.rounds.kinds.defences`). None (default): off.
    fixed_second_order
        Book ``ads_fixed_second_order`` beside ADS each round: the Shapley value of the second-order
        expansion of the fixed-weight round game at A_{t−1}, φ_k = u_k·(g + ½ H U) with u_k = p_k Δ_k,
        U = Σ_j u_j (:mod:`fedvalue.rounds.kinds.fixed_second_order`), from one gradient and one
        Hessian-vector product of U and two evaluations. Identities whose claims and claim-weighted
        updates add up to one client's are paid together what it would be. With ``defences`` too, each
        client's ``ads_fixed_second_order_defended`` follows: 0 for a flagged free-rider, a near-duplicate
        cluster paid as one claim (:mod:`fedvalue.rounds.defences.second_order`). Needs a differentiable
        utility (``neg_loss``, ``neg_mse``) and an inner strategy that aggregates by FedAvg's weighted
        mean (checked when the strategy is made). False (default): off.
    """

    flows: bool = False
    flows_projection_dim: int | None = None
    fairness: GroupFairness | None = None
    fair_curvature: float | None = None
    noisy_clients: Collection[int] | None = None
    defences: DefenceSettings | None = None
    fixed_second_order: bool = False

    def __post_init__(self) -> None:
        for name in ("flows", "fixed_second_order"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name}: expected True or False; got {getattr(self, name)!r}.")
        self._check_projection()
        if self.fairness is not None and not (callable(self.fairness)
                                              and callable(getattr(self.fairness, "gradient", None))):
            raise TypeError(f"fairness: expected a fedvalue.scoring.fairness.objectives.GroupFairness (or None); got "
                            f"{type(self.fairness).__name__}.")
        if self.fair_curvature is not None:
            if self.fairness is None:
                raise ValueError("fair_curvature: fairness influence with curvature needs fairness=GroupFairness(...).")
            object.__setattr__(self, "fair_curvature", check_positive("fair_curvature", self.fair_curvature))
        if self.noisy_clients is not None:
            if isinstance(self.noisy_clients, str | bytes) or not isinstance(self.noisy_clients, Collection):
                raise TypeError(f"noisy_clients: expected a collection of client ids or None; got "
                                f"{self.noisy_clients!r}.")
            object.__setattr__(self, "noisy_clients", frozenset(self.noisy_clients))
        if self.defences is not None and not isinstance(self.defences, DefenceSettings):
            raise TypeError(f"defences: expected a fedvalue.rounds.defences.settings.DefenceSettings (or None); got "
                            f"{type(self.defences).__name__}.")

    def _check_projection(self) -> None:
        """``flows_projection_dim`` a positive integer or None, with flows and without defences."""
        if self.flows_projection_dim is None:
            return
        object.__setattr__(self, "flows_projection_dim", check_integer("flows_projection_dim", self.flows_projection_dim,
                                                                       none_ok=True))
        if not self.flows:
            raise ValueError(f"flows_projection_dim: projects the vectors of TracIn flows, which this run does not "
                             f"book (flows=False); got flows_projection_dim={self.flows_projection_dim}. Pass "
                             "flows=True with it, or leave it None.")
        if self.defences is not None:
            raise ValueError("flows_projection_dim: the defences book a defended TracIn outflow from the full "
                             "inference gradients, which a projected run does not keep; leave flows_projection_dim "
                             "None with defences.")

    def flows_projection(self, seed: int) -> FlowsProjection | None:
        """The flows' projection of a run seeded ``seed`` (its seed derived from the run's:
        :meth:`fedvalue.flows.projected_flows.FlowsProjection.of_run`); None without one."""
        return None if self.flows_projection_dim is None else FlowsProjection.of_run(self.flows_projection_dim, seed)

    def check_strategy(self, strategy: Strategy) -> None:
        """ValueError when ``strategy`` would fail every reply these books ask for: flows and
        curvature travel as a second ArrayRecord beside the update, and the client-side DP
        mods of Flower's ``DifferentialPrivacyClientSide*`` strategies refuse a reply holding
        more than one ArrayRecord."""
        if not isinstance(strategy, CLIENT_SIDE_DP):
            return
        for name, asked in (("flows", self.flows), ("fair_curvature", self.fair_curvature is not None)):
            if asked:
                raise ValueError(
                    f"{name}: {type(strategy).__name__} clips on the clients, whose DP mods refuse a reply that "
                    f"carries a second ArrayRecord, and {name} sends one with every update, so every reply would "
                    "fail; use a server-side DP strategy or leave it off.")
