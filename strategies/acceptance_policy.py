"""What an acceptance policy is (:class:`Acceptance`) and what a round gives it (:class:`AcceptInputs`).

Every sampled client trains and the round is valued; an acceptance policy then decides which of the
valid replies the inner strategy aggregates, so the realized state moves with the accepted clients
([ADS] §6.2, App. C.2). A policy declares everything the valuing strategy reads of it, each with a
default, and decides from one :class:`AcceptInputs`: the round's values and, read lazily and only
when the policy ``needs`` them, what the run's books offer (:data:`OUTFLOWS`, :data:`FAIRNESS`,
:data:`REPLIES`; each offered by a book's hook, :class:`strategies.round_hook.RoundHook`). The
shipped policies are in :mod:`strategies.policies`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass, field

from fedvalue.valuation.round_game import RoundValuation

#: What a round's books can offer a policy beside its values, by name (:class:`AcceptInputs`).
OUTFLOWS, FAIRNESS, REPLIES = "outflows", "fairness", "replies"


@dataclass(frozen=True)
class AcceptInputs:
    """What a round gives its acceptance policy: the round, its valid replies (``clients``, in reply
    order), the round game's valuation and the run's seed, and what the run's books ``offered``
    (name -> a function computing it, called at most once and only when the policy reads it)."""

    server_round: int
    clients: Sequence[Hashable]
    valuation: RoundValuation | None
    seed: int
    offered: Mapping[str, Callable[[], object]] = field(default_factory=dict)
    _read: dict = field(default_factory=dict, repr=False, compare=False)

    def values(self, method: str) -> dict[Hashable, float]:
        """client -> its within-round value by ``method`` (``"ads"``, ``"loo"``), valid replies only."""
        values = self.valuation.results[method].values
        return {c: float(values[c]) for c in self.clients}

    def read(self, name: str) -> object:
        """What the books offered under ``name``, computed once; ValueError when none offers it."""
        if name not in self._read:
            if name not in self.offered:
                raise ValueError(f"acceptance: the policy reads {name!r}, which no book of this run offers (it offers "
                                 f"{sorted(self.offered)}).")
            self._read[name] = self.offered[name]()
        return self._read[name]

    def outflows(self) -> Mapping[Hashable, float]:
        """outflow_u of every valid reply as if all were aggregated (TracIn flows' offer)."""
        return self.read(OUTFLOWS)

    def fairness(self) -> Mapping[Hashable, float]:
        """The fairness scores the run's fairness rule acts on (the fairness books' offer)."""
        return self.read(FAIRNESS)

    def replies(self) -> tuple:
        """(A_{t−1}, client -> arrays, client -> weight, A_{t−2} or None) of the valid replies (the defences' offer)."""
        return self.read(REPLIES)


class Acceptance:
    """An acceptance policy: which valid replies of a round the inner strategy aggregates.

    Everything the valuing strategy reads of a policy is declared here with its default; a
    policy overrides what differs and :meth:`accept`.

    Attributes
    ----------
    books_selection
        Whether the ledger books a ``selected`` row (1/0) per client and round.
    needs
        What the policy reads of :class:`AcceptInputs` beside the values (``"outflows"``,
        ``"fairness"``, ``"replies"``); the strategy refuses a run whose books offer it none.
    fairness_rule
        The fairness rule the policy applies ([FAIRIJ] drop-K or I-JACK, as the round record
        saves it), so that the fairness books score by it and the audit derives it again.
    weighting
        The value-weighting rule (:mod:`fedvalue.rounds.kinds.value_weights`) that sets the
        accepted replies' weights from their values.
    recorded_acceptance
        The name under which the round record notes the policy where the audit derives its
        choice again from the record (``"representatives"``); None: the books name it.
    """

    books_selection: bool = False
    needs: Collection[str] = frozenset()
    fairness_rule: Mapping | None = None
    weighting: Mapping | None = None
    recorded_acceptance: str | None = None

    def check(self, *, methods: Sequence[str], flows: bool, clients_per_round: int | None) -> None:
        """Refuse a policy the strategy cannot honour (ValueError naming the parameter)."""

    def accept(self, round: AcceptInputs) -> set:
        """The accepted clients among ``round.clients``."""
        raise NotImplementedError(f"{type(self).__name__}.accept: an acceptance policy decides which clients of "
                                  "round.clients are aggregated.")


class AcceptAll(Acceptance):
    """Every valid reply is aggregated (plain valuation, nothing booked as selected): the default policy."""

    def accept(self, round: AcceptInputs) -> set:
        return set(round.clients)
