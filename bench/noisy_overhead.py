"""What valuation adds to the wall time of the default ``noisy-clients`` run.

    python -m bench.noisy_overhead               # 3 pairs, about 3 minutes on 2 cores
    python -m bench.noisy_overhead --pairs 5
    python -m bench.noisy_overhead --keep FILE   # also keep what is printed in FILE (a results file)

Runs ``simulations.experiments.noisy_clients.noisy_clients.run_noisy_clients`` with the default
``NoisyClientsConfig`` (30 clients, 5 rounds of 6, digits MLP 64-200-200-10, FedAvg)
twice per pair, alternating the order within each pair: with valuation
(``methods=("ads", "loo")``, exact within-round ADS + LOO, 2^6 coalitions per round)
and without (``methods=()``: the platform still books every round, which costs two
utility evaluations per round, v(∅) and v(I_t), but values no client). Every run is a
fresh child process (its own Ray start), so one run's warm caches never help another.

Printed per run: wall time of the ``run_noisy_clients`` call (Ray start and shutdown
included), the whole child process, and the ledger's summed ``valuation_seconds``;
then the median of each and the overhead ratio with/without − 1 (target: ≤ 50%).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import kept_output

ROOT = Path(__file__).resolve().parents[1]
MODES = {"with": ("ads", "loo"), "without": ()}


def _one(mode: str) -> dict:
    """One default noisy-clients run in this process."""
    import os

    os.environ.setdefault("FLWR_LOG_LEVEL", "ERROR")
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    from simulations.experiments.noisy_clients.noisy_clients import NoisyClientsConfig, run_noisy_clients

    config = NoisyClientsConfig(methods=MODES[mode])
    with tempfile.TemporaryDirectory() as out:
        started = time.perf_counter()
        run = run_noisy_clients(config, str(Path(out) / "run"))
        seconds = time.perf_counter() - started
        rounds = run.rounds
        return {
            "mode": mode,
            "seconds": seconds,
            "valuation_seconds": float(rounds["valuation_seconds"].fillna(0).sum()),
            "evaluations": int(rounds["num_evaluations"].fillna(0).sum()),
            "rounds": int(len(rounds)),
        }


def _child(mode: str) -> dict:
    command = [sys.executable, "-m", "bench.noisy_overhead", "--one", mode]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=ROOT)
    process_seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    record = json.loads(done.stdout.strip().splitlines()[-1])
    record["process_seconds"] = process_seconds
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=3, help="with/without pairs, order alternating")
    parser.add_argument("--one", choices=list(MODES), help=argparse.SUPPRESS)
    parser.add_argument("--keep", type=Path, metavar="FILE",
                        help="also keep what is printed in FILE, headed by the command and commit (a results file)")
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(_one(args.one)))
        return 0
    shown = sys.argv[1:] if argv is None else argv
    with kept_output(args.keep, "python -m bench.noisy_overhead " + " ".join(shown)):
        return _overhead(args.pairs)


def _overhead(pairs: int) -> int:
    """Run the pairs and print each run, the medians and the overhead."""
    print("default noisy-clients run (30 clients, 5 rounds x 6, digits MLP 64-200-200-10, FedAvg), "
          "with valuation (ads,loo) and without (methods=())")
    print(f"{'pair':>4} {'mode':<8} {'run s':>8} {'process s':>10} {'valuation s':>12} {'evaluations':>12}")
    records: dict[str, list[dict]] = {m: [] for m in MODES}
    for pair in range(pairs):
        order = ("with", "without") if pair % 2 == 0 else ("without", "with")
        for mode in order:
            record = _child(mode)
            records[mode].append(record)
            print(f"{pair:>4} {mode:<8} {record['seconds']:>8.2f} {record['process_seconds']:>10.2f} "
                  f"{record['valuation_seconds']:>12.2f} {record['evaluations']:>12}", flush=True)
    median = {m: {k: statistics.median(r[k] for r in rs) for k in ("seconds", "process_seconds", "valuation_seconds")}
              for m, rs in records.items()}
    for m in MODES:
        print(f"median {m:<8} run {median[m]['seconds']:.2f} s, process {median[m]['process_seconds']:.2f} s, "
              f"valuation {median[m]['valuation_seconds']:.2f} s")
    ratio = median["with"]["seconds"] / median["without"]["seconds"]
    process_ratio = median["with"]["process_seconds"] / median["without"]["process_seconds"]
    pair_ratios = [w["seconds"] / o["seconds"] for w, o in zip(records["with"], records["without"])]
    print(f"valuation overhead (run): {100 * (ratio - 1):+.1f}%  (process: {100 * (process_ratio - 1):+.1f}%; "
          f"per pair: {', '.join(f'{100 * (r - 1):+.1f}%' for r in pair_ratios)}); target <= +50%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
