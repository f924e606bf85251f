"""Every table of docs/reproductions.md is held to the results file(s) it is rendered from, or names the run that
would make them.

The lists are :mod:`bench.docs_tables.reproductions`'s (``python -m bench.docs_tables`` renders the held tables into
the doc): each header is in exactly one of

- :data:`HELD`: rendered from results files under docs/results/ (CSVs headed by the command that made them and the
  commit: :mod:`simulations.runner.results_files`); the docs' table must be the rendering, row for row;
- :data:`HELD_BY_TEST`: held by another test, named;
- :data:`PENDING`: no results file yet: the exact command(s) that would make it and why it is not kept; where the
  renderer is written already, its :class:`Rendering` too, and once every file it reads is made the entry must move
  to :data:`HELD`;
- :data:`NOT_MEASURED`: settings or definitions, not a measurement.

A table under no header of these fails, and so does an entry whose table is gone or a header in two of them. Tables
may share a header: one rendering may make them all under their captions (:func:`unheld` holds the lines between
too), or an :class:`InOrder` give each its own.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Mapping
from pathlib import Path

from bench.docs_tables.regions import tables, unheld
from bench.docs_tables.renderings import InOrder, Rendering, renderings_of
from bench.docs_tables.reproductions import (FAIRNESS_MARKDOWN, HELD, HELD_BY_TEST, LISTS, PENDING, PROCUREMENT,
                                             REGIMES_HEADER)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
DOC = (ROOT / "docs" / "reproductions.md").read_text().splitlines()


def listing_problems(lines: list[str], lists: Mapping[str, Mapping[str, object]]) -> list[str]:
    """The tables of ``lines`` in none of ``lists``, the entries whose table ``lines`` does not hold, and the headers
    in two lists."""
    headers = {table[0] for table in tables(lines)}
    listed = {header for entries in lists.values() for header in entries}
    names = list(lists)
    return ([f"in no list: {header}" for header in sorted(headers - listed)]
            + [f"{name} names a table the docs do not hold: {header}" for name, entries in lists.items()
               for header in entries if header not in headers]
            + [f"in {a} and {b}: {header}" for i, a in enumerate(names) for b in names[i + 1:]
               for header in sorted(set(lists[a]) & set(lists[b]))])


def test_every_table_is_in_one_list_and_every_entry_has_its_table():
    problems = listing_problems(DOC, LISTS)
    assert not problems, "docs/reproductions.md against HELD, HELD_BY_TEST, PENDING, NOT_MEASURED:\n" + \
        "\n".join(problems)


def test_an_unlisted_table_a_gone_table_and_a_table_listed_twice_are_found():
    lines = ["text", "| a | b |", "|---|---|", "| 1 | 2 |", "", "| c |", "|---|", "| 3 |", "| 4 |", "more text"]
    assert tables(lines) == [["| a | b |", "|---|---|", "| 1 | 2 |"], ["| c |", "|---|", "| 3 |", "| 4 |"]]
    assert not listing_problems(lines, {"HELD": {"| a | b |": None}, "PENDING": {"| c |": None}})
    assert listing_problems(lines, {"HELD": {"| a | b |": None}, "PENDING": {}}) == ["in no list: | c |"]
    assert listing_problems(lines, {"HELD": {"| a | b |": None, "| d |": None}, "PENDING": {"| c |": None}}) == [
        "HELD names a table the docs do not hold: | d |"]
    assert listing_problems(lines, {"HELD": {"| a | b |": None, "| c |": None}, "PENDING": {"| c |": None}}) == [
        "in HELD and PENDING: | c |"]


def test_the_held_tables_are_their_results_files():
    for entry in HELD.values():
        for file in entry.files:
            assert (RESULTS / file).read_text().startswith("# "), f"{file}: no header naming its command"
    wrong = unheld(DOC, HELD)
    assert not wrong, "tables that are not their results files' rendering (render them again):\n" + "\n".join(wrong)


def test_a_pending_table_whose_results_are_made_moves_to_held():
    made = [header for header, pending in PENDING.items()
            if pending.rendering is not None and all((RESULTS / f).is_file() for f in pending.rendering.files)]
    assert not made, "results files made: move these from PENDING to HELD:\n" + "\n".join(made)


def test_pending_entries_name_their_runs_and_a_reason():
    for header, pending in PENDING.items():
        assert pending.commands and pending.reason, header
        assert all(c.startswith(("fedvalue run ", "python -m ")) for c in pending.commands), header
        if pending.rendering is not None:
            assert all("--results docs/results" in c for c in pending.commands), header


def test_every_renderer_named_exists():
    """A renderer's name is checked before its files exist, so a pending table is ready to move once they do."""
    from simulations.experiments.procurement.markdown import PROCUREMENT_RESULTS

    named = [*((header, rendering) for header, entry in HELD.items() for rendering in renderings_of(entry)),
             *((header, pending.rendering) for header, pending in PENDING.items() if pending.rendering)]
    for header, rendering in named:
        module, name = rendering.function.split(":")
        assert callable(getattr(importlib.import_module(module), name, None)), f"{rendering.function} ({header})"
    assert PROCUREMENT == PROCUREMENT_RESULTS


