"""The docs' healthcare reciprocity tables ([RECIP] §5.2), rendered from results files alone.

``fedvalue run reciprocity --results FOLDER`` keeps each data set's figures (``to_frame()``: metric, measured and
the paper's figure where it gives one) as ``reciprocity_DATASET_figures.csv``, headed by the command and the commit.
The docs' tables set several runs side by side (the default start and ``--initialization zero``, ``--steps 1000``,
``--squared-loss half``), one results folder a run; the functions here take those runs' files in the docs' order.
"""

from __future__ import annotations

import pandas as pd

#: The results file of each data set a run measures.
RECIPROCITY_RESULTS = tuple(f"reciprocity_{dataset}_figures.csv" for dataset in ("breast-cancer", "diabetes",
                                                                                    "movielens"))
DATASET_NAMES = {"breast-cancer": "breast cancer", "diabetes": "diabetes"}
INFLUENCE_NAMES = {"tracin": "TracIn", "marginal": "Marginal"}


def results_frames(results) -> dict[str, pd.DataFrame]:
    """Each result's figures by its results file's name."""
    return {f"reciprocity_{r.config.dataset}_figures.csv": r.to_frame().reset_index() for r in results}


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
