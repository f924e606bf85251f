"""The docs' reciprocity tables ([RECIP] §5.2's healthcare models, §5.1's MovieLens), rendered from results files
alone.

``fedvalue run reciprocity --results FOLDER`` keeps each data set's figures (``to_frame()``: metric, measured and
the paper's figure where it gives one) as ``reciprocity_DATASET_figures.csv``, headed by the command and the commit;
a MovieLens run also keeps its figures over the first k splits for every k (``reciprocity_movielens_prefixes.csv``)
and α along training (``reciprocity_movielens_alpha_by_step.csv``). The docs' tables set several runs side by side
(the default start and ``--initialization zero``, ``--steps 1000``, ``--squared-loss half``; MovieLens' splits ×
initializations and its federated extension), one results folder a run; the functions here take those runs' files
in the docs' order.
"""

from __future__ import annotations

import math

import pandas as pd

#: A MovieLens run's figures over the first k splits, and its α along training.
MOVIELENS_PREFIXES, MOVIELENS_ALPHA_BY_STEP = "reciprocity_movielens_prefixes.csv", "reciprocity_movielens_alpha_by_step.csv"
#: The results files a run may write: each data set's figures, and MovieLens' two more.
RECIPROCITY_RESULTS = (*(f"reciprocity_{dataset}_figures.csv" for dataset in ("breast-cancer", "diabetes", "movielens")),
                       MOVIELENS_PREFIXES, MOVIELENS_ALPHA_BY_STEP)
DATASET_NAMES = {"breast-cancer": "breast cancer", "diabetes": "diabetes"}
INFLUENCE_NAMES = {"tracin": "TracIn", "marginal": "Marginal"}


def results_frames(results) -> dict[str, pd.DataFrame]:
    """Each result's figures by its results file's name; a MovieLens result's prefixes and α along training too."""
    frames = {}
    for r in results:
        frames[f"reciprocity_{r.config.dataset}_figures.csv"] = r.to_frame().reset_index()
        if r.config.dataset == "movielens":
            frames |= {MOVIELENS_PREFIXES: r.prefixes, MOVIELENS_ALPHA_BY_STEP: r.alpha_by_step}
    return frames


def measured(figures: pd.DataFrame, metric: str) -> float:
    """A figure of a run (``figures``: a results file's rows)."""
    return float(figures.set_index("metric").loc[metric, "measured"])


def published(figures: pd.DataFrame, metric: str) -> float:
    """The paper's figure beside it."""
    return float(figures.set_index("metric").loc[metric, "paper"])


def _alpha(influence: str, averaging: str, p: float = 0.75) -> str:
    return f"{influence} alpha_at_p={p:g} ({averaging})"


def _percent(share: float) -> str:
    return f"{100 * share:.1f}%"


def _row(dataset: str, influence: str, start: str, figures: pd.DataFrame, bold: bool) -> str:
    conditional = f"{measured(figures, _alpha(influence, 'conditional')):.3f}"
    return (f"| {DATASET_NAMES[dataset]} | {INFLUENCE_NAMES[influence]} | {start} | "
            f"{f'**{conditional}**' if bold else conditional} | {measured(figures, _alpha(influence, 'all-splits')):.3f} | "
            f"{published(figures, _alpha(influence, 'conditional')):.2f} | {measured(figures, f'{influence} pearson'):.3f} | "
            f"{_percent(measured(figures, f'{influence} negative_inflow_share'))} / "
            f"{_percent(measured(figures, f'{influence} negative_outflow_share'))} |")


