"""Coalition states scored as linear combinations of a round's basis states.

Every coalition of the FedAvg family is a state s_c = Σ_k C[c, k] B_k of fixed basis states
(basis = A_{t−1} and the clients' models, C[c, i] = n_i / Σ_{j∈S} n_j). When the model's
first parametrized layer is linear in its parameters θ = (W, b) — ``nn.Linear``,
``nn.Conv1d/2d/3d`` (any stride, padding, dilation, groups, padding mode), ``nn.Embedding``
(without ``max_norm``), after parameter-free modules such as Flatten or Unflatten — its
output f(x; θ) is linear in θ for fixed inputs x, so

    f(x; Σ_k C[c, k] θ_k) = Σ_k C[c, k] f(x; θ_k),

and the outputs f(x; θ_k) are computed once per round (once per client per held-out
batch); every coalition pays for a K-term combination and the layers after the first.
A batch holding most coalitions (exact enumeration) with a first layer of flat outputs
and a tail of Linear layers and activations (every MLP) is factored over two halves of
the basis (:mod:`fedvalue.scoring.coalition_halves`), so each coalition's first-layer output is
one two-term sum of precomputed half combinations, formed with the first ReLU in one pass
over rows that are in cache. Other models combine whole states.
Built by :meth:`fedvalue.scoring.torch_utilities.TorchModelUtility.linear`; values equal the plain path's
(near ties re-scored there, :mod:`fedvalue.scoring._scoring`).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping, Sequence

import numpy as np
import torch

from fedvalue.scoring._scoring import FastScores, scoring
from fedvalue.scoring.coalition_halves import Halves, split_rows

#: relu(x + alpha y) in one pass (ATen's fused kernel; the same float result as add then relu).
ADD_RELU = getattr(torch.ops.aten, "_add_relu", None)

#: Modules without parameters that may precede the first linear layer.
PARAMETER_FREE = (torch.nn.Flatten, torch.nn.Unflatten, torch.nn.Identity, torch.nn.Dropout)
#: First layers whose output is linear in (weight, bias) for fixed inputs (exact types: a
#: subclass may compute something else). Embedding only without ``max_norm``, which rescales
#: the looked-up rows (not linear).
FIRST_LAYERS = (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d, torch.nn.Embedding)


class LinearStates:
    """Scores states s_c = Σ_k C[c, k] B_k of fixed basis states B_k.

    Built by :meth:`TorchModelUtility.linear`. The basis is stacked once; when the
    model starts with a linear layer, its outputs on the held-out data are computed
    once for all K basis states (one matmul per held-out batch, K × examples × width
    floats kept for the round) and each state then costs only the layers after it.
    Coefficient rows are combined ``chunk`` states at a time by one matmul. A tail that
    is a chain of Linear layers and elementwise activations (every MLP) runs without
    ``functional_call``: state by state, one ``addmm`` per layer into reused buffers and
    activations in place, the chunk scored in one vectorized pass; other tails
    go through ``functional_call`` state by state.
    """

    #: States combined per matmul (memory: chunk × batch_size × first-layer width floats).
    chunk = 16
    #: Most bytes of one chunk's combined first-layer outputs: a convolution's outputs are
    #: several times its inputs, so its chunks hold fewer states (the MLP's 16 × 4,096 × 200
    #: floats, 52 MB, are within it).
    chunk_bytes = 64 << 20
    #: Most left directions of a factored batch (:meth:`_half_scores`): their first-layer
    #: products for ``block_rows`` rows should fit in the last-level cache together
    #: (32 × 1,024 × 200 floats = 26 MB for the digits MLP).
    left_directions = 32
    #: Held-out rows walked at a time by the factored path (measured on 2 CPU cores with a
    #: 32 MB cache: 1,024 ran the 200×200 tail at its matmuls' speed, 512 and 2,048 slower).
    block_rows = 1024
    #: Fewer rows per half direction than this: the chunked combination is cheaper.
    rows_per_direction = 4
    #: Most bytes of first-layer outputs kept for the whole round (K basis states × held-out
    #: rows × the per-example output size; a convolution's outputs are several times its
    #: inputs). Past it they are computed again per call and held-out batch, and not kept.
    head_cache_bytes = 1 << 30

    def __init__(self, utility, basis: Sequence[Mapping[str, np.ndarray]]) -> None:
        # utility: the fedvalue.scoring.torch_utilities.TorchModelUtility that built this (not imported: it imports us).
        if len(basis) == 0:
            raise ValueError("basis: expected at least one state; got none.")
        self.utility = utility
        self.basis = [utility.tensors(b) for b in basis]
        self.stacked = {k: torch.stack([s[k] for s in self.basis]) for k in utility.keys}
        self.dtype = self.stacked[utility.keys[0]].dtype
        self._heads: list[torch.Tensor] | None = None
        self._heads_done: set[int] = set()
        self._buffers: dict[Hashable, torch.Tensor] = {}
        self._out_shape: tuple[int, ...] | None = None

    @property
    def num_basis(self) -> int:
        return len(self.basis)

    def _checked(self, coefficients: np.ndarray) -> np.ndarray:
        coefficients = np.array(coefficients, dtype=np.float64)  # a copy: Ray hands out read-only arrays
        if coefficients.ndim != 2 or coefficients.shape[1] != self.num_basis:
            raise ValueError(
                f"coefficients: expected an array of shape (states, {self.num_basis}); got shape "
                f"{coefficients.shape}."
            )
        if not np.isfinite(coefficients).all():
            raise ValueError("coefficients: expected finite numbers; got NaN or inf.")
        return coefficients

    def _coefficients(self, coefficients: np.ndarray) -> torch.Tensor:
        return self._tensor(self._checked(coefficients))

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(array).to(device=self.utility.device, dtype=self.dtype)

    def combine(self, rows: torch.Tensor, keys: Sequence[str], *, reuse: bool = False) -> dict[str, torch.Tensor]:
        """Σ_k rows[:, k] B_k for the given state keys: one (states × K) @ (K × size) matmul each.
        ``reuse``: into buffers reused across calls (valid until the next such call)."""
        combined = {}
        for k in keys:
            flat = self.stacked[k].reshape(self.num_basis, -1)
            out = None
            if reuse:
                out = self._scratch(("combined", k), len(rows) * flat.shape[1], flat).view(len(rows), -1)
            combined[k] = torch.mm(rows.to(flat.dtype), flat, out=out).view(len(rows), *self.stacked[k].shape[1:])
        return combined

    def _prefixed(self, b: int) -> torch.Tensor:
        """Held-out batch ``b``'s inputs to the first layer (after the parameter-free prefix)."""
        utility, split = self.utility, self.utility.first_linear
        x = utility.x[utility.batch_rows(b)]
        return x if split.prefix is None else split.prefix(x)

    @property
    def out_shape(self) -> tuple[int, ...]:
        """Per-example shape of the first layer's output (probed once on one held-out example)."""
        if self._out_shape is None:
            x = self._prefixed(0)[:1]
            with torch.no_grad():
                self._out_shape = tuple(self._first_output(x, 0).shape[1:])
        return self._out_shape

    def _first_output(self, x: torch.Tensor, k: int, out: torch.Tensor | None = None) -> torch.Tensor:
        """f(x; θ_k), the first layer with basis state k's parameters, written into ``out``
        (rows × flattened output) when given. A Linear layer on flat rows is one ``addmm``
        in place (no bias-add or transpose copies); other layers run as the module does."""
        split = self.utility.first_linear
        weight = self.stacked[split.weight_key][k]
        bias = None if split.bias_key is None else self.stacked[split.bias_key][k]
        if split.flat_linear and x.dim() == 2 and out is not None:
            out = out.view(len(x), weight.shape[0])
            return torch.mm(x, weight.t(), out=out) if bias is None else torch.addmm(bias, x, weight.t(), out=out)
        parameters = {split.weight_name: weight, **({} if bias is None else {split.bias_name: bias})}
        result = torch.func.functional_call(split.layer, parameters, (x,))
        if out is None:
            return result
        return out.view(len(x), -1).copy_(result.reshape(len(x), -1))

    def _heads_by_batch(self, used: np.ndarray) -> Callable[[int], torch.Tensor]:
        """Held-out batch -> its (K, batch × output size) first-layer outputs of the basis states
        some row uses (``used``: K flags; rows of the others are zeros): kept for the round
        (:meth:`_head_products`) while they fit in ``head_cache_bytes``, else computed per
        batch into a reused buffer (valid until the next batch's)."""
        if self.keeps_heads:
            return self._head_products(used).__getitem__
        return lambda b: self._batch_heads(b, used)

    @property
    def keeps_heads(self) -> bool:
        """Whether the first-layer outputs of every basis state fit in ``head_cache_bytes``."""
        size = self.num_basis * len(self.utility.x) * math.prod(self.out_shape) * self.dtype.itemsize
        return size <= self.head_cache_bytes

    def _batch_heads(self, b: int, used: np.ndarray) -> torch.Tensor:
        x = self._prefixed(b)
        width = math.prod(self.out_shape)
        like = self.stacked[self.utility.first_linear.weight_key]  # x holds indices for an Embedding
        heads = self._scratch("heads", self.num_basis * len(x) * width, like).view(self.num_basis, -1)
        for k in range(self.num_basis):
            if used[k]:
                self._first_output(x, k, out=heads[k])
            else:  # zeros: a row's 0 × an uncomputed entry must stay 0 in the chunked matmul
                heads[k].zero_()
        return heads

    def _head_products(self, used: np.ndarray) -> list[torch.Tensor]:
        """Per held-out batch, the (K, batch × output size) first-layer outputs of the basis
        states; computed for the basis states some row uses (``used``: K flags; A_{t−1} is in
        no coalition's row but ∅'s, which is scored on the plain path), each at most once."""
        utility = self.utility
        if self._heads is None:
            width = math.prod(self.out_shape)
            self._heads = [  # zeros: a row's 0 × an uncomputed entry must stay 0 in the chunked matmul
                torch.zeros(self.num_basis, len(utility.y[utility.batch_rows(b)]) * width, dtype=self.dtype,
                            device=utility.device)
                for b in range(utility.num_batches)
            ]
        missing = [k for k in np.flatnonzero(used).tolist() if k not in self._heads_done]
        for b, head in enumerate(self._heads if missing else []):
            x = self._prefixed(b)
            for k in missing:  # written in place
                self._first_output(x, k, out=head[k])
        self._heads_done.update(missing)
        return self._heads

    @scoring()
    def scores(self, coefficients: np.ndarray, progress: Callable[[int], None] | None = None) -> FastScores:
        """Fast-path sums per (state, held-out batch) and near-tie rows (see module docstring).

        A batch of coalitions that factors over two halves of the basis (exact enumeration,
        :mod:`fedvalue.scoring.coalition_halves`) goes through :meth:`_half_scores`. Otherwise, per
        chunk of states and held-out batch, one matmul combines the first-layer outputs
        of the whole chunk into a reused buffer (a fresh tensor per chunk would page-fault
        tens of MB each time); the tail then runs as its plan (:meth:`_run_tail`, the chunk
        scored in one vectorized pass) or through ``functional_call`` state by state.
        Chunks are the outer loop while the first-layer outputs are kept for the round, the
        held-out batches when they are computed per batch (:meth:`_heads_by_batch`).
        (Walking the chunked path's batch in row blocks was measured and was slower there:
        the chunk's combination still streams K heads per block. The factored path's blocks
        pay because its two-term sums read halves that stay in cache.)
        """
        utility, split = self.utility, self.utility.first_linear
        checked = self._checked(coefficients)
        rows = self._tensor(checked)
        scores = FastScores(len(rows), utility.num_batches)
        done = _Done(progress, utility.num_batches)
        if split is None:
            self._whole_state_scores(rows, scores, done)
            return scores
        used = (checked != 0).any(axis=0)
        heads = self._heads_by_batch(used)
        plan = self._tail_plan()
        halves = self._halves(checked, plan)
        if halves is not None:
            self._half_scores(rows, halves, plan, heads, scores, done)
            return scores
        size = self._chunk_size()
        starts = range(0, len(rows), size)
        if self.keeps_heads:
            for start in starts:  # kept outputs: each chunk's tail states combined once
                tails = self.combine(rows[start : start + size], split.tail_keys)
                for b in range(utility.num_batches):
                    self._chunk_scores(rows, start, size, b, heads(b), tails, plan, scores)
                    done(len(rows[start : start + size]))
        else:
            for b in range(utility.num_batches):
                head = heads(b)
                for start in starts:
                    tails = self.combine(rows[start : start + size], split.tail_keys)
                    self._chunk_scores(rows, start, size, b, head, tails, plan, scores)
                    done(len(rows[start : start + size]))
        return scores

    def _chunk_size(self) -> int:
        """States per chunk: ``chunk``, fewer when their first-layer outputs for a full
        held-out batch would pass ``chunk_bytes``."""
        rows = min(self.utility.batch_size, len(self.utility.x))
        per_state = rows * math.prod(self.out_shape) * self.dtype.itemsize
        return max(1, min(self.chunk, self.chunk_bytes // per_state))

    def _chunk_scores(self, rows: torch.Tensor, start: int, size: int, b: int, head: torch.Tensor,
                      tails: Mapping[str, torch.Tensor], plan: list[tuple] | None, scores: FastScores) -> None:
        """The ``size`` rows from ``start`` on held-out batch ``b``: first-layer outputs
        combined by one matmul, then the tail (its plan, or ``functional_call`` per state)."""
        utility, split = self.utility, self.utility.first_linear
        chunk = rows[start : start + size]
        y = utility.y[utility.batch_rows(b)]
        hidden = self._scratch("hidden", len(chunk) * head.shape[1], head).view(len(chunk), head.shape[1])
        torch.matmul(chunk, head, out=hidden)
        hidden = hidden.view(len(chunk), len(y), -1)
        if plan is not None:
            outputs = self._run_tail(plan, hidden, tails)
            utility.score_fast_many(scores, range(start, start + len(chunk)), b, outputs, y, overwrite=True)
            return
        for j in range(len(chunk)):
            state = {k: v[j] for k, v in tails.items()}
            out = torch.func.functional_call(split.tail, state, (hidden[j].view(len(y), *self.out_shape),))
            utility.score_fast(scores, start + j, b, out, y)

    def _whole_state_scores(self, rows: torch.Tensor, scores: FastScores, done) -> None:
        """Models without a linear first layer: each state combined whole, then its forward pass."""
        utility = self.utility
        for start in range(0, len(rows), self.chunk):
            chunk = rows[start : start + self.chunk]
            states = self.combine(chunk, utility.keys)
            for b in range(utility.num_batches):
                batch = utility.batch_rows(b)
                for j in range(len(chunk)):
                    state = {k: v[j] for k, v in states.items()}
                    out = torch.func.functional_call(utility.model, state, (utility.x[batch],))
                    utility.score_fast(scores, start + j, b, out, utility.y[batch])
                done(len(chunk))

    def _halves(self, rows: np.ndarray, plan: list[tuple] | None) -> Halves | None:
        """The two-half factorization of ``rows`` when it pays: a tail plan with a linear
        layer, at most ``left_directions`` left directions and at least ``rows_per_direction``
        rows per direction; None otherwise."""
        if plan is None or _last_linear(plan) is None:
            return None
        halves = split_rows(rows, max_left=self.left_directions)
        if halves is None:
            return None
        directions = len(halves.left.directions) + len(halves.right.directions)
        return halves if len(rows) >= self.rows_per_direction * directions else None

    def _half_scores(self, rows: torch.Tensor, halves: Halves, plan: list[tuple], heads, scores: FastScores,
                     done) -> None:
        """Scores of rows C[c] = a_c u_l + b_c v_r (:mod:`fedvalue.scoring.coalition_halves`).

        Per held-out batch, the first-layer outputs P_l = Σ_k u_l[k] H_k of every left
        direction are combined once, and Q_r once per right direction; a row's first-layer
        output is then b_c (Q_r + (a_c / b_c) P_l), one pass where the chunked path makes
        three (combine, write, activate), with a leading ReLU applied in the same pass and
        b_c put into the next linear layer's ``alpha`` (ReLU is positively homogeneous).
        Rows are walked grouped by right direction, and the batch ``block_rows`` rows at a
        time so that every P_l of the block stays in cache for the whole group.
        """
        utility, split = self.utility, self.utility.first_linear
        left, right = halves.left, halves.right
        left_directions, right_directions = self._tensor(left.directions), self._tensor(right.directions)
        order = np.lexsort((left.of, right.of))
        groups = np.split(order, np.flatnonzero(np.diff(right.of[order])) + 1)
        num_outputs = self.stacked[plan[_last_linear(plan)][1]].shape[1]
        # A leading ReLU is applied while the two-term sum is formed (one pass instead of two;
        # ATen has that kernel for the CPU only).
        relu_first = plan[0][0] == "relu" and ADD_RELU is not None and rows.device.type == "cpu"
        steps = plan[1:] if relu_first else plan
        last_step = _last_linear(steps)
        for b in range(utility.num_batches):
            head = heads(b)
            y = utility.y[utility.batch_rows(b)]
            width = head.shape[1] // len(y)
            products = self._scratch("left", len(left_directions) * head.shape[1], head)
            products = products.view(len(left_directions), head.shape[1])
            torch.mm(left_directions, head[left.columns], out=products)
            products = products.view(len(left_directions), len(y), width)
            q = self._scratch("q", head.shape[1], head).view(len(y), width)
            for group in groups:
                r = int(right.of[group[0]])
                tails = self.combine(rows[torch.as_tensor(group, device=rows.device)], split.tail_keys, reuse=True)
                if r >= 0:
                    torch.mm(right_directions[r : r + 1], head[right.columns], out=q.view(1, -1))
                outputs = self._scratch("out", len(group) * len(y) * num_outputs, head)
                outputs = outputs.view(len(group), len(y), num_outputs)
                members = [(j, int(left.of[c]), float(left.sums[c]), float(right.sums[c]),
                            self._bind(steps, tails, j, last_step))
                           for j, c in enumerate(group.tolist())]
                for start in range(0, len(y), self.block_rows):
                    block = slice(start, start + self.block_rows)
                    rows_here = len(y[block])
                    first = self._scratch("first", rows_here * width, head).view(rows_here, width)
                    q_block, left_block = q[block], products[:, block]
                    for j, l, a, bc, bound in members:
                        if l >= 0 and r >= 0:
                            (ADD_RELU if relu_first else torch.add)(q_block, left_block[l], alpha=a / bc, out=first)
                            scale = bc
                        else:
                            source, scale = (left_block[l], a) if l >= 0 else (q_block, bc)
                            torch.clamp_min(source, 0, out=first) if relu_first else first.copy_(source)
                        self._run_state(bound, first, outputs[j, block], scale)
                for start in range(0, len(group), self.chunk):  # scored a chunk at a time: smaller temporaries
                    chunk = slice(start, start + self.chunk)
                    utility.score_fast_many(scores, group[chunk], b, outputs[chunk], y, overwrite=True)
                done(len(group))

    def _run_tail(self, plan: list[tuple], hidden: torch.Tensor, tails: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The tail's layers on ``hidden`` (states × rows × width, a scratch buffer that is
        overwritten), state by state so each layer's output is still in cache when the
        next step reads it (:meth:`_run_state`). Returns states × rows × outputs."""
        count, rows = hidden.shape[0], hidden.shape[1]
        last_linear = _last_linear(plan)
        if last_linear is None:
            result = hidden
        else:
            outputs = tails[plan[last_linear][1]].shape[1]
            result = self._scratch("out", count * rows * outputs, hidden).view(count, rows, outputs)
        for j in range(count):
            self._run_state(self._bind(plan, tails, j, last_linear), hidden[j], result[j])
        return result

    @staticmethod
    def _bind(plan: list[tuple], tails: Mapping[str, torch.Tensor], j: int, last_linear: int | None) -> list[tuple]:
        """State ``j``'s steps with its tensors: ("linear", Wᵀ, bias or None, scratch key or
        None for the last linear layer, at ``last_linear`` = :func:`_last_linear` of ``plan``)
        or the activation's step as it is."""
        bound = []
        for position, step in enumerate(plan):
            if step[0] == "linear":
                _, weight_key, bias_key = step
                bias = None if bias_key is None else tails[bias_key][j]
                bound.append(("linear", tails[weight_key][j].t(), bias, None if position == last_linear else position))
            else:
                bound.append(step)
        return bound

    def _run_state(self, steps: list[tuple], h: torch.Tensor, dest: torch.Tensor, scale: float = 1.0) -> None:
        """A state's bound tail steps (:meth:`_bind`) on its first-layer output ``scale`` · h
        (h: rows × width, overwritten): linear layers are one ``addmm`` into a reused buffer
        (the last one into ``dest``), activations run in place. ``scale`` goes into the first
        linear layer's ``alpha`` when only ReLUs come before it (relu(s x) = s relu(x) for
        s > 0) and is multiplied in before any other activation."""
        rows = h.shape[0]
        for step in steps:
            kind = step[0]
            if kind == "linear":
                _, weight_t, bias, key = step
                out = dest if key is None else self._scratch(key, rows * weight_t.shape[1], h).view(rows, -1)
                if scale != 1.0:  # only the half path scales: the chunked path's calls stay as they were
                    if bias is None:
                        torch.addmm(out, h, weight_t, beta=0, alpha=scale, out=out)
                    else:
                        torch.addmm(bias, h, weight_t, alpha=scale, out=out)
                    scale = 1.0
                elif bias is None:
                    torch.mm(h, weight_t, out=out)
                else:
                    torch.addmm(bias, h, weight_t, out=out)
                h = out
            elif kind == "relu":
                h.relu_()
            else:
                if scale != 1.0:
                    h.mul_(scale)
                    scale = 1.0
                if kind == "tanh":
                    h.tanh_()
                elif kind == "sigmoid":
                    h.sigmoid_()
        if scale != 1.0:
            h.mul_(scale)

    def _scratch(self, key: Hashable, numel: int, like: torch.Tensor) -> torch.Tensor:
        """A reused flat buffer of at least ``numel`` elements (fresh tensors page-fault)."""
        buffer = self._buffers.get(key)
        if buffer is None or buffer.numel() < numel:
            buffer = self._buffers[key] = torch.empty(numel, dtype=like.dtype, device=like.device)
        return buffer[:numel]

    def _tail_plan(self) -> list[tuple] | None:
        """The tail as in-place steps when the first layer's outputs are flat and the tail
        is a chain of Linear and elementwise activations (every MLP); None (functional_call
        per state) otherwise."""
        split = self.utility.first_linear
        if len(self.out_shape) != 1:  # the steps multiply rows × width matrices
            return None
        tail = split.tail
        if isinstance(tail, torch.nn.Identity):
            return []
        plan: list[tuple] = []
        for name, module in tail.named_children():
            if type(module) is torch.nn.Linear:
                plan.append(("linear", f"{name}.weight", f"{name}.bias" if module.bias is not None else None))
            elif type(module) is torch.nn.ReLU:
                plan.append(("relu",))
            elif type(module) is torch.nn.Tanh:
                plan.append(("tanh",))
            elif type(module) is torch.nn.Sigmoid:
                plan.append(("sigmoid",))
            elif type(module) in (torch.nn.Identity, torch.nn.Dropout) and not module.training:
                continue
            else:
                return None
        return plan

    def values(
        self,
        coefficients: np.ndarray,
        materialize: Callable[[int], Mapping[str, np.ndarray]] | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> np.ndarray:
        """U(s_c) for every row c of ``coefficients``.

        ``materialize(c)`` returns state c's arrays as the aggregation rule computes
        them (used only to re-score near-tie rows on the plain path); ``None``
        combines the basis here. ``progress(k)``: k more rows scored (on every held-out
        batch), told as the scoring goes.
        """
        return self.resolve(coefficients, self.scores(coefficients, progress), materialize)

    def resolve(self, coefficients, scores: FastScores, materialize=None) -> np.ndarray:
        """Per-state utilities from fast-path scores (near ties re-scored on the plain path)."""
        utility = self.utility

        def state_of(c: int) -> Mapping[str, torch.Tensor]:
            if materialize is not None:
                return utility.tensors(materialize(c))
            row = self._coefficients(coefficients)[c : c + 1]
            return {k: v[0] for k, v in self.combine(row, utility.keys).items()}

        with scoring():
            return utility.resolve_near_ties(scores, state_of)


class _Done:
    """Rows scored, told to ``progress`` in whole rows: a row counts once every held-out
    batch has scored it (``rows`` / ``batches`` per batch, the fractions carried over)."""

    def __init__(self, progress: Callable[[int], None] | None, batches: int) -> None:
        self.progress, self.batches, self.carried = progress, batches, 0

    def __call__(self, rows: int) -> None:
        if self.progress is None:
            return
        self.carried += rows
        whole, self.carried = divmod(self.carried, self.batches)
        if whole:
            self.progress(whole)


def _last_linear(plan: list[tuple]) -> int | None:
    """Position of the tail plan's last linear layer; None when it has none."""
    return max((p for p, step in enumerate(plan) if step[0] == "linear"), default=None)


class FirstLinear:
    """A model cut after its first parametrized layer (one of :data:`FIRST_LAYERS`): the
    parameter-free prefix, the layer (its state keys in the model), the tail."""

    def __init__(self, prefix, layer, name, tail, tail_keys):
        self.prefix = prefix
        self.layer = layer
        self.weight_name = "weight"
        self.bias_name = "bias"
        self.weight_key = f"{name}.weight"
        self.bias_key = f"{name}.bias" if getattr(layer, "bias", None) is not None else None
        #: A Linear layer: on flat rows its outputs are one addmm each, written in place.
        self.flat_linear = type(layer) is torch.nn.Linear
        self.tail = tail
        self.tail_keys = tail_keys


def _linear_in_parameters(module: torch.nn.Module) -> bool:
    """Whether ``module``'s output is linear in its (weight, bias) for fixed inputs."""
    if type(module) not in FIRST_LAYERS:
        return False
    return not (type(module) is torch.nn.Embedding and module.max_norm is not None)


def split_first_linear(model: torch.nn.Module) -> FirstLinear | None:
    """Cut a ``Sequential`` whose first parametrized module is linear in its parameters
    (:data:`FIRST_LAYERS`, exact types) after parameter-free modules of the exact types
    :data:`PARAMETER_FREE`; None for any other model, which then scores every state whole."""
    if not isinstance(model, torch.nn.Sequential):
        return None
    children = list(model.named_children())
    # Exact types: a subclass may compute something else than the layer (the fast path's premise).
    for position, (name, module) in enumerate(children):
        if type(module) in FIRST_LAYERS:
            break
        if type(module) not in PARAMETER_FREE or any(True for _ in module.parameters()):
            return None
    else:
        return None
    if not _linear_in_parameters(module) or any(True for _ in module.buffers()):
        return None
    prefix = torch.nn.Sequential(*[m for _, m in children[:position]]) if position else None
    tail_children = children[position + 1 :]
    tail = torch.nn.Sequential(OrderedDict(tail_children)) if tail_children else torch.nn.Identity()
    tail_keys = [f"{n}.{k}" for n, m in tail_children for k in m.state_dict()]
    # The tail's state names must map back to the model's (``Sequential(dict)`` keeps them).
    return FirstLinear(prefix, module, name, tail, tail_keys)
