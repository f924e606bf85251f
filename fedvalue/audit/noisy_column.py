"""The audit's check of the ledger's ``noisy`` column against the run's ground truth.

A round's books never know which clients a simulation made noisy: the writer joins that
ground truth into the ``noisy`` column as rows are written
(:func:`fedvalue.schema.with_ground_truth`). So the column is checked here, in one pass over
the whole ledger, against the run's noisy clients where they are known: those the caller
gives (a built-in simulation's config and seed), which run.json's ``noisy_clients`` must then
name too, else run.json's. Client ids are compared as text, as ledger.csv holds them.
"""

from __future__ import annotations

from collections.abc import Collection

import pandas as pd

from fedvalue.audit.report import AuditReport
from fedvalue.run.rundir import printable

#: Most mismatching (round, client) pairs named one by one; the rest are counted.
MAX_NAMED = 10


def known_noisy_clients(config: dict, given: Collection | None, report: AuditReport) -> set[str] | None:
    """The noisy clients as strings: those given (run.json's list must agree with them), else
    run.json's; None when neither says."""
    saved = config.get("noisy_clients")
    if given is not None and isinstance(saved, list) and sorted(map(str, saved)) != sorted(map(str, given)):
        report.problems.append(f"run.json: noisy_clients {saved[:10]} are not the ones the run's settings and "
                               f"seed draw, {sorted(given)[:10]}")
    if given is None and isinstance(saved, list):
        given = {c for c in saved if isinstance(c, (int, str)) and not isinstance(c, bool)}
    return None if given is None else {str(c) for c in given}


def _flag_text(value) -> str:
    """A ``noisy`` cell as the ledger spells it: ``true``, ``false`` or empty."""
    return "" if value is None or pd.isna(value) else str(value).lower()


def noisy_column_problems(ledger: pd.DataFrame, noisy_clients: set[str]) -> list[str]:
    """Where the ledger's ``noisy`` column differs from ``noisy_clients`` (ids as text): one
    finding per round and client, naming what is booked and what the run's noisy clients give."""
    if not len(ledger):
        return []
    booked = ledger["noisy"].astype(object).map(_flag_text)
    wanted = ledger["client_id"].astype(str).isin(noisy_clients).map({True: "true", False: "false"})
    wrong = pd.DataFrame({"round": ledger["round"], "client": ledger["client_id"], "booked": booked,
                          "wanted": wanted})[booked != wanted].drop_duplicates()
    problems = [f"round {row.round} client {printable(row.client, 40)}: noisy is booked {row.booked!r}; the run's "
                f"noisy clients give {row.wanted!r}" for row in wrong.head(MAX_NAMED).itertuples()]
    if len(wrong) > MAX_NAMED:
        problems.append(f"and {len(wrong) - MAX_NAMED} more (round, client) pairs whose noisy flag is not the run's")
    return problems


def check_noisy_column(ledger: pd.DataFrame, config: dict, given: Collection | None, report: AuditReport) -> None:
    """The ``noisy`` column against the run's known noisy clients (module docstring); findings go
    to ``report``, nothing when the run's noisy clients are not known."""
    noisy_clients = known_noisy_clients(config, given, report)
    if noisy_clients is None:
        return
    problems = noisy_column_problems(ledger, noisy_clients)
    report.problems += [f"ledger.csv: {p}" for p in problems]
    if not problems:
        report.checks.append(f"the noisy column marks exactly the run's {len(noisy_clients)} noisy clients")