def healthcare_table(breast_cancer: pd.DataFrame, breast_cancer_zero: pd.DataFrame, diabetes: pd.DataFrame,
                     diabetes_zero: pd.DataFrame) -> list[str]:
    """α(0.75) under both averagings, the paper's, Pearson and the negative shares: per data set TracIn from the
    default start (in bold) and from zero, then Marginal (runs with ``--influence both``; ``--initialization
    zero``)."""
    rows = ["| dataset | influence | start | α(0.75) conditional | α(0.75) all-splits | paper | Pearson "
            "| neg. inflow / outflow |", "|---" * 8 + "|"]
    for dataset, default, zero in (("breast-cancer", breast_cancer, breast_cancer_zero),
                                   ("diabetes", diabetes, diabetes_zero)):
        rows += [_row(dataset, "tracin", "average label (default)", default, True),
                 _row(dataset, "tracin", "zero", zero, False),
                 _row(dataset, "marginal", "average label", default, False)]
    return rows


def healthcare_figures_table(breast_cancer: pd.DataFrame, diabetes: pd.DataFrame,
                             diabetes_1000: pd.DataFrame) -> list[str]:
    """The Marginal outflow SNR's percentiles, diabetes α after 200 and 1,000 steps, and the first-order gap
    (the default runs with ``--influence both``; diabetes with ``--steps 1000``)."""
    both = (breast_cancer, diabetes)

    def pair(metric: str, column=measured) -> str:
        return " / ".join(f"{column(figures, metric):.2f}" for figures in both)

    def trained(averaging: str) -> str:
        """Diabetes TracIn α after 200 → 1,000 steps under ``averaging``."""
        return " → ".join(f"{measured(run, _alpha('tracin', averaging)):.2f}" for run in (diabetes, diabetes_1000))

    return ["| figure | paper | measured |", "|---|---|---|",
            "| 90th percentile of the Marginal outflow SNR (workshop §5.2.1), breast cancer / diabetes | "
            f"{pair('marginal outflow_snr_p90', published)} | {pair('marginal outflow_snr_p90')} |",
            "| median Marginal outflow SNR (ICML §5.2: \"0.30\" over the healthcare data sets) | 0.30 | "
            f"{pair('marginal outflow_snr_p50')} |",
            "| diabetes α(0.75) after 200 → 1,000 steps (workshop Fig. 6; `--steps 1000`) | "
            f"{published(diabetes, _alpha('tracin', 'conditional')):.2f} → "
            f"{published(diabetes_1000, _alpha('tracin', 'conditional')):.2f} | {trained('conditional')} "
            f"(all-splits {trained('all-splits')}) |",
            "| first-order gap (Σ flows against the actual reduction of the inference loss), breast cancer / diabetes "
            f"| — | {pair('first_order_gap')} |"]


def half_loss_table(plain: pd.DataFrame, half: pd.DataFrame, plain_1000: pd.DataFrame,
                    half_1000: pd.DataFrame) -> list[str]:
    """Diabetes under each reading of the squared loss (``--squared-loss half``): the paper's four figures,
    conditional mean (all-splits in brackets), the ½-loss TracIn figures in bold, the RMSE and the negative
    Marginal outflows."""
    def alphas(figures: pd.DataFrame, influence: str, bold: bool = False) -> str:
        conditional = f"{measured(figures, _alpha(influence, 'conditional')):.3f}"
        return (f"**{conditional}**" if bold else conditional) + \
            f" ({measured(figures, _alpha(influence, 'all-splits')):.3f})"

    snr = "marginal outflow_snr_p90"
    return ["| figure | paper | ℓ = (f − y)² (default) | ℓ = ½(f − y)² |", "|---|---|---|---|",
            f"| TracIn α(0.75), T = 200 | {published(plain, _alpha('tracin', 'conditional')):.2f} | "
            f"{alphas(plain, 'tracin')} | {alphas(half, 'tracin', True)} |",
            f"| Marginal α(0.75), T = 200 | {published(plain, _alpha('marginal', 'conditional')):.2f} | "
            f"{alphas(plain, 'marginal')} | {alphas(half, 'marginal')} |",
            f"| Marginal outflow SNR, 90th percentile (workshop §5.2.1) | {published(plain, snr):.2f} | "
            f"{measured(plain, snr):.2f} | {measured(half, snr):.2f} |",
            f"| TracIn α(0.75) after 1,000 steps (workshop Fig. 6) | "
            f"{published(plain_1000, _alpha('tracin', 'conditional')):.2f} | {alphas(plain_1000, 'tracin')} | "
            f"{alphas(half_1000, 'tracin', True)} |",
            f"| inference RMSE, T = 200 | — | {measured(plain, 'inference_rmse'):.2f} | "
            f"{measured(half, 'inference_rmse'):.2f} |",
            f"| negative Marginal outflows | — | {_percent(measured(plain, 'marginal negative_outflow_share'))} | "
            f"{_percent(measured(half, 'marginal negative_outflow_share'))} |"]


