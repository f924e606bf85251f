"""Coalition states scored as linear combinations of a round's basis states.

Every coalition of the FedAvg family is a state s_c = Σ_k C[c, k] B_k of fixed basis states
(basis = A_{t−1} and the clients' models, C[c, i] = n_i / Σ_{j∈S} n_j). When the model
starts with a linear layer (exactly ``nn.Linear``, after parameter-free modules such as
Flatten), that layer's output is linear in the parameters too:

    x W_c^T + b_c = Σ_k C[c, k] (x W_k^T + b_k)        (Σ_k C[c, k] = 1),

so the products x W_k^T are computed once per round for the K basis states and every
coalition pays only for the layers after the first. A batch holding most coalitions
(exact enumeration) is factored over two halves of the basis
(:mod:`fedvalue.coalition_halves`), so each coalition's first-layer output is one
two-term sum of precomputed half combinations, formed with the first ReLU in one pass
over rows that are in cache. Other models combine whole states.
Built by :meth:`fedvalue.utilities.TorchModelUtility.linear`; values equal the plain path's
(near ties re-scored there, :mod:`fedvalue._scoring`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping, Sequence

import numpy as np
import torch

from fedvalue._scoring import FastScores, scoring
from fedvalue.coalition_halves import Halves, split_rows

#: relu(x + alpha y) in one pass (ATen's fused kernel; the same float result as add then relu).
ADD_RELU = getattr(torch.ops.aten, "_add_relu", None)

#: Modules without parameters that may precede the first linear layer.
PARAMETER_FREE = (torch.nn.Flatten, torch.nn.Identity, torch.nn.Dropout)


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
    #: Most left directions of a factored batch (:meth:`_half_scores`): their first-layer
    #: products for ``block_rows`` rows should fit in the last-level cache together
    #: (32 × 1,024 × 200 floats = 26 MB for the digits MLP).
    left_directions = 32
    #: Held-out rows walked at a time by the factored path (measured on 2 CPU cores with a
    #: 32 MB cache: 1,024 ran the 200×200 tail at its matmuls' speed, 512 and 2,048 slower).
    block_rows = 1024
    #: Fewer rows per half direction than this: the chunked combination is cheaper.
    rows_per_direction = 4

    def __init__(self, utility, basis: Sequence[Mapping[str, np.ndarray]]) -> None:
        # utility: the fedvalue.utilities.TorchModelUtility that built this (not imported: it imports us).
        if len(basis) == 0:
            raise ValueError("basis: expected at least one state; got none.")
        self.utility = utility
        self.basis = [utility.tensors(b) for b in basis]
        self.stacked = {k: torch.stack([s[k] for s in self.basis]) for k in utility.keys}
        self.dtype = self.stacked[utility.keys[0]].dtype
        self._heads: list[torch.Tensor] | None = None
        self._heads_done: set[int] = set()
        self._buffers: dict[Hashable, torch.Tensor] = {}

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

    def _head_products(self, used: np.ndarray) -> list[torch.Tensor]:
        """Per held-out batch, the (K, batch × width) first-layer outputs of the basis states;
        computed for the basis states some row uses (``used``: K flags; A_{t−1} is in no
        coalition's row but ∅'s, which is scored on the plain path), each at most once."""
        utility, split = self.utility, self.utility.first_linear
        weights = self.stacked[split.weight_key]  # (K, width, inputs)
        if self._heads is None:
            self._heads = [  # zeros: a row's 0 × an uncomputed entry must stay 0 in the chunked matmul
                torch.zeros(self.num_basis, len(utility.y[utility.batch_rows(b)]) * weights.shape[1], dtype=self.dtype,
                            device=utility.device)
                for b in range(utility.num_batches)
            ]
        missing = [k for k in np.flatnonzero(used).tolist() if k not in self._heads_done]
        for b, head in enumerate(self._heads if missing else []):
            x = utility.x[utility.batch_rows(b)]
            if split.prefix is not None:
                x = split.prefix(x)
            for k in missing:  # written in place: no bias-add or transpose copies
                out = head[k].view(len(x), weights.shape[1])
                if split.bias_key is None:
                    torch.mm(x, weights[k].t(), out=out)
                else:
                    torch.addmm(self.stacked[split.bias_key][k], x, weights[k].t(), out=out)
        self._heads_done.update(missing)
        return self._heads

    @scoring()
    def scores(self, coefficients: np.ndarray) -> FastScores:
        """Fast-path sums per (state, held-out batch) and near-tie rows (see module docstring).

        A batch of coalitions that factors over two halves of the basis (exact enumeration,
        :mod:`fedvalue.coalition_halves`) goes through :meth:`_half_scores`. Otherwise, per
        chunk of states and held-out batch, one matmul combines the first-layer outputs
        of the whole chunk into a reused buffer (a fresh tensor per chunk would page-fault
        tens of MB each time); the tail then runs as its plan (:meth:`_run_tail`, the chunk
        scored in one vectorized pass) or through ``functional_call`` state by state.
        (Walking the chunked path's batch in row blocks was measured and was slower there:
        the chunk's combination still streams K heads per block. The factored path's blocks
        pay because its two-term sums read halves that stay in cache.)
        """
        utility, split = self.utility, self.utility.first_linear
        checked = self._checked(coefficients)
        rows = self._tensor(checked)
        scores = FastScores(len(rows), utility.num_batches)
        heads = None if split is None else self._head_products((checked != 0).any(axis=0))
        plan = None if split is None else self._tail_plan()
        halves = self._halves(checked, plan)
        if halves is not None:
            self._half_scores(rows, halves, plan, heads, scores)
            return scores
        for start in range(0, len(rows), self.chunk):
            chunk = rows[start : start + self.chunk]
            if split is None:
                states = self.combine(chunk, utility.keys)
                for b in range(utility.num_batches):
                    batch = utility.batch_rows(b)
                    for j in range(len(chunk)):
                        state = {k: v[j] for k, v in states.items()}
                        out = torch.func.functional_call(utility.model, state, (utility.x[batch],))
                        utility.score_fast(scores, start + j, b, out, utility.y[batch])
                continue
            tails = self.combine(chunk, split.tail_keys)
            for b, head in enumerate(heads):
                y = utility.y[utility.batch_rows(b)]
                hidden = self._scratch("hidden", len(chunk) * head.shape[1], head).view(len(chunk), head.shape[1])
                torch.matmul(chunk, head, out=hidden)
                hidden = hidden.view(len(chunk), len(y), -1)
                if plan is not None:
                    states = range(start, start + len(chunk))
                    outputs = self._run_tail(plan, hidden, tails)
                    utility.score_fast_many(scores, states, b, outputs, y, overwrite=True)
                    continue
                for j in range(len(chunk)):
                    state = {k: v[j] for k, v in tails.items()}
                    out = torch.func.functional_call(split.tail, state, (hidden[j],))
                    utility.score_fast(scores, start + j, b, out, y)
        return scores

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

    def _half_scores(self, rows: torch.Tensor, halves: Halves, plan: list[tuple], heads, scores: FastScores) -> None:
        """Scores of rows C[c] = a_c u_l + b_c v_r (:mod:`fedvalue.coalition_halves`).

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
        for b, head in enumerate(heads):
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
        """The tail as in-place steps when it is a chain of Linear and elementwise
        activations (every MLP); None (functional_call per state) otherwise."""
        split = self.utility.first_linear
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
    ) -> np.ndarray:
        """U(s_c) for every row c of ``coefficients``.

        ``materialize(c)`` returns state c's arrays as the aggregation rule computes
        them (used only to re-score near-tie rows on the plain path); ``None``
        combines the basis here.
        """
        return self.resolve(coefficients, self.scores(coefficients), materialize)

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


