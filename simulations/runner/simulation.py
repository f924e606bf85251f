"""The record by which an experiment registers itself with ``fedvalue run`` and ``fedvalue audit``.

An experiment module defines its config dataclass (each field an option), a ``cli_main(config,
options) -> exit code`` and one :class:`Simulation`; :mod:`simulations.cli.registry` lists the
records, one line each.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from simulations.runner.console import RunOptions


@dataclass(frozen=True)
class Simulation:
    """One simulation of the command line.

    Attributes
    ----------
    name
        Its name on the command line (``fedvalue run NAME``).
    config
        Its configuration dataclass: each field is a ``--option`` (tuples comma-separated).
    main
        Runs it with a config and the :class:`~simulations.runner.console.RunOptions`; prints; returns
        the exit code.
    out_optional
        ``--out`` may be left out (the tables are then only printed).
    resumable
        ``--resume DIR`` continues a run from its last committed round.
    utility_from_run
        Rebuilds the utility a run was valued with from its run.json, for the audit's
        recomputation (None: the audit cannot rebuild it).
    audit_from_run
        Rebuilds from a run.json what the audit checks a run against (the keywords
        ``utility``, ``noisy_clients``, ``sampled``, ``fairness`` of :func:`fedvalue.audit.checks.audit_run`);
        takes precedence over ``utility_from_run``.
    replay_check
        For runs that save no states to recompute from: replays the run from its run.json and
        returns the audit's (checks, problems).
    help
        Help text of options this simulation alone has.
    results
        The results files ``--results FOLDER`` writes (the CSVs the docs' tables are rendered from, each headed by
        the command and the commit: :mod:`simulations.runner.results_files`); none: no ``--results`` option.
    """

    name: str
    config: type
    main: Callable[[Any, RunOptions], int]
    out_optional: bool = False
    resumable: bool = False
    utility_from_run: Callable[[dict], Any] | None = None
    audit_from_run: Callable[[dict], dict] | None = None
    replay_check: Callable[[str], tuple[list[str], list[str]]] | None = None
    help: Mapping[str, str] = field(default_factory=dict)
    results: tuple[str, ...] = ()
