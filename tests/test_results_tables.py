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
