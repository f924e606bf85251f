"""Coalition states scored as linear combinations of a round's basis states.

Every coalition of the FedAvg family is a state s_c = Σ_k C[c, k] B_k of fixed basis states
(basis = A_{t−1} and the clients' models, C[c, i] = n_i / Σ_{j∈S} n_j). When the model
starts with a linear layer (exactly ``nn.Linear``, after parameter-free modules such as
Flatten), that layer's output is linear in the parameters too:

    x W_c^T + b_c = Σ_k C[c, k] (x W_k^T + b_k)        (Σ_k C[c, k] = 1),

so the products x W_k^T are computed once per round for the K basis states and every
coalition pays only for the layers after the first. Other models combine whole states.
Built by :meth:`fedvalue.utilities.TorchModelUtility.linear`; values equal the plain path's
(near ties re-scored there, :mod:`fedvalue._scoring`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping, Sequence

import numpy as np
import torch

from fedvalue._scoring import FastScores, scoring

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

    def __init__(self, utility, basis: Sequence[Mapping[str, np.ndarray]]) -> None:
        # utility: the fedvalue.utilities.TorchModelUtility that built this (not imported: it imports us).
        if len(basis) == 0:
            raise ValueError("basis: expected at least one state; got none.")
        self.utility = utility
        self.basis = [utility.tensors(b) for b in basis]
        self.stacked = {k: torch.stack([s[k] for s in self.basis]) for k in utility.keys}
        self.dtype = self.stacked[utility.keys[0]].dtype
        self._heads: list[torch.Tensor] | None = None
        self._buffers: dict[Hashable, torch.Tensor] = {}

    @property
    def num_basis(self) -> int:
        return len(self.basis)

    def _coefficients(self, coefficients: np.ndarray) -> torch.Tensor:
        coefficients = np.array(coefficients, dtype=np.float64)  # a copy: Ray hands out read-only arrays
        if coefficients.ndim != 2 or coefficients.shape[1] != self.num_basis:
            raise ValueError(
                f"coefficients: expected an array of shape (states, {self.num_basis}); got shape "
                f"{coefficients.shape}."
            )
        if not np.isfinite(coefficients).all():
            raise ValueError("coefficients: expected finite numbers; got NaN or inf.")
        return torch.as_tensor(coefficients).to(device=self.utility.device, dtype=self.dtype)

    def combine(self, rows: torch.Tensor, keys: Sequence[str]) -> dict[str, torch.Tensor]:
        """Σ_k rows[:, k] B_k for the given state keys: one (states × K) @ (K × size) matmul each."""
        return {
            k: (rows.to(self.stacked[k].dtype) @ self.stacked[k].reshape(self.num_basis, -1)).reshape(
                len(rows), *self.stacked[k].shape[1:]
            )
            for k in keys
        }

    def _head_products(self) -> list[torch.Tensor]:
        """Per held-out batch, the (K, batch × width) first-layer outputs of every basis state."""
        if self._heads is None:
            utility, split = self.utility, self.utility.first_linear
            weights = self.stacked[split.weight_key]  # (K, width, inputs)
            self._heads = []
            for b in range(utility.num_batches):
                x = utility.x[utility.batch_rows(b)]
                if split.prefix is not None:
                    x = split.prefix(x)
                head = torch.empty(self.num_basis, len(x) * weights.shape[1], dtype=x.dtype, device=x.device)
                for k in range(self.num_basis):  # written in place: no bias-add or transpose copies
                    out = head[k].view(len(x), weights.shape[1])
                    if split.bias_key is None:
                        torch.mm(x, weights[k].t(), out=out)
                    else:
                        torch.addmm(self.stacked[split.bias_key][k], x, weights[k].t(), out=out)
                self._heads.append(head)
        return self._heads

    @scoring()
    def scores(self, coefficients: np.ndarray) -> FastScores:
        """Fast-path sums per (state, held-out batch) and near-tie rows (see module docstring).

        Per chunk of states and held-out batch, one matmul combines the first-layer outputs
        of the whole chunk into a reused buffer (a fresh tensor per chunk would page-fault
        tens of MB each time); the tail then runs as its plan (:meth:`_run_tail`, the chunk
        scored in one vectorized pass) or through ``functional_call`` state by state.
        (Walking the batch in cache-sized blocks of rows was measured and was slower: the
        smaller matmuls lose more than the saved memory traffic gains, on 2 CPU cores.)
        """
        utility, split = self.utility, self.utility.first_linear
        rows = self._coefficients(coefficients)
        scores = FastScores(len(rows), utility.num_batches)
        heads = None if split is None else self._head_products()
        plan = None if split is None else self._tail_plan()
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
                    utility.score_fast_many(scores, start, b, self._run_tail(plan, hidden, tails), y)
                    continue
                for j in range(len(chunk)):
                    state = {k: v[j] for k, v in tails.items()}
                    out = torch.func.functional_call(split.tail, state, (hidden[j],))
                    utility.score_fast(scores, start + j, b, out, y)
        return scores

    def _run_tail(self, plan: list[tuple], hidden: torch.Tensor, tails: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The tail's layers on ``hidden`` (states × rows × width, a scratch buffer that is
        overwritten), state by state so each layer's output is still in cache when the
        next step reads it: linear layers are one ``addmm`` into a reused buffer,
        activations run in place. Returns states × rows × outputs."""
        count, rows = hidden.shape[0], hidden.shape[1]
        last_linear = max((p for p, step in enumerate(plan) if step[0] == "linear"), default=None)
        if last_linear is None:
            result = hidden
        else:
            outputs = tails[plan[last_linear][1]].shape[1]
            result = self._scratch("out", count * rows * outputs, hidden).view(count, rows, outputs)
        for j in range(count):
            h = hidden[j]
            for position, step in enumerate(plan):
                kind = step[0]
                if kind == "linear":
                    _, weight_key, bias_key = step
                    weight = tails[weight_key][j]
                    if position == last_linear:
                        dest = result[j]
                    else:
                        dest = self._scratch(position, rows * weight.shape[0], h).view(rows, weight.shape[0])
                    if bias_key is None:
                        torch.mm(h, weight.t(), out=dest)
                    else:
                        torch.addmm(tails[bias_key][j], h, weight.t(), out=dest)
                    h = dest
                elif kind == "relu":
                    h.relu_()
                elif kind == "tanh":
                    h.tanh_()
                elif kind == "sigmoid":
                    h.sigmoid_()
        return result

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
