"""TracIn flows of a federated round from projected vectors ([RECIP] §4 at large p), as a round
record keeps them: k numbers per client instead of p.

Round t draws one k×p random projection R_t (:class:`fedvalue.scoring.projection.RandomProjection`,
E[R_tᵀR_t] = I; a count sketch by default, O(p) a vector where a dense R costs O(k·p)) from the
run's projection seed and t, and applies it to every inference gradient and every update of the
round: the record keeps R_t g_v for every client v and R_t Δ_u for every valid reply u, and the
flows are booked from them alone,

    F̂_t(u→v) = −p_u (R_t Δ_u)·(R_t g_v),

by the same O(n·k) core as :func:`fedvalue.flows.round_flows.round_flows` ([RECIP] §4, Eqs. 5–6).

**Error** ([RECIP] §4; Johnson–Lindenstrauss). F̂_t(u→v) is an unbiased estimate of
F_t(u→v) = −p_u Δ_u·g_v with variance p_u² (‖Δ_u‖²‖g_v‖² + (Δ_u·g_v)² − c Σ_i Δ_ui² g_vi²) / k
(c = 2 for the count sketch and Rademacher R_t, 0 for a Gaussian one: :mod:`fedvalue.scoring.projection`),
so its standard deviation is at most p_u ‖Δ_u‖ ‖g_v‖ √(2/k), and that of an inflow or outflow
(a sum of such flows) at most the sum of theirs. R_t is drawn afresh each round, so the errors of
different rounds are independent. For k ≥ p there is no projection (R_t = I): the flows are exact.

**Storage.** Projected gradients are kept as float32 (the bulk of a record: one per client per
round; a float32 model's own gradients are float32 already, and the rounding of a projected one,
relative 2^−24, is far below √(2/k)); projected updates as float64 (a handful per round). The flows
are those of the vectors as stored, live and in the audit alike.

**Seed.** R_t's column block j is drawn from ``SeedSequence(seed, spawn_key=(t, j))``
(:meth:`FlowsProjection.for_round`); a run's ``seed`` is derived from the run's own seed
(:meth:`FlowsProjection.of_run`), and the record and run.json note it with k, the kind and the block
width (:meth:`FlowsProjection.as_json`), so that an audit can draw R_t again and check every
recorded R_t Δ_u against the reply it was made from.
"""

from __future__ import annotations

import numbers
from collections.abc import Hashable, Mapping
from dataclasses import dataclass

import numpy as np

from fedvalue._checks import check_choice, check_integer
from fedvalue.flows.round_flows import RoundFlows, round_flows
from fedvalue.scoring.projection import RandomProjection, flatten

__all__ = ["FLOWS_PROJECTION_STREAM", "FlowsProjection", "project_round", "projected_round_flows"]

#: Mixed with the run's seed into the projection's seed, so that R_t is no stream the run draws elsewhere.
FLOWS_PROJECTION_STREAM = 0x666C6F77  # "flow"
#: The dtype a record keeps projected gradients (bulk) and projected updates (few) in.
GRADIENT_DTYPE, UPDATE_DTYPE = np.float32, np.float64


@dataclass(frozen=True)
class FlowsProjection:
    """The random projection of a run's flows: k (``dim``), the seed R_t is drawn from, its kind
    (:data:`fedvalue.scoring.projection.RandomProjection.KINDS`) and the width of its generated
    column blocks.

    Parameters
    ----------
    dim
        k, a positive integer: numbers kept per client and round (k ≥ p: no projection).
    seed
        A non-negative integer; round t's R_t is drawn from it and t (module docstring).
    kind
        What R_t is (:class:`fedvalue.scoring.projection.RandomProjection`); default the count
        sketch, the one of O(p) cost a vector.
    chunk_size
        Columns per generated block (None: ``RandomProjection.default_chunk_size(k, kind)``);
        part of what R_t is, so it is noted.
    """

    dim: int
    seed: int
    kind: str = "count-sketch"
    chunk_size: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "dim", check_integer("dim", self.dim))
        object.__setattr__(self, "seed", check_integer("seed", self.seed, 0))
        check_choice("kind", self.kind, RandomProjection.KINDS)
        if self.chunk_size is None:
            object.__setattr__(self, "chunk_size", RandomProjection.default_chunk_size(self.dim, self.kind))
        object.__setattr__(self, "chunk_size", check_integer("chunk_size", self.chunk_size))

    @classmethod
    def of_run(cls, dim: int, run_seed: int) -> FlowsProjection:
        """The projection of a run seeded ``run_seed`` keeping ``dim`` numbers per vector; its seed
        is drawn from ``SeedSequence([run_seed, FLOWS_PROJECTION_STREAM])``."""
        run_seed = check_integer("seed", run_seed, 0)
        seed = int(np.random.SeedSequence([run_seed, FLOWS_PROJECTION_STREAM]).generate_state(1, np.uint64)[0])
        return cls(dim=dim, seed=seed)

    def for_round(self, p: int, server_round: int) -> RandomProjection:
        """R_t for vectors of length ``p`` in round ``server_round`` (the identity when k ≥ p)."""
        server_round = check_integer("server_round", server_round, 0)
        sequence = np.random.SeedSequence(self.seed, spawn_key=(server_round,))
        return RandomProjection(p, self.dim, kind=self.kind, seed=sequence, chunk_size=self.chunk_size)

    def as_json(self) -> dict:
        """The projection as a record's settings and run.json hold it."""
        return {"dim": self.dim, "seed": self.seed, "kind": self.kind, "chunk_size": self.chunk_size}

    @classmethod
    def from_json(cls, written: object) -> FlowsProjection:
        """A projection from a record's or run.json's object (untrusted: ValueError naming the field)."""
        keys = {"dim", "seed", "kind", "chunk_size"}
        if not isinstance(written, Mapping) or set(written) != keys:
            shown = sorted(written) if isinstance(written, Mapping) else type(written).__name__
            raise ValueError(f"flows_projection: expected an object with the keys {sorted(keys)}; got {shown}.")
        for name in ("dim", "seed", "chunk_size"):
            if not isinstance(written[name], numbers.Integral) or isinstance(written[name], bool):
                raise ValueError(f"flows_projection.{name}: expected an integer; got {written[name]!r}.")
        try:
            return cls(**written)
        except ValueError as error:
            raise ValueError(f"flows_projection.{error}") from None


