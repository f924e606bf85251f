"""Failures of the simulation engine, each said in one line: what failed, why, what to change.

Flower reports an engine that did not start, or crashed, as ``RuntimeError("An error was
encountered. Ending simulation.")``, chained to ``RuntimeError("Simulation Runtime
crashed.")``, chained to the real cause (``ray.init``'s error: a raylet that missed Ray's
30 s start-up window on a loaded machine, a session directory that cannot be made, ...), and
logs each link's traceback (an exported ``RAY_ADDRESS`` is none: a local run starts a Ray of
its own, :func:`simulations.runner.engine.ray_init_args`). A ServerApp whose
nodes do not report their partition ids in time raises
:class:`strategies.intake.nodes.QueryTimedOut`. :func:`engine_failure` turns these into one
:class:`EngineFailed` naming the cause and the option to change; anything else is not an
engine failure and is left as it is.
"""

from __future__ import annotations

import os
import traceback

from fedvalue._checks import counted
from fedvalue.run.rundir import printable
from strategies.intake.nodes import QueryTimedOut

#: Flower's messages for an engine that failed (the links of its chain).
_FLOWER_CRASH = ("An error was encountered. Ending simulation.", "Simulation Runtime crashed.")
#: Flower's log records of an engine crash (its tracebacks): the error says it in one line.
FLOWER_CRASH_LOGS = ("An exception occurred !!", "An exception occured!!", "Traceback (most recent call last)",
                     "Stopping Simulation Runtime.")


class EngineFailed(RuntimeError):
    """The simulation engine failed to start, or to serve the run (one line: cause and fix)."""


def _root(error: BaseException) -> BaseException:
    seen = {id(error)}
    while error.__cause__ is not None and id(error.__cause__) not in seen:
        error = error.__cause__
        seen.add(id(error))
    return error


def _in_ray_start(error: BaseException) -> bool:
    """Whether ``error`` was raised while Ray started (in Flower's ``init_ray`` or ``ray.init``)."""
    frames = traceback.extract_tb(error.__traceback__)
    return any(frame.name == "init_ray" or frame.filename.endswith(os.path.join("ray", "_private", "node.py"))
               for frame in frames)


def _ray_start_hint(root: BaseException) -> str:
    text = str(root)
    if "timed out during startup" in text:
        return ("its raylet missed Ray's 30 s start-up window, as on a loaded machine: run again when the machine "
                "is less loaded, or start a cluster (`ray start --head`) and attach to it with --ray-address")
    return "see Ray's logs (/tmp/ray/session_latest/logs); with --ray-address, check that the cluster is up"


def engine_failure(error: BaseException, *, run_dir: str, committed: int, removed: bool) -> EngineFailed | None:
    """``error`` as one :class:`EngineFailed` (module docstring), or None when it is not an
    engine failure. ``committed`` rounds are in ``run_dir`` (``removed``: the half-made
    directory of a new run that committed none was removed)."""
    if isinstance(error, QueryTimedOut):  # the simulation's own setting (--query-timeout on the command line)
        cause = f"engine: {error.said_with('--query-timeout')}"
    elif isinstance(error, RuntimeError) and str(error) in _FLOWER_CRASH:
        root = _root(error)
        what = f"{type(root).__name__}: {printable(root, 300)}"
        if _in_ray_start(root):
            cause = f"engine: Ray did not start ({what}); {_ray_start_hint(root)}"
        else:
            cause = f"engine: the simulation engine crashed ({what}); see Ray's logs (/tmp/ray/session_latest/logs)"
    else:
        return None
    cause = cause.rstrip(". ")
    if removed:
        cause += f". No round was committed, so {run_dir} was removed"
    else:
        cause += (f". {run_dir} holds the {counted(committed, 'round')} committed before it: continue with --resume {run_dir}"
                  if committed else f". No round was committed; continue with --resume {run_dir}")
    return EngineFailed(cause)
