"""[FAIRIJ]'s Adult experiment on Adult: the 100-unit SeLU MLP, the damped diagonal empirical
Fisher, every rule's λ path, and the rules compared at matched fairness.

**Protocol** ([FAIRIJ] §4, App. A, App. B; :func:`simulations.datasets.adult.read_adult_frame`).
Each seed splits Adult's 45,222 complete rows at random into the paper's 21,815 training,
10,746 validation and 12,661 test rows, standardizes every input (one-hot categories too) with
the training rows' statistics, and fits a one-hidden-layer MLP of ``hidden`` = 100 SeLU units
(§4) by ERM: Adam at ``learning_rate`` on minibatches of ``batch_size`` for ``epochs`` epochs on
the mean logistic loss plus (ρ/2N)‖θ‖² (the sum-form risk of [FAIRIJ] Eq. 1 divided by N). The
paper does not give its optimizer or epochs; the model is not at a stationary point, which is
App. A's situation. The curvature is App. A's: the diagonal empirical Fisher Σ_n g_n² + ρ with
the damping δ = ``damping``.

**Rules and their paths.** I_F,n = −g_aᵀM⁻¹g_n (Eq. 6; g_a the gradient of the validation
gap of Eq. 5, computed for all n at once as a forward-mode derivative of the per-example
losses along M⁻¹g_a), then for each rule of Eq. 9 — Fair-IJ (Prop. 3.1), drop/upweight
(Prop. C.1), I-JACK (Prop. 3.2), SIM-JACK (Prop. 3.3, Φ the fitted hidden layer, C = ΦΦᵀ + εI)
— the infinitesimal-jackknife edit θ(λ) = θ̂ − M⁻¹Σ_n(w_n(λ) − 1)g_n (Eq. 4) at ``lams``
a grid of strengths that resolves its path: I-JACK and SIM-JACK are linear in λ
(θ̂ + λd), so λ is set by the step, ‖λd‖ = c·0.1‖θ̂‖ with c log-spaced in [``lam_low``,
``lam_high``], the grid of the plain-gradient edit θ̂ − c·0.1‖θ̂‖/‖g_a‖·g_a (§3.3); the drop
rules change only where 1/λ crosses an influence, so their λ drop the K largest positive
influences for ``lams`` values of K log-spaced from 1 to all. (The paper searches λ on a
uniform grid in its own units, 0.01–10; every λ of its grid is one of these paths' points or
between two of them.) Σ_n(w_n − 1)g_n is one weighted backward pass (I-JACK and SIM-JACK: one
for the whole path; the drop rules: a pass over the rows that change between successive λ),
never the N×p gradient matrix.

**Selections** (on the validation split only; the test split is reported). ``lowest-gap``:
App. B's λ, the lowest validation gap. ``matched τ`` for each τ of ``targets``: among the λ
whose validation gap is at most τ, the most accurate on validation — every rule at the same
fairness, so accuracies compare (a rule whose path never reaches τ is counted, not reported).
Paired over seeds, with Student-t intervals: SIM-JACK − Fair-IJ (the paper's Adult claim:
"SIM-JACK consistently out-performs FairIJ in error rate for comparable fairness"), each
Fisher rule − the plain-gradient edit (§3.3's credit to H⁻¹: the edit without curvature,
on its own grid of step sizes, since a rule's λ is no step size without M⁻¹). ``--results FOLDER`` keeps the
summary as the docs' results file (:mod:`simulations.experiments.fairness.markdown`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from fedvalue.utilities import (
    GAPS,
    BinaryScoreModel,
    DiagonalSolver,
    WeightedRisk,
    fairness_reweighting as fr,
    gap_of_scores,
)
from simulations.datasets import adult_rows, read_adult_frame
from simulations.experiments.fairness.markdown import ADULT_RESULTS
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

#: [FAIRIJ] App. B: training, validation and test rows of Adult (the rest of 45,222 is test).
PAPER_SPLIT = (21_815, 10_746)
#: Rules whose weights are 1 − λ·s: their edit is linear in λ.
LINEAR_RULES = ("ijack", "simjack")


@dataclass(frozen=True)
class FairnessAdultConfig:
    seed: int = 0
    seeds: int = 10
    hidden: int = 100
    epochs: int = 20
    batch_size: int = 256
    learning_rate: float = 1e-3
    ridge: float = 1.0
    damping: float = 1.0
    epsilon: float = 1e-3
    gap: str = "dp"
    lams: int = 60
    lam_low: float = 0.001
    lam_high: float = 10.0
    targets: tuple[float, ...] = (0.10, 0.05, 0.02)
    train_rows: int = PAPER_SPLIT[0]
    validation_rows: int = PAPER_SPLIT[1]
    confidence: float = 0.95

    def check(self) -> None:
        check_integer("seed", self.seed, 0)
        check_integer("seeds", self.seeds, 2, why="paired intervals need two seeds")
        check_integer("hidden", self.hidden, 1)
        check_integer("epochs", self.epochs, 1)
        check_integer("batch_size", self.batch_size, 1)
        check_number("learning_rate", self.learning_rate, low=0.0, low_open=True)
        check_number("ridge", self.ridge, low=0.0)
        check_number("damping", self.damping, low=0.0, low_open=True)
        check_number("epsilon", self.epsilon, low=0.0, low_open=True)
        check_choice("gap", self.gap, GAPS)
        check_integer("lams", self.lams, 2)
        check_number("lam_low", self.lam_low, low=0.0, low_open=True)
        check_number("lam_high", self.lam_high, low=self.lam_low)
        if not self.targets or any(not isinstance(t, (int, float)) or not 0 < t < 1 for t in self.targets):
            raise ValueError(f"targets: expected validation gaps in the open interval (0, 1); got {list(self.targets)}.")
        check_integer("train_rows", self.train_rows, 10)
        check_integer("validation_rows", self.validation_rows, 10)
        check_number("confidence", self.confidence, low=0.0, high=1.0, low_open=True, high_open=True)


HELP = {
    "hidden": "SeLU units of the MLP's hidden layer ([FAIRIJ] §4: 100)",
    "epochs": "Adam epochs of the ERM fit (the paper gives none; chosen before results)",
    "batch_size": "minibatch size of the ERM fit",
    "learning_rate": "Adam learning rate of the ERM fit",
    "ridge": "ridge ρ of the sum-form risk (its curvature is added to the Fisher diagonal)",
    "damping": "damping δ added to the diagonal empirical Fisher ([FAIRIJ] App. A)",
    "epsilon": "ε of SIM-JACK's similarity C = ΦΦᵀ + εI",
    "gap": "fairness gap the influences target and λ is chosen on: dp, eop, eo",
    "lams": "points on each rule's path (steps for I-JACK, SIM-JACK and the gradient edit; numbers of drops K "
            "for the drop rules)",
    "lam_low": "smallest step on the linear paths, in units of 0.1·|θ̂|",
    "lam_high": "largest step on the linear paths, in units of 0.1·|θ̂|",
    "targets": "validation gaps at which the rules are compared (matched fairness), comma-separated",
    "train_rows": "training rows per seed ([FAIRIJ] App. B: 21,815)",
    "validation_rows": "validation rows per seed (App. B: 10,746; the rest is the test split)",
    "confidence": "level of the Student-t intervals over seeds",
}


def _hard_metrics(model: BinaryScoreModel, theta: torch.Tensor, x, y, z) -> dict[str, float]:
    """Accuracy and the hard DP/EOP/EO gaps of the predictions 1[f ≥ 0]."""
    with torch.no_grad():
        hard = (model.score(theta, x) >= 0).double()
    result = {"accuracy": float((hard == y).double().mean())}
    for gap in GAPS:
        result[f"{gap}_gap"] = float(gap_of_scores(hard, y, z, gap))
    return result


def fit_adult_mlp(config: FairnessAdultConfig, seed: int, x: torch.Tensor, y: torch.Tensor) -> BinaryScoreModel:
    """ERM by Adam on minibatches (module docstring); the returned model's θ0 is the fitted θ̂."""
    generator = torch.Generator().manual_seed(seed)
    module = torch.nn.Sequential(torch.nn.Linear(x.shape[1], config.hidden), torch.nn.SELU(),
                                 torch.nn.Linear(config.hidden, 1)).double()
    with torch.no_grad():
        for parameter in module.parameters():  # PyTorch's default bounds, drawn from the seeded generator
            bound = 1.0 / math.sqrt(parameter.shape[-1] if parameter.ndim > 1 else config.hidden)
            parameter.uniform_(-bound, bound, generator=generator)
    optimizer = torch.optim.Adam(module.parameters(), lr=config.learning_rate)
    ridge = config.ridge / (2.0 * len(y))
    for _ in range(config.epochs):
        for batch in torch.randperm(len(y), generator=generator).split(config.batch_size):
            optimizer.zero_grad()
            loss = torch.nn.functional.binary_cross_entropy_with_logits(module(x[batch])[:, 0], y[batch])
            penalty = sum((p * p).sum() for p in module.parameters())
            (loss + ridge * penalty).backward()
            optimizer.step()
    return BinaryScoreModel(module)


