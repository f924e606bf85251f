"""Cooperative games over client coalitions, with a coalition cache.

A game is a set of players (client ids) and a utility v: 2^N -> R. Every estimator in
fedvalue asks a :class:`CoalitionGame` for coalition values; the game evaluates each
distinct coalition at most once (cache keyed by bitmask) and counts the real utility
evaluations, so exact ADS, MC-ADS and LOO on one game share their work ([ADS],
Alg. 1 evaluates v on prefixes of permutations; all such prefixes are subsets, which
the cache deduplicates).

Bit ``k`` of a coalition mask stands for ``players[k]``.

A progress display can watch a game (:meth:`CoalitionGame.watch`): it is told the
coalitions evaluated so far and the estimators' planned total as they go, including
inside one large batch when the batch utility reports its own progress
(:meth:`CoalitionGame.advance`). Watching changes nothing that is computed.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any

import numpy as np

Utility = Callable[[frozenset], float]
BatchUtility = Callable[[Sequence[frozenset]], Sequence[float]]
#: Told (coalitions evaluated, coalitions planned) while a watched game is valued.
Progress = Callable[[int, int], None]


class NonFiniteValue(ValueError):
    """A utility gave a coalition a value that is not a finite number (``coalition`` says which)."""

    def __init__(self, message: str, coalition: frozenset) -> None:
        super().__init__(message)
        self.coalition = coalition


def _as_finite_float(value: Any, coalition: frozenset, source: str) -> float:
    """Return ``value`` as a finite float, or raise naming the utility and coalition."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"{source} must return a real number for every coalition; for coalition "
            f"{sorted(coalition, key=repr)} it returned {value!r} of type {type(value).__name__}. "
            "Return a float (for example accuracy on held-out data)."
        )
    value = float(value)
    if not math.isfinite(value):
        raise NonFiniteValue(
            f"{source} must return a finite number for every coalition; for coalition "
            f"{sorted(coalition, key=repr)} it returned {value}. Check the model or data "
            "behind the utility (a diverged aggregate gives NaN).", coalition
        )
    return value


