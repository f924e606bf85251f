"""The valuing strategy's settings beside valuation and the run directory: which books a
round keeps (:class:`BookSettings`) and how replies are taken in (:class:`IntakeSettings`);
and, apart from the settings, what the run tells its caller as it goes (:class:`RunCallbacks`).

Each is a frozen dataclass checked once when made (errors name the parameter); the
strategy takes them whole, so an option is added in one place. The valuation's settings
are :class:`fedvalue.valuation.round_game.ValuationSettings`, the run directory's
:class:`fedvalue.run.settings.RunSettings`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING

from flwr.serverapp.strategy import (
    DifferentialPrivacyClientSideAdaptiveClipping,
    DifferentialPrivacyClientSideFixedClipping,
    Strategy,
)

from fedvalue._checks import check_positive
from fedvalue.rounds.defences.settings import DefenceSettings
from fedvalue.run.run_info import load_utility
from fedvalue.valuation.round_game import ArraysUtility
from strategies.policies.claims import ClaimReview
from strategies.nodes import NodeDirectory

if TYPE_CHECKING:  # a torch module: loaded by whoever builds a fairness objective
    from fedvalue.scoring.fairness.objectives import GroupFairness

#: Flower's strategies that clip on the clients (their mods allow one ArrayRecord a reply).
CLIENT_SIDE_DP = (DifferentialPrivacyClientSideFixedClipping, DifferentialPrivacyClientSideAdaptiveClipping)


def settings_or_default(name: str, value: object, kind: type) -> object:
    """``value``, or ``kind()`` for None; TypeError naming ``name`` for anything else."""
    if value is None:
        return kind()
    if not isinstance(value, kind):
        raise TypeError(f"{name}: expected a {kind.__module__}.{kind.__name__} (or None); got {type(value).__name__}.")
    return value


def utility_of(utility: ArraysUtility | str) -> tuple[ArraysUtility, str | None]:
    """(U, the ``module:callable`` that built it or None) of the valuing strategy's ``utility``:
    U itself, or the importable ``"module:callable"`` (no arguments) that builds it. TypeError
    for anything that is neither."""
    reference = utility if isinstance(utility, str) else None
    built = load_utility(utility) if reference is not None else utility
    if not callable(built):
        raise TypeError(f"utility: expected U(arrays) -> float or an importable 'module:callable' building it; got "
                        f"{type(utility).__name__}.")
    return built, reference


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
    """

    flows: bool = False
    fairness: GroupFairness | None = None
    fair_curvature: float | None = None
    noisy_clients: Collection[int] | None = None
    defences: DefenceSettings | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.flows, bool):
            raise TypeError(f"flows: expected True or False; got {self.flows!r}.")
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


@dataclass(frozen=True)
class IntakeSettings:
    """How the round's replies are taken in (:mod:`strategies.intake`).

    Parameters
    ----------
    claims
        A :class:`strategies.policies.claims.ClaimReview` that caps and flags the weights clients claim
        before anything reads them (the books and the inner strategy both see the capped
        weight); each flag is booked as a ``claim_capped`` / ``claim_jumped`` row.
    reject_non_finite
        Keep replies with NaN or inf arrays out of the aggregate (status ``rejected``, booked
        with the harm they would have done); ``False`` passes them to the inner strategy.
    nodes
        Which node holds which partition (:class:`strategies.nodes.NodeDirectory`): share one
        between runs served one after another by the same engine so each node is queried
        once; ``None``: a directory of the run's own.
    query_timeout
        Seconds to wait for clients to report their partition ids (and, with flows, their
        inference gradients); > 0.
    query_data_key
        Send the train config's ``data-key`` with every gradient query too, so a client of an
        engine that serves several runs answers from the run's own data. False (default): the
        queries carry none.
    """

    claims: ClaimReview | None = None
    reject_non_finite: bool = True
    nodes: NodeDirectory | None = None
    query_timeout: float = 120.0
    query_data_key: bool = False

    def node_directory(self) -> NodeDirectory:
        """The node directory given, or (None) a new one for the run."""
        return NodeDirectory() if self.nodes is None else self.nodes

    def __post_init__(self) -> None:
        if self.claims is not None and not callable(getattr(self.claims, "review", None)):
            raise TypeError(f"claims: expected a strategies.policies.claims.ClaimReview (or None); got "
                            f"{type(self.claims).__name__}.")
        if not isinstance(self.reject_non_finite, bool):
            raise TypeError(f"reject_non_finite: expected True or False; got {self.reject_non_finite!r}.")
        if self.nodes is not None and not isinstance(self.nodes, NodeDirectory):
            raise TypeError(f"nodes: expected a strategies.nodes.NodeDirectory (or None); got "
                            f"{type(self.nodes).__name__}.")
        object.__setattr__(self, "query_timeout", check_positive("query_timeout", self.query_timeout))
        if not isinstance(self.query_data_key, bool):
            raise TypeError(f"query_data_key: expected True or False; got {self.query_data_key!r}.")


@dataclass
class RunCallbacks:
    """What a valued run tells its caller as it goes: displays and measurements that change
    nothing booked. Kept apart from the settings, which are data.

    Parameters
    ----------
    on_round
        Called with each round's ``rounds.csv`` row after the round commits.
    on_progress
        Called with (round, coalitions evaluated, coalitions planned) while a round is valued.
    """

    on_round: Callable[[dict], None] | None = None
    on_progress: Callable[[int, int, int], None] | None = None

    def __post_init__(self) -> None:
        for name, shape in (("on_round", "taking a rounds.csv row"), ("on_progress", "(round, evaluated, planned)")):
            value = getattr(self, name)
            if value is not None and not callable(value):
                raise TypeError(f"{name}: expected a callable {shape}, or None; got {type(value).__name__}.")