def weighted_gradient(model: BinaryScoreModel, theta: torch.Tensor, x, y, coefficients) -> torch.Tensor:
    """Σ_n c_n g_n = ∇_θ Σ_n c_n ℓ_n(θ): one backward pass, no per-example gradients."""
    c = torch.as_tensor(np.asarray(coefficients, dtype=np.float64))
    return torch.func.grad(lambda t: c @ torch.nn.functional.binary_cross_entropy_with_logits(
        model.score(t, x), y, reduction="none"))(theta)


def fisher_diagonal(risk: WeightedRisk, theta: torch.Tensor, chunk: int = 2048) -> torch.Tensor:
    """Σ_n g_n ⊙ g_n + ρ ([FAIRIJ] App. A, sum form), per-example gradients ``chunk`` rows at a time."""
    total = torch.full_like(theta, risk.ridge)
    for start in range(0, risk.num_examples, chunk):
        part = WeightedRisk(risk.model, risk.x[start:start + chunk], risk.y[start:start + chunk].numpy().astype(int))
        g = part.per_example_gradients(theta)
        total += (g * g).sum(dim=0)
    return total


def hidden_features(model: BinaryScoreModel, theta: torch.Tensor, x: torch.Tensor) -> np.ndarray:
    """SIM-JACK's Φ ([FAIRIJ] §3.2): the fitted MLP's hidden layer, SeLU(x W₀ᵀ + b₀), one row per example."""
    params = model.unflatten(theta)
    with torch.no_grad():
        return torch.nn.functional.selu(x @ params["0.weight"].T + params["0.bias"]).numpy()