def test_the_tests_named_as_holding_tables_exist():
    for header, test in HELD_BY_TEST.items():
        assert (ROOT / test).is_file(), f"{test} (holding {header})"


def _synthetic_scoring(tmp_path: Path, command: str) -> Rendering:
    """The docs' scoring table as a results file of made-up figures in ``tmp_path``, and its rendering."""
    import pandas as pd

    from simulations.runner.results_files import write_results

    rows = []
    for dataset in ("gaussian", "slid"):
        for i, score in enumerate(("first-order", "renormalized", "curvature-unrenormalized", "curvature")):
            row = {"dataset": dataset, "score": score, "seeds": 10}
            for column in ("correlation", "top_is_best", "top_raises_gap"):
                row |= {column: 0.5 + i / 10, f"{column}_low": 0.4 + i / 10, f"{column}_high": 0.6 + i / 10}
            rows.append(row)
    write_results(tmp_path, {"fairness_scoring.csv": pd.DataFrame(rows)}, command)
    return Rendering(f"{FAIRNESS_MARKDOWN}:scoring_table", ("fairness_scoring.csv",))


def test_a_changed_number_in_a_held_table_is_caught(tmp_path):
    """On a copy of the docs whose scoring table is replaced by a results file's rendering: the copy is held, and
    one digit changed in one row, or the docs' own table against that file, is caught."""
    header = "| data set | score | correlation | top = best exact drop | top drop raises the gap |"
    rendering = _synthetic_scoring(tmp_path, "fedvalue run fairness --out DIR --results FOLDER")
    held = {header: rendering}
    assert unheld(DOC, held, tmp_path), "the docs' own figures are not the made-up file's"
    table = next(t for t in tables(DOC) if t[0] == header)
    start = DOC.index(header)
    copy = DOC[:start] + rendering.lines(tmp_path) + DOC[start + len(table):]
    assert not unheld(copy, held, tmp_path)
    row = start + 4
    changed = list(copy)
    changed[row] = re.sub(r"\d(?=[^\d]*$)", lambda m: str((int(m.group()) + 1) % 10), copy[row])
    assert changed[row] != copy[row]
    assert unheld(changed, held, tmp_path) == [f"{header}: {changed[row]}"]


class _Given:
    """A rendering of given lines (no results file)."""

    def __init__(self, lines: list[str]) -> None:
        self.made = lines

    def lines(self, results: Path = RESULTS) -> list[str]:
        return list(self.made)


def test_tables_under_one_header_are_held_as_one_region_with_their_captions():
    """Two tables under one header, each after its caption: held together with the lines between; a changed
    number in the second, a changed caption, a row too many and a third table under the header elsewhere are
    caught."""
    blocks = ["**a, federation x** (2 seeds)", "", "| p | v |", "|---|---|", "| r | 1 |", "",
              "**a, federation y** (2 seeds)", "", "| p | v |", "|---|---|", "| r | 2 |", "| s | 3 |"]
    held = {"| p | v |": _Given(blocks)}
    lines = ["text", "", *blocks, "", "more text"]
    assert not unheld(lines, held)
    for old, new in (("| s | 3 |", "| s | 4 |"), ("federation y", "federation z")):
        changed = [line.replace(old, new) for line in lines]
        assert unheld(changed, held) == [f"| p | v |: {next(c for c, o in zip(changed, lines) if c != o)}"]
    assert unheld(lines[:-2] + ["| t | 5 |", "", "more text"], held) == ["| p | v |: 13 lines against 12"]
    elsewhere = lines + ["", "| p | v |", "|---|---|", "| r | 1 |"]
    assert unheld(elsewhere, held) == ["| p | v |: 18 lines against 12"]



def test_the_regimes_tables_are_each_their_rendering_in_order():
    """The regimes tables share a header: each is its own rendering, in the docs' order, so two swapped are caught
    (the first table of one run's rows is not the second's), and so is a rendering too few."""
    regimes = HELD[REGIMES_HEADER]
    assert isinstance(regimes, InOrder) and not unheld(DOC, {REGIMES_HEADER: regimes})
    first, second, *rest = regimes.renderings
    swapped = InOrder((second, first, *rest))
    assert unheld(DOC, {REGIMES_HEADER: swapped})[0].startswith(f"{REGIMES_HEADER}: | ")
    assert unheld(DOC, {REGIMES_HEADER: InOrder((first, second, *rest[:-1]))}) == [
        f"{REGIMES_HEADER}: 4 tables in the docs against 3 rendered"]