def _last_linear(plan: list[tuple]) -> int | None:
    """Position of the tail plan's last linear layer; None when it has none."""
    return max((p for p, step in enumerate(plan) if step[0] == "linear"), default=None)


class FirstLinear:
    """A model cut after its first linear layer: prefix (parameter free), layer, tail."""

    def __init__(self, prefix, weight_key, bias_key, tail, tail_keys):
        self.prefix = prefix
        self.weight_key = weight_key
        self.bias_key = bias_key
        self.tail = tail
        self.tail_keys = tail_keys


def split_first_linear(model: torch.nn.Module) -> FirstLinear | None:
    """Cut a ``Sequential`` whose first parametrized module is exactly ``nn.Linear`` (after
    parameter-free modules of the exact types above); None for any other model, which then
    scores every state whole."""
    if not isinstance(model, torch.nn.Sequential):
        return None
    children = list(model.named_children())
    # Exact types: a subclass may compute something else than x Wᵀ + b (the fast path's premise).
    for position, (name, module) in enumerate(children):
        if type(module) is torch.nn.Linear:
            break
        if type(module) not in PARAMETER_FREE or any(True for _ in module.parameters()):
            return None
    else:
        return None
    if any(True for _ in module.buffers()):
        return None
    prefix = torch.nn.Sequential(*[m for _, m in children[:position]]) if position else None
    tail_children = children[position + 1 :]
    tail = torch.nn.Sequential(OrderedDict(tail_children)) if tail_children else torch.nn.Identity()
    tail_keys = [f"{n}.{k}" for n, m in tail_children for k in m.state_dict()]
    bias_key = f"{name}.bias" if module.bias is not None else None
    # The tail's state names must map back to the model's (``Sequential(dict)`` keeps them).
    return FirstLinear(prefix, f"{name}.weight", bias_key, tail, tail_keys)