def fairness_influences(risk: WeightedRisk, theta: torch.Tensor, gap_gradient: torch.Tensor, solver) -> np.ndarray:
    """I_F,n = −g_nᵀ M⁻¹ g_a for every training example: one forward-mode derivative of the
    per-example losses along M⁻¹g_a ([FAIRIJ] Eq. 6)."""
    direction = solver.solve(gap_gradient)
    return -torch.func.jvp(risk.losses, (theta,), (direction,))[1].detach().numpy()


def drop_strengths(influences: np.ndarray, count: int) -> np.ndarray:
    """λ for the drop rules that drop the K largest positive influences, K ≈ log-spaced from 1 to all
    positive ones in ``count`` steps: 1/λ halfway between the K-th and (K+1)-th largest."""
    positive = np.sort(influences[influences > 0])[::-1]
    if positive.size == 0:
        return np.empty(0)
    ks = np.unique(np.round(np.geomspace(1, positive.size, count)).astype(int))
    below = np.append(positive, 0.0)
    return 2.0 / (positive[ks - 1] + below[ks])


def edit_path(model: BinaryScoreModel, theta: torch.Tensor, x, y, rule: str, influences: np.ndarray,
              strengths: np.ndarray, solver, features=None, epsilon: float = 1e-3) -> list[tuple[float, int, torch.Tensor]]:
    """(λ, changed weights, θ(λ)) along the path of ``rule``: θ(λ) = θ̂ − M⁻¹Σ(w_n(λ) − 1)g_n, equal to
    :func:`fedvalue.scoring.fairness.reweighting.ij_parameters` with the rule's weights.

    I-JACK and SIM-JACK (w − 1 = −λs): the edit is θ̂ + λd with d = M⁻¹Σ s_n g_n, at the steps
    ‖λd‖ = c·0.1‖θ̂‖ for c in ``strengths`` (the plain-gradient edit's grid). The drop rules: at the λ
    of :func:`drop_strengths` (K = 1 … all positive influences), nested sets, so each λ costs a pass
    over the rows that change.
    """
    if rule in LINEAR_RULES:
        direction = solver.solve(weighted_gradient(model, theta, x, y, 1.0 - fr.rule_weights(
            rule, influences, 1.0, features=features, epsilon=epsilon)))
        unit = 0.1 * float(theta.norm()) / max(float(direction.norm()), 1e-300)
        return [(float(c) * unit, len(influences), theta + float(c) * unit * direction) for c in strengths]
    path, previous, summed = [], np.zeros(len(influences)), torch.zeros_like(theta)
    for lam in drop_strengths(influences, len(strengths)):
        deviation = fr.rule_weights(rule, influences, float(lam)) - 1.0
        rows = np.flatnonzero(deviation != previous)  # the drop rules' sets only grow with λ
        if rows.size:
            summed = summed + weighted_gradient(model, theta, x[rows], y[rows], (deviation - previous)[rows])
        previous = deviation
        path.append((float(lam), int(np.count_nonzero(deviation)), theta - solver.solve(summed)))
    return path


