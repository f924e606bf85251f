"""The run-directory battery's tables of docs/faults-and-audit.md, rendered from two of its ``--json`` files: the
version before (``--code`` of that checkout) and this one (``python -m tests.hostile.run_dirs.battery --json FILE``).

:func:`counts_table` is the counts of each kind of failure; :func:`attacks_table` a row per attack, each side's
cell (:func:`reader_cell`) the audits' verdicts without and with the key, the other commands' exit statuses,
and the harms in bold. The files of both sides must hold the same attacks under the same limits.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

#: The audit modes, as the battery's files name their commands: without a key, with the signer's public key.
NO_KEY, WITH_KEY = "audit", "audit --public-key"
COUNTS_HEADER = "| count (of {n}) | before | after |"
ATTACKS_HEADER = "| attack | class | before: audit (no key · key), reader | after |"
#: The counts' rows: the JSON's key and the row's label (the hang's limits are the files').
COUNT_ROWS = (("intact_and_harmful", "an audit said intact and the reader was harmed"),
              ("harms", "reader harmed"),
              ("hang", "hang (no answer in {timeout:g} s, or killed past {cap:g} GB)"),
              ("traceback", "traceback"),
              ("missed_forgery", "a rewrite an audit mode must catch called intact"),
              ("false_alarm", "an untouched run not called intact"))
NOT_FORGED = "not forged on that version's files (the forger failed)"
#: A verdict of an audit as a cell shows it.
SHOWN_VERDICTS = {"intact": "intact", "NOT intact": "NOT intact", "NOT verifiable": "NOT verif."}
#: A harm is cut to this many characters in a cell.
HARM_CHARACTERS = 64
#: Harms shown in one attack's cell, the rest counted: two of 64 characters and the rest keep a table row within 250 characters.
HARMS_SHOWN = 2


def read_battery(path: Path) -> dict:
    """A battery's ``--json`` file; ValueError naming what it lacks."""
    kept = json.loads(Path(path).read_text())
    missing = [key for key in ("made_by", "timeout_s", "memory_cap_mb", "counts", "attacks") if key not in kept]
    if missing:
        raise ValueError(f"{path}: expected a battery's --json file; it lacks {', '.join(missing)}")
    return kept


def _same_attacks(before: dict, after: dict) -> list[str]:
    """The attacks both files hold, in order; ValueError when they or their limits differ."""
    names = [[row["name"] for row in side["attacks"]] for side in (before, after)]
    if names[0] != names[1]:
        raise ValueError(f"the files hold other attacks: before only {sorted(set(names[0]) - set(names[1]))}, "
                         f"after only {sorted(set(names[1]) - set(names[0]))} (or another order)")
    for key in ("timeout_s", "memory_cap_mb"):
        if before[key] != after[key]:
            raise ValueError(f"the files were made under other limits: {key} {before[key]} before, {after[key]} after")
    return names[1]


def counts_table(before: dict, after: dict) -> str:
    """The docs' counts table: how many attacks of each kind of failure, before and after."""
    names = _same_attacks(before, after)
    limits = {"timeout": after["timeout_s"], "cap": after["memory_cap_mb"] / 1000}
    lines = [COUNTS_HEADER.format(n=len(names)), "|---|---|---|"]
    lines += [f"| {label.format(**limits)} | {before['counts'][key]} | {after['counts'][key]} |"
              for key, label in COUNT_ROWS]
    failed = [sum("forger_failed" in row for row in side["attacks"]) for side in (before, after)]
    if any(failed):
        lines.append(f"| {NOT_FORGED} | {failed[0]} | {failed[1]} |")
    return "\n".join(lines)


def attacks_table(before: dict, after: dict) -> str:
    """The docs' table of every attack: its class and what the readers did, before and after."""
    _same_attacks(before, after)
    lines = [ATTACKS_HEADER, "|---|---|---|---|"]
    for old, new in zip(before["attacks"], after["attacks"]):
        lines.append(f"| {new['name'].replace('_', ' ')} | {new['kind']} | {reader_cell(old)} | {reader_cell(new)} |")
    return "\n".join(lines)


def _cut(text: str) -> str:
    """``text`` on one line, cut to :data:`HARM_CHARACTERS`, safe in a table cell."""
    text = " ".join(str(text).split())
    text = text if len(text) <= HARM_CHARACTERS else text[:HARM_CHARACTERS] + "…"
    return text.replace("|", "\\|")


def _verdict(said: str | None) -> str:
    return "—" if said is None else SHOWN_VERDICTS.get(said, _cut(said))


def reader_cell(row: dict) -> str:
    """One attack's cell: the audits' verdicts (no key · key) when an audit gave one; then ``hang`` and
    ``traceback`` in bold and each other command that exited as ``NAME exit RC`` (NAME its first word); then
    each harm in bold, once, without the command name it starts with (the first :data:`HARMS_SHOWN`, then how many
    more). Parts apart by ``;``."""
    if "forger_failed" in row:
        return f"not forged: {_cut(row['forger_failed'])}"
    commands, verdicts = row["commands"], row["verdicts"]
    parts = [f"{_verdict(verdicts.get(NO_KEY))} · {_verdict(verdicts.get(WITH_KEY))}"] if verdicts else []
    shown_as_verdict = {name for name in verdicts if name.rstrip("'") in (NO_KEY, WITH_KEY)}
    reader = ["**hang**"] * bool(row["hang"]) + ["**traceback**"] * bool(row["traceback"])
    reader += [f"{name.split()[0].rstrip(chr(39))} exit {result['rc']}" for name, result in commands.items()
               if result["outcome"] == "exited" and name not in shown_as_verdict]
    if reader:
        parts.append(", ".join(reader))
    prefix = re.compile("^(?:" + "|".join(map(re.escape, sorted(commands, key=len, reverse=True))) + "): ") \
        if commands else None
    harms = dict.fromkeys(prefix.sub("", harm) if prefix else harm for harm in row["harms"])
    if harms:  # the first HARMS_SHOWN, and how many more: a docs table row stays a screen wide
        shown = [f"**{_cut(harm)}**" for harm in list(harms)[:HARMS_SHOWN]]
        more = len(harms) - HARMS_SHOWN
        parts.append("; ".join(shown + [f"{more} more"] * (more > 0)))
    return "; ".join(parts) or "—"
