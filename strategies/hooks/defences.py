"""The valuing strategy's side of the defences, the hook of :mod:`fedvalue.rounds.kinds.defences`: the
round settings note their settings and the round record keeps the previous global model A_{t−2},
which the free-rider test compares each update with (the audit checks it is the start of the round
before); a policy that aggregates the defences' representatives reads the round's replies through it.

The hook remembers each round's start; a resumed run takes A_{k−1} from round k's saved record
(the round before the first it runs), so its records are the uninterrupted run's."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from fedvalue.rounds.defences.settings import DefenceSettings
from fedvalue.rounds.kinds.defences import PREVIOUS_GLOBAL
from fedvalue.run.archive import read_round_record, record_path
from fedvalue.valuation.settings import RENORMALIZED
from strategies.round_hook import HookContext, RoundHook, RoundView
from strategies.acceptance_policy import REPLIES


class DefenceHook(RoundHook):
    """What a run with defences adds to each round (module docstring).

    Parameters
    ----------
    settings
        The defences (:class:`fedvalue.rounds.defences.settings.DefenceSettings`).
    """

    offers = frozenset({REPLIES})

    def __init__(self, settings: DefenceSettings) -> None:
        if not isinstance(settings, DefenceSettings):
            raise TypeError(f"defences: expected a fedvalue.rounds.defences.settings.DefenceSettings (or None); got "
                            f"{type(settings).__name__}.")
        self.defences = settings
        self._previous: Mapping[str, np.ndarray] | None = None
        self._current: Mapping[str, np.ndarray] | None = None

    def settings(self) -> dict:
        """The defences' settings as the round settings note them."""
        return {"defences": self.defences.as_meta()}

    def resume_from(self, run_dir, committed_rounds: int) -> None:
        """A resumed run's first round: its A_{t−2} is the start of the last committed round."""
        if committed_rounds > 0 and self.defences.needs_history:
            self._current = read_round_record(record_path(run_dir, committed_rounds)).start_arrays

    def start_round(self, arrays, start_arrays: Mapping[str, np.ndarray], idle) -> None:
        """A round starts from ``start_arrays`` (A_{t−1}); the last round's start becomes A_{t−2}."""
        self._previous, self._current = self._current, start_arrays

    def note(self, round: RoundView) -> dict:
        """A_{t−2} among the record's references (when the tests need it and there was a round before)."""
        if self.defences.needs_history and self._previous is not None:
            return {"references": {PREVIOUS_GLOBAL: dict(self._previous)}}
        return {}

    def offer(self, round: RoundView, inputs) -> dict:
        """(A_{t−1}, client -> arrays, client -> weight, A_{t−2} or None) of the round's valid replies,
        for an acceptance policy that reads them (:mod:`strategies.policies.representatives`)."""
        previous = self._previous if self.defences.needs_history else None
        ok = list(round.ok)
        return {REPLIES: lambda: (round.start_arrays, {r.client_id: r.arrays for r in ok},
                                  {r.client_id: r.weight for r in ok}, previous)}


def defence_hook(context: HookContext) -> DefenceHook | None:
    """The run's defences hook (None without defences); ValueError under a coalition rule other than the
    renormalized one, for which the defended (quotient) game is defined."""
    if context.books.defences is None:
        return None
    if context.coalition_rule != RENORMALIZED:
        raise ValueError(f"defences: the defended game values clusters under the renormalized coalition rule; got "
                         f"coalition_rule={context.coalition_rule!r}: value with 'renormalized' or book no defences.")
    return DefenceHook(context.books.defences)
