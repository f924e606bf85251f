"""The steps of a run directory's commit sequence, named, with a test-only way to die at one.

A writer passes each step after the step's bytes are durable (fsynced). The order of a
round's steps is the crash-safety argument of :mod:`fedvalue.run.writer`; a process
killed after any of them must resume to the ledger an uninterrupted run writes. Nothing
but a real kill shows that, and a kill cannot otherwise land between two fsyncs of one
process deterministically, so a test names a step in :data:`KILL_AT` (``STEP:ROUND``) and
the writer sends itself SIGKILL there (or SIGSTOP with :data:`STOP_AT`: it then holds the
run directory's lock, frozen mid-commit). :data:`TRACE` names a file each step passed is
appended to, so a test can check its list of steps against the writer's.

Unset (always, outside tests), :func:`reached` reads three environment variables and
returns.
"""

from __future__ import annotations

import os
import signal

#: ``STEP:ROUND``: the writer kills itself (SIGKILL) right after that step.
KILL_AT = "FEDVALUE_KILL_AT"
#: ``STEP:ROUND``: the writer stops itself (SIGSTOP) right after that step.
STOP_AT = "FEDVALUE_STOP_AT"
#: A file every step passed is appended to, one ``STEP:ROUND`` a line.
TRACE = "FEDVALUE_KILL_POINTS_TRACE"

#: Opening a new run (round 0): run.json written, then the start's checkpoint pointer.
OPEN_STEPS = ("run_json", "start_pointer")
#: Committing round t, in order: its record; half of its ledger rows (a write torn by the
#: kill), all of them; half of its rounds.csv row, all of it (the commit mark); the
#: checkpoint's arrays and server state; the seal; checkpoint.json switched; older
#: checkpoint files pruned.
ROUND_STEPS = ("record", "ledger_torn", "ledger", "rounds_torn", "rounds", "checkpoint_arrays",
               "checkpoint_state", "seal", "checkpoint_switch", "prune")
#: first_order.csv rows of round t (TracIn flows): appended during round t + 1, before its
#: commit mark, or after the last round, before the manifest.
FIRST_ORDER_STEP = "first_order"
#: Closing the run (round: the last committed): the Parquet copy written, before the manifest.
CLOSE_STEP = "parquet"
#: The steps whose kill leaves a torn line: the writer writes only half of the step's bytes.
TORN_STEPS = ("ledger_torn", "rounds_torn")


def armed(step: str, server_round: int) -> bool:
    """Whether a test asked the writer to die (or stop) at ``step`` of ``server_round``."""
    name = f"{step}:{server_round}"
    return name in (os.environ.get(KILL_AT), os.environ.get(STOP_AT))


def reached(step: str, server_round: int) -> None:
    """The writer passed ``step`` of ``server_round``: trace it; die or stop if armed there."""
    name = f"{step}:{server_round}"
    trace = os.environ.get(TRACE)
    if trace:
        with open(trace, "a", encoding="utf-8") as handle:
            handle.write(name + "\n")
    if os.environ.get(STOP_AT) == name:
        os.kill(os.getpid(), signal.SIGSTOP)
    if os.environ.get(KILL_AT) == name:
        os.kill(os.getpid(), signal.SIGKILL)
