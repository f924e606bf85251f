"""Where a doc's rendered tables stand: each table is found by its header, and the lines it spans (with the
caption its rendering makes, if any) are a :class:`Region` that the rendering's lines replace.

A table is a line starting with ``|`` followed by a ``|---`` line, and the rows after them up to the first line that
is no row; it is known by its first line, its header. The renderings made under one header (:func:`regions`) take
the docs' tables under it in order: a rendering that makes k tables under the header takes the next k, and its
region runs from as far before the first as its header stands in its lines (its caption) to the end of the last,
every line between included.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.docs_tables.renderings import RESULTS, rendered


@dataclass(frozen=True)
class Region:
    """The lines ``start`` to ``end`` (excluded) of a doc, which the rendering under ``header`` makes as ``made``."""

    header: str
    start: int
    end: int
    made: tuple[str, ...]

    def difference(self, lines: Sequence[str]) -> str | None:
        """The first line of ``lines``' region that is not the rendering's (or their counts when one ends first);
        None when the region is the rendering."""
        region = list(lines[self.start:self.end])
        if region == list(self.made):
            return None
        return next((mine for mine, theirs in zip(region, self.made) if mine != theirs),
                    f"{len(region)} lines against {len(self.made)}")


def located(lines: Sequence[str]) -> list[tuple[int, list[str]]]:
    """Every markdown table of ``lines``, each as (the index of its header, its lines, header first)."""
    found = []
    for index, line in enumerate(lines[:-1]):
        if line.startswith("|") and lines[index + 1].startswith("|---") and not (
                index and lines[index - 1].startswith("|")):
            end = index + 2
            while end < len(lines) and lines[end].startswith("|"):
                end += 1
            found.append((index, list(lines[index:end])))
    return found


def tables(lines: Sequence[str]) -> list[list[str]]:
    """Every markdown table of ``lines`` (:func:`located`), as its lines."""
    return [table for _, table in located(lines)]


def _count(piece: Sequence[str], header: str) -> int:
    return sum(table[0] == header for table in tables(piece))


def regions(lines: Sequence[str], made: Mapping[str, Sequence[Sequence[str]]]) -> tuple[list[Region], list[str]]:
    """The regions of ``lines`` that the renderings ``made`` (header -> the renderings under it, each as its lines,
    in the docs' order) replace, in the docs' order; and, for each header whose tables cannot be matched to its
    renderings (none in the docs, other counts, regions overlapping), what is wrong, the header first."""
    found = located(lines)
    matched, problems = [], []
    for header, pieces in made.items():
        under = [(index, table) for index, table in found if table[0] == header]
        counts = [_count(piece, header) for piece in pieces]
        caption = [list(piece).index(header) if header in piece else 0 for piece in pieces]
        if not under:
            problems.append(f"{header}: no such table in the docs")
        elif sum(counts) != len(under) or 0 in counts:
            if len(pieces) == 1:  # the lines from its caption to the end of the last table under the header
                start, end = max(0, under[0][0] - caption[0]), under[-1][0] + len(under[-1][1])
                problems.append(f"{header}: {end - start} lines against {len(pieces[0])}")
            else:
                problems.append(f"{header}: {len(under)} tables in the docs against {sum(counts)} rendered")
        else:
            first = 0
            for piece, count, before in zip(pieces, counts, caption):
                start, (index, table) = under[first][0], under[first + count - 1]
                matched.append(Region(header, max(0, start - before), index + len(table), tuple(piece)))
                first += count
    matched.sort(key=lambda region: region.start)
    overlapping = {r.header for a, b in zip(matched, matched[1:]) if b.start < a.end for r in (a, b)}
    problems += [f"{header}: its region overlaps another rendered table's" for header in sorted(overlapping)]
    return [region for region in matched if region.header not in overlapping], problems


def rewritten(lines: Sequence[str], found: Sequence[Region]) -> list[str]:
    """``lines`` with each region of ``found`` (apart, in order) replaced by its rendering."""
    out, at = [], 0
    for region in found:
        out += [*lines[at:region.start], *region.made]
        at = region.end
    return out + list(lines[at:])


def made_of(held: Mapping[str, object], results: Path = RESULTS) -> dict[str, list[list[str]]]:
    """A registry's renderings (header -> :class:`~bench.docs_tables.renderings.Rendering` or
    :class:`~bench.docs_tables.renderings.InOrder`), rendered from the files under ``results``."""
    return {header: rendered(entry, results) for header, entry in held.items()}


def unheld(lines: Sequence[str], held: Mapping[str, object], results: Path = RESULTS) -> list[str]:
    """The headers of ``held`` whose tables in ``lines`` are not their rendering, each with the first line that
    differs (or why its tables and renderings do not match)."""
    found, problems = regions(lines, made_of(held, results))
    wrong = [f"{region.header}: {said}" for region in found if (said := region.difference(lines)) is not None]
    return wrong + problems