def gradient_path(theta: torch.Tensor, gap_gradient: torch.Tensor, strengths: np.ndarray) -> list:
    """The plain-gradient edit θ̂ − c·0.1‖θ̂‖/‖g_a‖·g_a (§3.3) on the grid ``strengths``."""
    unit = 0.1 * float(theta.norm()) / max(float(gap_gradient.norm()), 1e-300)
    return [(float(c), 0, theta - float(c) * unit * gap_gradient) for c in strengths]


def select(path_rows: pd.DataFrame, gap: str, targets) -> dict[str, int | None]:
    """Positions on one path chosen on validation: ``lowest-gap`` (App. B) and ``matched τ``: the most
    accurate position whose validation gap is at most τ (None where the path never gets there)."""
    gaps = path_rows[f"validation_{gap}_gap"].abs().to_numpy()
    accuracy = path_rows["validation_accuracy"].to_numpy()
    chosen: dict[str, int | None] = {"lowest-gap": int(np.argmin(gaps))}
    for target in targets:
        within = np.flatnonzero(gaps <= target)
        chosen[f"matched {target:g}"] = int(within[np.argmax(accuracy[within])]) if within.size else None
    return chosen


def adult_seed(config: FairnessAdultConfig, seed: int, frame: pd.DataFrame) -> tuple[list[dict], list[dict]]:
    """One seed: the whole path of every (curvature, edit) on validation, and the selected
    positions measured on the test split."""
    order = np.random.default_rng([seed, 53]).permutation(len(frame))
    cut = config.train_rows + config.validation_rows
    train, validation, test = (np.sort(order[:config.train_rows]), np.sort(order[config.train_rows:cut]),
                               np.sort(order[cut:]))
    x_all, y_all, z_all = adult_rows(frame, train)
    x, y, z = (torch.as_tensor(x_all), torch.as_tensor(y_all.astype(np.float64)), torch.as_tensor(z_all))
    model = fit_adult_mlp(config, seed, x[train], y[train])
    theta = model.theta0
    risk = WeightedRisk(model, x_all[train], y_all[train], ridge=config.ridge)
    gap_gradient = fr.validation_gap_gradient(model, theta, x_all[validation], y_all[validation], z_all[validation],
                                              config.gap)
    features = hidden_features(model, theta, x[train])
    solver = DiagonalSolver(fisher_diagonal(risk, theta), damping=config.damping)
    strengths = np.geomspace(config.lam_low, config.lam_high, config.lams)
    measure = {name: (lambda t, s=split: _hard_metrics(model, t, x[s], y[s], z[s]))
               for name, split in (("validation", validation), ("test", test))}
    erm = {"seed": seed, "curvature": "-", "edit": "erm", "selection": "-", "strength": 0.0, "changed": 0,
           **{f"test_{k}": v for k, v in measure["test"](theta).items()},
           **{f"validation_{k}": v for k, v in measure["validation"](theta).items()},
           "majority": float(max(y_all[test].mean(), 1 - y_all[test].mean()))}
    paths = {("none", "gradient"): gradient_path(theta, gap_gradient, strengths)}
    influences = fairness_influences(risk, theta, gap_gradient, solver)
    for rule in fr.RULES:
        paths["fisher", rule] = edit_path(model, theta, x[train], y[train], rule, influences, strengths, solver,
                                          features=features, epsilon=config.epsilon)
    path_rows, selected = [], [erm]
    for (curvature, edit), path in paths.items():
        rows = [{"seed": seed, "curvature": curvature, "edit": edit, "position": k, "strength": lam, "changed": changed,
                 **{f"validation_{key}": v for key, v in measure["validation"](t).items()}}
                for k, (lam, changed, t) in enumerate(path)]
        path_rows += rows
        for selection, position in select(pd.DataFrame(rows), config.gap, config.targets).items():
            record = {"seed": seed, "curvature": curvature, "edit": edit, "selection": selection}
            if position is None:
                selected.append({**record, "strength": math.nan, "changed": math.nan})
                continue
            lam, changed, t = path[position]
            selected.append({**record, "strength": lam, "changed": changed,
                             **{f"test_{k}": v for k, v in measure["test"](t).items()},
                             **{k: v for k, v in rows[position].items() if k.startswith("validation_")}})
    return path_rows, selected