# -------------------------------------------------------------------------- MovieLens ([RECIP] §5.1)

#: The TracIn figures a MovieLens figures file gives for each averaging ("single split", "all splits").
_SPLIT_FIGURES = ("alpha", "pearson", "negative_inflow_share", "negative_outflow_share")


def _split_figure(figures: pd.DataFrame, key: str, averaged: str, column=measured) -> float:
    """A TracIn figure of one averaging, measured (or the paper's, ``column=published``)."""
    return column(figures, f"tracin {key} ({averaged})")


def _paper_share(share: float, space: str) -> str:
    return f"{100 * share:g}{space}%"


def _share(share: float, space: str = " ") -> str:
    """A measured share to 0.1 %, none as 0 %."""
    return f"0{space}%" if share == 0 else f"{100 * share:.1f}{space}%"


def _counts(figures: pd.DataFrame) -> tuple[int, int]:
    """A MovieLens run's splits and initializations per split."""
    return int(measured(figures, "splits")), int(measured(figures, "initializations per split"))


def _require(figures: pd.DataFrame, splits: int, initializations: int, name: str) -> None:
    if _counts(figures) != (splits, initializations):
        raise ValueError(f"{name}: expected a run of {splits} splits × {initializations} initializations; got "
                         "{} × {}.".format(*_counts(figures)))


def movielens_prefixes_table(prefixes: pd.DataFrame, figures: pd.DataFrame) -> list[str]:
    """One MovieLens run's α(0.75), Pearson and negative shares over its first k splits, each k a row, the paper's
    single-split and all-splits figures (the run's figures file) beside the first and the last."""
    rows = ["| splits × initializations averaged | α(0.75) | Pearson | negative inflow | negative outflow |",
            "|---|---|---|---|---|"]
    last = len(prefixes) - 1
    for k, row in prefixes.reset_index(drop=True).iterrows():
        runs = f"{row['splits']:.0f} × {row['initializations']:.0f}"
        alpha = f"{row['alpha']:.3f}"
        if k in (0, last):
            averaged = "single split" if k == 0 else "all splits"
            paper = ", ".join([*(f"{_split_figure(figures, key, averaged, published):g}" for key in _SPLIT_FIGURES[:2]),
                               *(_paper_share(_split_figure(figures, key, averaged, published), " ")
                                 for key in _SPLIT_FIGURES[2:])])
            note = f' (the paper\'s "{averaged}"; paper: {paper})'
            runs, alpha = (f"**{runs}**", f"**{alpha}**") if k == last else (runs, alpha)
            runs += note
        rows.append(f"| {runs} | {alpha} | {row['pearson']:.3f} | {_share(row['negative_inflow_share'])} | "
                    f"{_share(row['negative_outflow_share'])} |")
    return rows


