"""An acceptance policy from the defences: aggregate one update per near-duplicate cluster and no
free-rider's, so the trajectory is not bought either.

The defences' book (:mod:`fedvalue.rounds.kinds.defences`) values a cluster of near-duplicates as
one player and free-riders at 0, but the realized step still weighs every copy (k copies move
FedAvg's mean k times; under FedMedian they can be its majority) and lets free-riders dilute it,
so the next rounds start where the attacker pushed them. With :class:`RepresentativesOnly` the
inner strategy aggregates only the clusters' representatives (each cluster's first member), the
free-riders left out: A_t = Agg(R), which is the defended game's grand coalition, so the defended
values add up to U(A_t) − U(A_{t−1}) again. The round record notes the policy
(``settings.acceptance``); the audit derives the accepted clients again from the record
(:mod:`fedvalue.audit.references`). Every valid reply is still valued and booked.
"""

from __future__ import annotations

from fedvalue.rounds.defences.quotient import REPRESENTATIVES, accepted_representatives
from fedvalue.rounds.defences.settings import DefenceSettings
from strategies.acceptance_policy import REPLIES, AcceptInputs, Acceptance


class RepresentativesOnly(Acceptance):
    """Aggregate the near-duplicate clusters' representatives only, free-riders left out (module docstring).

    The strategy must book the same defences (``BookSettings(defences=settings)``): the policy
    reads the previous global model the defences keep.
    """

    books_selection = True
    needs = frozenset({REPLIES})

    def __init__(self, settings: DefenceSettings | None = None) -> None:
        settings = DefenceSettings() if settings is None else settings
        if not isinstance(settings, DefenceSettings):
            raise TypeError(f"settings: expected a fedvalue.rounds.defences.settings.DefenceSettings; got "
                            f"{type(settings).__name__}.")
        self.settings = settings

    #: The round record's settings name the rule, so the audit derives the accepted clients again.
    recorded_acceptance = REPRESENTATIVES

    def accept(self, round: AcceptInputs) -> set:
        start, arrays, weights, previous = round.replies()
        return accepted_representatives(start, {c: arrays[c] for c in round.clients}, weights, previous,
                                        self.settings)

    def __repr__(self) -> str:
        return f"RepresentativesOnly({self.settings!r})"