def _paired(a: pd.DataFrame, b: pd.DataFrame, column: str, confidence: float) -> tuple[float, float, float, int]:
    """Mean and interval of a[column] − b[column] over the seeds both have (a and b indexed by seed)."""
    seeds = a.index.intersection(b.index)
    if len(seeds) == 0:
        return math.nan, math.nan, math.nan, 0
    return (*interval(a.loc[seeds, column] - b.loc[seeds, column], confidence), len(seeds))


def adult_summary(selected: pd.DataFrame, gap: str, confidence: float) -> pd.DataFrame:
    """Per (selection, curvature, edit): seeds that reached the selection, test accuracy and gaps
    (mean, interval), and the paired test-accuracy differences of the module docstring."""
    target = f"test_{gap}_gap"
    reached = selected.dropna(subset=["test_accuracy"])
    out = []
    for (selection, curvature, edit), group in reached.groupby(["selection", "curvature", "edit"], sort=False):
        g = group.set_index("seed")
        record = {"selection": selection, "curvature": curvature, "edit": edit, "seeds": len(g),
                  "of_seeds": int(((selected["selection"] == selection) & (selected["curvature"] == curvature)
                                   & (selected["edit"] == edit)).sum()),
                  "changed": float(g["changed"].mean())}
        for metric in ("test_accuracy", "test_dp_gap", "test_eop_gap", "test_eo_gap"):
            record[metric], record[f"{metric}_low"], record[f"{metric}_high"] = interval(g[metric], confidence)
        here = reached[reached["selection"] == selection]
        against = {"fair_ij": here[(here["curvature"] == curvature) & (here["edit"] == "fair-ij")],
                   "gradient": here[here["edit"] == "gradient"]}
        for name, base in against.items():
            if edit in ("erm", "gradient") or (name == "fair_ij" and edit != "simjack"):
                continue
            b = base.set_index("seed")
            for metric in ("test_accuracy", target):
                mean, low, high, n = _paired(g, b, metric, confidence)
                record.update({f"{metric}_vs_{name}": mean, f"{metric}_vs_{name}_low": low,
                               f"{metric}_vs_{name}_high": high, f"seeds_vs_{name}": n})
        out.append(record)
    return pd.DataFrame(out)