def movielens_prefix_alphas_table(one_initialization: pd.DataFrame, ten_initializations: pd.DataFrame,
                                  splits=(1, 2, 3, 10)) -> list[str]:
    """α(0.75) over the first k splits for each k of ``splits``, with one initialization per split and with the
    paper's ten (two runs' prefixes files)."""
    rows = ["| runs averaged | " + " | ".join(f"{k} split{'s' if k > 1 else ''}" for k in splits) + " |",
            "|---" * (1 + len(splits)) + "|"]
    for prefixes, initializations, name in ((one_initialization, 1, "one initialization per split (10 × 1 run below)"),
                                            (ten_initializations, 10, "ten initializations per split (the paper's)")):
        if set(prefixes["initializations"]) != {initializations}:
            raise ValueError(f"prefixes: expected {initializations} initializations per split; got "
                             f"{sorted(set(prefixes['initializations']))}.")
        alpha = prefixes.set_index("splits")["alpha"]
        rows.append(f"| {name} | " + " | ".join(f"{alpha.loc[k]:.2f}" for k in splits) + " |")
    return rows


def _along_training(steps: pd.DataFrame, clock: str | None) -> tuple[str, str, str]:
    """α along training, single / all splits: at the first checkpoint, at the peak and at the end; with ``clock``
    (step or round) where each was taken."""
    first, last = steps.iloc[0], steps.iloc[-1]
    peaks = sorted({int(steps.loc[steps[column].idxmax(), "step"]) for column in ("single_split", "all_splits")})
    pair = lambda single, every: f"{single:.2f} / {every:.2f}"  # noqa: E731
    peak = pair(steps["single_split"].max(), steps["all_splits"].max())
    end = pair(last["single_split"], last["all_splits"])
    if clock is None:
        return "—", peak, end
    where = f"{clock} {peaks[0]}" if len(peaks) == 1 else f"{clock}s {peaks[0]}–{peaks[-1]}"
    return (f"{pair(first['single_split'], first['all_splits'])} at {clock} {int(first['step'])}",
            f"{peak} at {where}", f"{end} at {int(last['step']):,}")


def _movielens_column(figures: pd.DataFrame, steps: pd.DataFrame, detail: bool, clock: str | None) -> list[str]:
    """A run's cells of the MovieLens figures table, row by row. One split: its all-splits halves and α along
    training are —; the spread of the test RMSE where the run has ten runs or more; ``detail``: α's start along
    training and the TracIn α on Marginal's users; ``clock``: where α along training peaks and ends."""
    splits, initializations = _counts(figures)
    one = splits == 1

    def both(key: str, form) -> str:
        single = form(_split_figure(figures, key, "single split"))
        return f"{single} / {'—' if one else form(_split_figure(figures, key, 'all splits'))}"

    rmse = f"{measured(figures, 'inference_rmse (mean)'):.3f}"
    if splits * initializations >= 10:
        rmse += f" ± {measured(figures, 'inference_rmse (std)'):.3f}"
    start, peak, end = ("—",) * 3 if one else _along_training(steps, clock)
    snr = measured(figures, "tracin outflow_snr_p10 (across splits)")
    marginal = {"subsample marginal outflow_snr_p90", "subsample marginal alpha", "subsample users"} <= set(
        figures["metric"])
    if marginal:
        users = int(measured(figures, "subsample users"))
        marginal_snr = f"{measured(figures, 'subsample marginal outflow_snr_p90'):.1f} ({users} users)"
        marginal_alpha = f"{measured(figures, 'subsample marginal alpha'):.2f}" + (
            f" ({users} users; TracIn on the same {users}: {measured(figures, 'subsample tracin alpha'):.2f})"
            if detail else "")
    else:
        marginal_snr = marginal_alpha = "—"
    return [rmse, f"{_split_figure(figures, 'alpha', 'single split'):.2f}",
            "—" if one else f"{_split_figure(figures, 'alpha', 'all splits'):.2f}",
            both("pearson", lambda v: f"{v:.2f}"), both("negative_inflow_share", lambda v: _share(v, "")),
            both("negative_outflow_share", lambda v: _share(v, "")), start if detail else "—", peak, end,
            f"{100 * measured(figures, 'first_order_discrepancy_p80 (median run)'):.2g}%",
            "—" if math.isnan(snr) else f"{snr:.2f}", marginal_snr, marginal_alpha]


