"""Held-out utilities U(arrays) for the round game: a torch model scored on fixed data.

``arrays`` are a model's state as ``dict[str, np.ndarray]`` (its ``state_dict`` names);
the model is run with ``torch.func.functional_call`` so no module is copied or loaded
per coalition.

Three ways to score states, all equal to the plain one-state-at-a-time path:

* ``U(arrays)``: the plain path, one forward pass per held-out batch.
* ``U.batch(arrays_list)``: many states; ``chunk_size`` states share one vmapped forward
  pass (worth it on a GPU; on a 2-core CPU a loop of large matmuls is faster, so the
  default there is 1).
* ``U.linear(basis).values(C)``: states that are linear combinations of fixed basis
  states, s_c = Σ_k C[c, k] B_k, which is every coalition of the FedAvg family
  (basis = A_{t−1} and the clients' models, C[c, i] = n_i / Σ_{j∈S} n_j). When the model
  starts with a linear layer (after parameter-free modules such as Flatten), that
  layer's output is linear in the parameters too:

      x W_c^T + b_c = Σ_k C[c, k] (x W_k^T + b_k)        (Σ_k C[c, k] = 1),

  so the products x W_k^T are computed once per round for the K basis states and every
  coalition pays only for the layers after the first. For a 784-200-200-10 MLP that is
  about a fifth of the arithmetic of a full forward pass.

Accuracy is a count of argmax hits, so any reordering of float sums could flip an
example whose two largest logits nearly tie. Rows where the fast path sees a top-2
margin within ``tie_tolerance`` × |largest logit| are re-scored on the plain path (for
``linear``, on the state the caller materializes exactly as the aggregation rule does),
so accuracies equal the plain path's; losses agree to float rounding.

Every path scores with denormal floats flushed to zero (the caller's setting is put
back after). Averaged and trained weights drive some activations into the subnormal
range, where x86 float arithmetic runs up to a hundred times slower: a 200-client
round took 164 s instead of 12 s with them. Flushing changes a result by at most the
subnormal magnitude (< 1.2e-38 in float32), far below any tolerance here.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from contextlib import contextmanager

import numpy as np
import torch

UTILITY_METRICS = ("accuracy", "neg_loss", "neg_mse")

#: Modules without parameters that may precede the first linear layer.
_PARAMETER_FREE = (torch.nn.Flatten, torch.nn.Identity, torch.nn.Dropout)


def _flushing_denormals() -> bool:
    """Whether this thread flushes denormals now (torch offers a setter but no getter)."""
    return float(torch.tensor(1e-39, dtype=torch.float32) * 1.0) == 0.0


@contextmanager
def _scoring() -> Iterator[None]:
    """No autograd, denormals flushed to zero; the previous flush setting is restored."""
    was_flushing = _flushing_denormals()
    torch.set_flush_denormal(True)
    try:
        with torch.no_grad():
            yield
    finally:
        if not was_flushing:
            torch.set_flush_denormal(False)


class TorchModelUtility:
    """U(arrays) = metric of ``model`` with parameters ``arrays`` on (x, y).

    Parameters
    ----------
    model
        A module whose ``state_dict`` names match the arrays' keys (used as a
        template; its own parameters are never changed).
    x, y
        Held-out inputs and labels (targets for ``"neg_mse"``).
    metric
        ``"accuracy"`` (share of argmax predictions equal to y), ``"neg_loss"``
        (minus mean cross-entropy) or ``"neg_mse"`` (minus mean squared error).
        Higher is better for all three, as a utility must be.
    batch_size
        Held-out examples per forward pass (bounds memory).
    chunk_size
        States per vmapped forward pass in :meth:`batch` (memory grows with
        ``chunk_size × batch_size × widest layer``). ``None``: 1 on CPU, 32 on CUDA.
    device
        Where the held-out data lives and every forward pass runs (``"cuda"`` when
        one is present); ``None`` is the CPU.
    tie_tolerance
        Relative top-2 logit margin (margin ≤ tie_tolerance × |largest logit|) under
        which a fast-path row is re-scored on the plain path (accuracy only). Fast and
        plain logits differ by a few 1e-6 of the largest logit in float32.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        x: np.ndarray,
        y: np.ndarray,
        *,
        metric: str = "accuracy",
        batch_size: int = 4096,
        chunk_size: int | None = None,
        device: str | torch.device | None = None,
        tie_tolerance: float = 2e-5,
    ) -> None:
        if metric not in UTILITY_METRICS:
            raise ValueError(f"metric: expected one of {list(UTILITY_METRICS)}; got {metric!r}.")
        if len(x) != len(y) or len(x) == 0:
            raise ValueError(
                f"x, y: expected the same non-zero number of held-out examples; got {len(x)} "
                f"inputs and {len(y)} labels."
            )
        for name, value in (("batch_size", batch_size), ("chunk_size", chunk_size)):
            if value is None and name == "chunk_size":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name}: expected a positive integer; got {value!r}.")
        if not (isinstance(tie_tolerance, (int, float)) and 0 <= tie_tolerance < 1):
            raise ValueError(f"tie_tolerance: expected a number in [0, 1); got {tie_tolerance!r}.")
        self.device = torch.device("cpu" if device is None else device)
        self.model = model.eval()
        self.metric = metric
        self.batch_size = int(batch_size)
        self.chunk_size = int(chunk_size) if chunk_size is not None else (32 if self.device.type == "cuda" else 1)
        self.tie_tolerance = float(tie_tolerance)
        self.x = torch.as_tensor(np.ascontiguousarray(x), dtype=torch.float32).to(self.device)
        self.y = torch.as_tensor(np.ascontiguousarray(y)).to(self.device)
        state = model.state_dict()
        self.keys = list(state.keys())
        # Server optimizers may hand back float64 (Flower's FedAdam does): score in the model's dtype.
        self.dtypes = {k: v.dtype for k, v in state.items()}
        self._split = _split_first_linear(model)

    # -- the plain path -------------------------------------------------------------------

    def _tensors(self, arrays: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
        missing = [k for k in self.keys if k not in arrays]
        if missing:
            raise KeyError(
                f"arrays: expected the model's state keys {self.keys}; missing {missing}."
            )
        tensors = {}
        for k in self.keys:
            value = np.asarray(arrays[k])
            if not value.flags.writeable:  # arrays from Ray's object store are read-only
                value = value.copy()
            tensors[k] = torch.as_tensor(value).to(device=self.device, dtype=self.dtypes[k])
        return tensors

    @property
    def num_batches(self) -> int:
        return -(-len(self.x) // self.batch_size)

    def _slice(self, b: int) -> slice:
        return slice(b * self.batch_size, (b + 1) * self.batch_size)

    def _plain_sum(self, state: Mapping[str, torch.Tensor], b: int) -> float:
        """Summed metric of batch ``b`` on the plain path (the reference every path equals)."""
        rows = self._slice(b)
        out = torch.func.functional_call(self.model, dict(state), (self.x[rows],))
        return float(self._summed_metric(out, self.y[rows]))

    @_scoring()
    def __call__(self, arrays: Mapping[str, np.ndarray]) -> float:
        state = self._tensors(arrays)
        return sum(self._plain_sum(state, b) for b in range(self.num_batches)) / len(self.x)

    # -- many states ------------------------------------------------------------------------

    @_scoring()
    def batch(self, arrays_list: Sequence[Mapping[str, np.ndarray]]) -> list[float]:
        """U for several states: ``chunk_size`` states per vmapped forward pass."""
        states = [self._tensors(arrays) for arrays in arrays_list]
        if self.chunk_size == 1:
            return [sum(self._plain_sum(s, b) for b in range(self.num_batches)) / len(self.x) for s in states]
        scores = FastScores(len(states), self.num_batches)
        forward = torch.func.vmap(
            lambda params, xb: torch.func.functional_call(self.model, params, (xb,)), in_dims=(0, None)
        )
        for start in range(0, len(states), self.chunk_size):
            chunk = states[start : start + self.chunk_size]
            stacked = {k: torch.stack([s[k] for s in chunk]) for k in self.keys}
            for b in range(self.num_batches):
                rows = self._slice(b)
                self._score_fast_many(scores, start, b, forward(stacked, self.x[rows]), self.y[rows])
        return list(self._resolve(scores, lambda c: states[c]))

    @property
    def supports_linear(self) -> bool:
        """Whether :meth:`linear` applies: every state entry is floating point."""
        return all(dtype.is_floating_point for dtype in self.dtypes.values())

    def linear(self, basis: Sequence[Mapping[str, np.ndarray]]) -> LinearStates:
        """Scorer of the states Σ_k C[c, k] basis[k] (see the module docstring)."""
        if not self.supports_linear:
            raise TypeError(
                "linear: combining states needs floating-point entries only; the model's state "
                f"has {sorted(k for k, d in self.dtypes.items() if not d.is_floating_point)} "
                "(integer buffers). Use batch() instead."
            )
        return LinearStates(self, basis)

    # -- metric ------------------------------------------------------------------------

    def _summed_metric(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.metric == "accuracy":
            return (out.argmax(dim=-1) == y).sum(dtype=torch.float64)
        if self.metric == "neg_loss":
            return -torch.nn.functional.cross_entropy(out, y.long(), reduction="sum").double()
        return -((out.reshape(y.shape) - y) ** 2).sum(dtype=torch.float64)

    def _score_fast(self, scores: FastScores, c: int, b: int, out: torch.Tensor, y: torch.Tensor) -> None:
        """Book a fast-path batch of one state (see :meth:`_score_fast_many`)."""
        self._score_fast_many(scores, c, b, out[None], y)

    def _score_fast_many(self, scores: FastScores, first: int, b: int, out: torch.Tensor, y: torch.Tensor) -> None:
        """Book fast-path outputs (``out``: states × rows × outputs) of states ``first, first + 1,
        ...`` on held-out batch ``b``; for accuracy, note the rows whose top-2 logits nearly tie.
        Losses are summed per state by the plain path's own reduction, so they round as it does."""
        count = out.shape[0]
        if self.metric != "accuracy" or out.shape[-1] < 2:
            sums = torch.stack([self._summed_metric(out[j], y) for j in range(count)])
        else:
            top, index = out.max(dim=-1)
            hit = index == y
            sums = hit.sum(dim=1, dtype=torch.float64)
            second = out.scatter(2, index[..., None], float("-inf")).max(dim=-1).values
            near = top - second <= self.tie_tolerance * top.abs()
            for j in near.any(dim=1).nonzero().flatten().tolist():
                near_rows = near[j].nonzero().flatten()
                scores.near[(first + j, b)] = (near_rows.cpu().numpy(), float(hit[j, near_rows].sum()))
        scores.sums[first : first + count, b] = sums.cpu().numpy()

    def _resolve(self, scores: FastScores, state_of: Callable[[int], Mapping[str, torch.Tensor]]) -> np.ndarray:
        """Per-state utilities: near-tie rows re-scored on the plain path.

        The rows go through the plain forward pass in a block of at least
        ``_RECHECK_ROWS`` rows of their batch (matmul kernels for a handful of rows may
        sum in another order than for a full batch).
        """
        sums = scores.sums.copy()
        cached: dict[int, Mapping[str, torch.Tensor]] = {}
        for (c, b), (rows, fast_hits) in sorted(scores.near.items()):
            if c not in cached:
                cached[c] = state_of(c)
            batch = self._slice(b)
            x, y = self.x[batch], self.y[batch]
            filler = np.setdiff1d(np.arange(min(_RECHECK_ROWS, len(x))), rows)[: max(0, _RECHECK_ROWS - len(rows))]
            block = torch.as_tensor(np.concatenate([rows, filler]), device=self.device)
            out = torch.func.functional_call(self.model, dict(cached[c]), (x[block],))[: len(rows)]
            plain_hits = float((out.argmax(dim=-1) == y[block[: len(rows)]]).sum())
            sums[c, b] += plain_hits - fast_hits
        return sums.sum(axis=1) / len(self.x)


#: Near-tie rows are re-scored in a block of at least this many rows.
_RECHECK_ROWS = 64


class FastScores:
    """Fast-path sums per (state, held-out batch) and the near-tie rows to re-score."""

    def __init__(self, num_states: int, num_batches: int) -> None:
        self.sums = np.zeros((num_states, num_batches))
        self.near: dict[tuple[int, int], tuple[np.ndarray, float]] = {}


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

    def __init__(self, utility: TorchModelUtility, basis: Sequence[Mapping[str, np.ndarray]]) -> None:
        if len(basis) == 0:
            raise ValueError("basis: expected at least one state; got none.")
        self.utility = utility
        self.basis = [utility._tensors(b) for b in basis]
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
            utility, split = self.utility, self.utility._split
            weights = self.stacked[split.weight_key]  # (K, width, inputs)
            self._heads = []
            for b in range(utility.num_batches):
                x = utility.x[utility._slice(b)]
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

    @_scoring()
    def scores(self, coefficients: np.ndarray) -> FastScores:
        """Fast-path sums per (state, held-out batch) and near-tie rows (see module docstring).

        Per chunk of states and held-out batch, one matmul combines the first-layer outputs
        of the whole chunk into a reused buffer (a fresh tensor per chunk would page-fault
        tens of MB each time); the tail then runs as its plan (:meth:`_run_tail`, the chunk
        scored in one vectorized pass) or through ``functional_call`` state by state.
        (Walking the batch in cache-sized blocks of rows was measured and was slower: the
        smaller matmuls lose more than the saved memory traffic gains, on 2 CPU cores.)
        """
        utility, split = self.utility, self.utility._split
        rows = self._coefficients(coefficients)
        scores = FastScores(len(rows), utility.num_batches)
        heads = None if split is None else self._head_products()
        plan = None if split is None else self._tail_plan()
        for start in range(0, len(rows), self.chunk):
            chunk = rows[start : start + self.chunk]
            if split is None:
                states = self.combine(chunk, utility.keys)
                for b in range(utility.num_batches):
                    batch = utility._slice(b)
                    for j in range(len(chunk)):
                        state = {k: v[j] for k, v in states.items()}
                        out = torch.func.functional_call(utility.model, state, (utility.x[batch],))
                        utility._score_fast(scores, start + j, b, out, utility.y[batch])
                continue
            tails = self.combine(chunk, split.tail_keys)
            for b, head in enumerate(heads):
                y = utility.y[utility._slice(b)]
                hidden = self._scratch("hidden", len(chunk) * head.shape[1], head).view(len(chunk), head.shape[1])
                torch.matmul(chunk, head, out=hidden)
                hidden = hidden.view(len(chunk), len(y), -1)
                if plan is not None:
                    utility._score_fast_many(scores, start, b, self._run_tail(plan, hidden, tails), y)
                    continue
                for j in range(len(chunk)):
                    state = {k: v[j] for k, v in tails.items()}
                    out = torch.func.functional_call(split.tail, state, (hidden[j],))
                    utility._score_fast(scores, start + j, b, out, y)
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
        split = self.utility._split
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
                return utility._tensors(materialize(c))
            row = self._coefficients(coefficients)[c : c + 1]
            return {k: v[0] for k, v in self.combine(row, utility.keys).items()}

        with _scoring():
            return utility._resolve(scores, state_of)


class _FirstLinear:
    """A model cut after its first linear layer: prefix (parameter free), layer, tail."""

    def __init__(self, prefix, weight_key, bias_key, tail, tail_keys):
        self.prefix = prefix
        self.weight_key = weight_key
        self.bias_key = bias_key
        self.tail = tail
        self.tail_keys = tail_keys


def _split_first_linear(model: torch.nn.Module) -> _FirstLinear | None:
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
        if type(module) not in _PARAMETER_FREE or any(True for _ in module.parameters()):
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
    return _FirstLinear(prefix, f"{name}.weight", bias_key, tail, tail_keys)
