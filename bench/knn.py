"""Exact KNN-ADS and KNN-Shapley: the vectorized, chunked estimator against a per-test-point loop.

    python -m bench.knn                       # 10,000 × 784 training, 1,000 test points, K = 5
    python -m bench.knn --train 2000 --test 200
    python -m bench.knn --keep FILE           # also keep what is printed in FILE (a results file)

Problem: random features (uniform on [0, 1)^784, float64), 10 classes, a fixed seed. KNN-ADS
uses two groups (the first half of the training set, then the second half, as originals
then synthetic data); KNN-Shapley ([KNNSV]) is the one-group case.

Reference: the recursion written as public KNN-Shapley code writes it — for each test
point, sort the training set by distance (the same key and tie rule as
:mod:`fedvalue.valuation.knn.utility`), then a Python loop over the sorted instances of each group
from the farthest up ([ADS] Thm 5.1 in the closed form of :mod:`fedvalue.valuation.knn.exact`, with
c_i, the labels and B_j kept as running Python scalars).

Every measurement runs in a fresh child process (``python -m bench.knn --child ...``) so
peak memory is its own: "peak RSS" is ``resource.getrusage(RUSAGE_SELF).ru_maxrss`` at the
end, and "over data" subtracts the resident size read from /proc/self/statm after the data
were generated and before the estimator started. The vectorized estimator is also run at
several chunk sizes to show that its extra memory follows the chunk, not n_train × n_test.
"CPU s" is the child's user + system time over the measured call (both BLAS threads count),
less sensitive than wall time to other jobs on a shared machine; the speed-up is wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench import kept_output
from fedvalue.valuation.knn.exact import knn_ads


def make_problem(num_train: int, num_test: int, num_features: int, seed: int):
    rng = np.random.default_rng(seed)
    x_train = rng.random((num_train, num_features))
    y_train = rng.integers(0, 10, size=num_train)
    x_test = rng.random((num_test, num_features))
    y_test = rng.integers(0, 10, size=num_test)
    return x_train, y_train, x_test, y_test


def groups_of(num_train: int, num_groups: int) -> list[np.ndarray]:
    return [part for part in np.array_split(np.arange(num_train), num_groups)]


def loop_reference(x_train, y_train, x_test, y_test, groups, k: int) -> np.ndarray:
    """Per test point: one sort, then a Python loop over each group's sorted members."""
    num_train = x_train.shape[0]
    group_of = np.empty(num_train, dtype=np.int64)
    for t, group in enumerate(groups):
        group_of[group] = t
    norms = np.einsum("ij,ij->i", x_train, x_train)
    totals = np.zeros(num_train)
    for x, label in zip(x_test, y_test):
        order = np.argsort(norms - 2.0 * (x_train @ x), kind="stable").tolist()
        correct = (y_train == label).tolist()
        group_list = group_of.tolist()
        for t in range(len(groups)):
            members, c, a = [], [], []
            earlier, prefix = 0, [0]  # P's instances seen so far; B_j over P's K nearest
            for i in order:
                g = group_list[i]
                if g < t:
                    earlier += 1
                    if len(prefix) <= k:
                        prefix.append(prefix[-1] + correct[i])
                elif g == t:
                    members.append(i)
                    c.append(earlier)
                    a.append(correct[i])
            prefix += [prefix[-1]] * (k + 1 - len(prefix))
            m = len(members)
            n0 = max(0, min(m, k - c[-1]))
            phi = (n0 * a[-1] - (prefix[k] - prefix[k - n0])) / (m * k)
            totals[members[-1]] += phi
            for i in range(m - 1, 0, -1):  # 1-based i: members[i-1] from members[i]
                n_b = max(0, min(i, k - c[i]))
                lo, hi = max(0, k - c[i]), min(i - 1, k - c[i - 1] - 1)
                n_c = max(0, hi - lo + 1)
                displaced = prefix[k - lo] - prefix[k - hi - 1] if n_c else 0
                phi += (n_b * (a[i - 1] - a[i]) + n_c * a[i - 1] - displaced) / (i * k)
                totals[members[i - 1]] += phi
    return totals / len(y_test)