def run_fairness_adult(config: FairnessAdultConfig, say=None) -> dict[str, pd.DataFrame]:
    """Every seed (module docstring): ``paths`` (validation, every λ), ``selected`` (test at the
    selections), ``summary``."""
    config.check()
    frame = read_adult_frame()
    if config.train_rows + config.validation_rows >= len(frame):
        raise ValueError(f"validation_rows: expected train_rows + validation_rows below Adult's {len(frame)} rows "
                         f"(the rest is the test split); got {config.train_rows} + {config.validation_rows}.")
    paths, selected = [], []
    for seed in range(config.seed, config.seed + config.seeds):
        seed_paths, seed_selected = adult_seed(config, seed, frame)
        paths += seed_paths
        selected += seed_selected
        if say is not None:
            say(f"adult: seed {seed} done")
    tables = {"paths": pd.DataFrame(paths), "selected": pd.DataFrame(selected)}
    tables["summary"] = adult_summary(tables["selected"], config.gap, config.confidence)
    return tables


def format_summary(tables: dict[str, pd.DataFrame], config: FairnessAdultConfig) -> str:
    """The printed table: per selection and rule, test accuracy and gap, and the paired differences."""
    s, gap = tables["summary"], config.gap
    erm = tables["selected"][tables["selected"]["edit"] == "erm"]
    lines = [(f"[FAIRIJ] on Adult: {config.hidden}-unit SeLU MLP, {config.seeds} seeds; ERM test accuracy "
             f"{erm['test_accuracy'].mean():.4f}, {gap.upper()} {erm[f'test_{gap}_gap'].mean():.4f}, validation "
             f"{erm[f'validation_{gap}_gap'].mean():.4f}; majority class {erm['majority'].mean():.4f}")]

    def cell(row, column: str) -> str:
        if column not in row or pd.isna(row[column]):
            return "-"
        low, high = row.get(f"{column}_low", math.nan), row.get(f"{column}_high", math.nan)
        return f"{row[column]:+.4f} [{low:+.4f}, {high:+.4f}]" if not pd.isna(low) else f"{row[column]:+.4f}"

    header = (f"{'selection':<14}{'curvature':<10}{'edit':<15}{'seeds':>7}{'test acc':>10}{'test ' + gap:>10}  "
              f"{'acc - Fair-IJ':<30}{'acc - gradient edit':<30}")
    lines.append(header)
    for _, row in s.iterrows():
        lines.append(f"{row['selection']:<14}{row['curvature']:<10}{row['edit']:<15}"
                     f"{int(row['seeds']):>3}/{int(row['of_seeds']):<3}{row['test_accuracy']:>10.4f}"
                     f"{row[f'test_{gap}_gap']:>10.4f}  {cell(row, 'test_accuracy_vs_fair_ij'):<30}"
                     f"{cell(row, 'test_accuracy_vs_gradient'):<30}")
    return "\n".join(lines)


def cli_main(config: FairnessAdultConfig, options) -> int:
    """``fedvalue run fairness-adult``: the table (and CSVs in --out when given)."""
    out = None if options.out is None else prepare_run_dir(options.out, overwrite=options.overwrite)
    tables = run_fairness_adult(config, say=options.say())
    print(format_summary(tables, config))
    if out is not None:
        for name, table in tables.items():
            table.to_csv(out / f"{name}.csv", index=False)
        write_run_config(out, {"simulation": "fairness-adult", **dataclasses.asdict(config)})
    if options.results:
        written = write_results(options.results, {ADULT_RESULTS: tables["summary"]}, options.command)
        print(f"results file: {written[0]}")
    print(f"done in {options.elapsed():.1f}s" + ("" if out is None else f"; tables in {out}"))
    return 0


#: This experiment's entry in ``fedvalue run`` (:mod:`simulations.cli.registry`).
SIMULATION = Simulation("fairness-adult", FairnessAdultConfig, cli_main, out_optional=True, help=HELP,
                        results=(ADULT_RESULTS,))
