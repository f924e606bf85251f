"""Replies whose inclusion makes the round's utility non-finite: rejected, not fatal.

The intake rejects arrays that are not finite or too large to aggregate
(:mod:`strategies.reply_checks`). A finite, aggregable reply can still make a coalition's
state score as no number: a deep model whose products overflow, or a loss utility whose
logits do (v_t(S) = U(Agg_t(S)) = −inf). The round game needs a number for every coalition,
so such a reply is rejected like a NaN one (booked with the harm it would have done, None
when that is no number either) and the round is valued without it: the coalitions without
it are those of a round without it. Which reply: among the members of the coalition that
scored as no number, the first whose own arrays score so, else the one farthest from
A_{t−1} (largest max |w − A_{t−1}|); repeated until the round values.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from fedvalue.schema import Status
from fedvalue.valuation.game import NonFiniteValue
from fedvalue.valuation.round_game import ArraysUtility, RoundValuation
from strategies.replies import ClientReply


def value_screened(value: Callable[[], RoundValuation], records: Sequence[ClientReply],
                   utility: ArraysUtility, start_arrays: Mapping[str, np.ndarray]) -> RoundValuation | None:
    """``value()`` of the round over its valid ``records``, rejecting (in place, with a reason) each
    reply that makes a coalition score as no number (module docstring) and valuing again; None
    when no valid reply is left. A non-finite v_t(∅) = U(A_{t−1}) is no reply's doing: raised."""
    while True:
        ok = [r for r in records if r.status == Status.OK]
        if not ok:
            return None
        try:
            return value()
        except NonFiniteValue as error:
            culprit = _culprit([r for r in ok if r.client_id in error.coalition], utility, start_arrays)
            if culprit is None:
                raise
            culprit.status = Status.REJECTED
            culprit.error = (f"arrays: its inclusion makes the round's utility non-finite (coalition "
                             f"{sorted(error.coalition, key=str)[:6]} scores no number)")


def _culprit(members: list[ClientReply], utility: ArraysUtility,
             start_arrays: Mapping[str, np.ndarray]) -> ClientReply | None:
    if not members:
        return None
    for member in members:
        with np.errstate(all="ignore"):
            if not np.isfinite(float(utility(member.arrays))):
                return member

    def distance(member: ClientReply) -> float:
        return max((float(np.max(np.abs(np.asarray(v, dtype=np.float64) - start_arrays[k]), initial=0.0))
                    for k, v in member.arrays.items() if np.asarray(v).dtype.kind == "f"), default=0.0)

    return max(members, key=distance)
