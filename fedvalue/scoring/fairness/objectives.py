"""Group fairness on held-out data, the two papers' smooth relaxations, and each client's
first-order influence on it.

Examples (x_j, y_j, z_j) carry a binary sensitive attribute z ∈ {0, 1} and a label y ∈ {0, 1}
(1: the favourable class; [FAIRINFL] writes −1/+1). A classifier with parameters θ has a real
score f(x; θ) (the log-odds of the favourable class) and the probability h_θ(x) = σ(f).

**Hard gaps** (the measures ψ of [FAIRINFL] Table 1, Eq. 13, 18–19, with two groups) compare
the groups' rates of positive predictions, h = 1[predicted class = favourable]:
DP |P(ŷ=1 | z=1) − P(ŷ=1 | z=0)|; EOP (equal TPR) the same given y = 1; EO the TPR gap plus
the FPR gap.

**Two relaxations, not one.**

* [FAIRIJ] Eq. 5 — *conditional means of the probability* (:func:`gap_of_scores` with
  h = h_θ, what :class:`GroupFairness` books): F_DP = |E[h_θ | z=1] − E[h_θ | z=0]|,
  F_EO = Σ_{y∈{0,1}} |E[h_θ | z=1, y] − E[h_θ | z=0, y]|, and the y = 1 term alone for EOP
  (the paper's ΔDEO).
* [FAIRINFL] Eq. 14 — *joint expectations of the score* (:func:`joint_gap_of_scores`, from
  Madras et al.): φ_DP = |E[f·1[z=1]] − E[f·1[z=0]]|, and Eq. 20 (equal TPR:
  |E[f·1[z=1, y=1]] − E[f·1[z=0, y=1]]|), Eq. 23 (equal FPR, y = 0), Eq. 25 (EO = TPR + FPR
  terms), Eq. 27 (the covariance |Cov(z, f)|). E[f·1[z=1]] = P(z=1) E[f | z=1]: it weighs each
  group by its share, uses the unbounded score and so differs from Eq. 5 unless the groups
  are equally large and f is the probability. Its per-example terms are what
  :mod:`fedvalue.scoring.fairness.ntk` differentiates.

The gradient of a relaxed gap is sign(a − b)(∇a − ∇b) per absolute term: the sign of the
group difference at θ, as [FAIRINFL] takes it after Eq. 17 (at exactly 0 the sign is 0).

**Client fairness influence (first order, no curvature).** In round t client u's share of
the FedAvg step is p_u Δ_u (p_u = n_u / Σ n, Δ_u = w_u − A_{t−1}), and

    I^F_t(u) = ∇F(A_{t−1}) · (p_u Δ_u),

the first-order change of the relaxed gap F caused by u's share (> 0: u raises the gap).
Σ_u I^F_t(u) = ∇F · (A_t − A_{t−1}). This is a TracIn-style score at the round's start, *not*
[FAIRIJ] Eq. 6 (which is −∇Fᵀ H⁻¹ ∇ℓ at a fitted model, with curvature:
:mod:`fedvalue.scoring.fairness.reweighting`) nor [FAIRINFL] Eq. 35 (the constraint term's influence
through the NTK: :mod:`fedvalue.scoring.fairness.ntk`).

**FedAvg renormalization.** Reweighting client u's aggregation weight, n_u → ω_u n_u, and
renormalizing (A_t = A_{t−1} + Σ_u ω_u n_u Δ_u / Σ_v ω_v n_v) gives at ω = 1

    ∂F(A_t)/∂ω_u = ∇F(A_t)·p_u(Δ_u − Σ_v p_v Δ_v) ≈ I^F_t(u) − p_u Σ_v I^F_t(v),

exact with the gradient taken at A_t, first order with the booked I^F at A_{t−1}; not
I^F_t(u): raising one weight lowers every other client's share
(:func:`fedavg_weight_derivatives`).

**Reweighting rules** at client level ([FAIRIJ] Eq. 9, used by the federated acceptance
policies): drop-K / Fair-IJ (Prop. 3.1) with a *fixed* K — the K clients with the largest
positive I^F (the paper derives K from λ: :func:`fedvalue.scoring.fairness.reweighting.fair_ij_weights`)
— and I-JACK (Prop. 3.2: w_u = 1 − λ I^F_t(u), clipped at 0 here so no client is
subtracted, then normalized). The federated drop rule may also act on the renormalized
derivative, on the curvature influence or on the exact drop effect
(:mod:`fedvalue.scoring.fairness.curvature`).

:class:`GroupFairness` also is a utility U(arrays) = −gap for the round game, so a round can
be valued on fairness by exact ADS and LOO like on accuracy.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping

import numpy as np
import torch

from fedvalue._checks import check_choice, check_integer, check_number
from fedvalue.scoring.projection import flatten

#: Gap names: demographic parity, equal opportunity (TPR), equalized odds.
GAPS = ("dp", "eop", "eo")
#: [FAIRINFL]'s relaxations (:func:`joint_gap_of_scores`): the gaps, the FPR term alone, the covariance.
JOINT_GAPS = ("dp", "eop", "fpr", "eo", "cov")


def _check_gap(gap: object) -> str:
    return str(check_choice("gap", gap, GAPS))


def _group_mean_difference(h: torch.Tensor, mask1: torch.Tensor, mask0: torch.Tensor) -> torch.Tensor:
    """E[h | mask1] − E[h | mask0] (0 for an empty group: it cannot differ)."""
    if not bool(mask1.any()) or not bool(mask0.any()):
        return h.sum() * 0.0
    return h[mask1].mean() - h[mask0].mean()


def gap_of_scores(h: torch.Tensor, y: torch.Tensor, z: torch.Tensor, gap: str) -> torch.Tensor:
    """The ``gap`` between the groups' conditional means of ``h`` (labels ``y``, 1 = positive;
    groups ``z``): the hard gap for 0/1 predictions, [FAIRIJ] Eq. 5 for probabilities h_θ.
    Differentiable in ``h``."""
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
    fairer, so :func:`fedvalue.valuation.round_game.round_game` values a round on fairness.

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


def joint_gap_of_scores(f: torch.Tensor, y: torch.Tensor, z: torch.Tensor, gap: str) -> torch.Tensor:
    """[FAIRINFL]'s relaxation of scores ``f`` (module docstring): joint expectations,
    (1/n)Σ_i f_i c_i inside an absolute value, with c_i = 1[z_i=1] − 1[z_i=0] for ``dp``
    (Eq. 14–15), times 1[y_i=1] for ``eop`` (Eq. 20–21), times 1[y_i=0] for ``fpr`` (Eq. 23),
    ``eo`` the sum of the ``eop`` and ``fpr`` terms (Eq. 25), ``cov`` with c_i = z_i − z̄
    (Eq. 27–28). Differentiable in ``f``."""
    gap = str(check_choice("gap", gap, JOINT_GAPS))
    f = f.to(torch.float64)
    group = (z == 1).to(torch.float64) - (z == 0).to(torch.float64)
    if gap == "cov":
        centred = z.to(torch.float64) - z.to(torch.float64).mean()
        return (f * centred).mean().abs()
    positive = (y == 1).to(torch.float64)
    tpr = (f * group * positive).mean().abs()
    fpr = (f * group * (1.0 - positive)).mean().abs()
    return {"dp": (f * group).mean().abs(), "eop": tpr, "fpr": fpr, "eo": tpr + fpr}[gap]


# ------------------------------------------------------------------------------ influence


def _total_weight(clients: Mapping[Hashable, object], weights: Mapping[Hashable, float], name: str) -> float:
    """Σ_{c∈clients} n_c, refusing a missing weight or a total that is not positive and finite."""
    missing = [c for c in clients if c not in weights]
    if missing:
        raise ValueError(f"weights: expected a weight for every client of {name}; missing {missing}.")
    total = float(sum(float(weights[c]) for c in clients))
    if clients and not (math.isfinite(total) and total > 0):
        raise ValueError(f"weights: expected a positive finite total; got {total!r}.")
    return total


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
    total = _total_weight(replies, weights, "replies")
    return {c: float(weights[c]) / total * float((flatten(arrays, keys=keys, name=f"replies[{c!r}]") - start) @ g)
            for c, arrays in replies.items()}


# ------------------------------------------------------------------------------ reweighting


def drop_k(influences: Mapping[Hashable, float], k: int) -> set:
    """The clients drop-K / Fair-IJ drops ([FAIRIJ] Prop. 3.1 with a fixed K instead of the
    K(λ) the proposition derives): the ``k`` with the largest positive influence (fewer when
    fewer are positive); ties go to the earlier client."""
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



def fedavg_weight_derivatives(influences: Mapping[Hashable, float],
                              weights: Mapping[Hashable, float]) -> dict[Hashable, float]:
    """∂F/∂ω_u = I(u) − p_u Σ_v I(v) under FedAvg's renormalized weights (module docstring).

    Parameters
    ----------
    influences
        Client -> I(u) = ∇F · (p_u Δ_u) (:func:`client_fairness_influences`), or any
        additive per-client first-order effect of its share.
    weights
        Client -> n_u; p_u = n_u / Σ_{v∈influences} n_v.

    Returns
    -------
    dict
        Client -> the derivative of F(A_t) in u's weight multiplier ω_u at ω = 1, in the order
        of ``influences``; they sum to I(total)·(1 − Σ_u p_u) = 0.
    """
    total = _total_weight(influences, weights, "influences")
    summed = float(sum(float(v) for v in influences.values()))
    return {c: float(v) - float(weights[c]) / total * summed for c, v in influences.items()}
