"""The noisy-federation policy tables' results files and their rendering, without a run (no Ray): the files made from
a benchmark folder of made-up cells, and the docs' tables rendered again, line for line, from a results file holding
the docs' own figures."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pandas as pd
import pytest

from simulations.experiments.noisy_federation.markdown import (
    HEADER,
    NOISY_FEDERATION_RESULTS,
    policy_tables,
    results_frames,
)
from simulations.experiments.noisy_federation.measures import MEASURES, summary_table
from simulations.runner import read_results, results_command, write_results
from tests.test_reproductions_tables import DOC, HELD, unheld

COMMAND = "fedvalue run noisy-federation --out DIR --seed 1 --seeds 3 --results FOLDER"
#: A cell of the docs' tables: mean, ± half-width, (k/n) when fewer seeds have it.
ESTIMATE = re.compile(r"([\d.]+)(?: ± ([\d.]+))?(?: \((\d+)/\d+\))?")
CAPTION = re.compile(r"\*\*(\w+), federation (\w[\w.]*)\*\* \((\d+) seeds\)")


def per_cell(seeds=(1, 2, 3)) -> pd.DataFrame:
    """collect()'s frame for made-up cells: the clean federation, and random, greedyfed, value-ucb and the oracle at
    p = 1; random reaches 95% in two seeds of three, value-ucb ends above random in every seed."""
    rows = []
    for seed in seeds:
        cells = [("clean", "clean", 0.78), *(("p1", policy, final) for policy, final in (
            ("random", 0.70), ("greedyfed", 0.77), ("value-ucb", 0.78), ("oracle", 0.779)))]
        for federation, policy, final in cells:
            final += 0.002 * seed
            reached = not (policy == "random" and seed == 3)
            rounds = {90: 8.0 + seed, 95: 13.0 + seed if reached else math.nan}
            row = {"model": "mlp", "seed": seed, "federation": federation, "policy": policy,
                   "final_accuracy": final, "auc": final - 0.07, "valuation_seconds": 0.006, "round_seconds": 0.45}
            for target, reached_round in rounds.items():
                row |= {f"rounds_to_{target}": reached_round, f"seconds_to_{target}": 0.5 * reached_round,
                        f"steady_seconds_to_{target}": 0.45 * reached_round}
            bad = 0.0 if policy in ("clean", "oracle") else 0.5 if policy == "random" else 0.2
            valuing = policy in ("greedyfed", "value-ucb")
            row |= {"bad_trained_share": bad, "bad_aggregated_share": bad,
                    "ruled_out_precision": 0.8 + 0.01 * seed if valuing else math.nan,
                    "ruled_out_recall": 0.5 if valuing else math.nan,
                    "rejected_precision": 0.4 if policy == "value-ucb" else math.nan,
                    "rejected_recall": 0.86 if policy == "value-ucb" else math.nan,
                    "maverick_accuracy": math.nan, "mavericks_ruled_out": math.nan}
            rows.append(row)
    return pd.DataFrame(rows)


def benchmark_folder(out: Path, cells: pd.DataFrame, rounds: int = 30) -> Path:
    """What write_tables leaves in the benchmark's ``--out`` that the results files are made from."""
    out.mkdir()
    (out / "benchmark.json").write_text(json.dumps({"simulation": "noisy-federation", "rounds": rounds}))
    cells.to_csv(out / "per_cell.csv", index=False)
    summary_table(cells).to_csv(out / "summary.csv", index=False)
    return out


def test_the_results_files_are_the_run_s_summary_and_its_pairs_against_three_baselines(tmp_path):
    cells = per_cell()
    frames = results_frames(benchmark_folder(tmp_path / "out", cells))
    written = write_results(tmp_path / "results", frames, COMMAND)
    assert [path.name for path in written] == list(NOISY_FEDERATION_RESULTS)
    assert all(results_command(path) == COMMAND for path in written)
    summary, paired = (read_results(path) for path in written)
    pd.testing.assert_frame_equal(summary, summary_table(cells), check_dtype=False)
    random = summary.set_index(["federation", "policy"]).loc[("p1", "random")]
    assert (random["rounds_to_95"], random["rounds_to_95_n"], random["seeds"]) == (14.5, 2, 3)

    assert sorted(set(paired["baseline"])) == ["greedyfed", "oracle", "random"]
    assert set(paired["federation"]) == {"p1"}  # the clean federation has no baseline
    pairs = paired.set_index(["policy", "baseline"])
    ucb = pairs.loc[("value-ucb", "random")]
    assert ucb["final_accuracy_diff"] == pytest.approx(0.08)
    assert (ucb["final_accuracy_diff_above"], ucb["final_accuracy_diff_below"], ucb["final_accuracy_diff_n"]) == (3, 0, 3)
    # random's unreached seed counts as T + 1 = 31 rounds: value-ucb is 0 rounds sooner twice and 15 once.
    assert ucb["rounds_to_95_diff"] == pytest.approx((0 + 0 + (16 - 31)) / 3)
    assert (ucb["rounds_to_95_diff_above"], ucb["rounds_to_95_diff_below"]) == (0, 1)
    oracle = pairs.loc[("value-ucb", "oracle")]
    assert (oracle["auc_diff_above"], oracle["auc_diff_below"]) == (3, 0)
    assert ("random", "greedyfed") in pairs.index and ("oracle", "oracle") not in pairs.index

    lines = policy_tables(summary, bold=("value-ucb",))
    assert lines[:4] == ["**mlp, federation clean** (3 seeds)", "", HEADER, "|---" * 10 + "|"]
    assert lines[4].startswith("| clean | 0.784 ± 0.005 | 0.714 ± 0.005 | 10.0 ± 2.5 | 15.0 ± 2.5 | ")
    assert lines[5:8] == ["", "**mlp, federation p1** (3 seeds)", ""]
    rows = {row.split(" | ")[0][2:]: row.split(" | ") for row in lines[10:]}
    assert list(rows) == ["random", "greedyfed", "**value-ucb**", "oracle"]
    assert rows["random"][4] == "14.5 ± 6.4 (2/3)" and rows["random"][6] == "6.5 ± 2.9 (2/3) / 7.2 ± 3.2 (2/3)"
    assert rows["random"][8] == rows["oracle"][8] == "–"
    assert rows["greedyfed"][8] == "out 0.82 ± 0.02 / 0.50 ± 0.00"
    assert rows["**value-ucb**"][8] == "out 0.82 ± 0.02 / 0.50 ± 0.00; left out 0.40 ± 0.00 / 0.86 ± 0.00"


