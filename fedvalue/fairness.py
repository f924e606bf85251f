"""Group fairness on held-out data, its smooth relaxations and each client's influence on it.

Held-out examples (x_j, y_j, z_j) carry a binary sensitive attribute z ∈ {0, 1}; a
classifier with parameters θ scores each example h_θ(x) ∈ [0, 1]. The gaps compare the
groups' mean scores:

* demographic parity ([FAIRINFL] Eq. 13–14, [FAIRIJ] Eq. 5):
  F_DP = |E[h | z=1] − E[h | z=0]|;
* equal opportunity, the true-positive-rate gap ([FAIRINFL] Eq. 18, 20):
  F_EOP = |E[h | z=1, y=1] − E[h | z=0, y=1]|;
* equalized odds ([FAIRINFL] Eq. 25, [FAIRIJ] Eq. 5): F_EO = Σ_{y∈{0,1}} |E[h | z=1, y] − E[h | z=0, y]|.

The **hard** gap takes h = 1[the predicted class is the positive one] (rates of positive
predictions); the **relaxed** gap takes the model's probability of the positive class
(softmax of the logits; sigmoid for one logit), which is smooth in θ ([FAIRIJ] Eq. 5; the
relaxation of [FAIRINFL] §4.1 with f = that probability). The gradient of a relaxed gap is
sign(a − b)(∇a − ∇b) per absolute term: the sign of the group difference at θ, as
[FAIRINFL] takes it after Eq. 17 (at a difference of exactly 0 the sign is taken as 0).

**Client fairness influence** (client-level reading of [FAIRIJ] Eq. 6 and [FAIRINFL] Eq. 35).
In round t client u's share of the FedAvg step is p_u Δ_u (p_u = n_u / Σ n, Δ_u = w_u − A_{t−1}),
and

    I^F_t(u) = ∇F(A_{t−1}) · (p_u Δ_u),

the first-order change of the relaxed gap F caused by u's share (> 0: u raises the gap).
Σ_u I^F_t(u) = ∇F · (A_t − A_{t−1}) is the first-order change over the round. One gradient
at A_{t−1} and one dot product per client: O(n·p), like the TracIn flows.

**Reweighting rules** at client level ([FAIRIJ] Eq. 9): drop-K / Fair-IJ (Prop. 3.1: weight 0
for the K clients with the largest positive influence) and I-JACK (Prop. 3.2:
w_u = 1 − λ I^F_t(u), clipped at 0 here so no client is subtracted, then normalized).

:class:`GroupFairness` also is a utility U(arrays) = −gap for the round game, so a round can
be valued on fairness by exact ADS and LOO like on accuracy.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping

import numpy as np
import torch

from fedvalue._checks import check_choice, check_integer, check_number
from fedvalue.projection import flatten

#: Gap names: demographic parity, equal opportunity (TPR), equalized odds.
GAPS = ("dp", "eop", "eo")


def _check_gap(gap: object) -> str:
    return str(check_choice("gap", gap, GAPS))


def _group_mean_difference(h: torch.Tensor, mask1: torch.Tensor, mask0: torch.Tensor) -> torch.Tensor:
    """E[h | mask1] − E[h | mask0] (0 for an empty group: it cannot differ)."""
    if not bool(mask1.any()) or not bool(mask0.any()):
        return h.sum() * 0.0
    return h[mask1].mean() - h[mask0].mean()


def gap_of_scores(h: torch.Tensor, y: torch.Tensor, z: torch.Tensor, gap: str) -> torch.Tensor:
    """The ``gap`` (module docstring) of scores ``h`` with labels ``y`` (1 = positive) and
    groups ``z``: hard for 0/1 scores, relaxed for probabilities. Differentiable in ``h``."""
    gap = _check_gap(gap)
    one, zero = z == 1, z == 0
    if gap == "dp":
        return _group_mean_difference(h, one, zero).abs()
    positive = y == 1
    tpr = _group_mean_difference(h, one & positive, zero & positive).abs()
    if gap == "eop":
        return tpr
    negative = ~positive
    return tpr + _group_mean_difference(h, one & negative, zero & negative).abs()


class GroupFairness:
    """Fairness gaps of a torch classifier on held-out data with a binary sensitive attribute.

    Calling it gives the utility U(arrays) = −gap (the relaxed gap by default), higher is
    fairer, so :func:`fedvalue.rounds.round_game` values a round on fairness.

    Parameters
    ----------
    model
        Template module whose ``state_dict`` names match the arrays (its own parameters
        are never used); its outputs are logits (one column: a sigmoid logit).
    x, y, sensitive
        Held-out inputs, labels and the sensitive attribute (0/1) of each example.
    gap
        ``"dp"``, ``"eop"`` or ``"eo"``: the gap F the utility, the gradient and the
        influences use.
    positive
        The favourable class (the label counted as positive, y = 1 in the gaps).
    utility_gap
        ``"relaxed"`` (default) or ``"hard"``: which gap the utility U = −gap negates.

    All arithmetic is float64 (the arrays are cast), so gradients meet finite differences.
    """

    def __init__(self, model: torch.nn.Module, x: np.ndarray, y: np.ndarray, sensitive: np.ndarray, *,
                 gap: str = "dp", positive: int = 1, utility_gap: str = "relaxed") -> None:
        self.gap = _check_gap(gap)
        check_choice("utility_gap", utility_gap, ("relaxed", "hard"))
        x = np.asarray(x, dtype=np.float64)
        if x.ndim < 2 or not np.isfinite(x).all():
            raise ValueError(f"x: expected finite inputs with one row per example (2-D or more); got shape {x.shape}"
                             f"{'' if x.ndim < 2 else ' with non-finite entries'}.")
        y = np.asarray(y)
        z = np.asarray(sensitive)
        if len(x) == 0 or len(y) != len(x) or len(z) != len(x):
            raise ValueError(f"x, y, sensitive: expected the same non-zero number of examples; got {len(x)} inputs, "
                             f"{len(y)} labels and {len(z)} sensitive values.")
        if not np.isin(z, (0, 1)).all():
            raise ValueError(f"sensitive: expected 0/1 values (a binary attribute); got {np.unique(z)[:5].tolist()}.")
        check_integer("positive", positive, 0, why="the favourable class index")
        self.model = model.eval()
        self.positive = int(positive)
        self.utility_gap = utility_gap
        self.x = torch.as_tensor(x, dtype=torch.float64)
        self.y = torch.as_tensor((y == self.positive).astype(np.int64))
        self.z = torch.as_tensor(z.astype(np.int64))
        self.labels = torch.as_tensor(y.astype(np.int64))
        state = model.state_dict()
        self.keys = list(state)
        self.floating = [k for k, v in state.items() if v.dtype.is_floating_point]

    # -- scores ------------------------------------------------------------------------------

    def _state(self, arrays: Mapping[str, np.ndarray], requires_grad: bool = False) -> dict[str, torch.Tensor]:
        missing = [k for k in self.keys if k not in arrays]
        if missing:
            raise KeyError(f"arrays: expected the model's state keys {self.keys}; missing {missing}.")
        state = {}
        for k in self.keys:
            value = np.array(arrays[k], copy=True)
            tensor = torch.as_tensor(value)
            if k in self.floating:
                tensor = tensor.to(torch.float64).requires_grad_(requires_grad)
            state[k] = tensor
        return state

    def _logits(self, state: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return torch.func.functional_call(self.model, dict(state), (self.x,))

    def _probability(self, out: torch.Tensor) -> torch.Tensor:
        if out.shape[-1] == 1:
            return torch.sigmoid(out[:, 0])
        return torch.softmax(out, dim=-1)[:, self.positive]

    def _hard(self, out: torch.Tensor) -> torch.Tensor:
        if out.shape[-1] == 1:
            return (out[:, 0] >= 0).to(torch.float64)
        return (out.argmax(dim=-1) == self.positive).to(torch.float64)

    # -- gaps ---------------------------------------------------------------------------------

    def relaxed_gap(self, arrays: Mapping[str, np.ndarray], gap: str | None = None) -> float:
        """The relaxed ``gap`` (default: this objective's) at ``arrays``."""
        with torch.no_grad():
            h = self._probability(self._logits(self._state(arrays)))
            return float(gap_of_scores(h, self.y, self.z, self.gap if gap is None else gap))

    def hard_gap(self, arrays: Mapping[str, np.ndarray], gap: str | None = None) -> float:
        """The hard ``gap`` (rates of positive predictions) at ``arrays``."""
        with torch.no_grad():
            h = self._hard(self._logits(self._state(arrays)))
            return float(gap_of_scores(h, self.y, self.z, self.gap if gap is None else gap))

    def metrics(self, arrays: Mapping[str, np.ndarray]) -> dict[str, float]:
        """Accuracy and every hard and relaxed gap at ``arrays`` (for reports)."""
        with torch.no_grad():
            out = self._logits(self._state(arrays))
            hard, soft = self._hard(out), self._probability(out)
            if out.shape[-1] == 1:
                accuracy = float(((out[:, 0] >= 0).long() == self.y).double().mean())
            else:
                accuracy = float((out.argmax(dim=-1) == self.labels).double().mean())
            result = {"accuracy": accuracy}
            for gap in GAPS:
                result[f"{gap}_gap"] = float(gap_of_scores(hard, self.y, self.z, gap))
                result[f"relaxed_{gap}_gap"] = float(gap_of_scores(soft, self.y, self.z, gap))
            return result

    def gradient(self, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """∇_θ F(θ) of the relaxed gap at ``arrays``, float64, one array per state key
        (zeros for non-floating entries such as integer buffers)."""
        state = self._state(arrays, requires_grad=True)
        value = gap_of_scores(self._probability(self._logits(state)), self.y, self.z, self.gap)
        leaves = [state[k] for k in self.floating]
        grads = torch.autograd.grad(value, leaves, allow_unused=True) if value.requires_grad else [None] * len(leaves)
        by_key = dict(zip(self.floating, grads))
        result = {}
        for k in self.keys:
            g = by_key.get(k)
            result[k] = np.zeros(np.shape(arrays[k])) if g is None else g.detach().numpy().astype(np.float64)
        return result

    def __call__(self, arrays: Mapping[str, np.ndarray]) -> float:
        """U(arrays) = −gap (relaxed or hard, as ``utility_gap`` says)."""
        return -(self.relaxed_gap(arrays) if self.utility_gap == "relaxed" else self.hard_gap(arrays))

    def __repr__(self) -> str:
        return f"GroupFairness(gap={self.gap!r}, examples={len(self.x)}, utility_gap={self.utility_gap!r})"


# ------------------------------------------------------------------------------ influence


def client_fairness_influences(
    gradient: Mapping[str, np.ndarray],
    start_arrays: Mapping[str, np.ndarray],
    replies: Mapping[Hashable, Mapping[str, np.ndarray]],
    weights: Mapping[Hashable, float],
) -> dict[Hashable, float]:
    """I^F_t(u) = ∇F(A_{t−1}) · (p_u Δ_u) of every client of ``replies`` (module docstring).

    Parameters
    ----------
    gradient
        ∇F(A_{t−1}) (:meth:`GroupFairness.gradient`), keyed like ``start_arrays``.
    start_arrays
        A_{t−1}.
    replies
        Client -> its returned arrays w_u (Δ_u = w_u − A_{t−1}).
    weights
        Client -> n_u; p_u = n_u / Σ_{v∈replies} n_v.

    Returns
    -------
    dict
        Client -> I^F_t(u), in the order of ``replies``; O(n·p).
    """
    keys = list(start_arrays)
    g = flatten(gradient, keys=keys, name="gradient")
    start = flatten(start_arrays, keys=keys, name="start_arrays")
    missing = [c for c in replies if c not in weights]
    if missing:
        raise ValueError(f"weights: expected a weight for every client of replies; missing {missing}.")
    total = float(sum(float(weights[c]) for c in replies))
    if replies and not (math.isfinite(total) and total > 0):
        raise ValueError(f"weights: expected a positive finite total; got {total!r}.")
    return {c: float(weights[c]) / total * float((flatten(arrays, keys=keys, name=f"replies[{c!r}]") - start) @ g)
            for c, arrays in replies.items()}


# ------------------------------------------------------------------------------ reweighting


def drop_k(influences: Mapping[Hashable, float], k: int) -> set:
    """The clients drop-K / Fair-IJ drops ([FAIRIJ] Prop. 3.1): the ``k`` with the largest
    positive influence (fewer when fewer are positive); ties go to the earlier client."""
    k = check_integer("k", k, 0)
    positive = [(position, c) for position, c in enumerate(influences) if influences[c] > 0]
    ranked = sorted(positive, key=lambda item: (-influences[item[1]], item[0]))
    return {c for _, c in ranked[: int(k)]}


def ijack_factors(influences: Mapping[Hashable, float], lam: float) -> dict[Hashable, float]:
    """I-JACK factors ([FAIRIJ] Prop. 3.2): w_u = max(0, 1 − λ I^F_t(u)), normalized to mean 1
    over the round's clients (λ = 0 gives exactly 1 for everyone); all 0 when every w_u is 0.

    A client's aggregation weight becomes p_u w_u / Σ_v p_v w_v."""
    lam = check_number("lam", lam, low=0.0)
    raw = {c: max(0.0, 1.0 - float(lam) * float(v)) for c, v in influences.items()}
    total = sum(raw.values())
    if total <= 0:
        return {c: 0.0 for c in raw}
    return {c: w * len(raw) / total for c, w in raw.items()}

