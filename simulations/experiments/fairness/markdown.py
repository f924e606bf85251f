"""The docs' markdown tables of the fairness simulations, rendered from their results files alone.

``fedvalue run fairness --results FOLDER`` writes :data:`FEDERATED_RESULTS` (the frames of
:mod:`simulations.experiments.fairness.tables`), ``fedvalue run fairness-central --results FOLDER``
:data:`CENTRAL_RESULTS` and ``fedvalue run fairness-adult --results FOLDER`` :data:`ADULT_RESULTS`, each headed by
the command and the commit; the functions here turn those files into the tables
of docs/reproductions.md, row for row, so a test can hold the docs to the files.
"""

from __future__ import annotations

import math

import pandas as pd

from simulations.experiments.fairness.data import ASYMMETRIC_MEANS, DATASETS

#: The results files of ``fedvalue run fairness --results FOLDER``: file name -> the table it holds.
FEDERATED_RESULTS = {"fairness_tradeoff.csv": "tradeoff", "fairness_comparison.csv": "comparison",
                     "fairness_scoring.csv": "scoring"}
DATASET_NAMES = {"gaussian": "Gaussian", "german": "German credit", "slid": "SLID"}
#: The rules in the docs' order, and their names there.
RULE_NAMES = {"fedavg": "FedAvg", "drop-k": "drop-K first-order", "drop-k-renormalized": "drop-K renormalized",
              "drop-k-curvature": "drop-K curvature", "drop-k-exact": "drop-K exact", "random": "random drop",
              "ijack": "I-JACK"}
#: The first-order scores (tables.SCORED) in the docs' order, and their names there.
SCORE_NAMES = {"first-order": "first-order I^F", "renormalized": "renormalized I^F",
               "curvature-unrenormalized": "curvature I^H", "curvature": "renormalized I^H"}
GAP_COLUMNS = ("accuracy", "dp_gap", "eop_gap", "eo_gap")


