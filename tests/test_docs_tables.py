"""``python -m bench.docs_tables`` rebuilds the docs' results tables from docs/results/: on the repository's docs
``--check`` finds nothing to change; on a copy with a number changed in a held table it names the table, prints the
diff and exits 1, and the rewrite restores the table; every line that no rendering makes (a table not held, a
printed block) is left byte for byte, and a printed block that is no excerpt of its kept file is reported."""

from __future__ import annotations

import re
from pathlib import Path

from bench.docs_tables.__main__ import main
from bench.docs_tables.benchmarks import BLOCKS_HELD
from bench.docs_tables.blocks import blocks, entry_of
from bench.docs_tables.faults_audit import REWRITE_HEADER
from bench.docs_tables.regions import Region, located, regions, rewritten
from bench.docs_tables.reproductions import NOT_MEASURED, PENDING, REGIMES_HEADER

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SCORING = "| data set | score | correlation | top = best exact drop | top drop raises the gap |"
ATTACK = "| shells | method | gain (mean over seeds) | min | max |"
ESTIMATORS = "  n  estimator                 max |φ − exact|  evaluations  permutations     |gap|  seconds"


def _bumped(line: str) -> str:
    """``line`` with its last digit one more (9 -> 0)."""
    return re.sub(r"\d(?=[^\d]*$)", lambda m: str((int(m.group()) + 1) % 10), line)


def _change(lines: list[str], header: str, which: int = 0, row: int = 2) -> str:
    """Bump a number in the ``row``-th line of the ``which``-th table under ``header`` of ``lines`` (in place);
    the line as it was."""
    index = [start for start, table in located(lines) if table[0] == header][which] + row
    was, lines[index] = lines[index], _bumped(lines[index])
    assert lines[index] != was
    return was


def test_the_docs_are_their_results_files(capsys):
    assert main(["--check"]) == 0, capsys.readouterr()
    assert capsys.readouterr() == ("", "")


def test_a_changed_number_in_a_held_table_is_named_by_check_and_restored(tmp_path, capsys):
    """A number changed in the scoring table, the second regimes table and an attack table: --check names each,
    shows the lines in its diff and writes nothing; the rewrite restores them; the tables not held keep theirs."""
    texts = {name: (DOCS / name).read_text() for name in ("reproductions.md", "faults-and-audit.md")}
    lines = {name: text.split("\n") for name, text in texts.items()}
    changed = [_change(lines["reproductions.md"], SCORING), _change(lines["reproductions.md"], REGIMES_HEADER, 1, 3),
               _change(lines["faults-and-audit.md"], ATTACK)]
    not_held = [*list(NOT_MEASURED)[:2], *list(PENDING)[:1]]  # a settings table, and a pending one while any is
    for header in not_held:
        _change(lines["reproductions.md"], header)
    for name, doc in lines.items():
        (tmp_path / name).write_text("\n".join(doc))
    copies = {name: (tmp_path / name).read_text() for name in texts}
    argv = ["--docs", str(tmp_path), "--doc", "reproductions", "--doc", "faults-and-audit"]
    assert main(["--check", *argv]) == 1
    out, err = capsys.readouterr()
    assert not err
    for header in (SCORING, REGIMES_HEADER, ATTACK):
        assert f": differs from its rendering: {header}\n" in out
    assert not any(header in out for header in not_held)
    for line in changed:
        assert f"\n+{line}\n" in out and f"\n-{_bumped(line)}\n" in out
    assert {name: (tmp_path / name).read_text() for name in texts} == copies
    assert main(argv) == 0
    restored = (tmp_path / "reproductions.md").read_text()
    assert (tmp_path / "faults-and-audit.md").read_text() == texts["faults-and-audit.md"]
    assert restored != texts["reproductions.md"]  # the tables not held keep their change
    for header in not_held:
        row = _row(texts["reproductions.md"], header)
        restored = restored.replace(_bumped(row), row)
    assert restored == texts["reproductions.md"]


def _row(text: str, header: str) -> str:
    """The row :func:`_change` changes in the first table under ``header`` of ``text``."""
    lines = text.split("\n")
    return lines[[start for start, table in located(lines) if table[0] == header][0] + 2]


def test_a_table_not_held_and_the_rest_of_the_file_are_left_byte_for_byte(tmp_path, capsys):
    """The audit-attacks table (held by the audit tests, not rendered) with a verdict changed, a held table changed and
    no newline at the end: the rewrite restores the held table and nothing else."""
    lines = (DOCS / "faults-and-audit.md").read_text().rstrip("\n").split("\n")
    _change(lines, ATTACK)
    row = [start for start, table in located(lines) if table[0] == REWRITE_HEADER][0] + 2
    lines[row] = lines[row].replace("intact", "NOT intact", 1)
    (tmp_path / "faults-and-audit.md").write_text("\n".join(lines))
    assert main(["--docs", str(tmp_path), "--doc", "faults-and-audit"]) == 0
    assert f"rewritten: {ATTACK}\n" in capsys.readouterr().out
    expected = (DOCS / "faults-and-audit.md").read_text().rstrip("\n").split("\n")
    expected[row] = lines[row]
    assert (tmp_path / "faults-and-audit.md").read_bytes() == "\n".join(expected).encode()


def test_a_printed_block_that_is_no_excerpt_is_reported_and_left(tmp_path, capsys):
    """A number changed in a held block of docs/benchmarks.md: both --check and the rewrite name the block and its file,
    exit 1 and leave the doc as it is."""
    text = (DOCS / "benchmarks.md").read_text()
    block = next(block for block in blocks(text.split("\n")) if entry_of(block, BLOCKS_HELD) == ESTIMATORS)
    changed = text.replace(block[1], _bumped(block[1]), 1)
    (tmp_path / "benchmarks.md").write_text(changed)
    for check in (["--check"], []):
        assert main([*check, "--docs", str(tmp_path), "--doc", "benchmarks"]) == 1
        out, err = capsys.readouterr()
        assert not out and f"the printed block {ESTIMATORS[:60]!r}: {BLOCKS_HELD[ESTIMATORS]}: lines not as the run " \
                               "printed them" in err
        assert (tmp_path / "benchmarks.md").read_text() == changed


def test_renderings_under_one_header_take_its_tables_in_order_and_a_mismatch_rewrites_nothing():
    """Two renderings under one header take its two tables, each with its caption; one table too few or too many, or
    a header the lines lack, is a problem and no region."""
    lines = ["text", "*a*", "| p | v |", "|---|---|", "| r | 1 |", "", "prose", "*b*", "| p | v |", "|---|---|",
             "| r | 2 |", "| s | 3 |", "end"]
    made = [["*a*", "| p | v |", "|---|---|", "| r | 1 |"], ["*b*", "| p | v |", "|---|---|", "| r | 2 |", "| s | 4 |"]]
    found, problems = regions(lines, {"| p | v |": made})
    assert not problems
    assert found == [Region("| p | v |", 1, 5, tuple(made[0])), Region("| p | v |", 7, 12, tuple(made[1]))]
    assert [region.difference(lines) for region in found] == [None, "| s | 3 |"]
    assert rewritten(lines, found) == [*lines[:11], "| s | 4 |", "end"]
    assert regions(lines, {"| p | v |": made[:1]}) == ([], ["| p | v |: 11 lines against 4"])
    assert regions(lines, {"| p | v |": made * 2}) == ([], ["| p | v |: 2 tables in the docs against 4 rendered"])
    assert regions(lines, {"| q |": [["| q |", "|---|"]]}) == ([], ["| q |: no such table in the docs"])
