"""Within-round leave-one-out ([ADS], App. C.2).

    ψ(i) = v(N) − v(N ∖ {i}),   i ∈ N,

n + 1 evaluations. In FL, N = I_t and v is the round game conditioned on A_{t−1}
(the Federated LOO of wang2020principled); on a shared
:class:`~fedvalue.CoalitionGame` every coalition it needs is already cached after
exact ADS.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np
import pandas as pd

from fedvalue.valuation.ads import validate_groups
from fedvalue.valuation.game import CoalitionGame, Utility, as_game
from fedvalue.valuation.result import ValuationResult


def loo(utility: Utility | CoalitionGame, players: Sequence[Hashable]) -> ValuationResult:
    """Leave-one-out value of each player: v(N) − v(N ∖ {i}).

    Parameters
    ----------
    utility
        Callable taking a frozenset of player ids and returning a float, or a
        :class:`~fedvalue.CoalitionGame` whose cache is shared.
    players
        N, a non-empty sequence of unique player ids.
    """
    (players,) = validate_groups([players])
    game = as_game(utility, players)
    evaluations_before = game.num_evaluations
    full = game.mask_of(players)
    masks = [full] + [full & ~(1 << game.index_of(p)) for p in players]
    game.expect(game.num_missing(masks))  # for a progress display watching the game
    utilities = game.values(masks)
    index = pd.Index(list(players), dtype=object, name="player")
    return ValuationResult(
        method="loo",
        values=pd.Series(utilities[0] - utilities[1:], index=index, name="loo"),
        stderr=pd.Series(np.zeros(len(players)), index=index, name="stderr"),
        num_evaluations=game.num_evaluations - evaluations_before,
        groups=(players,),
        prefix_utilities=(float(utilities[0]),),
        efficiency_gaps=pd.Series([], dtype=np.float64, name="gap"),
    )