def number(value: float, digits: int, signed: bool = False) -> str:
    """``value`` to ``digits`` decimals with the docs' minus sign (−), a + when ``signed``; – for none."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:{'+' if signed else ''}.{digits}f}".replace("-", "−")


def interval_text(row, column: str, digits: int = 3, signed: bool = False) -> str:
    """``mean [low, high]`` of ``column`` (its ``_low`` and ``_high`` beside it)."""
    return (f"{number(row[column], digits, signed)} [{number(row[column + '_low'], digits, signed)}, "
            f"{number(row[column + '_high'], digits, signed)}]")


def _ordered(frame: pd.DataFrame, key: str, order) -> pd.DataFrame:
    """``frame`` by data set (DATASETS' order), then ``key`` in ``order``, keeping the file's order within."""
    rank = {name: i for i, name in enumerate(order)}
    return frame.assign(_d=frame["dataset"].map({d: i for i, d in enumerate(DATASETS)}),
                        _k=frame[key].map(rank)).sort_values(["_d", "_k"], kind="mergesort")


def _rule(policy: str, parameter: float, shown_k: bool) -> str:
    """A rule's name in the tables: drop-K first-order and random drops with their K, I-JACK with its λ, the other
    drop rules with their K when the run has more than one (``shown_k``)."""
    name = RULE_NAMES[policy]
    if policy == "ijack":
        return f"{name} (λ = {parameter:g})"
    if policy in ("drop-k", "random") or (policy != "fedavg" and shown_k):
        return f"{name} (K = {parameter:g})"
    return name


def tradeoff_table(tradeoff: pd.DataFrame) -> list[str]:
    """Report half, mean [interval] over seeds: accuracy and the three gaps of every rule of every data set."""
    drops = tradeoff[tradeoff["policy"].isin(("drop-k", "drop-k-renormalized", "drop-k-curvature", "drop-k-exact"))]
    shown_k = drops["parameter"].nunique() > 1
    rows = ["| data set | rule | accuracy | DP gap | EOP gap | EO gap |", "|---|---|---|---|---|---|"]
    for _, row in _ordered(tradeoff, "policy", RULE_NAMES).iterrows():
        rows.append(f"| {DATASET_NAMES[row['dataset']]} | {_rule(row['policy'], row['parameter'], shown_k)} | "
                    + " | ".join(interval_text(row, column) for column in GAP_COLUMNS) + " |")
    return rows


def _verdict(row) -> str:
    """Whether the rule beats random drops on the DP gap at equal accuracy cost; "no (accuracy)" when its gap is
    lower by an interval excluding 0 but its accuracy is lower too."""
    if bool(row["beats_random_dp"]):
        return "yes"
    return "no (accuracy)" if row["dp_gap_diff_high"] < 0 else "no"


def comparison_table(comparison: pd.DataFrame, k: int, random_k: int, dataset: str | None = None) -> list[str]:
    """Each rule at K = ``k`` (I-JACK at every λ) minus random drops of ``random_k`` clients, paired by seed, with
    the verdict on the DP gap; every data set (a column), or ``dataset``'s rows alone (no such column)."""
    chosen = comparison[(comparison["random_k"] == random_k)
                        & ((comparison["policy"] == "ijack") | (comparison["parameter"] == k))]
    if dataset is not None:
        chosen = chosen[chosen["dataset"] == dataset]
        rows = [f"| rule (K = {k}) − random drops (K = {random_k}) | accuracy | DP gap | EOP gap | EO gap "
                "| beats random (DP) |", "|---|---|---|---|---|---|"]
    else:
        rows = ["| data set | rule | accuracy | DP gap | EOP gap | EO gap | beats random (DP) |",
                "|---|---|---|---|---|---|---|"]
    for _, row in _ordered(chosen, "policy", RULE_NAMES).iterrows():
        name = f"I-JACK λ = {row['parameter']:g}" if row["policy"] == "ijack" else RULE_NAMES[row["policy"]]
        cells = [name, *(interval_text(row, f"{column}_diff", signed=True) for column in GAP_COLUMNS), _verdict(row)]
        if dataset is None:
            cells.insert(0, DATASET_NAMES[row["dataset"]])
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def scoring_table(scoring: pd.DataFrame) -> list[str]:
    """Each first-order score against the exact drop effect: correlation, top = best exact drop, top drop raises
    the gap; mean [interval] over seeds, two decimals."""
    rows = ["| data set | score | correlation | top = best exact drop | top drop raises the gap |",
            "|---|---|---|---|---|"]
    for _, row in _ordered(scoring, "score", SCORE_NAMES).iterrows():
        rows.append(f"| {DATASET_NAMES[row['dataset']]} | {SCORE_NAMES[row['score']]} | "
                    + " | ".join(interval_text(row, column, 2) for column in ("correlation", "top_is_best", "top_raises_gap"))
                    + " |")
    return rows


# -------------------------------------------------------------------------- fedvalue run fairness-adult

#: The results file of ``fedvalue run fairness-adult --results FOLDER``: its summary (adult_ij.adult_summary).
ADULT_RESULTS = "fairness_adult_summary.csv"
#: The edits of the Adult table in the docs' order, their names there, and the first row's longer name.
ADULT_EDITS = {"gradient": "gradient edit", "fair-ij": "Fair-IJ", "ijack": "I-JACK", "simjack": "SIM-JACK",
               "drop-upweight": "drop/upweight"}
ADULT_FIRST = {"lowest-gap": "lowest gap (App. B)", "gradient": "gradient edit (no curvature)"}


def _selection(selection: str, gap: str) -> str:
    """``lowest-gap`` -> lowest gap; ``matched 0.1`` -> DP ≤ 0.10."""
    if selection == "lowest-gap":
        return "lowest gap"
    return f"{gap.upper()} ≤ {float(selection.split()[1]):.2f}"


def adult_table(summary: pd.DataFrame, gap: str = "dp") -> list[str]:
    """[FAIRIJ] on Adult: per selection (lowest validation gap, then each matched target) the plain-gradient edit
    and every Fisher rule that reached it in every seed, test accuracy [interval] and gap, SIM-JACK − Fair-IJ and
    rule − gradient edit in accuracy, paired by seed."""
    rows = [f"| selection | rule | test accuracy | test {gap.upper()} | SIM-JACK − Fair-IJ, accuracy "
            "| rule − gradient edit, accuracy |", "|---|---|---|---|---|---|"]
    shown = summary[summary["edit"].isin(ADULT_EDITS) & (summary["seeds"] == summary["of_seeds"])]
    for selection in dict.fromkeys(shown["selection"]):
        here = shown[shown["selection"] == selection].set_index("edit")
        for edit in [e for e in ADULT_EDITS if e in here.index]:
            row = here.loc[edit]
            first = len(rows) == 2
            versus = [interval_text(row, f"test_accuracy_vs_{name}", signed=True)
                      if f"test_accuracy_vs_{name}" in row and not pd.isna(row[f"test_accuracy_vs_{name}"]) else "—"
                      for name in ("fair_ij", "gradient")]
            rows.append(f"| {ADULT_FIRST[selection] if first else _selection(selection, gap)} | "
                        f"{ADULT_FIRST[edit] if first and edit in ADULT_FIRST else ADULT_EDITS[edit]} | "
                        f"{interval_text(row, 'test_accuracy')} | {number(row[f'test_{gap}_gap'], 3)} | "
                        + " | ".join(versus) + " |")
    return rows


# -------------------------------------------------------------------------- fedvalue run fairness-central

#: The results files of ``fedvalue run fairness-central --results FOLDER`` (those of the experiments run): the
#: toy's summary and its ERM rows (threshold, gaps, lever, means), the tabular summary, the pruning summary (with
#: the retraining's γ and optimizer).
CENTRAL_RESULTS = ("fairness_central_toy.csv", "fairness_central_toy_erm.csv", "fairness_central_tabular.csv",
                   "fairness_central_pruning.csv")
#: The toy rows the docs show, (γ, kept fraction, pruning order), in their order.
TOY_ROWS = ((0.0, 0.8, "fairness"), (0.0, 0.8, "random"), (0.0, 0.6, "fairness"), (0.0, 0.6, "accuracy"),
            (0.0, 0.6, "random"), (0.0, 0.4, "fairness"), (0.0, 0.4, "random"), (0.1, 1.0, "full"),
            (0.1, 0.6, "fairness"), (0.1, 0.6, "random"))
#: Pruning orders by their names in the docs, and the longer name of an order's first row.
PRUNED_BY = {"fairness": "fairness", "accuracy": "accuracy", "random": "random", "full": "—"}
PRUNED_BY_FIRST = {"fairness": "fairness (small \\|S(i)\\|)", "accuracy": "accuracy (large \\|S_ℓ(i)\\|)"}
#: The SLID pruning rows the docs show, (kept fraction, order); with Adam, per γ.
PRUNING_ROWS = ((0.8, "fairness"), (0.8, "accuracy"), (0.8, "random"), (0.4, "fairness"), (0.4, "accuracy"),
                (0.4, "random"), (0.2, "fairness"), (0.2, "random"))
ADAM_ROWS = {1.0: ((1.0, "full"), (0.8, "fairness"), (0.8, "random"), (0.6, "fairness"), (0.6, "random"),
                   (0.4, "fairness"), (0.4, "random"), (0.2, "fairness"), (0.2, "accuracy"), (0.2, "random")),
             0.02: ((1.0, "full"), (0.8, "fairness"), (0.8, "random"), (0.6, "fairness"), (0.6, "random"),
                    (0.4, "fairness"), (0.4, "accuracy"), (0.4, "random"), (0.2, "fairness"), (0.2, "random"))}
CURVATURES = {"-": "—", "exact": "exact H", "fisher": "diag. Fisher", "none": "none"}
EDIT_NAMES = {"erm": "ERM", "fair-ij": "Fair-IJ", "drop-upweight": "drop/upweight", "ijack": "I-JACK",
              "simjack": "SIM-JACK", "gradient": "gradient edit"}
#: Where the paper defines each edit, which the logistic-regression table gives at the edit's first row.
EDIT_SOURCES = {"fair-ij": " (Prop. 3.1)", "drop-upweight": " (C.1)", "ijack": " (3.2)", "simjack": " (3.3)",
                "gradient": " θ̂ − c·g_a (§3.3)"}
#: Edits whose weights move every training row.
EVERY_ROW = ("ijack", "simjack")


def signed_interval(row, column: str, digits: int = 3, signed_bounds: bool = False) -> str:
    """``+mean [low, high]``: the mean signed, the bounds signed only when ``signed_bounds``; – for none."""
    if column not in row or pd.isna(row[column]):
        return "—"
    return (f"{number(row[column], digits, True)} [{number(row[column + '_low'], digits, signed_bounds)}, "
            f"{number(row[column + '_high'], digits, signed_bounds)}]")


def central_results(tables: dict[str, pd.DataFrame], toy_means, prune_gamma: float,
                    prune_optimizer: str) -> dict[str, pd.DataFrame]:
    """The results files of a fairness-central run, by name, from its tables (those of the experiments it ran):
    the toy's ERM rows carry the instance's means, the pruning summary the retraining's γ and optimizer."""
    frames = {}
    if "toy" in tables:
        erm = tables["toy_runs"][tables["toy_runs"]["order"] == "erm"]
        frames |= {CENTRAL_RESULTS[0]: tables["toy"],
                   CENTRAL_RESULTS[1]: erm.assign(toy_means=", ".join(f"{m:g}" for m in toy_means))}
    if "tabular" in tables:
        frames |= {CENTRAL_RESULTS[2]: tables["tabular"],
                   CENTRAL_RESULTS[3]: tables["pruning"].assign(prune_gamma=prune_gamma,
                                                                 prune_optimizer=prune_optimizer)}
    return frames


def _kept(fraction: float) -> str:
    return f"{100 * fraction:.0f} %"


def toy_table(toy: pd.DataFrame, rows_shown=TOY_ROWS) -> list[str]:
    """[FAIRINFL] §5's toy: each shown (γ, kept fraction, order) against ERM on the same seed: threshold shift,
    accuracy change, DP change, mean [interval] over seeds."""
    rows = ["| retraining | kept | pruned by | threshold shift | accuracy change | DP gap change |",
            "|---|---|---|---|---|---|"]
    by_key = toy.set_index(["gamma", "keep", "order"])
    seen: set[str] = set()
    for gamma, keep, order in rows_shown:
        row = by_key.loc[(gamma, keep, order)]
        retraining = ("plain" + ("" if len(rows) > 2 else " (γ = 0)")) if gamma == 0 else f"relaxed DP, γ = {gamma:g}"
        pruned = PRUNED_BY_FIRST.get(order, PRUNED_BY[order]) if order not in seen else PRUNED_BY[order]
        seen.add(order)
        rows.append(f"| {retraining} | {_kept(keep)} | {pruned} | {signed_interval(row, 'threshold_shift')} | "
                    f"{number(row['accuracy_change'], 4, True)} | {signed_interval(row, 'dp_change', 4)} |")
    return rows


#: The kept fractions of the toy-instances table, in its column order.
INSTANCE_KEPT = (0.8, 0.6, 0.4)


def _means(toy_erm: pd.DataFrame) -> str:
    """An instance's μ as the docs write it, the default instance marked."""
    text = str(toy_erm["toy_means"].iloc[0])
    means = tuple(float(m) for m in text.split(","))
    return f"({text.replace('-', '−')})" + (" (the default)" if means == tuple(ASYMMETRIC_MEANS) else "")


def _reaches_zero(row, column: str) -> bool:
    return bool(row[f"{column}_low"] <= 0 <= row[f"{column}_high"])


def _shows(row) -> bool:
    """Prop. 5.2's direction at one kept fraction: the threshold moves right and DP falls, both intervals
    excluding 0."""
    return bool(row["threshold_shift_low"] > 0 and row["dp_change_high"] < 0)


def _instance_cell(row) -> str:
    """Pruning by fairness at one kept fraction: the threshold shift (its interval where it reaches 0), then the DP
    change [interval], in bold where the interval lies above 0 (the gap rises)."""
    shift = number(row["threshold_shift"], 3, True)
    if _reaches_zero(row, "threshold_shift"):
        shift += (f" [{number(row['threshold_shift_low'], 3, True)}, "
                  f"{number(row['threshold_shift_high'], 3, True)}]")
    dp = number(row["dp_change"], 4, True)
    return (f"{shift}, {f'**{dp}**' if row['dp_change_low'] > 0 else dp} "
            f"[{number(row['dp_change_low'], 4, True)}, {number(row['dp_change_high'], 4, True)}]")


def _shows_at(cells: list) -> str:
    """The kept fractions where the proposition shows; for none, why: DP rises somewhere, or it falls where the
    shift's interval reaches 0."""
    shown = [f"{100 * row.name:.0f}" for row in cells if _shows(row)]
    if shown:
        return ", ".join(shown) + " %"
    if any(row["dp_change_low"] > 0 for row in cells):
        return "none (DP rises)"
    falls = [row for row in cells if row["dp_change_high"] < 0]
    if falls and all(_reaches_zero(row, "threshold_shift") for row in falls):
        return "none (DP falls, the shift's interval reaches 0)"
    return "none"


def toy_instances_table(*runs: pd.DataFrame, kept=INSTANCE_KEPT) -> list[str]:
    """[FAIRINFL] §5's toy over instances, one row a run of ``--experiment toy --gammas 0``: ``runs`` are each run's
    toy summary and ERM rows (:data:`CENTRAL_RESULTS`' first two files) in turn. Per instance its means, the ERM
    threshold and DP gap and the lever d DP/dt there (means over seeds), pruning by fairness at each of ``kept``
    (:func:`_instance_cell`) and the fractions where the proposition shows (:func:`_shows_at`)."""
    if not runs or len(runs) % 2:
        raise ValueError(f"runs: expected each run's toy summary and ERM rows in turn; got {len(runs)} frames.")
    rows = ["| μ = (μ_00, μ_10, μ_01, μ_11) | ERM threshold, DP | lever | "
            + " | ".join(f"kept {_kept(k)}" + (": shift, DP change" if not i else "") for i, k in enumerate(kept))
            + " | shows at |", "|---" * (4 + len(kept)) + "|"]
    for toy, erm in zip(runs[::2], runs[1::2]):
        fairness = toy[(toy["gamma"] == 0) & (toy["order"] == "fairness")].set_index("keep")
        cells = [fairness.loc[k] for k in kept]
        rows.append(f"| {_means(erm)} | {number(erm['threshold'].mean(), 2)}, {number(erm['dp_gap'].mean(), 3)} | "
                    f"{number(erm['lever'].mean(), 3)} | " + " | ".join(_instance_cell(c) for c in cells)
                    + f" | {_shows_at(cells)} |")
    return rows


def _tabular_order(tabular: pd.DataFrame):
    """The rows of ``tabular``: ERM, the exact-Hessian rules, the Fisher rules, the plain-gradient edit."""
    rank = {"-": 0, "exact": 1, "fisher": 2, "none": 3}
    ordered = tabular.assign(_rank=tabular["curvature"].map(rank)).sort_values("_rank", kind="mergesort")
    return (row for _, row in ordered.iterrows())


def _changed(row) -> str:
    if row["edit"] in EVERY_ROW:
        return "all"
    return "—" if row["edit"] == "gradient" else f"{row['changed']:.0f}"


def _beats(row) -> str:
    return "—" if "beats_random" not in row or pd.isna(row["beats_random"]) else (
        "yes" if str(row["beats_random"]) == "True" else "no")


def tabular_table(tabular: pd.DataFrame, gap: str = "dp") -> list[str]:
    """[FAIRIJ]'s protocol on SLID with logistic regression: every rule with each curvature, its test accuracy and
    gaps, its gap and accuracy against random reweighting matched in accuracy, and whether it beats it."""
    rows = [f"| curvature | rule | changed weights | test accuracy | DP gap | EOP gap | EO gap | {gap.upper()} − "
            "random-matched | accuracy − random-matched | beats random |", "|---" * 10 + "|"]
    seen: set[str] = set()
    for row in _tabular_order(tabular):
        name = EDIT_NAMES[row["edit"]] + ("" if row["edit"] in seen else EDIT_SOURCES.get(row["edit"], ""))
        seen.add(row["edit"])
        rows.append(f"| {CURVATURES[row['curvature']]} | {name} | {_changed(row)} | "
                    + " | ".join(number(row[f"test_{m}"], 3) for m in ("accuracy", "dp_gap", "eop_gap", "eo_gap"))
                    + f" | {signed_interval(row, f'test_{gap}_gap_vs_matched')} | "
                    f"{signed_interval(row, 'test_accuracy_vs_matched')} | {_beats(row)} |")
    return rows


def tabular_mlp_table(tabular: pd.DataFrame, gap: str = "dp") -> list[str]:
    """The same protocol with the SeLU MLP: no ERM row, the damped exact Hessian, and each rule's accuracy against
    the plain-gradient edit instead of random-matched's."""
    rows = [f"| curvature | rule | changed | test accuracy | DP gap | EO gap | {gap.upper()} − random-matched "
            "| accuracy − gradient edit | beats random |", "|---" * 9 + "|"]
    for row in _tabular_order(tabular[tabular["edit"] != "erm"]):
        curvature = "exact H (damped)" if row["curvature"] == "exact" else CURVATURES[row["curvature"]]
        rows.append(f"| {curvature} | {EDIT_NAMES[row['edit']]} | {_changed(row)} | "
                    + " | ".join(number(row[f"test_{m}"], 3) for m in ("accuracy", "dp_gap", "eo_gap"))
                    + f" | {signed_interval(row, f'test_{gap}_gap_vs_matched')} | "
                    f"{signed_interval(row, 'test_accuracy_vs_gradient')} | {_beats(row)} |")
    return rows


def _pruning_cells(row, signed_bounds: bool, bold: bool) -> str:
    """Test accuracy and DP gap, then each against random pruning at the same fraction (— for random itself);
    with ``bold``, a DP difference whose interval lies below 0 in bold."""
    dp = signed_interval(row, "test_dp_gap_vs_random", signed_bounds=signed_bounds)
    if bold and dp != "—" and row["test_dp_gap_vs_random_high"] < 0:
        mean, rest = dp.split(" ", 1)
        dp = f"**{mean}** {rest}"
    return (f"{number(row['test_accuracy'], 3)} | {number(row['test_dp_gap'], 3)} | "
            f"{signed_interval(row, 'test_accuracy_vs_random', signed_bounds=signed_bounds)} | {dp}")


def pruning_table(pruning: pd.DataFrame, rows_shown=PRUNING_ROWS) -> list[str]:
    """[FAIRINFL] pruning on SLID retrained by L-BFGS: each shown (kept fraction, order), paired against random."""
    rows = ["| kept | pruned by | test accuracy | DP gap | accuracy − random | DP − random |", "|---" * 6 + "|"]
    by_key = pruning.set_index(["keep", "order"])
    for keep, order in rows_shown:
        rows.append(f"| {_kept(keep)} | {PRUNED_BY[order]} | {_pruning_cells(by_key.loc[(keep, order)], False, False)} |")
    return rows


def adam_pruning_table(*prunings: pd.DataFrame, rows_shown=ADAM_ROWS) -> list[str]:
    """The same pruning retrained by Adam, one run a γ (its ``prune_gamma`` column), each with its shown rows."""
    rows = ["| γ | kept | pruned by | test accuracy | DP gap | accuracy − random | DP − random |", "|---" * 7 + "|"]
    for pruning in prunings:
        gamma = float(pruning["prune_gamma"].iloc[0])
        by_key = pruning.set_index(["keep", "order"])
        for keep, order in rows_shown[gamma]:
            pruned = "— (full)" if order == "full" else PRUNED_BY[order]
            rows.append(f"| {gamma:g} | {_kept(keep)} | {pruned} | "
                        f"{_pruning_cells(by_key.loc[(keep, order)], True, True)} |")
    return rows
