"""The docs' blocks of printed results, held to the files their runs kept: a block is an excerpt of its file when
every line of it is a line of the file, in the file's order (a block may quote part of what was printed, never a
changed line). The blocks are not rendered: ``python -m bench.docs_tables --check`` reports a block that is no
excerpt, and the registries (:data:`bench.docs_tables.benchmarks.BLOCKS_HELD`,
:data:`bench.docs_tables.reproductions.BLOCKS_HELD`) say which file holds which block, by its key: its first line, or
first lines where blocks open alike (:func:`entry_of`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from bench.docs_tables.renderings import RESULTS

#: First words of a block that is a command to type, or the one line the CLI prints for bad input: not results.
COMMANDS = ("fedvalue ", "python ", "pip ", "fedvalue: error: ")


def blocks(lines: list[str]) -> list[list[str]]:
    """Every fenced block of ``lines`` that is not code (its fence names a language) or a command, as its lines."""
    opens = [i for i, line in enumerate(lines) if line.startswith("```")]
    found = [lines[start:end] for start, end in zip(opens[::2], opens[1::2])]
    return [block[1:] for block in found
            if block[0].rstrip() == "```" and block[1:] and not block[1].startswith(COMMANDS)]


def entry_of(block: list[str], keys: Iterable[str]) -> str | None:
    """The key ``block`` is listed under: the longest of ``keys`` whose lines (joined by newlines) it opens with."""
    return max((key for key in keys if block[:key.count("\n") + 1] == key.split("\n")), key=len, default=None)


def unkept_lines(block: list[str], kept: list[str]) -> list[str]:
    """The lines of ``block`` that are not lines of ``kept`` in ``kept``'s order (none: the block is an excerpt)."""
    rest = iter(kept)  # trailing blanks are not part of a line
    return [line for line in block if not any(line.rstrip() == other.rstrip() for other in rest)]


def held_problems(found: list[list[str]], held: Mapping[str, str], results: Path = RESULTS) -> list[str]:
    """The held blocks of ``found`` that are not excerpts of their results files under ``results`` (a file may hold
    several blocks)."""
    problems = []
    for block in found:
        key = entry_of(block, held)
        if key is not None:
            kept = (results / held[key]).read_text().splitlines()
            if not kept[0].startswith(("# python -m bench.", "# fedvalue run ")):
                problems.append(f"{held[key]}: not headed by the command that made it")
            elif unkept_lines(block, kept[1:]):
                problems.append(f"{held[key]}: lines not as the run printed them")
    return problems
