"""Kill a real run at each step of its commit sequence, then resume it: every case a process.

    python -m tests.hostile.crashes.matrix WORK KEY CASE [CASE ...]

A case is ``STEP:ROUND`` (:mod:`fedvalue.run.kill_points`), or several joined by ``+``:
the run is killed at the first, its resume at the next, and so on; then a last resume
runs to the end. Each run and resume is its own process, forked from this one after
torch, Flower and fedvalue are imported and torch has run once (a fresh interpreter pays
that for each of the dozens of processes: minutes on two cores instead of seconds). The
parent runs no part of fedvalue's run: what a resumed child knows comes from the run
directory. Each child is :mod:`tests.hostile.crashes.driver`; an armed one dies by SIGKILL.

Writes, under WORK: ``reference/`` (the run uninterrupted) and ``trace.txt`` (the steps it
passed), and per case ``CASE/run`` (resumed to its end) and ``CASE/killed-N`` (the
directory as the N-th kill left it, copied before it was resumed). Prints one JSON line
per case: how each process ended and what a refused one said.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import signal
import sys
import traceback
from pathlib import Path

import torch

from fedvalue.run import kill_points
from tests.hostile.crashes import driver as kill_driver
def _warm_torch() -> None:
    """One tiny SGD step (an optimizer imports torch's compiler stack lazily, over a second),
    so that no child pays torch's first-call costs; then the heap is frozen, so that the
    children's garbage collector does not copy it page by page."""
    torch.set_num_threads(1)  # no thread pool in the parent: forking it is safe
    model = kill_driver.make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = torch.nn.functional.cross_entropy(model(torch.zeros(4, kill_driver.FEATURES)), torch.zeros(4).long())
    loss.backward()
    optimizer.step()
    gc.collect()
    gc.freeze()


def run_child(run_dir: Path, key: str, *, resume: bool, environment: dict[str, str], log: Path) -> str:
    """Run the driver in a forked process; how it ended: ``exit N`` or ``signal NAME``."""
    pid = os.fork()
    if pid == 0:  # the child: its own environment and stderr, then the driver, then out
        code = 3
        try:
            os.environ.update(environment)
            descriptor = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(descriptor, 2)
            code = kill_driver.main([str(run_dir), "--key", key, *(["--resume"] if resume else [])])
        except BaseException:  # noqa: BLE001 - whatever happens, the child reports and exits
            traceback.print_exc()
        finally:
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return f"signal {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exit {os.WEXITSTATUS(status)}"


def run_case(work: Path, key: str, case: str) -> dict:
    """Kill at each step of ``case`` in turn (copying what each kill left), then resume to the end."""
    base = work / case.replace(":", "-").replace("+", "_")
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    ended = []
    for number, step in enumerate(case.split("+"), start=1):
        ended.append(run_child(base / "run", key, resume=number > 1, environment={kill_points.KILL_AT: step},
                               log=base / f"kill-{number}.err"))
        shutil.copytree(base / "run", base / f"killed-{number}")
    ended.append(run_child(base / "run", key, resume=True, environment={}, log=base / "resume.err"))
    return {"case": case, "dir": str(base), "ended": ended, "resume_error": (base / "resume.err").read_text()[-2000:]}


def main(argv: list[str]) -> int:
    work, key, cases = Path(argv[0]), argv[1], argv[2:]
    _warm_torch()
    shutil.rmtree(work / "reference", ignore_errors=True)
    trace = work / "trace.txt"
    trace.unlink(missing_ok=True)
    reference = run_child(work / "reference", key, resume=False, environment={kill_points.TRACE: str(trace)},
                          log=work / "reference.err")
    print(json.dumps({"case": "reference", "dir": str(work / "reference"), "ended": [reference]}), flush=True)
    for case in cases:
        print(json.dumps(run_case(work, key, case)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
