"""A binary classifier as a function of one flat parameter vector, its weighted training risk,
the minimizer of that risk, and inverse-curvature products H⁻¹v for influence functions.

**Score.** :class:`BinaryScoreModel` wraps a torch module whose output is one logit (sigmoid)
or two (softmax) and reads it as the log-odds of the favourable class,
f(x; θ) = logit (one output) or l_pos − l_neg (two), so h_θ(x) = σ(f(x; θ)) is the probability
of the favourable class and the prediction is 1[f ≥ 0] ([FAIRINFL] §2 writes f: X → ℝ with
this rule; [FAIRIJ] §2.2 uses the probability h_θ). θ are the module's floating parameters,
flattened in ``named_parameters`` order; all arithmetic is float64.

**Weighted risk** ([FAIRIJ] Eq. 1). R(θ; w) = Σ_n w_n ℓ(y_n, f(x_n; θ)) + (ρ/2)‖θ‖², ℓ the
logistic loss (the negative log-likelihood of h_θ), ρ ≥ 0 an optional ridge that is not
reweighted (it makes θ*(w) unique, so finite differences of the retrained model are defined).
The paper writes the risk as a mean (1/N)Σ_n; its argmin is the same, and with the risk as a
sum the implicit-function derivative of [FAIRIJ] Eq. 3 is exact as printed:
Σ_n w_n g_n(θ*(w)) + ρθ*(w) = 0 differentiated in w_n gives ∂θ*/∂w_n = −H⁻¹ g_n with
H = ∇²_θ R(θ̂; 1) = Σ_n ∇²ℓ_n + ρI, g_n = ∇_θ ℓ_n(θ̂) (with the mean, −H_mean⁻¹ g_n / N).

**Inverse curvature.** Every solver answers ``solve(v)`` = M⁻¹v for its M ≈ H:

* :class:`ExactSolver`: M = H + δI, the exact Hessian (Cholesky; p×p, where it fits);
* :class:`DiagonalSolver`: M = diag(d) + δI; with d = Σ_n g_n ⊙ g_n the diagonal *empirical*
  Fisher of [FAIRIJ] App. A (``BinaryScoreModel``-free: built from gradients, so a federated
  server can sum clients' diagonals);
* :class:`ConjugateGradientSolver`: (H + δI)s = v by conjugate gradients on Hessian-vector
  products (O(p) memory, for models whose Hessian does not fit); stops at a relative residual
  ``tol`` and refuses a direction of non-positive curvature (raise δ);
* :class:`IdentitySolver`: M = I, no curvature (the plain-gradient edit [FAIRIJ] §3.3
  contrasts with).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import numpy as np
import torch

from fedvalue._checks import check_integer, check_number


def _as_double(value) -> torch.Tensor:
    return torch.as_tensor(np.asarray(value, dtype=np.float64) if not isinstance(value, torch.Tensor) else value,
                           dtype=torch.float64)


class BinaryScoreModel:
    """f(x; θ) of a torch binary classifier over a flat float64 θ (module docstring).

    Parameters
    ----------
    module
        A classifier with one output (a sigmoid logit) or two (softmax logits). Its own
        parameters give :attr:`theta0`; it is evaluated functionally, never modified.
    positive
        With two outputs, the favourable class's index.
    """

    def __init__(self, module: torch.nn.Module, *, positive: int = 1) -> None:
        self.module = copy.deepcopy(module).double().eval()  # the caller's module stays as it was
        self.positive = check_integer("positive", positive, 0)
        if self.positive > 1:
            raise ValueError(f"positive: expected 0 or 1 (a binary classifier's class index); got {positive!r}.")
        named = [(k, v) for k, v in self.module.named_parameters()]
        if not named:
            raise ValueError("module: expected a module with parameters; it has none.")
        self.names = [k for k, _ in named]
        self.shapes = [tuple(v.shape) for _, v in named]
        self.sizes = [int(v.numel()) for _, v in named]
        self.theta0 = torch.cat([v.detach().reshape(-1) for _, v in named]).to(torch.float64)

    @property
    def num_parameters(self) -> int:
        return int(self.theta0.numel())

    def unflatten(self, theta: torch.Tensor) -> dict[str, torch.Tensor]:
        if theta.shape != self.theta0.shape:
            raise ValueError(f"theta: expected a flat vector of {self.num_parameters} parameters; got shape "
                             f"{tuple(theta.shape)}.")
        return {k: chunk.reshape(shape)
                for k, chunk, shape in zip(self.names, torch.split(theta, self.sizes), self.shapes)}

    def score(self, theta: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """f(x; θ), the log-odds of the favourable class, one value per row of ``x``."""
        out = torch.func.functional_call(self.module, self.unflatten(theta), (x,))
        if out.ndim == 1:
            return out
        if out.shape[-1] == 1:
            return out[:, 0]
        if out.shape[-1] != 2:
            raise ValueError(f"module: expected 1 or 2 outputs (a binary classifier); got {out.shape[-1]}.")
        return out[:, self.positive] - out[:, 1 - self.positive]

    def probability(self, theta: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """h_θ(x) = σ(f(x; θ)), the probability of the favourable class."""
        return torch.sigmoid(self.score(theta, x))

    def score_jacobian(self, theta: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """J[n] = ∂f(x_n; θ)/∂θ, shape (N, p) (one reverse pass per row, vectorized)."""
        one = lambda t, row: self.score(t, row[None])[0]  # noqa: E731 - the per-row function vmap maps
        return torch.func.vmap(torch.func.grad(one), in_dims=(None, 0))(theta, x)


class WeightedRisk:
    """R(θ; w) = Σ_n w_n ℓ(y_n, f(x_n; θ)) + (ρ/2)‖θ‖² of [FAIRIJ] Eq. 1 (module docstring).

    Parameters
    ----------
    model
        The :class:`BinaryScoreModel`.
    x, y
        Training inputs and 0/1 labels (1: the favourable class).
    ridge
        ρ ≥ 0 (not reweighted).
    """

    def __init__(self, model: BinaryScoreModel, x, y, *, ridge: float = 0.0) -> None:
        self.model = model
        self.x = _as_double(x)
        y = np.asarray(y)
        if len(y) != len(self.x) or len(y) == 0 or not np.isin(y, (0, 1)).all():
            raise ValueError(f"y: expected one 0/1 label per row of x ({len(self.x)}); got {len(y)} labels with "
                             f"values {np.unique(y)[:5].tolist()}.")
        self.y = torch.as_tensor(y.astype(np.float64))
        self.ridge = check_number("ridge", ridge, low=0.0)

    @property
    def num_examples(self) -> int:
        return len(self.y)

    def _weights(self, weights) -> torch.Tensor:
        if weights is None:
            return torch.ones(self.num_examples, dtype=torch.float64)
        w = _as_double(weights)
        if w.shape != (self.num_examples,) or not bool(torch.isfinite(w).all()):
            raise ValueError(f"weights: expected {self.num_examples} finite weights; got shape {tuple(w.shape)}.")
        return w

    def losses(self, theta: torch.Tensor) -> torch.Tensor:
        """ℓ_n(θ), the logistic loss of every example."""
        return torch.nn.functional.binary_cross_entropy_with_logits(self.model.score(theta, self.x), self.y,
                                                                    reduction="none")

    def value(self, theta: torch.Tensor, weights=None) -> torch.Tensor:
        """R(θ; w)."""
        return self._weights(weights) @ self.losses(theta) + 0.5 * self.ridge * theta @ theta

    def per_example_gradients(self, theta: torch.Tensor) -> torch.Tensor:
        """G[n] = g_n = ∇_θ ℓ_n(θ), shape (N, p)."""
        def one(t, row, label):
            return torch.nn.functional.binary_cross_entropy_with_logits(self.model.score(t, row[None])[0], label)
        return torch.func.vmap(torch.func.grad(one), in_dims=(None, 0, 0))(theta, self.x, self.y)

    def gradient(self, theta: torch.Tensor, weights=None) -> torch.Tensor:
        """∇_θ R(θ; w)."""
        return torch.func.grad(lambda t: self.value(t, weights))(theta)

    def hvp(self, theta: torch.Tensor, vector: torch.Tensor, weights=None) -> torch.Tensor:
        """∇²_θ R(θ; w) v (forward over reverse; the Hessian is never formed)."""
        return torch.func.jvp(lambda t: self.gradient(t, weights), (theta,), (vector,))[1]

    def hessian(self, theta: torch.Tensor, weights=None, *, chunk: int = 64) -> torch.Tensor:
        """∇²_θ R(θ; w), p×p: Hessian-vector products with ``chunk`` basis vectors at a time
        (memory O(chunk·N·width), not O(p·N·width))."""
        check_integer("chunk", chunk)
        p = self.model.num_parameters
        grad = lambda t: self.gradient(t, weights)  # noqa: E731
        columns = []
        for start in range(0, p, chunk):
            basis = torch.eye(p, dtype=torch.float64)[start:start + chunk]
            columns.append(torch.func.vmap(lambda v: torch.func.jvp(grad, (theta,), (v,))[1])(basis))
        h = torch.cat(columns)
        return 0.5 * (h + h.T)

    def fisher_diagonal(self, theta: torch.Tensor, weights=None) -> torch.Tensor:
        """Σ_n w_n g_n ⊙ g_n, the diagonal of the empirical Fisher ([FAIRIJ] App. A) in the risk's
        sum form, plus ρ (the ridge's own curvature)."""
        g = self.per_example_gradients(theta)
        return self._weights(weights) @ (g * g) + self.ridge

    def fit(self, start: torch.Tensor | None = None, weights=None, *, tol: float = 1e-10, max_iter: int = 2000,
            newton_steps: int = 0) -> torch.Tensor:
        """θ*(w) = argmin_θ R(θ; w) from ``start`` (default the module's θ0): L-BFGS on R/N (the
        same minimizer; ``tol`` bounds the mean-risk gradient), then up to ``newton_steps`` exact
        Newton steps while the Hessian is positive definite (small models: the minimizer to
        machine precision)."""
        scale = 1.0 / self.num_examples
        theta = minimize(lambda t: scale * self.value(t, weights), self.model.theta0 if start is None else start,
                         tol=tol, max_iter=max_iter)
        for _ in range(check_integer("newton_steps", newton_steps, 0)):
            factor, info = torch.linalg.cholesky_ex(self.hessian(theta, weights))
            if int(info) != 0:
                break
            step = torch.cholesky_solve(self.gradient(theta, weights)[:, None], factor)[:, 0]
            theta = theta - step
            if float(step.abs().max()) < 1e-15 * max(1.0, float(theta.abs().max())):
                break
        return theta


def minimize(objective: Callable[[torch.Tensor], torch.Tensor], start: torch.Tensor, *, tol: float = 1e-10,
             max_iter: int = 2000) -> torch.Tensor:
    """argmin of a smooth ``objective`` of a flat float64 vector: full-batch L-BFGS with a
    strong-Wolfe line search, stopped at gradient ∞-norm ``tol`` or ``max_iter`` evaluations.
    Deterministic (no sampling)."""
    check_number("tol", tol, low=0.0, low_open=True)
    check_integer("max_iter", max_iter)
    theta = start.detach().clone().to(torch.float64).requires_grad_(True)
    optimizer = torch.optim.LBFGS([theta], lr=1.0, max_iter=max_iter, max_eval=2 * max_iter, history_size=50,
                                  tolerance_grad=tol, tolerance_change=1e-16, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        value = objective(theta)
        value.backward()
        return value

    optimizer.step(closure)
    return theta.detach()


# -------------------------------------------------------------------------- solvers


class ExactSolver:
    """s = (H + δI)⁻¹ v with H given (Cholesky once; many solves). Refuses an H + δI that is
    not positive definite (a saddle or a flat direction: raise ``damping``)."""

    def __init__(self, hessian, *, damping: float = 0.0) -> None:
        h = _as_double(hessian)
        if h.ndim != 2 or h.shape[0] != h.shape[1]:
            raise ValueError(f"hessian: expected a square matrix; got shape {tuple(h.shape)}.")
        self.damping = check_number("damping", damping, low=0.0)
        matrix = 0.5 * (h + h.T) + self.damping * torch.eye(len(h), dtype=torch.float64)
        factor, info = torch.linalg.cholesky_ex(matrix)
        if int(info) != 0:
            smallest = float(torch.linalg.eigvalsh(matrix)[0])
            raise ValueError(f"damping: expected H + damping·I positive definite; its smallest eigenvalue is "
                             f"{smallest:.3g} with damping {self.damping:g} (raise damping above {-smallest:.3g}).")
        self.factor = factor

    def solve(self, vector) -> torch.Tensor:
        v = _as_double(vector)
        return torch.cholesky_solve(v.reshape(len(v), -1), self.factor).reshape(v.shape)


class DiagonalSolver:
    """s = v / (d + δ): a diagonal curvature, e.g. the empirical Fisher diagonal Σ_n g_n²
    ([FAIRIJ] App. A: "a diagonal empirical Fisher ... with a diagonal dampner")."""

    def __init__(self, diagonal, *, damping: float = 0.0) -> None:
        d = _as_double(diagonal)
        self.damping = check_number("damping", damping, low=0.0)
        self.diagonal = d + self.damping
        if d.ndim != 1 or not bool((self.diagonal > 0).all()):
            raise ValueError(f"damping: expected diagonal + damping > 0 everywhere; its smallest entry is "
                             f"{float(self.diagonal.min()):.3g} (raise damping).")

    @classmethod
    def empirical_fisher(cls, per_example_gradients, *, damping: float) -> DiagonalSolver:
        """From gradients g_n (rows): d = Σ_n g_n ⊙ g_n."""
        g = _as_double(per_example_gradients)
        return cls((g * g).sum(dim=0), damping=damping)

    def solve(self, vector) -> torch.Tensor:
        v = _as_double(vector)
        return v / (self.diagonal if v.ndim == 1 else self.diagonal[:, None])


class ConjugateGradientSolver:
    """s = (H + δI)⁻¹ v by conjugate gradients on ``hvp(v) = Hv`` (module docstring)."""

    def __init__(self, hvp: Callable[[torch.Tensor], torch.Tensor], *, damping: float = 0.0, tol: float = 1e-10,
                 max_iter: int = 1000) -> None:
        self.hvp = hvp
        self.damping = check_number("damping", damping, low=0.0)
        self.tol = check_number("tol", tol, low=0.0, low_open=True)
        self.max_iter = check_integer("max_iter", max_iter)
        self.iterations = 0

    def solve(self, vector) -> torch.Tensor:
        b = _as_double(vector)
        x = torch.zeros_like(b)
        r = b.clone()
        p = r.clone()
        rr = float(r @ r)
        target = self.tol ** 2 * rr
        for step in range(self.max_iter):
            if rr <= target:
                break
            hp = self.hvp(p) + self.damping * p
            curvature = float(p @ hp)
            if curvature <= 0:
                raise ValueError(f"damping: expected H + damping·I positive definite; conjugate gradients met "
                                 f"curvature {curvature:.3g} ≤ 0 at step {step} (raise damping).")
            alpha = rr / curvature
            x = x + alpha * p
            r = r - alpha * hp
            rr_next = float(r @ r)
            p = r + (rr_next / rr) * p
            rr = rr_next
            self.iterations = step + 1
        else:
            if rr > target:
                raise ValueError(f"max_iter: conjugate gradients did not reach the relative residual {self.tol:g} in "
                                 f"{self.max_iter} steps (residual {np.sqrt(rr / max(float(b @ b), 1e-300)):.3g}); "
                                 "raise max_iter or damping.")
        return x


class IdentitySolver:
    """s = v: no curvature."""

    damping = 0.0

    def solve(self, vector) -> torch.Tensor:
        return _as_double(vector).clone()
