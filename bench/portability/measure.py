"""Making a study's runs and audits, each a child process of the real CLI, and its results file.

Layout of ``--out``::

    runs/<run>/                      each run's folder (``fedvalue run ... --out`` it); <run>.log its output,
                                     <run>.argv.json its command
    audits/<run>/<audited>/<set>.json  one audit's record: the audit's own report (``fedvalue audit --json``),
                                     the kernel set's environment, exit code and wall seconds; <set>.log its
                                     printed lines

A run is complete when every directory of it that is audited holds its manifest (the run closed); an
audit is done when its record exists (written whole, after the audit) for the same environment. Both are
skipped when done, so the command resumes where it stopped, and ``--quick`` and the full study can share
``--out`` (their common runs and audits made once).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.portability.plan import KERNEL_SETS, Run, Study
from bench.portability.tables import MEASURED, write_results
from fedvalue.scoring.kernels import KERNEL_ENVIRONMENT

ROOT = Path(__file__).resolve().parents[2]
#: What a run closes with: its manifest (docs/run-directory.md).
MANIFEST = "manifest.json"
#: Most seconds a run or an audit may take before the study stops (the audit's own budget is 3600 s).
CHILD_TIMEOUT = 4 * 3600


def environment(kernel_set: str) -> dict[str, str]:
    """This process's environment without the variables that steer kernels and threads
    (:data:`fedvalue.scoring.kernels.KERNEL_ENVIRONMENT`), then ``kernel_set``'s; the worktree importable."""
    base = {k: v for k, v in os.environ.items() if k not in KERNEL_ENVIRONMENT}
    base["PYTHONPATH"] = os.pathsep.join([str(ROOT), base.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return {**base, **KERNEL_SETS[kernel_set]}


def _child(argv: list[str], log: Path, kernel_set: str) -> tuple[int, float]:
    """``python -m simulations.cli ARGV`` under ``kernel_set``, its output in ``log``: (exit code, seconds)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with open(log, "w", encoding="utf-8") as output:
        code = subprocess.run([sys.executable, "-m", "simulations.cli", *argv], cwd=ROOT, env=environment(kernel_set),
                              stdout=output, stderr=subprocess.STDOUT, timeout=CHILD_TIMEOUT, check=False).returncode
    return code, time.perf_counter() - started


def complete(run: Run, folder: Path) -> bool:
    """Whether every directory of ``run`` that is audited closed (holds its manifest)."""
    return all((folder / relative / MANIFEST).is_file() for relative in run.audited.values())


def make(run: Run, out: Path) -> Path:
    """``run``'s folder under ``out``/runs, made unless complete (module docstring); a folder another command
    made (its ``.argv.json`` beside it) is refused."""
    folder = out / "runs" / run.name
    made_by = folder.with_suffix(".argv.json")
    if made_by.is_file() and json.loads(made_by.read_text()) != list(run.argv):
        raise RuntimeError(f"{folder} was made by another command ({made_by}); give the study another --out")
    made_by.parent.mkdir(parents=True, exist_ok=True)
    made_by.write_text(json.dumps(list(run.argv)))
    if complete(run, folder):
        print(f"{run.name}: made before", flush=True)
        return folder
    again = ["--overwrite"] if folder.exists() and not run.continues else []
    code, seconds = _child([*run.argv, "--out", str(folder), *again], folder.with_suffix(".log"), "own")
    if code != 0 or not complete(run, folder):
        raise RuntimeError(f"{run.name}: fedvalue {' '.join(run.argv)} exited {code} without closing every audited "
                           f"run; its output: {folder.with_suffix('.log')}")
    print(f"{run.name}: made in {seconds:.0f} s", flush=True)
    return folder


def _head(run_dir: Path) -> str | None:
    """The chain head the run closed with (its manifest's): a record of an audit of another run is not its."""
    try:
        return json.loads((run_dir / MANIFEST).read_text()).get("head")
    except (OSError, ValueError, AttributeError):
        return None


def audit(run_dir: Path, kernel_set: str, record: Path) -> dict:
    """The record of ``fedvalue audit RUN_DIR --json`` under ``kernel_set`` (kept at ``record``, read back
    when kept before under the same environment, of the run as it closed): ``report`` (the audit's JSON), ``environment``,
    ``exit_code`` and ``seconds``."""
    if record.is_file():
        kept = json.loads(record.read_text())
        if kept.get("environment") == KERNEL_SETS[kernel_set] and kept["report"].get("head") == _head(run_dir):
            return kept
    record.parent.mkdir(parents=True, exist_ok=True)
    report = record.with_suffix(".report.json")
    code, seconds = _child(["audit", str(run_dir), "--json", str(report)], record.with_suffix(".log"), kernel_set)
    if code not in (0, 1) or not report.is_file():
        raise RuntimeError(f"the audit of {run_dir} under {kernel_set} exited {code} without a report; its output: "
                           f"{record.with_suffix('.log')}")
    kept = {"report": json.loads(report.read_text()), "environment": KERNEL_SETS[kernel_set], "exit_code": code,
            "seconds": round(seconds, 1)}
    partial = record.with_suffix(".partial")
    partial.write_text(json.dumps(kept, indent=1))
    os.replace(partial, record)
    report.unlink()
    return kept


def run_capability(run_dir: Path) -> str:
    """The instruction set torch's kernels used where the run was made (run.json's ``platform``)."""
    try:
        platform = json.loads((run_dir / "run.json").read_text()).get("platform")
    except (OSError, ValueError, AttributeError):
        return "unknown"
    return str(platform.get("cpu_capability", "unknown")) if isinstance(platform, dict) else "unknown"


def result_row(study: str, audited: str, kernel_set: str, record: dict, capability: str) -> dict:
    """One audit's row of the results file (:data:`bench.portability.tables.COLUMNS`) from its record."""
    report = record["report"]
    measured = report.get("measured") or {}
    row = {"study": study, "run": audited, "kernel_set": kernel_set,
           "environment": " ".join(f"{k}={v}" for k, v in KERNEL_SETS[kernel_set].items()),
           "run_cpu_capability": capability, "verdict": report["verdict"], "findings": len(report["problems"]),
           "unverifiable": len(report["unverifiable"]), **{name: measured.get(name, 0) for name in MEASURED},
           "audit_seconds": record["seconds"]}
    return row


def measure(study: Study, out: Path, results: Path, command: str) -> list[dict]:
    """Make ``study``'s runs in ``out``, audit each audited directory under each kernel set, and write the
    results file ``results`` headed by ``command`` and the commit; its rows, in the plan's order."""
    folders = {run.name: make(run, out) for run in study.runs}
    rows = []
    for run in study.runs:
        for audited, relative in run.audited.items():
            run_dir = folders[run.name] / relative
            for kernel_set in study.kernel_sets:
                record = audit(run_dir, kernel_set, out / "audits" / run.name / audited / f"{kernel_set}.json")
                rows.append(result_row(study.name, audited, kernel_set, record, run_capability(run_dir)))
                print(f"{audited} under {kernel_set}: {record['report']['verdict']} ({record['seconds']:.0f} s)",
                      flush=True)
    write_results(results, rows, command)
    return rows
