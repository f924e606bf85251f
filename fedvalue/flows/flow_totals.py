"""Flows accumulated over rounds, and their reciprocity ([RECIP] Eqs. 1–2, Def. 2.1, §5.1).

A :class:`FlowTotals` adds up each round's :class:`fedvalue.flows.round_flows.RoundFlows` per client
(inflow, outflow, self) and reports reciprocity on the totals, or after every round on the
cumulative flows ([RECIP] Fig. 1c).
"""

from __future__ import annotations

import numbers
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from fedvalue.flows.round_flows import RoundFlows, _unique_clients, round_flows, tracin_round_flows
from fedvalue.scoring.projection import Vector
from fedvalue.flows.reciprocity_measures import (
    DEFAULT_P,
    ReciprocityReport,
    reciprocity,
    reciprocity_over_rounds,
    reciprocity_ratio,
)

@dataclass
class _Record:
    round: int
    positions: np.ndarray
    flows: RoundFlows


class FlowTotals:
    """Flows accumulated over rounds: per-round frames, totals, summary and reciprocity.

    Parameters
    ----------
    clients
        Optional fixed population. Then a round naming another client raises ValueError
        and clients that never appear are reported with zero flows. Default: the
        population grows in order of first appearance.
    keep_rounds
        Keep every round's flows (for :meth:`rounds_frame` and
        :meth:`reciprocity_over_rounds`); False keeps only running totals.

    Examples
    --------
    >>> book = FlowTotals()
    >>> book.add_round({"a": [1.0, 0.0]}, {"a": [0.0, 1.0], "b": [-1.0, 0.0]})  # doctest: +ELLIPSIS
    RoundFlows(...)
    >>> float(book.summary().loc["b", "inflow"])
    1.0
    """

    def __init__(self, clients: Iterable[Hashable] | None = None, *, keep_rounds: bool = True) -> None:
        self._fixed = clients is not None
        self._clients: list[Hashable] = list(_unique_clients("clients", clients)) if clients is not None else []
        self._position = {c: i for i, c in enumerate(self._clients)}
        n = len(self._clients)
        self._inflow, self._outflow, self._self = np.zeros(n), np.zeros(n), np.zeros(n)
        self._rounds_seen, self._rounds_trained = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
        self.keep_rounds = bool(keep_rounds)
        self._records: list[_Record] = []
        self._last_round: int | None = None
        self._last_clients: tuple | None = None
        self._last_positions: np.ndarray | None = None
        self._count = 0
        #: Σ over rounds of RoundFlows.total (first-order reduction of the summed inference loss).
        self.total = 0.0

    @property
    def clients(self) -> tuple[Hashable, ...]:
        return tuple(self._clients)

    @property
    def num_rounds(self) -> int:
        """Rounds added so far."""
        return self._count

    def _positions(self, clients: tuple) -> np.ndarray:
        if clients == self._last_clients and self._last_positions is not None:
            return self._last_positions
        new = [c for c in clients if c not in self._position]
        if new and self._fixed:
            raise ValueError(f"flows: unknown client(s) {new[:10]}; the book's clients are {self._clients[:10]}...")
        for c in new:
            self._position[c] = len(self._clients)
            self._clients.append(c)
        if new:
            grow = len(new)
            self._inflow, self._outflow, self._self = (np.concatenate([a, np.zeros(grow)])
                                                        for a in (self._inflow, self._outflow, self._self))
            self._rounds_seen, self._rounds_trained = (np.concatenate([a, np.zeros(grow, dtype=np.int64)])
                                                       for a in (self._rounds_seen, self._rounds_trained))
        positions = np.array([self._position[c] for c in clients], dtype=np.intp)
        self._last_clients, self._last_positions = clients, positions
        return positions

    def add(self, flows: RoundFlows, *, round: int | None = None) -> RoundFlows:
        """Book one round's flows.

        Parameters
        ----------
        flows
            From :func:`round_flows` or :func:`tracin_round_flows`.
        round
            Round number; default the previous one + 1 (first: 1). Must increase.

        Returns
        -------
        RoundFlows
            ``flows``, for chaining.
        """
        if not isinstance(flows, RoundFlows):
            raise TypeError(f"flows: expected a RoundFlows; got {type(flows).__name__}.")
        if round is None:
            round = 1 if self._last_round is None else self._last_round + 1
        if isinstance(round, bool) or not isinstance(round, numbers.Integral):
            raise TypeError(f"round: expected an integer; got {round!r}.")
        if self._last_round is not None and round <= self._last_round:
            raise ValueError(f"round: expected a round after {self._last_round}; got {round}.")
        positions = self._positions(flows.clients)
        self._inflow[positions] += flows.inflow
        self._outflow[positions] += flows.outflow
        self._self[positions] += flows.self_influence
        self._rounds_seen[positions] += 1
        self._rounds_trained[positions] += flows.trained
        self.total += flows.total
        if self.keep_rounds:
            self._records.append(_Record(int(round), positions, flows))
        self._last_round = int(round)
        self._count += 1
        return flows

    def add_round(self, updates: Mapping[Hashable, Vector], gradients: Mapping[Hashable, Vector], *,
                  round: int | None = None, **options) -> RoundFlows:
        """:func:`round_flows` (``options``: weights, keys, projection), then :meth:`add`."""
        return self.add(round_flows(updates, gradients, **options), round=round)

    def add_tracin_step(self, train_gradients: np.ndarray, inference_gradients: np.ndarray, *, step_size: float,
                        round: int | None = None, **options) -> RoundFlows:
        """:func:`tracin_round_flows` (``options``: owners, projection), then :meth:`add`."""
        return self.add(tracin_round_flows(train_gradients, inference_gradients, step_size=step_size, **options),
                        round=round)

    @property
    def balance_gap(self) -> float:
        """Σ inflow − Σ outflow over all clients and rounds (zero up to rounding)."""
        return float(self._inflow.sum() - self._outflow.sum())

    def rounds_frame(self) -> pd.DataFrame:
        """One row per round and client: ``round, client, inflow, outflow, self, trained``."""
        if not self.keep_rounds:
            raise ValueError("keep_rounds: this book was made with keep_rounds=False; per-round flows were not kept.")
        columns = ["round", "client", "inflow", "outflow", "self", "trained"]
        if not self._records:
            return pd.DataFrame(columns=columns)
        return pd.DataFrame({
            "round": np.concatenate([np.full(len(r.positions), r.round) for r in self._records]),
            "client": [c for r in self._records for c in r.flows.clients],
            "inflow": np.concatenate([r.flows.inflow for r in self._records]),
            "outflow": np.concatenate([r.flows.outflow for r in self._records]),
            "self": np.concatenate([r.flows.self_influence for r in self._records]),
            "trained": np.concatenate([r.flows.trained for r in self._records]),
        }, columns=columns)

    def totals(self) -> pd.DataFrame:
        """Per client, summed over rounds: ``inflow, outflow, self, rounds, rounds_trained``."""
        index = pd.Index(list(self._clients), name="client", tupleize_cols=False)
        return pd.DataFrame({
            "inflow": self._inflow, "outflow": self._outflow, "self": self._self,
            "rounds": self._rounds_seen, "rounds_trained": self._rounds_trained,
        }, index=index)

    def summary(self) -> pd.DataFrame:
        """Totals plus ``balance`` = inflow − outflow and ``ratio`` = r_u (Def. 2.1)."""
        frame = self.totals()
        frame.insert(3, "balance", frame["inflow"] - frame["outflow"])
        frame.insert(4, "ratio", reciprocity_ratio(frame["inflow"].to_numpy(), frame["outflow"].to_numpy()))
        return frame

    def reciprocity(self, p: float = DEFAULT_P) -> ReciprocityReport:
        """:func:`fedvalue.flows.reciprocity_measures.reciprocity` of the total inflows and outflows."""
        frame = self.totals()
        return reciprocity(frame["inflow"], frame["outflow"], p=p)

    def reciprocity_over_rounds(self, p: float = DEFAULT_P) -> pd.DataFrame:
        """Reciprocity on the cumulative flows after each round ([RECIP] Fig. 1c)."""
        return reciprocity_over_rounds(self.rounds_frame(), p=p)
