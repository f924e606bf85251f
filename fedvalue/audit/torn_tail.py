"""A run killed mid-commit: the part of its last round that rounds.csv never committed.

A writer commits round k in a fixed order (:mod:`fedvalue.run.writer`): its record, its
ledger.csv rows, then its rounds.csv row, the commit mark. Killed before the mark, it
leaves a *torn tail*: round k's record, some or all of its ledger rows (the last line
possibly cut in its middle), a rounds.csv line cut in its middle, or, killed in round 1,
no rounds.csv at all. That is what an interrupted run looks like, not what a forger
writes, so the audit reports it as *incomplete* (not verifiable: ``round k was not
committed``; a resume cuts it and runs the round again) and checks the committed rounds
before it.

Only a run without its final manifest can have one: in a run that claims to be complete,
rows past the commit are a finding. And only the exact shape a kill leaves is a tail:
rows of round k = (committed rounds) + 1 after every committed row, or one last line
without its newline; rows of any other round that rounds.csv never committed stay a
finding.
"""

from __future__ import annotations

from dataclasses import dataclass, field

@dataclass
class Table:
    """A table as the audit reads it: its header (without newline) and its data lines."""

    header: str
    lines: list[str]


@dataclass
class TornTail:
    """What :func:`split_torn_tail` took off the tables: round ``round``'s uncommitted parts."""

    round: int
    parts: list[str] = field(default_factory=list)

    def finding(self) -> str:
        return (f"incomplete: round {self.round} was not committed (the run stopped while writing it: "
                f"{', '.join(self.parts)}); a resume cuts it and runs the round again")


def _round_key(line: str) -> str:
    return line.split(",", 1)[0]


def split_torn_tail(ledger: Table, rounds: Table, *, record_exists) -> tuple[Table, Table, TornTail | None]:
    """``ledger`` and ``rounds`` without a torn tail (module docstring), and the tail (None
    when there is none). ``record_exists(k)``: whether round k's record is in the directory.
    Call it only for a run without its final manifest."""
    round_lines = list(rounds.lines)
    parts: list[str] = []
    if round_lines and not round_lines[-1].endswith("\n"):
        round_lines.pop()
        parts.append("its rounds.csv row, cut in the middle")
    torn = len(round_lines) + 1
    ledger_lines = list(ledger.lines)
    cut = len(ledger_lines)
    while cut > 0 and _round_key(ledger_lines[cut - 1]) == str(torn):
        cut -= 1
    if ledger_lines and not ledger_lines[-1].endswith("\n") and cut == len(ledger_lines):
        cut -= 1  # a last line cut before its round number was whole
        while cut > 0 and _round_key(ledger_lines[cut - 1]) == str(torn):
            cut -= 1
    if cut < len(ledger_lines):
        whole = sum(1 for line in ledger_lines[cut:] if line.endswith("\n"))
        cut_short = len(ledger_lines) - cut - whole
        parts.append(f"{whole} ledger.csv rows" + (", and one cut in the middle" if cut_short else ""))
        ledger_lines = ledger_lines[:cut]
    if record_exists(torn):
        parts.insert(0, "its record")
    tail = TornTail(torn, parts) if parts else None
    return Table(ledger.header, ledger_lines), Table(rounds.header, round_lines), tail


def table_of(text: str | None, columns: tuple[str, ...], *, complete: bool) -> Table:
    """A table's text as header and lines. In a run without its manifest, a table that is
    missing, or holds only its header cut before its newline, is the empty table a writer
    killed before its first line leaves."""
    canonical = ",".join(columns)
    if text is None or (not complete and "\n" not in text and canonical.startswith(text)):
        return Table(canonical, [])
    lines = text.splitlines(keepends=True)
    return Table(lines[0].rstrip("\n") if lines else "", lines[1:])
