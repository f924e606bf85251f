"""Peak memory of ``fedvalue audit`` on a run whose round record is a 1 GiB sparse file.

The run directory's capped reader (fedvalue.run.rundir) reads a file of at most 1 GiB
whole; the audit reads a round record to check its seal's digest and to recompute the
round. This measures the audit's peak resident set size (``/usr/bin/time -v``) on a small
real run (noisy-clients, 3 clients, 1 round) as written, and with its round record
replaced by a sparse file at the read cap, so the difference is what reading that one
file costs.

    python bench/reader_memory.py [--code DIR] [--work DIR]

``--code`` runs the audit from another checkout (``git archive HEAD | tar -x -C DIR``),
for a before/after comparison on the same machine.
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

PROJECT = Path(__file__).resolve().parents[1]
RECORD = "records/round-000001.npz"
TINY = ["--num-clients", "3", "--clients-per-round", "2", "--rounds", "1", "--local-epochs", "1", "--hidden", "8",
        "--quiet"]


def _cli(code: Path, *arguments: str, measure: bool = False) -> tuple[int, str]:
    """Run ``python -m simulations.cli ARGUMENTS`` from ``code``; (peak RSS in KiB, its stdout)."""
    command = [sys.executable, "-m", "simulations.cli", *arguments]
    if measure:
        command = ["/usr/bin/time", "-v", *command]
    done = subprocess.run(command, cwd=code, env={**os.environ, "PYTHONPATH": str(code)}, capture_output=True,
                          text=True, timeout=1800)
    found = re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr)
    return (int(found.group(1)) if found else -1), done.stdout or done.stderr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--code", type=Path, default=PROJECT, help="checkout whose fedvalue audits (default: this)")
    parser.add_argument("--work", type=Path, default=None, help="directory for the runs (default: a temporary one)")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="reader-memory-"))
    honest = work / "honest"
    if not honest.exists():
        _, output = _cli(PROJECT, "run", "noisy-clients", "--out", str(honest), *TINY)
        assert (honest / RECORD).is_file(), output
    sparse = work / "sparse"
    shutil.rmtree(sparse, ignore_errors=True)
    shutil.copytree(honest, sparse)
    with open(sparse / RECORD, "r+b") as handle:  # the read cap (fedvalue.run.rundir.MAX_FILE_BYTES), all holes
        handle.truncate(1024**3)
    for options in ((), ("--no-recompute",)):
        peaks = {}
        for name, run in (("as written", honest), ("1 GiB sparse record", sparse)):
            peaks[name], output = _cli(args.code, "audit", str(run), *options, measure=True)
            verdict = output.strip().splitlines()[-1] if output.strip() else "(no output)"
            print(f"audit {' '.join(options) or '(recompute)'}, {name}: peak RSS {peaks[name] / 1024:.0f} MiB; "
                  f"{verdict[-60:]}")
        print(f"  the 1 GiB record costs {(peaks['1 GiB sparse record'] - peaks['as written']) / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
