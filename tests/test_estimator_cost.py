"""``python -m bench.large_rounds --cost``: every estimator's cost a round, side by side. Its table in
docs/benchmarks.md is the rendering of docs/results/estimator_cost.csv, row for row; its estimators are the ones
the docs name, each at the budget the docs state; and on a small hand-built round (no training) every estimator
books a row, MC-ADS-100's seconds divide every row's, exact ranks at 1 against itself (the reference up to n = 10),
the expansions evaluate the round's two anchors only, and the rows survive the file and the table."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from bench.large_rounds import (
    BASELINE,
    COST_COLUMNS,
    COST_ESTIMATORS,
    COST_TABLE_HEADER,
    EXACT_UP_TO,
    cost_commands,
    cost_rows,
    cost_settings,
    cost_table,
    read_cost,
    write_cost,
)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results" / "estimator_cost.csv"


def test_the_docs_table_is_the_results_file():
    if not RESULTS.exists():
        pytest.skip("docs/results/estimator_cost.csv is not made yet (python -m bench.large_rounds --cost "
                    "--results docs/results/estimator_cost.csv)")
    rows = cost_table(read_cost(RESULTS))
    lines = (ROOT / "docs" / "benchmarks.md").read_text().splitlines()
    assert COST_TABLE_HEADER in lines, "the docs hold no estimator-cost table (python -m bench.large_rounds --table)"
    start = lines.index(COST_TABLE_HEADER)
    end = next((k for k in range(start, len(lines)) if not lines[k].startswith("|")), len(lines))
    assert lines[start:end] == rows, ("the docs' table is not the results file's (python -m bench.large_rounds "
                                      "--table docs/results/estimator_cost.csv)")


def test_every_estimator_runs_at_the_budget_the_docs_state():
    assert set(COST_ESTIMATORS) == {"exact", "mc-100", "mc-10n", "adaptive", "first-order", "second-order"}
    methods = {name: cost_settings(name, 10).method for name in COST_ESTIMATORS}
    assert methods == {"exact": "exact", "mc-100": "mc", "mc-10n": "mc", "adaptive": "adaptive",
                       "first-order": "first-order", "second-order": "second-order"}
    assert cost_settings("exact", EXACT_UP_TO + 1) is None
    assert [cost_settings("mc-100", n).budget for n in (10, 20, 49, 50, 100)] == [100, 100, 100, 101, 201]
    assert [cost_settings("mc-10n", n).budget for n in (10, 100)] == [100, 1000]
    adaptive = cost_settings("adaptive", 20)
    assert (adaptive.decision, adaptive.cut, adaptive.budget) == ("threshold", 0.0, None)
    from fedvalue.valuation.plan import minimum_budget

    assert cost_settings("adaptive", 20, adaptive_budget=1).budget == minimum_budget("adaptive", 20)
    with pytest.raises(ValueError, match="name: expected one of"):
        cost_settings("kernelshap", 10)


def a_round(n: int, seed: int = 0) -> tuple:
    """(model, x, y, start, replies, weights) as :func:`bench.large_rounds.real_round` returns them, made by hand."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 3))
    rng = np.random.default_rng(seed)
    x, y = rng.normal(size=(40, 4)).astype(np.float32), rng.integers(0, 3, size=40)
    start = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    replies = [{k: v + rng.normal(scale=0.2, size=v.shape).astype(v.dtype) for k, v in start.items()}
               for _ in range(n)]
    return model, x, y, start, replies, [float(w) for w in rng.integers(5, 20, size=n)]


@pytest.mark.parametrize("rule", ["fixed-weight", "renormalized"])
def test_a_small_round_books_every_estimator_against_exact(rule, tmp_path):
    rows = cost_rows(a_round(5), "mlp", rule, repeats=2)
    by_name = {row["estimator"]: row for row in rows}
    assert list(by_name) == list(COST_ESTIMATORS)  # n = 5: exact is the reference, no reference row
    assert by_name[BASELINE]["over_mc100"] == 1.0
    assert by_name["exact"]["spearman"] == pytest.approx(1.0) and by_name["exact"]["reference"] == "exact"
    assert by_name["first-order"]["evaluations"] == by_name["second-order"]["evaluations"] == 2
    assert by_name["exact"]["evaluations"] == 2 ** 5
    assert all(row["repeats"] == 2 and row["seconds_min"] <= row["seconds"] <= row["seconds_max"] for row in rows)
    assert all(row["over_mc100"] == pytest.approx(row["seconds"] / by_name[BASELINE]["seconds"]) for row in rows)
    path = tmp_path / "cost.csv"
    write_cost(path, rows, "python -m bench.large_rounds --cost --quick")
    assert path.read_text().startswith("# python -m bench.large_rounds --cost --quick (commit ")
    kept = read_cost(path)
    assert list(kept[0]) == COST_COLUMNS and len(kept) == len(rows)
    table = cost_table(kept)
    assert table[0] == COST_TABLE_HEADER and len(table) == 2 + len(rows)
    assert all(line.count("|") == COST_TABLE_HEADER.count("|") for line in table)
    # Resumed: the earlier run's rows and command stay first, the new run's follow under its own command.
    more = cost_rows(a_round(4, seed=2), "mlp", rule, repeats=1)
    write_cost(path, kept + more, "python -m bench.large_rounds --cost --resume", cost_commands(path))
    commands = cost_commands(path)
    assert commands[0].startswith("# python -m bench.large_rounds --cost --quick (commit ")
    assert commands[1].startswith("# python -m bench.large_rounds --cost --resume (commit ") and len(commands) == 2
    again = read_cost(path)
    assert again[:len(kept)] == kept and [row["n"] for row in again[len(kept):]] == ["4"] * len(more)


def test_past_exact_the_reference_is_sampled_with_its_own_seed_and_has_its_row():
    rows = cost_rows(a_round(EXACT_UP_TO + 1, seed=1), "mlp", "fixed-weight", repeats=1, reference_budget=30)
    names = [row["estimator"] for row in rows]
    assert "exact" not in names and names[-1] == "reference"
    reference = rows[-1]
    assert reference["spearman"] is None and reference["reference"].endswith("evaluations asked, seed 10000")
    assert reference["budget"] == 30 * (EXACT_UP_TO + 1)
    assert "reference (" in cost_table([{k: ("" if v is None else str(v)) for k, v in reference.items()}])[-1]
