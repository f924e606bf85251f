"""One doc rebuilt from the results files: each held table's region (:mod:`bench.docs_tables.regions`) replaced by
its rendering, every other line kept byte for byte, and each printed block checked against the file it quotes.

:data:`DOCS` names the docs the command rebuilds and where each takes its renderings and kept blocks from.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from bench.docs_tables import benchmarks, faults_audit, reproductions
from bench.docs_tables.blocks import blocks, held_problems
from bench.docs_tables.regions import regions, rewritten
from bench.docs_tables.renderings import rendered

#: Errors a renderer raises on results files it cannot read (missing, another format).
UNREADABLE = (OSError, ValueError, KeyError)


def _reproductions(results: Path) -> tuple[dict[str, list[list[str]]], list[str]]:
    made, problems = {}, []
    for header, entry in reproductions.HELD.items():
        try:
            made[header] = rendered(entry, results)
        except UNREADABLE as error:
            problems.append(f"{header}: not rendered ({type(error).__name__}: {error})")
    return made, problems


def _faults_audit(results: Path) -> tuple[dict[str, list[list[str]]], list[str]]:
    made: dict[str, list[list[str]]] = {}
    try:
        for table in faults_audit.rendered(results):
            lines = table.split("\n")
            made.setdefault(lines[0], []).append(lines)
    except UNREADABLE as error:
        return {}, [f"its tables: not rendered ({type(error).__name__}: {error})"]
    return made, []


@dataclass(frozen=True)
class Doc:
    """A doc the command rebuilds: its file under the docs folder, its tables' renderings from a results folder
    (header -> the renderings under it in the doc's order, and what could not be rendered) and its printed blocks'
    kept files (block key -> file under the results folder)."""

    file: str
    made: Callable[[Path], tuple[dict[str, list[list[str]]], list[str]]]
    blocks_held: Mapping[str, str]


DOCS = {
    "reproductions": Doc("reproductions.md", _reproductions, reproductions.BLOCKS_HELD),
    "faults-and-audit": Doc("faults-and-audit.md", _faults_audit, benchmarks.BLOCKS_HELD),
    "benchmarks": Doc("benchmarks.md", lambda results: ({}, []), benchmarks.BLOCKS_HELD),
}


@dataclass(frozen=True)
class Rebuilt:
    """A doc's text as it is (``old``) and rebuilt (``new``), the headers of the tables that changed, in the doc's
    order, and what could not be rebuilt or checked (a table not rendered or not matched, a block that is no excerpt
    of its file)."""

    path: Path
    old: str
    new: str
    changed: list[str]
    problems: list[str]


def rebuild(doc: Doc, docs: Path, results: Path) -> Rebuilt:
    """``doc`` under the folder ``docs`` rebuilt from the results files under ``results`` (nothing written)."""
    path = docs / doc.file
    old = path.read_text()
    lines = old.split("\n")  # split, not splitlines: joined again, the text is the same bytes
    made, problems = doc.made(results)
    found, unmatched = regions(lines, made)
    changed = [region.header for region in found if region.difference(lines) is not None]
    for block in blocks(lines):
        problems += [f"the printed block {block[0][:60]!r}: {problem}"
                     for problem in held_problems([block], doc.blocks_held, results)]
    return Rebuilt(path, old, "\n".join(rewritten(lines, found)), changed, problems + unmatched)
