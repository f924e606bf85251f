"""The fairness papers' own small experiments, centralized: [FAIRINFL] §5's toy and [FAIRIJ]'s
reweighting protocol.

**Toy** ([FAIRINFL] §5, Fig. 1, Prop. 5.2). x ~ N(μ_{z,y}, 1) with the asymmetric means
:data:`simulations.experiments.fairness.data.ASYMMETRIC_MEANS` (|μ_{1,0}| < |μ_{0,1}|), ``toy_train`` training
rows, ``toy_test`` test rows, a linear model f(x) = w·x + b fitted by logistic regression (ERM).
At the ERM model every training example gets S(i) (Eq. 35, relaxed DP, :mod:`fedvalue.scoring.fairness.ntk`)
and S_ℓ(i) (the loss analogue); for each kept fraction the examples are pruned by fairness
(ascending |S(i)|), by accuracy (descending |S_ℓ(i)|) or at random (§6.1) and the model is
retrained on the rest, with the relaxed-DP regularizer γ φ̂ of Eq. 10 for each γ in ``gammas``
(γ = 0: plain retraining, the setting of Prop. 5.2's proof). Reported on the test rows: the
threshold −b/w, accuracy, the hard DP gap; and the instance's lever d DP/dt at the ERM
threshold (from the known densities: < 0 means moving the threshold right lowers the gap).
Fig. 1's direction holds when pruning by fairness moves the threshold right and lowers DP.

**Tabular** ([FAIRIJ] §4 and App. B protocol, on SLID standing in for Adult). Each seed
splits SLID (:func:`simulations.experiments.fairness.data.slid_rows`) at random into train / validation /
test (50 / 25 / 25 %), fits logistic regression by ERM (ridge ``ridge``; with ``hidden`` > 0
the paper's one-hidden-layer SeLU MLP instead, whose exact Hessian is damped where it is not
positive definite and whose hidden layer is SIM-JACK's Φ), computes the
fairness influences I_F,n = −g_aᵀH⁻¹g_n (Eq. 6, g_a the gradient of the validation gap of
Eq. 5) with each curvature — the exact Hessian, the damped diagonal empirical Fisher of
App. A (damping ``damping``) — and for each rule (Fair-IJ Prop. 3.1, drop-K/upweight-M
Prop. C.1, I-JACK Prop. 3.2, SIM-JACK Prop. 3.3 with Φ the standardized inputs) edits the
model by the infinitesimal jackknife (Eq. 4, 10–12) at ``lams`` strengths λ = c / max_n|(C)I_n|,
c log-spaced in [lam_low, lam_high]; the plain-gradient edit θ̂ − c·0.1‖θ̂‖/‖g_a‖·g_a of §3.3 is
searched the same way. λ is chosen on the validation split (lowest hard ``gap`` there, as
App. B does); accuracy and the DP/EOP/EO gaps are reported on the test split. Each rule is
paired with **random**: the same weights given to randomly permuted examples (the same
number of drops for Fair-IJ, the same multiset of weights for I-JACK/SIM-JACK), edited the
same way, and **random-matched**: those random deviations scaled (scale chosen on validation)
until the validation accuracy equals the rule's, i.e. random reweighting at equal accuracy
cost. Paired differences over seeds carry Student-t intervals; a rule *beats random at equal
accuracy cost* when its test gap is below random-matched's by an interval excluding 0 while
its test accuracy is not below by an interval excluding 0.

**Pruning on SLID** ([FAIRINFL] §6.1–6.2 on the same splits and ERM model): S(i) and S_ℓ(i) of
the training rows, each pruning order at each of ``prune_fractions``, retrained with the
relaxed-DP regularizer γ = ``prune_gamma`` (Eq. 10 with Eq. 14); "full" is all rows with the
regularizer (the paper's lfatr baseline); test accuracy and DP, paired against random pruning.
``prune_optimizer``: ``lbfgs`` minimizes Eq. 10 from the ERM model; ``adam`` trains from the
model's initialization as §6.1 does, Adam at ``prune_learning_rate`` (0.001) for
``prune_epochs`` epochs in minibatches of ``prune_batch_size``
(:mod:`simulations.experiments.fairness.adam_fit`).

``--results FOLDER`` keeps the summaries as the docs' results files (:mod:`simulations.experiments.fairness.markdown`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from scipy import stats

from fedvalue.utilities import (
    GAPS,
    BinaryScoreModel,
    DiagonalSolver,
    ExactSolver,
    WeightedRisk,
    fairness_ntk as fair_ntk,
    fairness_reweighting as fr,
    gap_of_scores,
)
from simulations.experiments.fairness.adam_fit import fit_regularized_adam
from simulations.experiments.fairness.data import ASYMMETRIC_MEANS, slid_frame, slid_rows, toy_rows
from simulations.experiments.fairness.markdown import CENTRAL_RESULTS, central_results
from simulations.experiments.fairness.tables import interval
from simulations.runner import (
    Simulation,
    check_choice,
    check_integer,
    check_number,
    prepare_run_dir,
    write_results,
    write_run_config,
)

EXPERIMENTS = ("toy", "tabular", "all")
CURVATURES = ("exact", "fisher")
#: The edits of the tabular experiment: [FAIRIJ]'s rules and the plain-gradient edit.
EDITS = (*fr.RULES, "gradient")
#: How SLID is retrained after pruning (module docstring).
PRUNE_OPTIMIZERS = ("lbfgs", "adam")


@dataclass(frozen=True)
class FairnessCentralConfig:
    experiment: str = "all"
    seed: int = 0
    seeds: int = 10
    toy_means: tuple[float, ...] = ASYMMETRIC_MEANS
    toy_train: int = 2000
    toy_test: int = 20000
    keep_fractions: tuple[float, ...] = (0.8, 0.6, 0.4)
    gammas: tuple[float, ...] = (0.0, 0.1)
    gap: str = "dp"
    lams: int = 50
    lam_low: float = 0.01
    lam_high: float = 100.0
    ridge: float = 1.0
    damping: float = 1.0
    epsilon: float = 1e-3
    confidence: float = 0.95
    prune_fractions: tuple[float, ...] = (0.8, 0.6, 0.4, 0.2)
    prune_gamma: float = 1.0
    prune_optimizer: str = "lbfgs"
    prune_epochs: int = 20
    prune_learning_rate: float = 1e-3
    prune_batch_size: int = 64
    hidden: int = 0
    fit_iterations: int = 500

    def check(self) -> None:
        check_choice("experiment", self.experiment, EXPERIMENTS)
        check_integer("seed", self.seed, 0)
        check_integer("seeds", self.seeds, 2, why="paired intervals need two seeds")
        check_integer("toy_train", self.toy_train, 20)
        check_integer("toy_test", self.toy_test, 20)
        check_integer("lams", self.lams, 1)
        check_choice("gap", self.gap, GAPS)
        means = self.toy_means
        if len(means) != 4 or not all(isinstance(m, (int, float)) and math.isfinite(m) for m in means) or not (
                means[0] < means[1] < 0 < means[2] < means[3]):
            raise ValueError(f"toy_means: expected four numbers μ_00 < μ_10 < 0 < μ_01 < μ_11; got {list(means)}.")
        if not self.keep_fractions or any(not isinstance(f, (int, float)) or not 0 < f < 1
                                          for f in self.keep_fractions):
            raise ValueError(f"keep_fractions: expected numbers in the open interval (0, 1); got "
                             f"{list(self.keep_fractions)}.")
        if not self.gammas or any(not isinstance(g, (int, float)) or not g >= 0 for g in self.gammas):
            raise ValueError(f"gammas: expected numbers ≥ 0; got {list(self.gammas)}.")
        check_number("lam_low", self.lam_low, low=0.0, low_open=True)
        check_number("lam_high", self.lam_high, low=self.lam_low)
        check_number("ridge", self.ridge, low=0.0, low_open=True, why="logistic regression needs it on separable data")
        check_number("damping", self.damping, low=0.0, low_open=True)
        check_number("epsilon", self.epsilon, low=0.0, low_open=True)
        check_number("confidence", self.confidence, low=0.0, high=1.0, low_open=True, high_open=True)
        if not self.prune_fractions or any(not isinstance(f, (int, float)) or not 0 < f < 1
                                           for f in self.prune_fractions):
            raise ValueError(f"prune_fractions: expected numbers in the open interval (0, 1); got "
                             f"{list(self.prune_fractions)}.")
        check_number("prune_gamma", self.prune_gamma, low=0.0)
        check_choice("prune_optimizer", self.prune_optimizer, PRUNE_OPTIMIZERS)
        check_integer("prune_epochs", self.prune_epochs, 1)
        check_number("prune_learning_rate", self.prune_learning_rate, low=0.0, low_open=True)
        check_integer("prune_batch_size", self.prune_batch_size, 2)
        check_integer("hidden", self.hidden, 0)
        check_integer("fit_iterations", self.fit_iterations, 1)


HELP = {
    "experiment": "toy ([FAIRINFL] §5), tabular ([FAIRIJ] protocol on SLID) or all",
    "toy_means": "μ_00, μ_10, μ_01, μ_11 of the toy (group z, label y), comma-separated",
    "toy_train": "training rows of the toy per seed",
    "toy_test": "test rows of the toy per seed",
    "keep_fractions": "fractions of the toy's training rows kept after pruning, comma-separated",
    "gammas": "strengths γ of the relaxed-DP regularizer when retraining after pruning, comma-separated",
    "lams": "number of λ values searched on the validation split",
    "lam_low": "smallest λ·max|influence| searched",
    "lam_high": "largest λ·max|influence| searched",
    "ridge": "ridge ρ of the weighted risk (sum form)",
    "damping": "damping added to the diagonal empirical Fisher",
    "epsilon": "ε of SIM-JACK's similarity C = ΦΦᵀ + εI",
    "confidence": "level of the Student-t intervals over seeds",
    "gap": "fairness gap the influences target and λ is chosen on: dp, eop, eo",
    "prune_fractions": "fractions of SLID's training rows kept by [FAIRINFL] pruning, comma-separated",
    "prune_gamma": "γ of the relaxed-DP regularizer when retraining SLID after pruning ([FAIRINFL] §6.1: 1)",
    "prune_optimizer": "retraining after pruning: lbfgs (Eq. 10 minimized from the ERM model) or adam (§6.1: Adam "
                       "from the initialization, --prune-epochs epochs at --prune-learning-rate)",
    "prune_epochs": "Adam epochs of the retraining after pruning (the paper gives none)",
    "prune_learning_rate": "Adam learning rate of the retraining after pruning ([FAIRINFL] §6.1: 0.001)",
    "prune_batch_size": "Adam minibatch size of the retraining after pruning",
    "hidden": "SLID model: 0 = logistic regression, else one SeLU hidden layer of this width ([FAIRIJ] §4: 100)",
    "fit_iterations": "L-BFGS iterations when fitting the SLID MLP (logistic regression is fitted to convergence)",
}


def _hard_gaps(model: BinaryScoreModel, theta: torch.Tensor, x, y, z) -> dict[str, float]:
    f = model.score(theta, torch.as_tensor(x)).detach()
    hard = (f >= 0).double()
    yy, zz = torch.as_tensor(y), torch.as_tensor(z)
    result = {"accuracy": float((hard.numpy() == y).mean())}
    for gap in GAPS:
        result[f"{gap}_gap"] = float(gap_of_scores(hard, yy, zz, gap))
    return result


# -------------------------------------------------------------------------- toy


def threshold_lever(means, threshold: float) -> float:
    """d DP(t)/dt at t for the toy's known mixture (σ = 1, z and y fair coins):
    DP(t) = P(x ≥ t | z=1) − P(x ≥ t | z=0), so d/dt = p(t | z=0) − p(t | z=1)."""
    m00, m10, m01, m11 = means
    density = stats.norm.pdf
    return 0.5 * (density(threshold - m00) + density(threshold - m01)) - 0.5 * (
        density(threshold - m10) + density(threshold - m11))


def toy_seed(config: FairnessCentralConfig, seed: int) -> list[dict]:
    """One seed of the toy: ERM, then every (γ, kept fraction, pruning order)."""
    rng = np.random.default_rng([seed, 31])
    x, y, z = toy_rows(config.toy_train, rng, tuple(config.toy_means))
    x_test, y_test, z_test = toy_rows(config.toy_test, rng, tuple(config.toy_means))
    generator = torch.Generator().manual_seed(seed)
    layer = torch.nn.Linear(1, 1)
    with torch.no_grad():
        layer.weight.normal_(generator=generator)
        layer.bias.zero_()
    model = BinaryScoreModel(layer)
    theta = WeightedRisk(model, x, y).fit()
    scores = model.score(theta, torch.as_tensor(x)).detach().numpy()
    jacobian = model.score_jacobian(theta, torch.as_tensor(x))
    fairness = fair_ntk.constraint_influence(jacobian, fair_ntk.constraint_factors(scores, y, z, "dp"))
    loss = fair_ntk.loss_influence(jacobian, fair_ntk.logistic_loss_derivatives(scores, y))

    def row(t: torch.Tensor, **keys) -> dict:
        w, b = (float(v) for v in t)
        return {"seed": seed, **keys, "threshold": -b / w if w != 0 else math.nan,
                **_hard_gaps(model, t, x_test, y_test, z_test)}

    erm = row(theta, gamma=0.0, keep=1.0, order="erm")
    rows = [{**erm, "lever": threshold_lever(config.toy_means, erm["threshold"])}]
    for gamma in config.gammas:
        if gamma > 0:
            rows.append(row(fair_ntk.fit_regularized(model, x, y, z, gamma=gamma, start=theta),
                            gamma=gamma, keep=1.0, order="full"))
        for fraction in config.keep_fractions:
            keep = max(2, int(round(fraction * len(y))))
            for order in fair_ntk.PRUNINGS:
                kept = fair_ntk.kept_examples(order, keep, fairness_scores=fairness, loss_scores=loss,
                                              seed=np.random.default_rng([seed, 32, keep]))
                t = fair_ntk.fit_regularized(model, x[kept], y[kept], z[kept], gamma=gamma, start=theta)
                rows.append(row(t, gamma=gamma, keep=fraction, order=order))
    return rows


def toy_summary(rows: pd.DataFrame, confidence: float) -> pd.DataFrame:
    """Per (γ, kept fraction, order): threshold shift, accuracy change and DP change against
    ERM on the same seed, mean and interval; ``fig1_direction``: right shift and lower DP."""
    erm = rows[rows["order"] == "erm"].set_index("seed")
    out = []
    for (gamma, keep, order), group in rows[rows["order"] != "erm"].groupby(["gamma", "keep", "order"], sort=False):
        g = group.set_index("seed")
        record = {"gamma": gamma, "keep": keep, "order": order}
        for column, name in (("threshold", "threshold_shift"), ("accuracy", "accuracy_change"),
                             ("dp_gap", "dp_change")):
            mean, low, high = interval(g[column] - erm.loc[g.index, column], confidence)
            record.update({name: mean, f"{name}_low": low, f"{name}_high": high})
        record["fig1_direction"] = bool(record["threshold_shift_low"] > 0 and record["dp_change_high"] < 0)
        out.append(record)
    return pd.DataFrame(out)


# -------------------------------------------------------------------------- tabular


def _strengths(config: FairnessCentralConfig) -> np.ndarray:
    return np.geomspace(config.lam_low, config.lam_high, config.lams)


def slid_erm(config: FairnessCentralConfig, seed: int, frame: pd.DataFrame):
    """A seed's SLID split (train / validation / test: 50 / 25 / 25 %), its rows, and the model
    fitted by ERM on the training rows (ridge ``ridge``): logistic regression from 0 (convex:
    to convergence), or with ``hidden`` > 0 a one-hidden-layer SeLU MLP from a seeded
    initialization, ``fit_iterations`` L-BFGS iterations (not necessarily stationary: App. A)."""
    order = np.random.default_rng([seed, 47]).permutation(len(frame))
    n = len(order)
    splits = np.sort(order[:n // 2]), np.sort(order[n // 2:3 * n // 4]), np.sort(order[3 * n // 4:])
    x, y, z = slid_rows(frame, splits[0])
    if config.hidden == 0:
        module = torch.nn.Linear(x.shape[1], 1)
        with torch.no_grad():
            module.weight.zero_()
            module.bias.zero_()
    else:
        generator = torch.Generator().manual_seed(seed)
        module = torch.nn.Sequential(torch.nn.Linear(x.shape[1], config.hidden), torch.nn.SELU(),
                                     torch.nn.Linear(config.hidden, 1))
        with torch.no_grad():
            for parameter in module.parameters():
                bound = 1.0 / math.sqrt(parameter.shape[-1] if parameter.ndim > 1 else config.hidden)
                parameter.uniform_(-bound, bound, generator=generator)
    model = BinaryScoreModel(module)
    risk = WeightedRisk(model, x[splits[0]], y[splits[0]], ridge=config.ridge)
    theta = risk.fit(newton_steps=3) if config.hidden == 0 else risk.fit(max_iter=config.fit_iterations)
    return (x, y, z), splits, model, risk, theta


def exact_solver(hessian: torch.Tensor, damping: float) -> ExactSolver:
    """The exact Hessian, damped only where it is not positive definite (a model short of a
    minimum, App. A's damped reading): δ = ``damping`` − λ_min(H) then."""
    smallest = float(torch.linalg.eigvalsh(hessian)[0])
    return ExactSolver(hessian, damping=0.0 if smallest > 0 else damping - smallest)


def slid_features(config: FairnessCentralConfig, model: BinaryScoreModel, theta: torch.Tensor, x) -> np.ndarray:
    """SIM-JACK's Φ ([FAIRIJ] §3.2): the hidden layer of the fitted MLP, or the standardized
    inputs for logistic regression (no intermediate layer)."""
    if config.hidden == 0:
        return np.asarray(x)
    hidden = model.module[0:2]
    params = {k: v for k, v in model.unflatten(theta).items() if k.startswith(("0.", "1."))}
    return torch.func.functional_call(hidden, params, (torch.as_tensor(x),)).detach().numpy()


def tabular_seed(config: FairnessCentralConfig, seed: int, frame: pd.DataFrame) -> list[dict]:
    """One seed of the [FAIRIJ] protocol (module docstring): rows per (curvature, edit, variant)."""
    (x, y, z), (train, validation, test), model, risk, theta = slid_erm(config, seed, frame)
    gradients = risk.per_example_gradients(theta)
    gap_gradient = fr.validation_gap_gradient(model, theta, x[validation], y[validation], z[validation], config.gap)
    solvers = {"exact": exact_solver(risk.hessian(theta), config.damping),
               "fisher": DiagonalSolver(risk.fisher_diagonal(theta), damping=config.damping)}
    permutation = np.random.default_rng([seed, 48]).permutation(len(train))
    features = slid_features(config, model, theta, x[train])

    def measure(t: torch.Tensor, split: np.ndarray) -> dict[str, float]:
        return _hard_gaps(model, t, x[split], y[split], z[split])

    erm = {"seed": seed, "curvature": "-", "edit": "erm", "variant": "rule", "strength": 0.0, "changed": 0,
           **{f"test_{k}": v for k, v in measure(theta, test).items()},
           **{f"validation_{k}": v for k, v in measure(theta, validation).items()},
           "majority": float(max(y[test].mean(), 1 - y[test].mean()))}
    rows = [erm]
    for name, solver in solvers.items():
        influences = fr.fairness_influences(gradients, gap_gradient, solver)
        for edit in EDITS:
            if edit == "gradient" and name != "exact":
                continue  # the plain-gradient edit uses no curvature: once is enough
            best = None
            for c in _strengths(config):
                if edit == "gradient":
                    step = c * 0.1 * float(theta.norm()) / max(float(gap_gradient.norm()), 1e-300)
                    weights, edited = None, theta - step * gap_gradient
                else:
                    scale = fr.similarity_product(features, influences, config.epsilon) if edit == "simjack" \
                        else influences
                    lam = c / max(float(np.abs(scale).max()), 1e-300)
                    weights = fr.rule_weights(edit, influences, lam, features=features, epsilon=config.epsilon)
                    edited = fr.ij_parameters(theta, gradients, weights, solver)
                score = abs(measure(edited, validation)[f"{config.gap}_gap"])
                if best is None or score < best[0]:
                    best = (score, c, weights, edited)
            _, c, weights, edited = best
            label = "none" if edit == "gradient" else name
            common = {"seed": seed, "curvature": label, "edit": edit, "strength": c,
                      "changed": 0 if weights is None else int(np.count_nonzero(weights != 1.0))}
            rows.append({**common, "variant": "rule", **{f"test_{k}": v for k, v in measure(edited, test).items()},
                         **{f"validation_{k}": v for k, v in measure(edited, validation).items()}})
            if weights is not None:
                for variant, shuffled in random_edits(theta, gradients, weights[permutation], solver,
                                                      measure(edited, validation)["accuracy"],
                                                      lambda t: measure(t, validation)["accuracy"]):
                    rows.append({**common, "variant": variant,
                                 **{f"test_{k}": v for k, v in measure(shuffled, test).items()},
                                 **{f"validation_{k}": v for k, v in measure(shuffled, validation).items()}})
    return rows


def pruning_seed(config: FairnessCentralConfig, seed: int, frame: pd.DataFrame) -> list[dict]:
    """[FAIRINFL] §6.1–6.2 on SLID, same split and ERM model as :func:`tabular_seed`: S(i) (Eq. 35,
    relaxed DP) and S_ℓ(i) at ERM on the training rows, each pruning order and kept fraction,
    retrained with γ φ̂ (Eq. 10) on the kept rows; test accuracy and gaps ("full": all rows)."""
    (x, y, z), (train, _, test), model, _, theta = slid_erm(config, seed, frame)
    scores = model.score(theta, torch.as_tensor(x[train])).detach().numpy()
    jacobian = model.score_jacobian(theta, torch.as_tensor(x[train]))
    fairness = fair_ntk.constraint_influence(jacobian, fair_ntk.constraint_factors(scores, y[train], z[train], "dp"))
    loss = fair_ntk.loss_influence(jacobian, fair_ntk.logistic_loss_derivatives(scores, y[train]))

    def row(t: torch.Tensor, keep: float, prune: str) -> dict:
        return {"seed": seed, "keep": keep, "order": prune,
                **{f"test_{k}": v for k, v in _hard_gaps(model, t, x[test], y[test], z[test]).items()}}

    rows = [row(theta, 1.0, "erm")]
    xs, ys, zs = x[train], y[train], z[train]
    iterations = 2000 if config.hidden == 0 else config.fit_iterations

    def retrain(kept: np.ndarray) -> torch.Tensor:
        if config.prune_optimizer == "adam":
            return fit_regularized_adam(model, xs[kept], ys[kept], zs[kept], gamma=config.prune_gamma,
                                        epochs=config.prune_epochs, learning_rate=config.prune_learning_rate,
                                        batch_size=config.prune_batch_size, seed=seed)
        return fair_ntk.fit_regularized(model, xs[kept], ys[kept], zs[kept], gamma=config.prune_gamma, start=theta,
                                        max_iter=iterations)

    rows.append(row(retrain(np.arange(len(train))), 1.0, "full"))
    for fraction in config.prune_fractions:
        keep = max(2, int(round(fraction * len(train))))
        for prune in fair_ntk.PRUNINGS:
            kept = fair_ntk.kept_examples(prune, keep, fairness_scores=fairness, loss_scores=loss,
                                          seed=np.random.default_rng([seed, 49, keep]))
            rows.append(row(retrain(kept), fraction, prune))
    return rows


def pruning_summary(rows: pd.DataFrame, confidence: float) -> pd.DataFrame:
    """Per (kept fraction, order): test accuracy and DP gap (mean, interval) and the paired
    differences against random pruning at the same fraction."""
    out = []
    for (keep, prune), group in rows.groupby(["keep", "order"], sort=False):
        g = group.set_index("seed")
        record = {"keep": keep, "order": prune}
        for metric in ("test_accuracy", "test_dp_gap"):
            mean, low, high = interval(g[metric], confidence)
            record.update({metric: mean, f"{metric}_low": low, f"{metric}_high": high})
        random = rows[(rows["keep"] == keep) & (rows["order"] == "random")].set_index("seed")
        if prune != "random" and len(random):
            for metric in ("test_accuracy", "test_dp_gap"):
                mean, low, high = interval(g[metric] - random.loc[g.index, metric], confidence)
                record.update({f"{metric}_vs_random": mean, f"{metric}_vs_random_low": low,
                               f"{metric}_vs_random_high": high})
        out.append(record)
    return pd.DataFrame(out)


#: Scales of the random deviations searched to match a rule's validation accuracy.
RANDOM_SCALES = np.geomspace(0.1, 1000.0, 41)


def random_edits(theta, gradients, shuffled_weights, solver, rule_accuracy: float, validation_accuracy):
    """The random counterparts of a rule's edit: ``random`` gives the rule's weights to
    permuted examples; ``random-matched`` scales those deviations, 1 + s(w_perm − 1), with s
    chosen on the validation split so that its validation accuracy is closest to the rule's
    (equal accuracy cost, decided on validation)."""
    plain = fr.ij_parameters(theta, gradients, shuffled_weights, solver)
    deviation = shuffled_weights - 1.0
    best = None
    for scale in RANDOM_SCALES:
        edited = fr.ij_parameters(theta, gradients, 1.0 + scale * deviation, solver)
        distance = abs(validation_accuracy(edited) - rule_accuracy)
        if best is None or distance < best[0]:
            best = (distance, edited)
    return [("random", plain), ("random-matched", best[1])]


def tabular_summary(rows: pd.DataFrame, gap: str, confidence: float) -> pd.DataFrame:
    """Per (curvature, edit): test accuracy and gaps (mean, interval), and the paired
    differences against ERM, random, random-matched and the plain-gradient edit."""
    erm = rows[rows["edit"] == "erm"].set_index("seed")
    target = f"test_{gap}_gap"
    out = []
    metrics = ["test_accuracy", "test_dp_gap", "test_eop_gap", "test_eo_gap"]
    rules = rows[(rows["edit"] != "erm") & (rows["variant"] == "rule")]
    keys = [("-", "erm")] + list(dict.fromkeys(zip(rules["curvature"], rules["edit"])))
    for curvature, edit in keys:
        group = rows[(rows["curvature"] == curvature) & (rows["edit"] == edit) & (rows["variant"] == "rule")]
        g = group.set_index("seed")
        record = {"curvature": curvature, "edit": edit, "seeds": len(g), "changed": float(g["changed"].mean()),
                  "strength": float(np.median(g["strength"]))}
        for metric in metrics:
            mean, low, high = interval(g[metric], confidence)
            record.update({metric: mean, f"{metric}_low": low, f"{metric}_high": high})
        for against, base in (("erm", erm),):
            for metric in ("test_accuracy", target):
                mean, low, high = interval(g[metric] - base.loc[g.index, metric], confidence)
                record.update({f"{metric}_vs_{against}": mean, f"{metric}_vs_{against}_low": low,
                               f"{metric}_vs_{against}_high": high})
        for variant, suffix in (("random", "random"), ("random-matched", "matched")):
            random = rows[(rows["curvature"] == curvature) & (rows["edit"] == edit) & (rows["variant"] == variant)]
            if not len(random):
                continue
            r = random.set_index("seed")
            for metric in ("test_accuracy", target):
                mean, low, high = interval(g[metric] - r.loc[g.index, metric], confidence)
                record.update({f"{metric}_vs_{suffix}": mean, f"{metric}_vs_{suffix}_low": low,
                               f"{metric}_vs_{suffix}_high": high})
        gradient = rows[(rows["edit"] == "gradient") & (rows["variant"] == "rule")].set_index("seed")
        if edit not in ("erm", "gradient") and len(gradient):
            for metric in ("test_accuracy", target):  # curvature against none ([FAIRIJ] §3.3), paired
                mean, low, high = interval(g[metric] - gradient.loc[g.index, metric], confidence)
                record.update({f"{metric}_vs_gradient": mean, f"{metric}_vs_gradient_low": low,
                               f"{metric}_vs_gradient_high": high})
        if f"{target}_vs_matched" in record:
            record["beats_random"] = bool(record[f"{target}_vs_matched_high"] < 0
                                          and record["test_accuracy_vs_matched_high"] >= 0)
        out.append(record)
    return pd.DataFrame(out)


# -------------------------------------------------------------------------- run


def run_fairness_central(config: FairnessCentralConfig, say=None) -> dict[str, pd.DataFrame]:
    """Every seed of the chosen experiments; the per-seed rows and the summaries."""
    config.check()
    seeds = range(config.seed, config.seed + config.seeds)
    tables: dict[str, pd.DataFrame] = {}
    if config.experiment in ("toy", "all"):
        rows = []
        for seed in seeds:
            rows += toy_seed(config, seed)
            if say is not None:
                say(f"toy: seed {seed} done")
        tables["toy_runs"] = pd.DataFrame(rows)
        tables["toy"] = toy_summary(tables["toy_runs"], config.confidence)
    if config.experiment in ("tabular", "all"):
        frame = slid_frame()
        rows, pruned = [], []
        for seed in seeds:
            rows += tabular_seed(config, seed, frame)
            pruned += pruning_seed(config, seed, frame)
            if say is not None:
                say(f"tabular: seed {seed} done")
        tables["tabular_runs"] = pd.DataFrame(rows)
        tables["tabular"] = tabular_summary(tables["tabular_runs"], config.gap, config.confidence)
        tables["pruning_runs"] = pd.DataFrame(pruned)
        tables["pruning"] = pruning_summary(tables["pruning_runs"], config.confidence)
    return tables


def _print(tables: dict[str, pd.DataFrame], config: FairnessCentralConfig) -> None:
    fmt = lambda v: f"{v:.4f}"  # noqa: E731
    with pd.option_context("display.width", 200, "display.max_columns", None, "display.max_rows", None):
        if "toy" in tables:
            lever = tables["toy_runs"].loc[tables["toy_runs"]["order"] == "erm", "lever"]
            print(f"[FAIRINFL] §5 toy, means {list(config.toy_means)}: ERM threshold lever d DP/dt = "
                  f"{lever.mean():.4f} (< 0: moving the threshold right lowers the DP gap)")
            print(tables["toy"][["gamma", "keep", "order", "threshold_shift", "threshold_shift_low",
                                 "threshold_shift_high", "accuracy_change", "dp_change", "dp_change_low",
                                 "dp_change_high", "fig1_direction"]].to_string(index=False, float_format=fmt))
        if "tabular" in tables:
            t = tables["tabular"]
            target = f"test_{config.gap}_gap"
            columns = ["curvature", "edit", "changed", "test_accuracy", "test_dp_gap", "test_eop_gap", "test_eo_gap",
                       f"{target}_vs_erm", "test_accuracy_vs_erm", f"{target}_vs_random", "test_accuracy_vs_random",
                       f"{target}_vs_matched", f"{target}_vs_matched_low", f"{target}_vs_matched_high",
                       "test_accuracy_vs_matched", "test_accuracy_vs_matched_low", "test_accuracy_vs_matched_high",
                       "beats_random", f"{target}_vs_gradient", "test_accuracy_vs_gradient",
                       "test_accuracy_vs_gradient_low", "test_accuracy_vs_gradient_high"]
            majority = tables["tabular_runs"]["majority"].dropna().mean()
            print(f"[FAIRIJ] protocol on SLID (λ chosen on validation, test split reported); majority-class "
                  f"test accuracy {majority:.4f}")
            print(t[[c for c in columns if c in t]].to_string(index=False, float_format=fmt))
            how = (f"Adam, lr {config.prune_learning_rate:g}, {config.prune_epochs} epochs from the initialization"
                   if config.prune_optimizer == "adam" else "Eq. 10 minimized from ERM")
            print(f"[FAIRINFL] pruning on SLID, retrained with γ = {config.prune_gamma:g} ({how}; test split)")
            print(tables["pruning"].to_string(index=False, float_format=fmt))


def cli_main(config: FairnessCentralConfig, options) -> int:
    """``fedvalue run fairness-central``: the tables (and CSVs in --out when given)."""
    out = None if options.out is None else prepare_run_dir(options.out, overwrite=options.overwrite)
    tables = run_fairness_central(config, say=options.say())
    _print(tables, config)
    if out is not None:
        for name, table in tables.items():
            table.to_csv(out / f"{name}.csv", index=False)
        write_run_config(out, {"simulation": "fairness-central", **dataclasses.asdict(config)})
    if options.results:
        frames = central_results(tables, config.toy_means, config.prune_gamma, config.prune_optimizer)
        written = write_results(options.results, frames, options.command)
        print(f"results files: {', '.join(map(str, written))}")
    print(f"done in {options.elapsed():.1f}s" + ("" if out is None else f"; tables in {out}"))
    return 0


#: This experiment's entry in ``fedvalue run`` (:mod:`simulations.cli.registry`).
SIMULATION = Simulation("fairness-central", FairnessCentralConfig, cli_main, out_optional=True, help=HELP,
                        results=CENTRAL_RESULTS)
