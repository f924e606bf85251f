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
  states, s_c = Σ_k C[c, k] B_k, which is every coalition of the FedAvg family; the
  outputs of a first layer linear in its parameters (Linear, Conv1d/2d/3d, Embedding)
  are computed once per round and basis state (:mod:`fedvalue.scoring.linear`).

Accuracy is a count of argmax hits, so any reordering of float sums could flip an
example whose two largest logits nearly tie: another path, or another machine's kernels.
Every path, the plain one included, decides a row whose top-2 margin is within
``tie_tolerance`` × its largest |logit| (the scale of its float32 rounding, even where the
top two logits are near zero) by a float64 forward pass of that row (for ``linear``,
on the state the caller materializes exactly as the aggregation rule does), so accuracies
equal the plain path's and an auditor's machine counts the same hits as the run's; losses
agree to float rounding. A state whose fast outputs or sums are not finite (a basis state
that overflows spoils every combination, even one that gives it a zero coefficient) is
scored whole on the plain path.

Every path scores with denormal floats flushed to zero (:mod:`fedvalue.scoring._scoring`).

A loss (``neg_loss``, ``neg_mse``) is a float32 sum, so it rounds by the machine's kernels
(:attr:`TorchModelUtility.rounded_by_machine`); :meth:`TorchModelUtility.float64_value` scores a state
with a float64 forward pass and metric, the reference an audit measures that rounding against
(:mod:`fedvalue.audit.rounding_envelope`).