def resident_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def child(spec: dict) -> dict:
    """One measurement in this (fresh) process; values go to spec['values_path']."""
    x_train, y_train, x_test, y_test = make_problem(spec["train"], spec["test"], spec["features"], spec["seed"])
    groups = groups_of(spec["train"], spec["groups"])
    before = resident_mib()
    cpu_before = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    if spec["implementation"] == "loop":
        values = loop_reference(x_train, y_train, x_test, y_test, groups, spec["k"])
    else:
        result = knn_ads(x_train, y_train, x_test, y_test, groups, k=spec["k"], chunk_size=spec["chunk"])
        values = result.instances.values.sort_index().to_numpy(float)
    seconds = time.perf_counter() - started
    cpu_after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    np.save(spec["values_path"], values)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    return {"seconds": seconds, "cpu_seconds": cpu, "peak_mib": peak, "over_data_mib": peak - before}


def measure(spec: dict) -> tuple[dict, np.ndarray]:
    output = subprocess.run([sys.executable, "-m", "bench.knn", "--child", json.dumps(spec)], check=True,
                            capture_output=True, text=True)
    return json.loads(output.stdout.strip().splitlines()[-1]), np.load(spec["values_path"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=int, default=10_000)
    parser.add_argument("--test", type=int, default=1_000)
    parser.add_argument("--features", type=int, default=784)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--chunk", type=int, default=128, help="test points per chunk of the vectorized estimator")
    parser.add_argument("--chunk-sweep", type=str, default="32,512",
                        help="other chunk sizes to measure for memory (comma-separated; empty: none)")
    parser.add_argument("--keep", type=Path, metavar="FILE",
                        help="also keep what is printed in FILE, headed by the command and commit (a results file)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return 0
    with kept_output(args.keep, "python -m bench.knn " + " ".join(sys.argv[1:] if argv is None else argv)):
        print_table(args)
    return 0


def print_table(args: argparse.Namespace) -> None:
    """Every measurement, each in a fresh child process, as one table."""
    base = {"train": args.train, "test": args.test, "features": args.features, "k": args.k, "seed": args.seed}
    print(f"problem: {args.train} training × {args.features} features, {args.test} test points, K = {args.k}, "
          f"10 classes, seed {args.seed}; each row a fresh process")
    header = f"{'method':<12} {'implementation':<22} {'wall s':>7} {'CPU s':>7} {'peak RSS MiB':>13} " \
             f"{'over data MiB':>14} {'speed-up':>9} {'max |Δ value|':>14}"
    print(header)
    print("-" * len(header))

    def row(name: str, implementation: str, run: dict, speed_up: str, difference: str) -> None:
        print(f"{name:<12} {implementation:<22} {run['seconds']:>7.2f} {run['cpu_seconds']:>7.2f} "
              f"{run['peak_mib']:>13.0f} {run['over_data_mib']:>14.0f} {speed_up:>9} {difference:>14}")

    with tempfile.TemporaryDirectory() as scratch:
        for name, num_groups in (("KNN-ADS", 2), ("KNN-Shapley", 1)):
            runs = {}
            for implementation, chunk in (("vectorized", args.chunk), ("loop", None)):
                spec = base | {"groups": num_groups, "implementation": implementation, "chunk": chunk,
                               "values_path": os.path.join(scratch, f"{name}-{implementation}.npy")}
                runs[implementation] = measure(spec)
            (fast, fast_values), (slow, slow_values) = runs["vectorized"], runs["loop"]
            difference = float(np.max(np.abs(fast_values - slow_values)))
            row(name, f"vectorized, chunk {args.chunk}", fast, f"{slow['seconds'] / fast['seconds']:.1f}x",
                f"{difference:.1e}")
            row(name, "loop per test point", slow, "1.0x", "")
        for chunk in [int(c) for c in args.chunk_sweep.split(",") if c.strip()]:
            spec = base | {"groups": 2, "implementation": "vectorized", "chunk": chunk,
                           "values_path": os.path.join(scratch, f"sweep-{chunk}.npy")}
            run, values = measure(spec)
            difference = float(np.max(np.abs(values - runs_values_reference(scratch))))
            row("KNN-ADS", f"vectorized, chunk {chunk}", run, "", f"{difference:.1e}")


def runs_values_reference(scratch: str) -> np.ndarray:
    """The loop's KNN-ADS values, against which the chunk sweep is compared."""
    return np.load(os.path.join(scratch, "KNN-ADS-loop.npy"))


if __name__ == "__main__":
    raise SystemExit(main())