class CoalitionGame:
    """A utility over coalitions of ``players`` with a bitmask-keyed cache.

    Parameters
    ----------
    utility
        Callable taking a ``frozenset`` of player ids and returning a float.
    players
        The players, in the order that defines their bits. Ids must be hashable and
        unique.
    batch_utility
        Optional callable taking a sequence of frozensets and returning one float per
        coalition, in order; used whenever several uncached coalitions are needed at
        once (batched model evaluation). When given, ``utility`` may be None.

    Attributes
    ----------
    num_evaluations : int
        Real utility evaluations so far (cache hits excluded).
    """

    def __init__(
        self,
        utility: Utility | None,
        players: Iterable[Hashable],
        *,
        batch_utility: BatchUtility | None = None,
    ) -> None:
        if utility is None and batch_utility is None:
            raise TypeError(
                "utility: expected a callable taking a frozenset of player ids and returning "
                "a float (or pass batch_utility=...); got None."
            )
        if utility is not None and not callable(utility):
            raise TypeError(
                f"utility: expected a callable taking a frozenset of player ids and returning "
                f"a float; got {type(utility).__name__}."
            )
        if batch_utility is not None and not callable(batch_utility):
            raise TypeError(
                f"batch_utility: expected a callable taking a sequence of frozensets; got "
                f"{type(batch_utility).__name__}."
            )
        players = tuple(players)
        index: dict[Hashable, int] = {}
        for player in players:
            try:
                hash(player)
            except TypeError as error:
                raise TypeError(
                    f"players: expected hashable player ids; got {player!r} of type "
                    f"{type(player).__name__}."
                ) from error
            if player in index:
                raise ValueError(
                    f"players: expected unique player ids; {player!r} appears more than once."
                )
            index[player] = len(index)
        self.players: tuple[Hashable, ...] = players
        self._index = index
        self._utility = utility
        self._batch_utility = batch_utility
        self._cache: dict[int, float] = {}
        self.num_evaluations = 0
        self._progress: Progress | None = None
        self._planned = 0
        self._reported = 0

    @property
    def num_players(self) -> int:
        return len(self.players)

    @property
    def full_mask(self) -> int:
        return (1 << len(self.players)) - 1

    def index_of(self, player: Hashable) -> int:
        """Bit position of ``player``."""
        try:
            return self._index[player]
        except (KeyError, TypeError):
            raise ValueError(
                f"player {player!r} is not a player of this game; its players are "
                f"{list(self.players)!r}."
            ) from None

    def mask_of(self, coalition: Iterable[Hashable]) -> int:
        """Bitmask of a coalition given as player ids."""
        mask = 0
        for player in coalition:
            mask |= 1 << self.index_of(player)
        return mask

    def coalition_of(self, mask: int) -> frozenset:
        """Player ids of a bitmask."""
        return frozenset(p for k, p in enumerate(self.players) if (mask >> k) & 1)

    def num_missing(self, masks: Iterable[int]) -> int:
        """Distinct masks of ``masks`` not evaluated yet."""
        return sum(1 for m in set(int(m) for m in masks) if m not in self._cache)

    @property
    def num_cached(self) -> int:
        """Distinct coalitions evaluated so far."""
        return len(self._cache)

    def value(self, mask: int) -> float:
        """v(coalition of ``mask``), evaluated at most once."""
        return float(self.values([mask])[0])

    def values(self, masks: Iterable[int]) -> np.ndarray:
        """v for each mask, in order; uncached coalitions go to the utility in one batch.

        Uncached masks are evaluated in order of first appearance, so a deterministic
        request gives a deterministic sequence of utility calls.
        """
        masks = [int(m) for m in masks]
        missing = list(dict.fromkeys(m for m in masks if m not in self._cache))
        if missing:
            self._evaluate(missing)
        return np.fromiter((self._cache[m] for m in masks), dtype=np.float64, count=len(masks))

    # -- progress ---------------------------------------------------------------------------

    def watch(self, progress: Progress | None) -> None:
        """Tell ``progress`` (evaluated, planned) from now on; counts start at 0 (None: stop)."""
        if progress is not None and not callable(progress):
            raise TypeError(f"progress: expected a callable taking (evaluated, planned) or None; got "
                            f"{type(progress).__name__}.")
        self._progress, self._planned, self._reported = progress, 0, 0

    def expect(self, count: int) -> None:
        """An estimator plans ``count`` more evaluations (an upper bound; it may stop sooner)."""
        self._planned += int(count)
        self._notify()

    def advance(self, count: int) -> None:
        """``count`` coalitions of the batch in progress are done (for batch utilities that
        report within a batch; the rest of the batch is counted when it returns)."""
        self._reported += int(count)
        self._notify()

    def finish(self) -> None:
        """The valuation is over: tell the watcher (evaluated, evaluated) and stop watching."""
        if self._progress is not None:
            self._progress(self._reported, self._reported)
        self.watch(None)

    def _notify(self) -> None:
        if self._progress is not None:
            self._progress(self._reported, max(self._planned, self._reported))

    def _evaluate(self, masks: list[int]) -> None:
        coalitions = [self.coalition_of(m) for m in masks]
        reported = self._reported
        values = self._evaluate_coalitions(coalitions)
        if self._progress is not None:  # what the utility did not report itself
            self.advance(max(0, len(masks) - (self._reported - reported)))
        # Commit only after every value passed its check: a bad batch leaves no half state.
        for mask, value in zip(masks, values):
            self._cache[mask] = value
        self.num_evaluations += len(masks)

    def _evaluate_coalitions(self, coalitions: list[frozenset]) -> list[float]:
        if self._batch_utility is not None:
            raw = list(self._batch_utility(coalitions))
            if len(raw) != len(coalitions):
                raise ValueError(
                    f"batch_utility must return one value per coalition; asked for "
                    f"{len(coalitions)}, got {len(raw)}."
                )
            source = "batch_utility"
        else:
            raw = []
            for coalition in coalitions:
                raw.append(self._utility(coalition))  # type: ignore[misc]
                if self._progress is not None:
                    self.advance(1)
            source = "utility"
        return [_as_finite_float(v, c, source) for v, c in zip(raw, coalitions)]

    def cached_values(self) -> dict[frozenset, float]:
        """Every evaluated coalition and its value (for ledgers and audits)."""
        return {self.coalition_of(m): v for m, v in self._cache.items()}


def as_game(utility: Utility | CoalitionGame, players: Sequence[Hashable]) -> CoalitionGame:
    """Use ``utility`` as a game over ``players``; an existing game keeps its cache.

    A :class:`CoalitionGame` passed in must hold every player of ``players``.
    """
    if isinstance(utility, CoalitionGame):
        for player in players:
            utility.index_of(player)
        return utility
    if not callable(utility):
        raise TypeError(
            f"utility: expected a callable taking a frozenset of player ids and returning a "
            f"float, or a fedvalue.CoalitionGame; got {type(utility).__name__}."
        )
    return CoalitionGame(utility, players)
