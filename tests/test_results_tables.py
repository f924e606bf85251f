"""The regimes' tables in docs/reproductions.md are the results files' own: every row
``python -m bench.regimes.table`` renders from docs/results/regimes_paired*.csv and
regimes_summary*.csv stands in the docs verbatim, and the docs hold no regimes row the files do not."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench.regimes.table import HEADER, read_results, table_rows

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
DOC = (ROOT / "docs" / "reproductions.md").read_text()
PAIRS = sorted(RESULTS.glob("regimes_paired*.csv"))


def rendered(paired: Path) -> list[str]:
    summary = paired.with_name(paired.name.replace("regimes_paired", "regimes_summary"))
    return table_rows(read_results(paired), read_results(summary))


@pytest.mark.parametrize("paired", PAIRS, ids=[p.stem for p in PAIRS])
def test_every_row_the_results_make_stands_in_the_docs(paired):
    rows = rendered(paired)
    assert rows and HEADER in DOC
    missing = [row for row in rows if row not in DOC.splitlines()]
    assert not missing, f"rows of {paired.name} the docs do not hold (rerun python -m bench.regimes.table):\n" + \
        "\n".join(missing)


def test_the_docs_hold_no_regimes_row_the_results_do_not_make():
    made = {row for paired in PAIRS for row in rendered(paired)}
    header_at = [i for i, line in enumerate(DOC.splitlines()) if line == HEADER.splitlines()[0]]
    lines = DOC.splitlines()
    quoted = []
    for start in header_at:
        for line in lines[start + 2:]:
            if not line.startswith("|"):
                break
            quoted.append(line)
    assert quoted and not [row for row in quoted if row not in made]


def test_a_changed_number_is_caught():
    """The check compares whole rows: one digit changed in a rendered row is not in the docs."""
    row = rendered(PAIRS[0])[0]
    changed = re.sub(r"\d(?=[^\d]*$)", lambda m: str((int(m.group()) + 1) % 10), row)
    assert changed != row and changed not in DOC.splitlines()


def test_the_value_guard_tuning_table_is_its_results_file():
    from bench.regimes.tuning import markdown_rows

    rows = markdown_rows(read_results(RESULTS / "guard_tuning.csv"))
    lines = DOC.splitlines()
    start = lines.index(rows[0])
    assert lines[start:start + len(rows)] == rows and lines[start + len(rows)] == ""


def test_the_regimes_curves_end_where_the_summary_says_and_draw_one_panel_a_regime(tmp_path):
    """regimes_curves.csv's means over the final window are the summary's final accuracy (both are means over
    seeds and rounds, so the order does not matter), and the figure has a panel for each of its regimes."""
    from bench.regimes.figure import read_curves, regimes_figure

    curves = read_curves(RESULTS / "regimes_curves.csv")
    summary = read_results(RESULTS / "regimes_summary.csv")
    window = 5  # the quick configuration's final window
    last = curves["round"].max()
    ends = curves[curves["round"] > last - window].groupby(["regime", "policy"])["mean"].mean()
    finals = summary.set_index(["regime", "policy"])["final_accuracy"]
    assert set(ends.index) == set(finals.index)
    assert max(abs(ends[k] - finals[k]) for k in ends.index) < 1e-9

    import matplotlib.image

    png = regimes_figure(curves, tmp_path / "regimes.png")
    height, width = matplotlib.image.imread(png).shape[:2]
    rows = -(-curves["regime"].nunique() // 4)
    assert width > height and rows == 4