def project_round(projection: RandomProjection, start_arrays: Mapping[str, np.ndarray],
                  gradients: Mapping[Hashable, Mapping[str, np.ndarray]],
                  replies: Mapping[Hashable, Mapping[str, np.ndarray]]) -> tuple[dict, dict]:
    """(client -> R g_v as float32, client -> R Δ_u as float64) of one round.

    Every vector is flattened in the order of ``start_arrays``' keys (A_{t−1}), Δ_u = w_u − A_{t−1}
    in float64. The gradients are projected in one pass over R's blocks and the updates in
    another, so that an audit projecting the same updates repeats the same arithmetic.

    Raises
    ------
    ValueError
        A vector whose keys or length differ from A_{t−1}'s, or that is not finite.
    """
    keys = list(start_arrays)
    start = flatten(start_arrays, keys=keys, name="start arrays")
    if len(start) != projection.dim:
        raise ValueError(f"projection: expected a projection of dim {len(start)} (the model's size); got "
                         f"{projection.dim}.")
    rows = [flatten(g, keys=keys, name=f"gradients[{c!r}]") for c, g in gradients.items()]
    projected_g = projection.project_many(rows) if rows else np.zeros((0, projection.output_dim))
    del rows
    deltas = [flatten(w, keys=keys, name=f"arrays of client {c!r}") - start for c, w in replies.items()]
    projected_u = projection.project_many(deltas) if deltas else np.zeros((0, projection.output_dim))
    return ({c: row.astype(GRADIENT_DTYPE) for c, row in zip(gradients, projected_g)},
            {c: row.astype(UPDATE_DTYPE) for c, row in zip(replies, projected_u)})


def projected_round_flows(updates: Mapping[Hashable, np.ndarray], gradients: Mapping[Hashable, np.ndarray],
                          weights: Mapping[Hashable, float]) -> tuple[RoundFlows, frozenset]:
    """TracIn flows of a FedAvg step from projected vectors: F̂(u→v) = −p_u (RΔ_u)·(Rg_v) with
    p_u = n_u / Σ_{j∈updates} n_j (``weights``) — :func:`fedvalue.flows.round_flows.fedavg_round_flows`
    on the projected side. ``updates`` are R Δ_u of the clients making the step, ``gradients`` R g_v
    of every client with a gradient (the result's order). A client of ``updates`` without a gradient
    keeps its outflow and is computed with R g = 0; the second element names those clients (their
    inflow is unknown).

    Raises
    ------
    ValueError
        Vectors of different lengths, or non-finite ones; a client of ``updates`` without a weight.
    """
    missing_weights = [c for c in updates if c not in weights]
    if missing_weights:
        raise ValueError(f"weights: expected a weight for every client of updates; missing {missing_weights}.")
    total = float(sum(weights[c] for c in updates))
    grads = dict(gradients)
    missing = frozenset(c for c in updates if c not in grads)
    width = len(next(iter(updates.values()))) if updates else None
    for client in missing:
        grads[client] = np.zeros(width)
    if not grads:
        raise ValueError("gradients: expected the projected gradient of at least one client; got none.")
    return round_flows(dict(updates), grads, weights={c: weights[c] / total for c in updates}), missing