With a differentiable metric (``neg_loss``, ``neg_mse``; :attr:`TorchModelUtility.differentiable`),
:meth:`TorchModelUtility.gradient` gives g = ∇U(arrays) and :meth:`TorchModelUtility.hessian_vector_product`
gives H v = ∇²U(arrays) v (torch autograd, double backward), both with respect to every floating-point
state entry, in float64 where the model runs in float64 (else in its own dtype), summed over the held-out
batches in order: deterministic on the CPU. The round game's expansions at A_{t−1} take them
(:mod:`fedvalue.valuation.taylor`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import torch

from fedvalue._checks import check_integer, check_number
from fedvalue.scoring._scoring import RECHECK_ROWS, FastScores, scoring
from fedvalue.scoring.linear import LinearStates, split_first_linear

UTILITY_METRICS = ("accuracy", "neg_loss", "neg_mse")
#: The metrics U is differentiable in (accuracy counts argmax hits: its gradient is zero almost everywhere).
DIFFERENTIABLE_METRICS = ("neg_loss", "neg_mse")
#: The metrics whose value is a float32 sum of per-row losses, rounded by the machine's kernels
#: (accuracy is a count, its near ties decided in float64: the same number on every machine).
MACHINE_ROUNDED_METRICS = ("neg_loss", "neg_mse")


class TorchModelUtility:
    """U(arrays) = metric of ``model`` with parameters ``arrays`` on (x, y).

    Parameters
    ----------
    model
        A module whose ``state_dict`` names match the arrays' keys (used as a
        template; its own parameters are never changed).
    x, y
        Held-out inputs (float32 features; integer arrays are kept as int64 indices, for
        a model that starts with an ``nn.Embedding``) and labels (targets for ``"neg_mse"``).
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
        Relative top-2 logit margin (margin ≤ tie_tolerance × the row's largest |logit|)
        under which a row's prediction is decided in float64 (accuracy only). Fast and plain
        logits differ by a few 1e-6 of the largest |logit| in float32, and so do one
        machine's plain logits and another's.
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
        check_integer("batch_size", batch_size)
        check_integer("chunk_size", chunk_size, none_ok=True)
        check_number("tie_tolerance", tie_tolerance, low=0.0, high=1.0, high_open=True)
        self.device = torch.device("cpu" if device is None else device)
        self.model = model.eval()
        self.metric = metric
        self.batch_size = int(batch_size)
        self.chunk_size = int(chunk_size) if chunk_size is not None else (32 if self.device.type == "cuda" else 1)
        self.tie_tolerance = float(tie_tolerance)
        x = np.ascontiguousarray(x)
        # Integer inputs are indices (an Embedding's); everything else is float32 features.
        self.x = torch.as_tensor(x, dtype=torch.long if np.issubdtype(x.dtype, np.integer) else torch.float32)
        self.x = self.x.to(self.device)
        self.y = torch.as_tensor(np.ascontiguousarray(y)).to(self.device)
        state = model.state_dict()
        self.keys = list(state.keys())
        # Server optimizers may hand back float64 (Flower's FedAdam does): score in the model's dtype.
        self.dtypes = {k: v.dtype for k, v in state.items()}
        self.first_linear = split_first_linear(model)

    # -- the plain path -------------------------------------------------------------------

    def tensors(self, arrays: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
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

    def held_out_digest(self) -> str:
        """SHA-256 of what this utility scores: the metric and the held-out inputs and labels
        (dtype, shape and bytes of each), so an audit can tell a rebuilt U scores the same data."""
        digest = hashlib.sha256(f"metric={self.metric}".encode())
        for tensor in (self.x, self.y):
            array = np.ascontiguousarray(tensor.detach().cpu().numpy())
            digest.update(f"|{array.dtype.str}{array.shape}|".encode())
            digest.update(array.tobytes())
        return "sha256:" + digest.hexdigest()

    @property
    def num_batches(self) -> int:
        return -(-len(self.x) // self.batch_size)

    def batch_rows(self, b: int) -> slice:
        return slice(b * self.batch_size, (b + 1) * self.batch_size)

    def _plain_sum(self, state: Mapping[str, torch.Tensor], b: int) -> float:
        """Summed metric of batch ``b`` on the plain path (the reference every path equals)."""
        rows = self.batch_rows(b)
        out = torch.func.functional_call(self.model, dict(state), (self.x[rows],))
        if self.metric == "accuracy" and out.shape[-1] >= 2:
            return self._settled_hits(state, out, self.x[rows], self.y[rows])
        return float(self._summed_metric(out, self.y[rows]))

    def _settled_hits(self, state: Mapping[str, torch.Tensor], out: torch.Tensor, x: torch.Tensor,
                      y: torch.Tensor) -> float:
        """Argmax hits of a plain-path batch, its near-tie rows (top-2 margin ≤
        ``tie_tolerance`` × the row's largest |logit|) decided by :meth:`_exact_predictions`."""
        hits = out.argmax(dim=-1) == y
        top2 = out.topk(2, dim=-1).values
        near = (top2[:, 0] - top2[:, 1] <= self.tie_tolerance * out.abs().amax(dim=-1)).nonzero().flatten()
        if len(near):
            hits[near] = self._exact_predictions(state, x[near], out[near]) == y[near]
        return float(hits.sum(dtype=torch.float64))

    def _exact_predictions(self, state: Mapping[str, torch.Tensor], x: torch.Tensor,
                          out: torch.Tensor) -> torch.Tensor:
        """The predicted classes of rows ``x`` from a float64 forward pass (``out``: their
        logits in the model's dtype, whose argmax stands where float64 is not possible).

        Float32 logits differ across machines by up to ~1e-6 of the largest |logit| (another
        BLAS code path, measured: docs/faults-and-audit.md), which can flip a near tie; the
        float64 pass moves only by ~1e-15, so an auditor on any machine counts the same hits."""
        wide = {k: v.double() if v.is_floating_point() else v for k, v in state.items()}
        try:
            return torch.func.functional_call(self.model, wide, (x.double() if x.is_floating_point() else x,)
                                              ).argmax(dim=-1)
        except (RuntimeError, TypeError):  # a model holding tensors of its own that cannot widen
            return out.argmax(dim=-1)

    @scoring()
    def __call__(self, arrays: Mapping[str, np.ndarray]) -> float:
        state = self.tensors(arrays)
        return sum(self._plain_sum(state, b) for b in range(self.num_batches)) / len(self.x)

    # -- float32 rounding ---------------------------------------------------------------------

    @property
    def rounded_by_machine(self) -> bool:
        """Whether U's value rounds by the machine's kernels: its metric is one of
        :data:`MACHINE_ROUNDED_METRICS` (a float32 sum of per-row losses), not accuracy."""
        return self.metric in MACHINE_ROUNDED_METRICS

    @scoring()
    def float64_value(self, arrays: Mapping[str, np.ndarray]) -> float | None:
        """U(arrays) from a float64 forward pass and metric (the state's floating entries and the
        held-out inputs widened, batch by batch as the plain path), or None for a model holding
        tensors of its own that cannot widen. Float64 rounds ~1e-16 of U, so it stands for the
        exact U against which float32's rounding (~1e-7 of U) on this machine is measured."""
        state = self.tensors(arrays)
        wide = {k: v.double() if v.is_floating_point() else v for k, v in state.items()}
        total = 0.0
        try:
            for b in range(self.num_batches):
                rows = self.batch_rows(b)
                x = self.x[rows].double() if self.x.is_floating_point() else self.x[rows]
                out = torch.func.functional_call(self.model, wide, (x,))
                y = self.y[rows].double() if self.metric == "neg_mse" else self.y[rows]
                total += float(self._summed_metric(out, y))
        except (RuntimeError, TypeError):
            return None
        return total / len(self.x)

    # -- many states ------------------------------------------------------------------------

    @scoring()
    def batch(self, arrays_list: Sequence[Mapping[str, np.ndarray]]) -> list[float]:
        """U for several states: ``chunk_size`` states per vmapped forward pass."""
        states = [self.tensors(arrays) for arrays in arrays_list]
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
                rows = self.batch_rows(b)
                states_here = range(start, start + len(chunk))
                self.score_fast_many(scores, states_here, b, forward(stacked, self.x[rows]), self.y[rows])
        return list(self.resolve_near_ties(scores, lambda c: states[c]))

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

    # -- derivatives -------------------------------------------------------------------------

    @property
    def differentiable(self) -> bool:
        """Whether U is differentiable in the state: its metric is one of :data:`DIFFERENTIABLE_METRICS`."""
        return self.metric in DIFFERENTIABLE_METRICS

    def gradient(self, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """g = ∇U(arrays), one float64 array per state key (zeros for integer entries), where
        U = (1/N) Σ_b (summed metric of held-out batch b); see the module docstring."""
        return self._derivative("gradient", arrays, None)

    def hessian_vector_product(self, arrays: Mapping[str, np.ndarray],
                               vector: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """H v = ∇²U(arrays) v for a ``vector`` shaped like the state (its integer entries are
        ignored), one float64 array per state key, by double backward: ∇(∇U · v)."""
        missing = [k for k in self.keys if k not in vector]
        if missing:
            raise KeyError(f"vector: expected the model's state keys {self.keys}; missing {missing}.")
        return self._derivative("hessian_vector_product", arrays, vector)

    def _derivative(self, name: str, arrays: Mapping[str, np.ndarray],
                    vector: Mapping[str, np.ndarray] | None) -> dict[str, np.ndarray]:
        """∇U (``vector`` None) or ∇²U v at ``arrays``, in float64 when the model takes it."""
        if not self.differentiable:
            raise ValueError(f"metric: {name} needs a utility differentiable in the state, metric one of "
                             f"{list(DIFFERENTIABLE_METRICS)}; this one scores {self.metric!r} (a count of argmax hits, "
                             "whose gradient is zero almost everywhere).")
        state = self.tensors(arrays)
        floating = [k for k in self.keys if state[k].is_floating_point()]
        try:
            return self._summed_derivative(state, floating, vector, torch.float64)
        except (RuntimeError, TypeError):  # a model holding tensors of its own that cannot widen: its own dtype
            return self._summed_derivative(state, floating, vector, None)

    def _summed_derivative(self, state: Mapping[str, torch.Tensor], floating: Sequence[str],
                           vector: Mapping[str, np.ndarray] | None, dtype: torch.dtype | None) -> dict[str, np.ndarray]:
        """Σ_b over the held-out batches of the derivative of batch b's summed metric, over N."""
        leaves = {k: (state[k] if dtype is None else state[k].to(dtype)).detach().requires_grad_() for k in floating}
        fixed = {k: v for k, v in state.items() if k not in leaves}
        directions = None if vector is None else [
            torch.as_tensor(np.asarray(vector[k]), device=self.device).to(leaves[k].dtype) for k in floating]
        totals = [torch.zeros_like(leaf, dtype=torch.float64) for leaf in leaves.values()]
        with torch.enable_grad():
            for b in range(self.num_batches):
                x = self.x[self.batch_rows(b)]
                x = x.to(dtype) if dtype is not None and x.is_floating_point() else x
                out = torch.func.functional_call(self.model, {**fixed, **leaves}, (x,))
                total = self._summed_metric(out, self.y[self.batch_rows(b)])
                first = torch.autograd.grad(total, list(leaves.values()), create_graph=vector is not None,
                                            allow_unused=True)
                if directions is not None:
                    product = sum((g * d).sum() for g, d in zip(first, directions) if g is not None)
                    first = torch.autograd.grad(product, list(leaves.values()), allow_unused=True) \
                        if torch.is_tensor(product) and product.requires_grad else [None] * len(leaves)
                for k, g in enumerate(first):
                    if g is not None:
                        totals[k] += g.detach().double()
        by_key = {k: (t / len(self.x)).cpu().numpy() for k, t in zip(floating, totals)}
        return {k: by_key[k] if k in by_key else np.zeros(tuple(state[k].shape)) for k in self.keys}

    # -- metric ------------------------------------------------------------------------

    def _summed_metric(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.metric == "accuracy":
            return (out.argmax(dim=-1) == y).sum(dtype=torch.float64)
        if self.metric == "neg_loss":
            return -torch.nn.functional.cross_entropy(out, y.long(), reduction="sum").double()
        return -((out.reshape(y.shape) - y) ** 2).sum(dtype=torch.float64)

    def score_fast(self, scores: FastScores, c: int, b: int, out: torch.Tensor, y: torch.Tensor) -> None:
        """Book a fast-path batch of one state (see :meth:`score_fast_many`)."""
        self.score_fast_many(scores, [c], b, out[None], y)

    def score_fast_many(self, scores: FastScores, states: Sequence[int], b: int, out: torch.Tensor,
                        y: torch.Tensor, *, overwrite: bool = False) -> None:
        """Book fast-path outputs (``out``: states × rows × outputs) of ``states`` (their indices)
        on held-out batch ``b``; for accuracy, note the rows whose top-2 logits nearly tie.
        Losses are summed per state by the plain path's own reduction, so they round as it does.
        ``overwrite``: ``out`` is the caller's scratch and the top-2 pass may write into it
        (no copy of the outputs)."""
        count = out.shape[0]
        finite = torch.isfinite(out).reshape(count, -1).all(dim=1)  # before the top-2 pass writes -inf into out
        if self.metric != "accuracy" or out.shape[-1] < 2:
            sums = torch.stack([self._summed_metric(out[j], y) for j in range(count)])
        else:
            top, index = out.max(dim=-1)
            scale = out.abs().amax(dim=-1)  # before the top-2 pass may overwrite ``out``
            hit = index == y
            sums = hit.sum(dim=1, dtype=torch.float64)
            masked = out.scatter_ if overwrite else out.scatter
            second = masked(2, index[..., None], float("-inf")).max(dim=-1).values
            near = top - second <= self.tie_tolerance * scale
            for j in near.any(dim=1).nonzero().flatten().tolist():
                near_rows = near[j].nonzero().flatten()
                scores.near[(int(states[j]), b)] = (near_rows.cpu().numpy(), float(hit[j, near_rows].sum()))
        scores.sums[np.asarray(states), b] = sums.cpu().numpy()
        unusable = (~finite).cpu().numpy() | ~np.isfinite(scores.sums[np.asarray(states), b])
        scores.plain.update((int(states[j]), b) for j in np.flatnonzero(unusable))

    def resolve_near_ties(self, scores: FastScores, state_of: Callable[[int], Mapping[str, torch.Tensor]]) -> np.ndarray:
        """Per-state utilities: near-tie rows decided as the plain path decides them, by
        :meth:`_exact_predictions` (a row the plain path finds no near tie is decided the same
        by its float32 argmax: its margin exceeds float32's error many times), and every batch
        whose fast outputs were not finite scored whole on the plain path (:class:`FastScores`)."""
        sums = scores.sums.copy()
        cached: dict[int, Mapping[str, torch.Tensor]] = {}
        for c, b in sorted(scores.plain):  # fast outputs that were not numbers: the whole batch, plainly
            if c not in cached:
                cached[c] = state_of(c)
            sums[c, b] = self._plain_sum(cached[c], b)
        for (c, b), (rows, fast_hits) in sorted(scores.near.items()):
            if (c, b) in scores.plain:
                continue
            if c not in cached:
                cached[c] = state_of(c)
            batch = self.batch_rows(b)
            x, y = self.x[batch], self.y[batch]
            # The float32 logits of a block of at least RECHECK_ROWS rows (matmul kernels for a
            # handful of rows may sum in another order): the plain path's, where float64 fails.
            filler = np.setdiff1d(np.arange(min(RECHECK_ROWS, len(x))), rows)[: max(0, RECHECK_ROWS - len(rows))]
            block = torch.as_tensor(np.concatenate([rows, filler]), device=self.device)
            out = torch.func.functional_call(self.model, dict(cached[c]), (x[block],))[: len(rows)]
            index = block[: len(rows)]
            plain_hits = float((self._exact_predictions(cached[c], x[index], out) == y[index]).sum())
            sums[c, b] += plain_hits - fast_hits
        return sums.sum(axis=1) / len(self.x)
