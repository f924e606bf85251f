"""The value-driven sampler's tuning table (:mod:`bench.regimes.ucb_tuning`): each variant's command runs the
quick configuration with exactly the settings its words name, and the eleven commands' results files render the
docs' table; both through ``python -m bench.regimes`` itself, with the benchmark's runs replaced by made-up tables
of the real format whose figures are the docs' own (no engine)."""

from __future__ import annotations

import math
import shlex
from pathlib import Path

import pandas as pd
import pytest

from bench.regimes import study
from bench.regimes.ucb_tuning import CHOSEN, HEADER, REGIMES, VARIANTS, command, markdown_rows, results_files
from simulations.experiments.noisy_federation.config import NoisyFederationConfig
from simulations.experiments.noisy_federation.measures import MEASURES, paired_differences, summary_table
from simulations.runner.results_files import read_results, results_command

DOC = (Path(__file__).resolve().parents[1] / "docs" / "reproductions.md").read_text().splitlines()
#: The regimes' flip probabilities.
P = {"label-flip-1.0": 1.0, "label-flip-0.5": 0.5}
#: What each variant's words say, as settings: policy, selection, acceptance, round-robin first, c, utility,
#: GreedyFed's memory (None: the plain mean).
MEANING = {
    "uniform-weighted": ("value-ucb", "uniform", "value-weighted", 0, 0.5, "neg_loss", None),
    "uniform-fedavg": ("value-ucb", "uniform", "all", 0, 0.5, "neg_loss", None),
    "uniform-fedavg-accuracy": ("value-ucb", "uniform", "all", 0, 0.5, "accuracy", None),
    "round-robin-fedavg": ("value-ucb", "uniform", "all", 1, 0.5, "neg_loss", None),
    "round-robin-fedavg-c0.25": ("value-ucb", "uniform", "all", 1, 0.25, "neg_loss", None),
    "ucb-fedavg": ("value-ucb", "ucb", "all", 0, 0.5, "neg_loss", None),
    "ucb-fedavg-c1": ("value-ucb", "ucb", "all", 0, 1, "neg_loss", None),
    "ucb-weighted": ("value-ucb", "ucb", "value-weighted", 0, 0.5, "neg_loss", None),
    "greedyfed-mean": ("greedyfed", "ucb", "value-weighted", 0, 0.5, "neg_loss", None),
    "greedyfed-average": ("greedyfed", "ucb", "value-weighted", 0, 0.5, "neg_loss", 0.5),
    "greedyfed-average-accuracy": ("greedyfed", "ucb", "value-weighted", 0, 0.5, "accuracy", 0.5),
}


def docs_table() -> list[str]:
    start = DOC.index(HEADER)
    end = next(i for i in range(start, len(DOC)) if not DOC[i].startswith("|"))
    return DOC[start:end]


def docs_figures() -> dict:
    """variant -> regime -> (rounds to 95%, AUC, final accuracy), as the docs' table gives them."""
    figures = {}
    for variant, row in zip(VARIANTS, docs_table()[2:], strict=True):
        cells = row.replace("**", "").strip("| ").split(" | ")
        rounds, auc, final = ([float(x) for x in cell.split(" / ")] for cell in cells[1:])
        figures[variant.name] = {regime: (rounds[k], auc[k], final[k]) for k, regime in enumerate(REGIMES)}
    return figures


def made_up_tables(config: NoisyFederationConfig, out: Path) -> dict:
    """The tables ``write_tables`` returns for a regime's folder ``out`` (``DIR/VARIANT/REGIME``): a clean cell and
    the policy's, the policy's measures the docs' figures for that variant and regime."""
    rounds, auc, final = docs_figures()[out.parent.name][out.name]
    cell = dict.fromkeys(MEASURES, math.nan)
    per_cell = pd.DataFrame([
        {"model": "mlp", "seed": config.seed, "federation": "clean", "policy": "clean",
         **cell, "final_accuracy": 0.782, "auc": 0.72, "rounds_to_95": 13.0},
        {"model": "mlp", "seed": config.seed, "federation": f"p{config.flip_probabilities[0]:g}",
         "policy": config.policies[0], **cell, "final_accuracy": final, "auc": auc, "rounds_to_95": rounds}])
    curves = pd.DataFrame([{"model": "mlp", "seed": config.seed, "federation": row["federation"],
                            "policy": row["policy"], "round": t, "test_accuracy": row["final_accuracy"]}
                           for _, row in per_cell.iterrows() for t in (1, 2)])
    return {"per_cell": per_cell, "summary": summary_table(per_cell), "paired": paired_differences(per_cell, 30),
            "curves": curves}


@pytest.fixture
def runs(tmp_path, monkeypatch) -> tuple[Path, dict]:
    """Every variant's command run by ``python -m bench.regimes``'s own main into ``tmp_path`` (runs under runs/,
    results under results/): the results folder and the configuration each (variant, regime) ran."""
    ran = {}
    monkeypatch.setattr(study, "run_benchmark", lambda config, out: ran.setdefault((out.parent.name, out.name), config))
    monkeypatch.setattr(study, "write_tables", made_up_tables)
    for variant in VARIANTS:
        line = command(variant, out=str(tmp_path / "runs"), results=str(tmp_path / "results"))
        assert line.startswith("python -m bench.regimes ")
        study.main(shlex.split(line)[3:])
    return tmp_path / "results", ran


def test_each_variant_runs_the_quick_configuration_with_the_settings_its_words_name(runs):
    _, ran = runs
    assert set(MEANING) == {variant.name for variant in VARIANTS} and sum(v.name == CHOSEN for v in VARIANTS) == 1
    for (name, regime), config in ran.items():
        policy, selection, acceptance, warm_start, confidence, utility, memory = MEANING[name]
        assert config == NoisyFederationConfig(
            seed=100, seeds=1, policies=(policy,), flip_probabilities=(P[regime],), elimination_selection=selection,
            elimination_acceptance=acceptance, elimination_warm_start=warm_start,
            elimination_confidence=confidence, utility=utility, greedy_memory=memory), (name, regime)
    assert sorted(ran) == sorted((variant.name, regime) for variant in VARIANTS for regime in REGIMES)


def test_the_eleven_results_files_render_the_docs_table(runs):
    results, _ = runs
    for file in results_files():
        assert results_command(results / file).startswith("python -m bench.regimes --seed 100 --seeds 1 ")
    summaries = [read_results(results / file) for file in results_files()]
    assert markdown_rows(*summaries) == docs_table()
    assert docs_table()[2 + [v.name for v in VARIANTS].index(CHOSEN)].startswith("| **UCB, value-weighted")


def test_a_target_never_reached_is_a_dash_and_a_missing_regime_is_named(runs):
    results, _ = runs
    summaries = [read_results(results / file) for file in results_files()]
    first = summaries[0]
    first.loc[first["regime"] == REGIMES[1], ["rounds_to_95", "rounds_to_95_n"]] = [math.nan, 0]
    assert markdown_rows(*summaries)[2].startswith("| uniform among survivors, value-weighted | 11 / – | ")
    summaries[0] = first[first["regime"] != REGIMES[1]]
    with pytest.raises(ValueError, match="uniform-weighted; missing"):
        markdown_rows(*summaries)
    with pytest.raises(ValueError, match="one regimes summary a variant"):
        markdown_rows(*summaries[1:])