#: The MovieLens figures table's rows.
MOVIELENS_FIGURE_ROWS = (
    "test RMSE", "α(0.75), single split", "α(0.75), all splits", "Pearson, single / all splits",
    "negative inflow, single / all", "negative outflow, single / all",
    "α along training (Fig. 1c), start; single / all splits", "α along training, peak; single / all splits",
    "α along training, end; single / all splits", "first-order discrepancy per step, 80th percentile (App. C.1)",
    "TracIn outflow SNR across splits, 10th percentile (App. C.2, Fig. 6)",
    "Marginal outflow SNR, 90th percentile (workshop: \"90% … less than 0.49\")", "Marginal α(0.75), all splits")
#: The paper's figures that are words, not numbers of a figures file, by row.
PAPER_WORDS = {6: "low", 7: "rises early", 8: "degrades near convergence", 12: 'not reported ("only TracIn")'}


def _paper_column(figures: pd.DataFrame) -> list[str]:
    """The paper's cells of the MovieLens figures table, from a run's figures file (its ``paper`` column)."""
    def both(key: str, form) -> str:
        return " / ".join(form(_split_figure(figures, key, averaged, published))
                          for averaged in ("single split", "all splits"))

    cells = [f"{published(figures, 'inference_rmse (mean)'):.3f} ± {published(figures, 'inference_rmse (std)'):.3f} "
             "(workshop; 0.910 on a 90:10 split)",
             f"{_split_figure(figures, 'alpha', 'single split', published):g}",
             f"{_split_figure(figures, 'alpha', 'all splits', published):g}", both("pearson", lambda v: f"{v:g}"),
             both("negative_inflow_share", lambda v: _paper_share(v, "")),
             both("negative_outflow_share", lambda v: _paper_share(v, "")), "", "", "",
             f"{100 * published(figures, 'first_order_discrepancy_p80 (median run)'):g}%",
             f"{published(figures, 'tracin outflow_snr_p10 (across splits)'):g}",
             f"{published(figures, 'subsample marginal outflow_snr_p90'):g}", ""]
    return [PAPER_WORDS.get(i, cell) for i, cell in enumerate(cells)]


def movielens_figures_table(ten_by_one: pd.DataFrame, ten_by_one_steps: pd.DataFrame, split_zero: pd.DataFrame,
                            split_zero_steps: pd.DataFrame, three_by_one: pd.DataFrame,
                            three_by_one_steps: pd.DataFrame, federated: pd.DataFrame,
                            federated_steps: pd.DataFrame) -> list[str]:
    """MovieLens' figures against the paper's 10 × 10, each run's figures file and α along training in turn: the
    10 × 1 run with ``--influence both`` in full (where α peaks and ends along training, its start, the TracIn α on
    Marginal's users), split 0 with ten initializations, the 3 × 1 run (``--influence both``) and the federated one
    (E = 5, 3 × 1) with their headline figures, the federated one's α along training in rounds."""
    columns = ((ten_by_one, ten_by_one_steps, (10, 1), True, "step"), (split_zero, split_zero_steps, (1, 10), False, None),
               (three_by_one, three_by_one_steps, (3, 1), False, None), (federated, federated_steps, (3, 1), False, "round"))
    for name, (figures, _, counts, _, _) in zip(("10 × 1", "split 0", "3 × 1", "federated"), columns):
        _require(figures, *counts, name)
    cells = [_paper_column(ten_by_one), *(_movielens_column(figures, steps, detail, clock)
                                          for figures, steps, _, detail, clock in columns)]
    rows = ["| figure | paper (10 × 10) | measured (10 × 1) | split 0 × 10 initializations | 3 × 1 "
            "| federated, E = 5 (3 × 1) |", "|---" * 6 + "|"]
    return rows + [f"| {name} | " + " | ".join(column[i] for column in cells) + " |"
                   for i, name in enumerate(MOVIELENS_FIGURE_ROWS)]
