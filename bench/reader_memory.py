"""Peak memory of ``fedvalue audit`` on a run whose round record is a 1 GiB sparse file.

The run directory's capped reader (fedvalue.run.rundir) reads a file of at most 1 GiB
whole; the audit reads a round record to check its seal's digest and to recompute the
round. This measures the audit's peak resident set size (``/usr/bin/time -v``) on a small
real run (noisy-clients, 3 clients, 1 round) as written, and with its round record
replaced by a sparse file at the read cap, so the difference is what reading that one
file costs.

    python -m bench.reader_memory [--code DIR] [--work DIR] [--keep FILE]

``--code`` makes the run and audits it from another checkout (``git archive REV | tar -x -C DIR``),
for a before/after comparison on the same machine: each version audits a run it wrote itself.
``--keep`` keeps what is printed as a results file (:func:`bench.kept_output`); :func:`docs_table`
renders the docs' table from the files of two versions.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench import kept_output

PROJECT = Path(__file__).resolve().parents[1]
RECORD = "records/round-000001.npz"
TINY = ["--num-clients", "3", "--clients-per-round", "2", "--rounds", "1", "--local-epochs", "1", "--hidden", "8",
        "--quiet"]
#: The audit modes measured: their options and the row of the docs' table each is.
MODES = {"recompute": ((), "`fedvalue audit DIR` (the record is parsed)"),
         "no recompute": (("--no-recompute",), "`fedvalue audit DIR --no-recompute` (hashed only)")}
WRITTEN, SPARSE = "as written", "1 GiB sparse record"
#: One printed measurement: the audit mode, the run, its peak RSS, exit status and the audit's last line.
MEASUREMENT = re.compile(r"audit (?P<mode>[\w ]+) \| (?P<run>[\w ]+) \| peak RSS (?P<mib>\d+) MiB \| exit (?P<rc>-?\d+)"
                         r" \| (?P<said>.*)")
DOCS_HEADER = "| audit of a 1 GiB record | before | after |"


def _cli(code: Path, *arguments: str, measure: bool = False) -> tuple[int | None, int, str]:
    """Run ``python -m simulations.cli ARGUMENTS`` from ``code``; (peak RSS in KiB or None, exit status, its stdout)."""
    command = [sys.executable, "-m", "simulations.cli", *arguments]
    if measure:
        command = ["/usr/bin/time", "-v", *command]
    done = subprocess.run(command, cwd=code, env={**os.environ, "PYTHONPATH": str(code)}, capture_output=True,
                          text=True, timeout=1800)
    found = re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr)
    return (int(found.group(1)) if found else None), done.returncode, done.stdout or done.stderr


def measure(code: Path, work: Path) -> None:
    """Make the run with ``code`` (kept in ``work``), copy it with a sparse record, and print one line a measurement."""
    honest = work / "honest"
    if not honest.exists():
        _, _, output = _cli(code, "run", "noisy-clients", "--out", str(honest), *TINY)
        if not (honest / RECORD).is_file():
            raise SystemExit(f"the run wrote no {RECORD}:\n{output[-3000:]}")
    sparse = work / "sparse"
    shutil.rmtree(sparse, ignore_errors=True)
    shutil.copytree(honest, sparse)
    with open(sparse / RECORD, "r+b") as handle:  # the read cap (fedvalue.run.rundir.MAX_FILE_BYTES), all holes
        handle.truncate(1024**3)
    for mode, (options, _) in MODES.items():
        peaks = {}
        for name, run in ((WRITTEN, honest), (SPARSE, sparse)):
            peak, rc, output = _cli(code, "audit", str(run), *options, measure=True)
            if peak is None:
                raise SystemExit(f"/usr/bin/time -v reported no peak for the audit ({mode}, {name}):\n{output[-2000:]}")
            peaks[name] = peak
            said = output.strip().splitlines()[-1] if output.strip() else "(no output)"
            print(f"audit {mode} | {name} | peak RSS {peak / 1024:.0f} MiB | exit {rc} | {said[-60:]}", flush=True)
        print(f"  the 1 GiB record costs {(peaks[SPARSE] - peaks[WRITTEN]) / 1024:.0f} MiB")


def peaks_of(text: str) -> dict[tuple[str, str], int]:
    """(audit mode, run) -> peak MiB of a kept results file's text (its header and other lines skipped)."""
    return {(m["mode"], m["run"]): int(m["mib"]) for m in map(MEASUREMENT.fullmatch, text.splitlines()) if m}


def docs_table(before: str, after: str) -> str:
    """The docs' table of the 1 GiB record from the kept results files' texts of the version before and this one:
    the peak of each audit mode on the run with the sparse record. ValueError naming a measurement a file lacks."""
    kept = {"before": peaks_of(before), "after": peaks_of(after)}
    lines = [DOCS_HEADER, "|---|---|---|"]
    for mode, (_, row) in MODES.items():
        missing = [side for side, peaks in kept.items() if (mode, SPARSE) not in peaks]
        if missing:
            raise ValueError(f"the {' and '.join(missing)} file holds no 'audit {mode} | {SPARSE}' line")
        lines.append(f"| {row} | {kept['before'][mode, SPARSE]} MiB | {kept['after'][mode, SPARSE]} MiB |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--code", type=Path, default=PROJECT,
                        help="checkout that makes the run and audits it (default: this one)")
    parser.add_argument("--work", type=Path, default=None,
                        help="directory for the runs, one per checkout: a run found there is reused (default: a new one)")
    parser.add_argument("--keep", type=Path, metavar="FILE",
                        help="also keep what is printed in FILE, headed by the command and commit (a results file)")
    args = parser.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="reader-memory-"))
    with kept_output(args.keep, "python -m bench.reader_memory " + " ".join(sys.argv[1:] if argv is None else argv)):
        print("peak RSS of fedvalue audit (/usr/bin/time -v) on a small real run, as written and with a sparse record")
        measure(args.code.resolve(), work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
