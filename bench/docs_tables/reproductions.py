"""docs/reproductions.md's registries: which results files each table and printed block comes from, or the run that
would make them.

Each table (known by its header: :mod:`bench.docs_tables.regions`) is in exactly one of :data:`HELD` (rendered from
results files under docs/results/, CSVs headed by the command that made them and the commit:
:mod:`simulations.runner.results_files`), :data:`HELD_BY_TEST` (held by another test, named), :data:`PENDING` (no
results file yet: the exact command(s) that would make it and why it is not kept; where the renderer is written
already, its :class:`Rendering` too, and once every file it reads is made the entry moves to :data:`HELD`) or
:data:`NOT_MEASURED` (settings or definitions). Tables may share a header (the noisy-federation policy tables, one a
federation): one :class:`Rendering` may make every one of them under its caption, or an :class:`InOrder` give each
its own. Printed blocks are :data:`BLOCKS_HELD` (by the kept file they are an excerpt of) or :data:`BLOCKS_PENDING`
(by the run that would keep them). tests/test_reproductions_tables.py and tests/test_reproductions_blocks.py hold
the doc to these lists; ``python -m bench.docs_tables`` renders the held tables into it.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.docs_tables.renderings import InOrder, Pending, Rendering
from bench.regimes import ucb_tuning
from bench.regimes.table import HEADER as REGIMES_TABLE_HEADER

FAIRNESS_MARKDOWN = "simulations.experiments.fairness.markdown"
RECIPROCITY_MARKDOWN = "simulations.experiments.reciprocity.markdown"
NOISY_CLIENTS_MARKDOWN = "simulations.experiments.noisy_clients.markdown"
#: The results files of one procurement run (simulations.experiments.procurement.markdown.PROCUREMENT_RESULTS).
PROCUREMENT = ("procurement_summary.csv", "procurement_paired.csv", "procurement_per_seed.csv",
               "procurement_purchases.csv", "procurement_offers.csv")

#: The toy instances of [FAIRINFL] §5 the docs' over-instances table runs, in its order, and their results folder.
TOY_MEANS = ("-2,-0.1,0.5,1", "-3,-0.5,1,1.65", "-2,-0.2,1,2", "-1.5,-0.3,0.6,1.5", "-1,-0.5,0.8,1.2", "-3,-1,1.5,3")
TOY_INSTANCES = "fairness_toy_instances"

REGIMES_TABLE = "bench.regimes.table:docs_table"
#: The regimes study's results files (python -m bench.regimes --results docs/results): paired, then summary.
REGIMES = ("regimes_paired.csv", "regimes_summary.csv")
#: The regimes tables' header line (several tables: the study's policies, its baselines, other runs').
REGIMES_HEADER = REGIMES_TABLE_HEADER.splitlines()[0]

#: Tables rendered from results files: header -> how (the regimes tables, under one header, each in its order).
HELD: dict[str, Rendering | InOrder] = {
    "| variant (value-driven sampler; utility −loss unless said) | rounds to 95%, p = 1 / 0.5 | AUC p = 1 / 0.5 "
    "| final p = 1 / 0.5 |": Rendering("bench.regimes.ucb_tuning:markdown_rows", ucb_tuning.results_files()),
    "| splits × initializations averaged | α(0.75) | Pearson | negative inflow | negative outflow |":
        Rendering(f"{RECIPROCITY_MARKDOWN}:movielens_prefixes_table",
                  ("movielens_10x10/reciprocity_movielens_prefixes.csv",
                   "movielens_10x10/reciprocity_movielens_figures.csv")),
    "| runs averaged | 1 split | 2 splits | 3 splits | 10 splits |":
        Rendering(f"{RECIPROCITY_MARKDOWN}:movielens_prefix_alphas_table",
                  ("movielens_10x1/reciprocity_movielens_prefixes.csv",
                   "movielens_10x10/reciprocity_movielens_prefixes.csv")),
    "| figure | paper (10 × 10) | measured (10 × 1) | split 0 × 10 initializations | 3 × 1 "
    "| federated, E = 5 (3 × 1) |":
        Rendering(f"{RECIPROCITY_MARKDOWN}:movielens_figures_table", tuple(
            f"movielens_{run}/reciprocity_movielens_{name}.csv" for run in ("10x1", "1x10", "3x1", "federated_3x1")
            for name in ("figures", "alpha_by_step"))),
    "| | Fashion-MNIST, paper's protocol: ADS | LOO | random | digits stand-in: ADS | LOO | random |":
        Rendering(f"{NOISY_CLIENTS_MARKDOWN}:study_pair_table", (
            "noisy_clients_study_fashion/noisy_clients_study_summary.csv",
            "noisy_clients_study/noisy_clients_study_summary.csv")),
    "| policy | final acc | AUC | rounds to 90% | rounds to 95% | s to 90% (steady / measured) "
    "| s to 95% (steady / measured) | bad share of training | detection precision / recall | valuation s / round |":
        Rendering("simulations.experiments.noisy_federation.markdown:policy_tables",
                  ("noisy_federation/noisy_federation_summary.csv",), {"bold": ("value-ucb",)}),
    "| | ADS | LOO | random |":
        Rendering(f"{NOISY_CLIENTS_MARKDOWN}:study_table", ("noisy_clients_study/noisy_clients_study_summary.csv",)),
    "| μ = (μ_00, μ_10, μ_01, μ_11) | ERM threshold, DP | lever | kept 80 %: shift, DP change | kept 60 % "
    "| kept 40 % | shows at |":
        Rendering(f"{FAIRNESS_MARKDOWN}:toy_instances_table", tuple(
            f"{TOY_INSTANCES}/{i}/{name}" for i in range(1, len(TOY_MEANS) + 1)
            for name in ("fairness_central_toy.csv", "fairness_central_toy_erm.csv"))),
    "| | paper ([ADS] Figs. 5, 6, four LLMs) | minibatches of 10 (default) | full batch |":
        Rendering("simulations.experiments.procurement.markdown:procurement_table",
                  (*PROCUREMENT, *(f"procurement_full_batch/{name}" for name in PROCUREMENT))),
    "| dataset | influence | start | α(0.75) conditional | α(0.75) all-splits | paper | Pearson "
    "| neg. inflow / outflow |":
        Rendering(f"{RECIPROCITY_MARKDOWN}:healthcare_table", (
            "reciprocity_breast-cancer_figures.csv", "reciprocity_zero/reciprocity_breast-cancer_figures.csv",
            "reciprocity_diabetes_figures.csv", "reciprocity_zero/reciprocity_diabetes_figures.csv")),
    "| figure | paper | measured |":
        Rendering(f"{RECIPROCITY_MARKDOWN}:healthcare_figures_table", (
            "reciprocity_breast-cancer_figures.csv", "reciprocity_diabetes_figures.csv",
            "reciprocity_1000_steps/reciprocity_diabetes_figures.csv")),
    "| figure | paper | ℓ = (f − y)² (default) | ℓ = ½(f − y)² |":
        Rendering(f"{RECIPROCITY_MARKDOWN}:half_loss_table", (
            "reciprocity_diabetes_figures.csv", "reciprocity_half_loss/reciprocity_diabetes_figures.csv",
            "reciprocity_1000_steps/reciprocity_diabetes_figures.csv",
            "reciprocity_half_loss_1000_steps/reciprocity_diabetes_figures.csv")),
    "| curvature | rule | changed | test accuracy | DP gap | EO gap | DP − random-matched | accuracy − gradient edit "
    "| beats random |":
        Rendering(f"{FAIRNESS_MARKDOWN}:tabular_mlp_table", ("fairness_central_mlp/fairness_central_tabular.csv",)),
    "| selection | rule | test accuracy | test DP | SIM-JACK − Fair-IJ, accuracy | rule − gradient edit, accuracy |":
        Rendering(f"{FAIRNESS_MARKDOWN}:adult_table", ("fairness_adult_summary.csv",)),
    "| rule (K = 2) − random drops (K = 4) | accuracy | DP gap | EOP gap | EO gap | beats random (DP) |":
        Rendering(f"{FAIRNESS_MARKDOWN}:comparison_table", ("fairness_k4/fairness_comparison.csv",),
                  {"k": 2, "random_k": 4, "dataset": "slid"}),
    "| data set | rule | accuracy | DP gap | EOP gap | EO gap |":
        Rendering(f"{FAIRNESS_MARKDOWN}:tradeoff_table", ("fairness_tradeoff.csv",)),
    "| data set | rule | accuracy | DP gap | EOP gap | EO gap | beats random (DP) |":
        Rendering(f"{FAIRNESS_MARKDOWN}:comparison_table", ("fairness_comparison.csv",), {"k": 2, "random_k": 2}),
    "| data set | score | correlation | top = best exact drop | top drop raises the gap |":
        Rendering(f"{FAIRNESS_MARKDOWN}:scoring_table", ("fairness_scoring.csv",)),
    "| γ | kept | pruned by | test accuracy | DP gap | accuracy − random | DP − random |":
        Rendering(f"{FAIRNESS_MARKDOWN}:adam_pruning_table", tuple(
            f"fairness_adam_{gamma}/fairness_central_pruning.csv" for gamma in ("1", "0.02"))),
    "| retraining | kept | pruned by | threshold shift | accuracy change | DP gap change |":
        Rendering(f"{FAIRNESS_MARKDOWN}:toy_table", ("fairness_central_toy.csv",)),
    "| curvature | rule | changed weights | test accuracy | DP gap | EOP gap | EO gap | DP − random-matched "
    "| accuracy − random-matched | beats random |":
        Rendering(f"{FAIRNESS_MARKDOWN}:tabular_table", ("fairness_central_tabular.csv",)),
    "| kept | pruned by | test accuracy | DP gap | accuracy − random | DP − random |":
        Rendering(f"{FAIRNESS_MARKDOWN}:pruning_table", ("fairness_central_pruning.csv",)),
    "| method | utility | tied | exactly 0 | distinct values |":
        Rendering("simulations.experiments.synthetic_data.markdown:ties_table",
                  ("augmentation_ties.csv", "augmentation_likelihood/augmentation_ties.csv")),
    REGIMES_HEADER: InOrder((
        Rendering(REGIMES_TABLE, ("regimes_paired_fixed_weight.csv", "regimes_summary_fixed_weight.csv")),
        Rendering(REGIMES_TABLE, REGIMES, {"policies": ("value-ucb", "greedyfed", "value-guard")}),
        Rendering(REGIMES_TABLE, REGIMES, {"policies": ("oracle", "median", "trimmed-mean", "krum",
                                                        "power-of-choice")}),
        Rendering(REGIMES_TABLE, ("regimes_paired_full.csv", "regimes_summary_full.csv")))),
    "| variant | clean | free-rider | label-flip-1.0 | mavericks | worst | mean |":
        Rendering("bench.regimes.tuning:markdown_rows", ("guard_tuning.csv",)),
}

#: Tables another test holds to their results files, which ``python -m bench.docs_tables`` does not render: header ->
#: that test.
HELD_BY_TEST: dict[str, str] = {}

#: Measured tables no results file holds yet: header -> the runs that would make them and why they are not kept.
PENDING: dict[str, Pending] = {
}

#: Tables that state settings or definitions, not measurements: header -> what they hold.
NOT_MEASURED = {
    "| experiment | hyperparameter | value | status |": "every experiment's hyperparameters and how each was set",
    "| hyperparameter | value | status |": "the noisy-federation benchmark's hyperparameters and how each was set",
    "| `--bad-kind` | the bad client | behaviour | strength p |": "the kinds of bad client and their settings",
}

LISTS = {"HELD": HELD, "HELD_BY_TEST": HELD_BY_TEST, "PENDING": PENDING, "NOT_MEASURED": NOT_MEASURED}


@dataclass(frozen=True)
class Run:
    """A block no results file holds yet: the command that would keep it, and what it costs by the docs' timings."""

    command: str
    cost: str


ORDERINGS = "mean relative accuracy over fractions > 0 (better: (a), (d) higher; (b), (c) lower)\n"
#: Blocks of printed results not kept yet, by their first line (or lines, where two open alike).
BLOCKS_PENDING: dict[str, Run] = {
}
#: Blocks kept by their run, by key: the file under docs/results/ that holds them.
BLOCKS_HELD: dict[str, str] = {
    ORDERINGS + "panel   knn-ads   mc-ads   knn-ds   tmc-ds      loo   random   ADS beats DS and LOO (knn-ads / mc-ads)":
        "augmentation_random/augmentation_printed.txt",
    "noisy-clients study, 20 seeds, 160 runs of 5 rounds": "study_20.txt",
    ORDERINGS + "panel    mc-ads   tmc-ds      loo   random   ADS beats DS and LOO (mc-ads)": "augmentation_logistic/augmentation_printed.txt",
    "problem: 10000 training × 784 features, 1000 test points, K = 5, 10 classes, seed 0; each row a fresh process":
        "knn.txt",
    "scenario      configuration               DS contrib.  DS broker  ADS contrib.  ADS broker":
        "replication_market_printed.txt",
}
