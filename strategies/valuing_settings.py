"""The valuing strategy's settings beside valuation, books and the run directory: how replies are
taken in (:class:`IntakeSettings`); and, apart from the settings, what the run tells its caller as
it goes (:class:`RunCallbacks`).

Each is a frozen dataclass checked once when made (errors name the parameter); the strategy takes
them whole, so an option is added in one place. The valuation's settings are
:class:`fedvalue.valuation.settings.ValuationSettings`, the books' :class:`strategies.book_settings.BookSettings`,
the run directory's :class:`fedvalue.run.settings.RunSettings`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fedvalue._checks import check_integer, check_positive
from fedvalue.run.run_info import load_utility
from fedvalue.schema import RoundRow
from fedvalue.valuation.round_game import ArraysUtility
from strategies.intake.nodes import NodeDirectory
from strategies.intake.claims import ClaimReview


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
class IntakeSettings:
    """How the round's replies are taken in (:mod:`strategies.intake.round_intake`).

    Parameters
    ----------
    claims
        A :class:`strategies.intake.claims.ClaimReview` that caps and flags the weights clients claim
        before anything reads them (the books and the inner strategy both see the capped
        weight); each flag is booked as a ``claim_capped`` / ``claim_jumped`` row.
    reject_non_finite
        Keep replies with NaN or inf arrays out of the aggregate (status ``rejected``, booked
        with the harm they would have done); ``False`` passes them to the inner strategy.
    nodes
        Which node holds which partition (:class:`strategies.intake.nodes.NodeDirectory`): share one
        between runs served one after another by the same engine so each node is queried
        once; ``None``: a directory of the run's own.
    query_timeout
        Seconds to wait for clients to report their partition ids (and, with flows, their
        inference gradients); > 0.
    query_batch
        The node directory's queries and, with flows, the idle clients' gradient queries go out at most
        this many at a time, each batch answered before the next is sent, within ``query_timeout`` in all;
        None (default): all at once.
        Flower's simulation engine scans every queued message for every node each time it polls
        (O(nodes × queued)), so asking 1,000 clients at once spends the server's time on that scan;
        a batch keeps the queue short. The flows are the same whatever the batch.
    query_data_key
        Send the train config's ``data-key`` with every gradient query too, so a client of an
        engine that serves several runs answers from the run's own data. False (default): the
        queries carry none.
    federated_evaluation
        False: no client-side evaluation rounds (the books value every round on the server's
        held-out data; the inner strategy's ``configure_evaluate`` is not called). Unlike
        ``fraction_evaluate=0.0`` on the inner strategy, Flower does not warn about it.
    """

    claims: ClaimReview | None = None
    reject_non_finite: bool = True
    nodes: NodeDirectory | None = None
    query_timeout: float = 120.0
    query_data_key: bool = False
    federated_evaluation: bool = True
    query_batch: int | None = None

    def node_directory(self) -> NodeDirectory:
        """The node directory given, or (None) a new one for the run."""
        return NodeDirectory() if self.nodes is None else self.nodes

    def __post_init__(self) -> None:
        if self.claims is not None and not isinstance(self.claims, ClaimReview):
            raise TypeError(f"claims: expected a strategies.intake.claims.ClaimReview (or None); got "
                            f"{type(self.claims).__name__}.")
        if not isinstance(self.reject_non_finite, bool):
            raise TypeError(f"reject_non_finite: expected True or False; got {self.reject_non_finite!r}.")
        if self.nodes is not None and not isinstance(self.nodes, NodeDirectory):
            raise TypeError(f"nodes: expected a strategies.intake.nodes.NodeDirectory (or None); got "
                            f"{type(self.nodes).__name__}.")
        object.__setattr__(self, "query_timeout", check_positive("query_timeout", self.query_timeout))
        if self.query_batch is not None:
            object.__setattr__(self, "query_batch", check_integer("query_batch", self.query_batch, 1))
        for name in ("query_data_key", "federated_evaluation"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name}: expected True or False; got {getattr(self, name)!r}.")


#: What a run calls with each committed round's rounds.csv row.
RoundCallback = Callable[[RoundRow], None]


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

    on_round: RoundCallback | None = None
    on_progress: Callable[[int, int, int], None] | None = None

    def __post_init__(self) -> None:
        for name, shape in (("on_round", "taking the round's RoundRow"), ("on_progress", "(round, evaluated, planned)")):
            value = getattr(self, name)
            if value is not None and not callable(value):
                raise TypeError(f"{name}: expected a callable {shape}, or None; got {type(value).__name__}.")


def __getattr__(name: str):
    """``BookSettings`` at its earlier import path, with a DeprecationWarning (its home is
    :mod:`strategies.book_settings`, the face :mod:`strategies`)."""
    if name == "BookSettings":
        import warnings

        from strategies.book_settings import BookSettings

        warnings.warn("strategies.valuing_settings.BookSettings moved to strategies.book_settings (or the face: "
                      "strategies); import it from there.", DeprecationWarning, stacklevel=2)
        return BookSettings
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
