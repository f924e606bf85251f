"""The valuing strategy's side of the defences (:mod:`fedvalue.rounds.defences`): the round record
notes their settings and keeps the previous global model A_{t−2}, which the free-rider test
compares each update with (the audit checks it is the start of the round before).

The strategy remembers each round's start; a resumed run takes A_{k−1} from round k's saved
record (the round before the first it runs), so its records are the uninterrupted run's."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from fedvalue.rounds.defences.settings import DefenceSettings
from fedvalue.rounds.kinds.defences import PREVIOUS_GLOBAL
from fedvalue.run.archive import RoundRecord, read_round_record, record_path


class DefenceRounds:
    """What a run with defences adds to each round's record.

    Parameters
    ----------
    settings
        The defences (:class:`fedvalue.rounds.defences.settings.DefenceSettings`).
    """

    def __init__(self, settings: DefenceSettings) -> None:
        if not isinstance(settings, DefenceSettings):
            raise TypeError(f"defences: expected a fedvalue.rounds.defences.settings.DefenceSettings (or None); got "
                            f"{type(settings).__name__}.")
        self.settings = settings
        self._previous: Mapping[str, np.ndarray] | None = None
        self._current: Mapping[str, np.ndarray] | None = None

    def settings_note(self) -> dict:
        """The defences' settings as the round record's settings note them."""
        return self.settings.as_meta()

    def resume_from(self, run_dir, committed_rounds: int) -> None:
        """A resumed run's first round: its A_{t−2} is the start of the last committed round."""
        if committed_rounds > 0 and self.settings.needs_history:
            self._current = read_round_record(record_path(run_dir, committed_rounds)).start_arrays

    def start_round(self, start_arrays: Mapping[str, np.ndarray]) -> None:
        """A round starts from ``start_arrays`` (A_{t−1}); the last round's start becomes A_{t−2}."""
        self._previous, self._current = self._current, start_arrays

    def round_replies(self, start_arrays: Mapping[str, np.ndarray], ok) -> tuple:
        """(A_{t−1}, client -> arrays, client -> weight, A_{t−2} or None) of the round's valid replies,
        for an acceptance policy that reads them (:mod:`strategies.policies.representatives`)."""
        previous = self._previous if self.settings.needs_history else None
        return start_arrays, {r.client_id: r.arrays for r in ok}, {r.client_id: r.weight for r in ok}, previous

    def note(self, record: RoundRecord) -> RoundRecord:
        """``record`` with A_{t−2} among its references (when the tests need it and there was a round before)."""
        if self.settings.needs_history and self._previous is not None:
            record.references[PREVIOUS_GLOBAL] = dict(self._previous)
        return record
