"""The models of the synthetic-data valuation ([ADS] §6.1), refit along permutations.

Two :class:`fedvalue.valuation.prefix_mc.PrefixModel` implementations, each "retraining" the model a
valuation prefix or an intervention names:

* ``knn``: the K-NN classifier's majority vote (:class:`fedvalue.valuation.knn.monte_carlo.KnnAccuracyPrefixes`);
* ``logistic``: L2-regularized binary logistic regression as liblinear fits it, the model of
  [ADS]'s non-KNN row (Omniglot: "A logistic regression model is trained with solver
  liblinear"): with x̃ = (x, 1) and y ∈ {−1, +1},

      w* = argmin_w  C Σ_{i∈S} log(1 + exp(−y_i x̃_i·w)) + ½ ‖w‖²,

  the intercept penalized like the other weights (liblinear's ``intercept_scaling=1``), so
  every subset, empty or of one class (where scikit-learn refuses to fit), has one optimum. :class:`LogisticPrefixes` finds it by
  damped Newton steps, for a block of subsets at once; a subset grown by one instance starts
  from its previous optimum (the objective is strictly convex, so the start changes the
  iterations, not the optimum: tests compare with scikit-learn's liblinear fit). The
  prediction is class 1 when x̃·w* > 0 (an empty subset's w* = 0 predicts class 0).
"""

from __future__ import annotations

import numpy as np

__all__ = ["LogisticPrefixes", "MODELS", "UTILITIES", "prefix_model"]

MODELS = ("knn", "logistic")


class LogisticPrefixes:
    """Binary logistic regression (module docstring) as a PrefixModel; utility = test accuracy."""

    def __init__(self, x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, y_test: np.ndarray, *,
                 c: float = 1.0, tolerance: float = 1e-9, max_iterations: int = 100) -> None:
        classes = np.unique(np.concatenate([y_train, y_test]))
        if len(classes) > 2:
            raise ValueError(f"y_train: expected two classes for the binary logistic model; got {len(classes)}.")
        self.classes = classes
        self.design = np.hstack([np.asarray(x_train, np.float64), np.ones((len(x_train), 1))])
        self.test_design = np.hstack([np.asarray(x_test, np.float64), np.ones((len(x_test), 1))])
        self.signs = np.where(np.asarray(y_train) == classes[-1], 1.0, -1.0)
        self.test_positive = np.asarray(y_test) == classes[-1]
        self.c, self.tolerance, self.max_iterations = float(c), float(tolerance), int(max_iterations)
        self.num_train = len(self.design)

    def _objective(self, weights: np.ndarray, masks: np.ndarray) -> np.ndarray:
        margins = self.signs * (weights @ self.design.T)
        return self.c * (masks * np.logaddexp(0.0, -margins)).sum(axis=1) + 0.5 * (weights * weights).sum(axis=1)

    def fit(self, weights: np.ndarray, masks: np.ndarray) -> np.ndarray:
        """The optimum of every row's subset, by damped Newton from ``weights`` (not modified)."""
        weights = np.array(weights, dtype=np.float64)
        masks = np.asarray(masks, dtype=np.float64)
        active = np.arange(len(weights))
        for _ in range(self.max_iterations):
            w, m = weights[active], masks[active]
            margins = self.signs * (w @ self.design.T)
            p = 0.5 * (1.0 + np.tanh(0.5 * margins))  # σ(y x̃·w)
            gradient = self.c * ((m * (p - 1.0) * self.signs) @ self.design) + w
            done = np.abs(gradient).max(axis=1) <= self.tolerance * max(1.0, self.c * self.num_train)
            if done.all():
                break
            active, w, m, gradient, p = active[~done], w[~done], m[~done], gradient[~done], p[~done]
            curvature = self.c * m * p * (1.0 - p)
            hessian = np.matmul((curvature[:, :, None] * self.design).transpose(0, 2, 1), self.design)
            hessian += np.eye(self.design.shape[1])
            direction = np.linalg.solve(hessian, gradient[:, :, None])[:, :, 0]
            # Halve the step where the objective would not fall (Armijo), then take it.
            step = np.ones(len(active))
            before = self._objective(w, m)
            slope = -(gradient * direction).sum(axis=1)
            for _ in range(30):
                trial = w - step[:, None] * direction
                bad = self._objective(trial, m) > before + 1e-4 * step * slope
                if not bad.any():
                    break
                step[bad] *= 0.5
            weights[active] = w - step[:, None] * direction
        return weights

    def _accuracy(self, weights: np.ndarray) -> np.ndarray:
        predicted = (weights @ self.test_design.T) > 0
        return (predicted == self.test_positive).mean(axis=1)

    def start(self, masks: np.ndarray) -> dict:
        masks = np.asarray(masks, dtype=bool)
        weights = self.fit(np.zeros((len(masks), self.design.shape[1])), masks)
        return {"weights": weights, "masks": masks.copy()}

    def utilities(self, state: dict) -> np.ndarray:
        return self._accuracy(state["weights"])

    def add(self, state: dict, rows: np.ndarray, instances: np.ndarray) -> np.ndarray:
        state["masks"][rows, instances] = True
        state["weights"][rows] = self.fit(state["weights"][rows], state["masks"][rows])
        return self._accuracy(state["weights"][rows])


#: Utilities a retrained model is scored by: the paper's test accuracy, or (K-NN only) the K-NN
#: likelihood of the right label (:class:`fedvalue.valuation.knn.monte_carlo.KnnLikelihoodPrefixes`).
UTILITIES = ("accuracy", "likelihood")


def prefix_model(model: str, x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, y_test: np.ndarray,
                 k: int, utility: str = "accuracy"):
    """The PrefixModel of ``model`` (``knn`` with K = ``k``, or ``logistic``) on these data, scored by
    ``utility`` (``likelihood``: K-NN only)."""
    from fedvalue import KnnAccuracyPrefixes, KnnLikelihoodPrefixes

    if utility not in UTILITIES or (utility == "likelihood" and model != "knn"):
        raise ValueError(f"utility: expected 'accuracy', or 'likelihood' with the knn model; got {utility!r} with "
                         f"model {model!r}.")
    if model == "knn":
        return (KnnLikelihoodPrefixes if utility == "likelihood" else KnnAccuracyPrefixes)(x_train, y_train, x_test,
                                                                                           y_test, k)
    if model == "logistic":
        return LogisticPrefixes(x_train, y_train, x_test, y_test)
    raise ValueError(f"model: expected one of {list(MODELS)}; got {model!r}.")
