"""How a docs table is made from results files: a :class:`Rendering` (a renderer and the files it reads), an
:class:`InOrder` (the tables under one header, each its own rendering) and a :class:`Pending` table (the runs that
would make its files). The registries of each doc (:mod:`bench.docs_tables.reproductions`) are made of these."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

#: The repository's root and the folder of its kept results files.
ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"


@dataclass(frozen=True)
class Rendering:
    """A table made from results files: ``function`` (``module:name``) called with the frames of ``files`` (under
    the results folder, in order) and ``options``, returning the table's lines, header first (or after the caption
    it makes)."""

    function: str
    files: tuple[str, ...]
    options: Mapping = field(default_factory=dict)

    def renderer(self):
        """The function ``function`` names."""
        module, name = self.function.split(":")
        return getattr(importlib.import_module(module), name)

    def lines(self, results: Path = RESULTS) -> list[str]:
        """The table's lines, rendered from the files under ``results``."""
        from simulations.runner.results_files import read_results

        return list(self.renderer()(*(read_results(results / file) for file in self.files), **self.options))


@dataclass(frozen=True)
class InOrder:
    """The tables under one header, each made by its own rendering: the docs' first table under the header is the
    first rendering's, and so on (the captions between them are the docs' own)."""

    renderings: tuple[Rendering, ...]

    @property
    def files(self) -> tuple[str, ...]:
        """Every file the renderings read, once each, in order."""
        return tuple(dict.fromkeys(file for rendering in self.renderings for file in rendering.files))


def renderings_of(entry: Rendering | InOrder) -> tuple[Rendering, ...]:
    """The renderings of a registry's entry: its own, or each of an :class:`InOrder`'s."""
    return entry.renderings if isinstance(entry, InOrder) else (entry,)


def rendered(entry: Rendering | InOrder, results: Path = RESULTS) -> list[list[str]]:
    """The lines of each table a registry's entry makes, rendered from the files under ``results``."""
    return [rendering.lines(results) for rendering in renderings_of(entry)]


@dataclass(frozen=True)
class Pending:
    """A table no results file holds yet: the command(s) that would make its files, in order, why it is not kept,
    and its renderer when one is written."""

    commands: tuple[str, ...]
    reason: str
    rendering: Rendering | None = None
