"""Load: 200 clients, 20 per round, through the real CLI, with wall time and peak memory.

    python -m bench.load                     # rounds 5 and 20 (about 5 minutes on 2 cores)
    python -m bench.load --rounds 20

Runs ``fedvalue run noisy-clients --num-clients 200 --clients-per-round 20 --schedule
random`` as a child process for each round count and samples, every 0.2 s, the resident
memory of the driver (the server: strategy, books, valuation) and of its whole process
tree (the driver plus every Ray process it starts), from /proc. Round records go to
disk as each round completes, so the server's peak memory is meant not to grow with the
number of rounds: the table prints the peak for 5 and for 20 rounds side by side, and
their ratio. 20 clients per round is past exact ADS (2^20 coalitions), so each round is
valued by MC-ADS (Alg. 1, m* permutations through the coalition cache) and LOO.

The server's resident memory also counts the pages of Ray's object store (shared memory in
/dev/shm) that it maps: every train message and reply over 100 KiB passes through the store.
The table gives that shared part of the server's peak beside it (``RssShmem``), so a growth of
the store's pages is told from the server's own; the tree's sum counts such pages once in every
process that touched them.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import kept_output

ROOT = Path(__file__).resolve().parents[1]
PAGE = os.sysconf("SC_PAGE_SIZE")


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    parent = int(handle.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            tree.setdefault(parent, []).append(int(entry))
    return tree


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as handle:
            return int(handle.read().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return 0


def shared_rss(pid: int) -> int:
    """The shared-memory part of ``pid``'s resident memory (``RssShmem``: Ray's object store), in bytes."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("RssShmem:"):
                    return int(line.split()[1]) * 1024
    except (OSError, IndexError, ValueError):
        pass
    return 0


def tree_rss(root: int) -> tuple[int, int]:
    """(RSS of ``root``, RSS of ``root`` and all its descendants), in bytes."""
    tree, total, stack = _children(), 0, [root]
    while stack:
        pid = stack.pop()
        total += _rss(pid)
        stack.extend(tree.get(pid, []))
    return _rss(root), total


def measure(rounds: int, out: Path, extra: list[str]) -> dict:
    command = [sys.executable, "-m", "simulations.cli", "run", "noisy-clients", "--out", str(out),
               "--num-clients", "200", "--clients-per-round", "20", "--rounds", str(rounds),
               "--schedule", "random", "--quiet", *extra]
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak_driver = peak_total = shared_at_peak = 0
    while process.poll() is None:
        driver, total = tree_rss(process.pid)
        if driver > peak_driver:
            peak_driver, shared_at_peak = driver, shared_rss(process.pid)
        peak_total = max(peak_total, total)
        time.sleep(0.2)
    wall = time.perf_counter() - started
    output = process.stdout.read()
    if process.returncode != 0:
        raise SystemExit(f"the run with {rounds} rounds failed ({process.returncode}):\n{output[-3000:]}")
    rounds_csv = (out / "rounds.csv").read_text().splitlines()[1:]
    records = sum(p.stat().st_size for p in (out / "records").iterdir())
    return {"rounds": rounds, "wall": wall, "driver": peak_driver, "driver_shared": shared_at_peak, "total": peak_total,
            "records_mb": records / 2**20, "booked_rounds": len(rounds_csv)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, nargs="+", default=[5, 20])
    parser.add_argument("--runs", metavar="DIR", help="keep the run directories under this folder")
    parser.add_argument("--keep", type=Path, metavar="FILE",
                        help="also keep what is printed in FILE, headed by the command and commit (a results file)")
    args, extra = parser.parse_known_args(argv)
    shown = sys.argv[1:] if argv is None else argv
    with kept_output(args.keep, "python -m bench.load " + " ".join(shown)):
        before = " ".join(f"{x:.1f}" for x in os.getloadavg())
        with tempfile.TemporaryDirectory() as scratch:
            base = Path(args.runs or scratch)
            results = [measure(rounds, base / f"load-{rounds}", extra) for rounds in args.rounds]
        report(results, before)
    return 0


def report(results: list[dict], load_before: str) -> None:
    """The table: wall time, peak memory of the server (and the shared part of it: Ray's object store) and of its
    process tree, and record bytes per run."""
    print(f"noisy-clients, 200 clients, 20 per round (MC-ADS + LOO per round); load average before: {load_before}")
    print(f"{'rounds':>6}{'wall s':>9}{'s/round':>9}{'server peak MB':>16}{'of it shared':>14}{'tree peak MB':>14}"
          f"{'records MB':>12}")
    for r in results:
        print(f"{r['rounds']:>6}{r['wall']:>9.1f}{r['wall'] / r['rounds']:>9.2f}{r['driver'] / 2**20:>16.0f}"
              f"{r['driver_shared'] / 2**20:>14.0f}{r['total'] / 2**20:>14.0f}{r['records_mb']:>12.1f}")
    if len(results) > 1:
        first, last = results[0], results[-1]
        print(f"server peak, {last['rounds']} rounds / {first['rounds']} rounds: {last['driver'] / first['driver']:.2f}")


if __name__ == "__main__":
    raise SystemExit(main())
