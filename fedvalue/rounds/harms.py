"""The harm a rejected reply would have done: what its round books in place of a value.

A reply with NaN/inf arrays is kept out of the aggregate; its rows book
U(Agg(accepted ∪ {i})) − U(Agg(accepted)), on the run's utility (valuation rows) or on the
fairness objective (fairness rows), None when that is not a number.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Mapping, Sequence

import numpy as np

from fedvalue.valuation.round_game import Aggregator, Arrays, ArraysUtility, weighted_mean
from fedvalue.schema import ClientEntry, Status


def rejected_harms(entries: Sequence[ClientEntry], accepted: Collection[Hashable], *,
                   start_arrays: Mapping[str, np.ndarray], replies: Mapping[Hashable, Arrays],
                   utility: ArraysUtility, aggregate: Aggregator | None = None) -> dict:
    """U(Agg(accepted ∪ {i})) − U(Agg(accepted)) for every rejected client i (None when not
    finite); the accepted clients in reply order, i last."""
    rejected = [e for e in entries if e.status == Status.REJECTED]
    if not rejected:
        return {}
    weights = {e.client_id: e.weight for e in entries}
    kept = [e.client_id for e in entries if e.status == Status.OK and e.client_id in accepted]

    def utility_of(members: list) -> float:
        if not members:
            return float(utility(start_arrays))
        with np.errstate(all="ignore"):
            arrays = (weighted_mean([replies[c] for c in members], [weights[c] for c in members])
                      if aggregate is None else aggregate(members))
            return float(utility(arrays))

    base = utility_of(kept)
    harms = {}
    for entry in rejected:
        with np.errstate(all="ignore"):
            value = utility_of(kept + [entry.client_id]) - base
        harms[entry.client_id] = value if np.isfinite(value) else None
    return harms
