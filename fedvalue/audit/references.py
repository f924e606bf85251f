"""The audit's check of what a round record keeps to compare replies with (its ``references``):
the defences' free-rider test reads A_{t−2} from the record (:mod:`fedvalue.rounds.kinds.defences`),
so a record could flag an honest client, or spare a free-rider, by keeping a made-up "previous"
model. A_{t−2} must be the state round t−1 started from, bit for bit, and a round after the
first whose defences run the replay test must keep it. A round whose inner strategy aggregated
only the defences' representatives (``settings.acceptance``, :mod:`strategies.policies.representatives`)
must have accepted exactly the representatives the record's replies give."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from fedvalue.rounds.defences.quotient import REPRESENTATIVES, accepted_representatives
from fedvalue.rounds.defences.settings import DefenceSettings
from fedvalue.rounds.kinds.defences import PREVIOUS_GLOBAL
from fedvalue.run.archive import RoundRecord
from fedvalue.schema import Status


def _same(left: Mapping[str, np.ndarray], right: Mapping[str, np.ndarray]) -> bool:
    return list(left) == list(right) and all(
        np.shape(left[k]) == np.shape(right[k]) and np.array_equal(left[k], right[k]) for k in left)


def reference_problems(record: RoundRecord, previous: RoundRecord | None) -> list[str]:
    """Where round t's references disagree with the run; ``previous`` is round t−1's record
    (None when there is none, or it was not read: only a first round is then judged)."""
    t, problems = record.round, []
    unknown = sorted(set(record.references) - {PREVIOUS_GLOBAL})
    if unknown:
        problems.append(f"round {t}: its record keeps references no book reads: {unknown[:4]}")
    kept = record.references.get(PREVIOUS_GLOBAL)
    defences = record.settings.defences
    if kept is not None and t == 1:
        problems.append(f"round {t}: its record keeps a previous global model, but no round came before it")
    elif kept is not None and previous is not None and not _same(kept, previous.start_arrays):
        problems.append(f"round {t}: the previous global model its record keeps is not the state round {t - 1} "
                        "started from")
    elif kept is None and t > 1 and defences is not None and _needs_history(defences):
        problems.append(f"round {t}: its defences test replies against the previous global model, but its record "
                        "keeps none")
    return problems + acceptance_problems(record)


def acceptance_problems(record: RoundRecord) -> list[str]:
    """Where a round that aggregated the representatives only accepted others than its replies give."""
    if record.settings.acceptance != REPRESENTATIVES:
        return []
    try:
        settings = DefenceSettings.from_meta(record.settings.defences)
    except (TypeError, ValueError) as error:
        return [f"round {record.round}: it aggregated the defences' representatives, but its defence settings do "
                f"not read ({error})"]
    ok = [e.client_id for e in record.entries if e.status == Status.OK and e.client_id in record.replies]
    weights = record.weights
    expected = accepted_representatives(record.start_arrays, {c: record.replies[c] for c in ok},
                                        {c: weights[c] for c in ok}, record.references.get(PREVIOUS_GLOBAL),
                                        settings) if ok else set()
    if expected != set(record.accepted):
        return [f"round {record.round}: the defences' representatives are {sorted(expected, key=str)}; the record "
                f"accepted {sorted(record.accepted, key=str)}"]
    return []


def _needs_history(defences: object) -> bool:
    """Whether recorded defence settings run the replay test (unreadable settings are the books' finding)."""
    try:
        return DefenceSettings.from_meta(defences).needs_history
    except (TypeError, ValueError):
        return False