def _estimate(text: str, seeds: int) -> tuple[float, float, int]:
    """(mean, half-width, seeds that have it) of a cell of the docs' tables."""
    if text == "–":
        return math.nan, math.nan, 0
    value, half, n = ESTIMATE.fullmatch(text).groups()
    return float(value), float(half) if half else math.nan, int(n) if n else seeds


def docs_tables() -> list[str]:
    """The docs' lines from the first policy table's caption to the end of the last policy table."""
    starts = [index for index, line in enumerate(DOC) if line == HEADER]
    end = starts[-1]
    while end < len(DOC) and DOC[end].startswith("|"):
        end += 1
    return DOC[starts[0] - 2:end]


def docs_summary() -> pd.DataFrame:
    """The summary a results file would hold for the docs' current tables: every figure they show read back from
    them, the measures they do not show absent (n = 0)."""
    rows = []
    for line in docs_tables():
        caption = CAPTION.fullmatch(line)
        if caption:
            model, federation, seeds = caption.group(1), caption.group(2), int(caption.group(3))
        if not line.startswith("| ") or line == HEADER:
            continue
        cells = line[2:-2].split(" | ")
        figures = {"final_accuracy": cells[1], "auc": cells[2], "rounds_to_90": cells[3], "rounds_to_95": cells[4],
                   "bad_trained_share": cells[7], "valuation_seconds": cells[9]}
        for target, cell in ((90, cells[5]), (95, cells[6])):
            steady, measured = cell.split(" / ") if cell != "–" else ("–", "–")
            figures |= {f"steady_seconds_to_{target}": steady, f"seconds_to_{target}": measured}
        for part in ([] if cells[8] == "–" else cells[8].split("; ")):
            kind, pair = ("rejected", part.removeprefix("left out ")) if part.startswith("left out ") else (
                "ruled_out", part.removeprefix("out "))
            figures[f"{kind}_precision"], figures[f"{kind}_recall"] = pair.split(" / ")
        row = {"model": model, "federation": federation, "policy": cells[0].strip("*"), "seeds": seeds}
        for measure in MEASURES:
            mean, half, n = _estimate(figures.get(measure, "–"), seeds)
            row |= {measure: mean, f"{measure}_ci": half, f"{measure}_n": n}
        rows.append(row)
    return pd.DataFrame(rows)


def test_the_docs_tables_are_the_rendering_of_a_results_file_holding_their_figures(tmp_path):
    """The HELD entry's rendering, given a results file of the docs' own figures, is the docs' three tables with
    their captions, line for line; the docs' test holds the three as one region, so one changed digit is caught."""
    summary = docs_summary()
    assert len(summary) == 1 + 11 + 11 and list(summary["federation"].unique()) == ["clean", "p1", "p0.5"]
    write_results(tmp_path / "noisy_federation", {NOISY_FEDERATION_RESULTS[0]: summary}, COMMAND)
    rendering = HELD[HEADER]
    assert rendering.files == (f"noisy_federation/{NOISY_FEDERATION_RESULTS[0]}",)
    assert rendering.lines(tmp_path) == docs_tables()
    assert not unheld(DOC, {HEADER: rendering}, tmp_path)

    start = DOC.index(docs_tables()[0])
    for row in (start + 4, start + len(docs_tables()) - 1):  # the first table's row and the last table's last row
        changed = list(DOC)
        changed[row] = re.sub(r"\d(?=[^\d]*$)", lambda m: str((int(m.group()) + 1) % 10), DOC[row])
        assert changed[row] != DOC[row]
        assert unheld(changed, {HEADER: rendering}, tmp_path) == [f"{HEADER}: {changed[row]}"]
