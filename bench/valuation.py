"""Per-round cost of exact within-round ADS + LOO, three ways and a floor, measured side by side.

    python -m bench.valuation                 # n = 6, 8, 10 clients (a few minutes on 2 cores)
    python -m bench.valuation --sizes 6 --repeats 3
    python -m bench.valuation --threads 1      # torch threads per child (default: torch's, 2 here)
    python -m bench.valuation --against-floor --sizes 10 --repeats 5   # (c) and (d) only, every run
    python -m bench.valuation --against-floor --before main --threads 1  # and (c) as of git rev main
    python -m bench.valuation --spread          # why identical rounds take 1.5 s or 35 s (threads, load)
    python -m bench.valuation --model cnn       # the LeNet CNN: fast path, plain path, floor

The round: an MNIST-scale MLP 784-200-200-10, 10,000 held-out examples (synthetic
inputs, labels from a fixed random teacher network), n clients that each took a few
local SGD steps from the same start (half on flipped labels), FedAvg with unequal
weights, accuracy as utility. Every (n, way) runs in a fresh child process, in
interleaved order, so the timings and peak memory of one never leak into another.

(a) naive: for each of the 2^n coalitions, FedAvg's mean in numpy, a deep-copied
    model, ``load_state_dict`` and a batched ``DataLoader`` pass; exact ADS and LOO
    from that table.
(b) the seed's MC without a cache: 200 permutations, every prefix of every
    permutation evaluated as in (a) (200·n evaluations), plus LOO's n + 1.
(c) fedvalue: ``fedavg_round_game`` + ``value_round`` (one shared cache, linear
    combinations with first-layer reuse, near ties re-scored on the plain path).
(d) the floor of (c): only the matmuls after the first layer (784-200 is shared by all
    coalitions; 200x200 and 200x10 are not), 2^n times per held-out batch, in (c)'s
    shapes, with nothing else. (c)/(d) is what (c) spends on top of that arithmetic.

Printed: seconds per round, ratios (a)/(c), (b)/(c) and (c)/(d), peak resident memory of the
child (and its growth above the state after setup), and the largest |value(a) −
value(c)| over ADS and LOO (must be ≤ 1e-6), and (b)'s MC error against exact. The
load average before and after is printed too: with other work on the machine, torch's
two threads wait on each other (a thread that lost its core stalls the other at every
parallel region) and every way slows down several-fold; ``--threads 1`` is then the
fairer measurement.
"""

from __future__ import annotations

import argparse
import copy
import inspect
import json
import math
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench import kept_output

NUM_HELD_OUT = 10_000
HIDDEN = (200, 200)


def _setup(num_clients: int, seed: int = 0):
    import torch

    from clients.training import get_model_arrays, train_locally
    from simulations.datasets.models import make_mlp

    rng = np.random.default_rng(seed)
    teacher = make_mlp(784, 10, hidden=(64,), seed=seed + 1)
    x = rng.normal(size=(NUM_HELD_OUT, 784)).astype(np.float32)
    with torch.no_grad():
        y = teacher(torch.as_tensor(x)).argmax(dim=1).numpy()
    model = make_mlp(784, 10, hidden=HIDDEN, seed=seed)
    start = get_model_arrays(model)
    clients, weights = [], []
    for k in range(num_clients):
        size = int(rng.integers(100, 400))
        xk = rng.normal(size=(size, 784)).astype(np.float32)
        with torch.no_grad():
            yk = teacher(torch.as_tensor(xk)).argmax(dim=1).numpy()
        if k % 2:
            yk = rng.integers(0, 10, size)
        local = make_mlp(784, 10, hidden=HIDDEN, seed=seed)
        train_locally(local, xk, yk, epochs=5, learning_rate=0.1, seed=seed + 10 + k)
        clients.append(get_model_arrays(local))
        weights.append(float(size))
    return model, x, y, start, clients, weights


def _naive_utility(model, x, y, client_arrays, weights):
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from fedvalue.valuation.round_game import weighted_mean

    loader = DataLoader(TensorDataset(torch.as_tensor(x), torch.as_tensor(y)), batch_size=1000)
    start_state = {k: v.detach().clone() for k, v in model.state_dict().items()}

    def utility(coalition: frozenset) -> float:
        members = sorted(coalition)
        if members:
            arrays = weighted_mean([client_arrays[k] for k in members], [weights[k] for k in members])
            state = {k: torch.as_tensor(v) for k, v in arrays.items()}
        else:
            state = start_state
        copy_of_model = copy.deepcopy(model)
        copy_of_model.load_state_dict(state)
        copy_of_model.eval()
        hits = 0
        with torch.no_grad():
            for xb, yb in loader:
                hits += int((copy_of_model(xb).argmax(dim=1) == yb).sum())
        return hits / len(x)

    return utility


def _one(num_clients: int, way: str, permutations: int, threads: int = 0) -> dict:
    """Run one (n, way) measurement in this process; returns a JSON-able record."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    from fedvalue.scoring.torch_utilities import TorchModelUtility
    from fedvalue.valuation.ads import ads
    from fedvalue.valuation.game import CoalitionGame
    from fedvalue.valuation.loo import loo
    from fedvalue.valuation.round_game import fedavg_round_game, value_round
    from fedvalue.valuation.settings import AdsSettings

    model, x, y, start, clients, weights = _setup(num_clients)
    ids = list(range(num_clients))
    baseline = _max_rss_mb()
    started = time.perf_counter()
    if way == "naive":
        game = CoalitionGame(_naive_utility(model, x, y, clients, weights), ids)
        ads_values = ads(game, [ids], method="exact").values.to_numpy()
        loo_values = loo(game, ids).values.to_numpy()
        evaluations = game.num_evaluations
    elif way == "mc-no-cache":
        naive = _naive_utility(model, x, y, clients, weights)

        def v(coalition) -> float:
            return naive(frozenset(int(k) for k in coalition))

        rng = np.random.default_rng(0)
        totals = np.zeros(num_clients)
        evaluations = 0
        empty = v(())
        evaluations += 1
        for _ in range(permutations):
            order = rng.permutation(num_clients)
            previous = empty
            for j in range(num_clients):
                current = v(order[: j + 1])
                evaluations += 1
                totals[order[j]] += current - previous
                previous = current
        ads_values = totals / permutations
        full = v(ids)
        loo_values = np.array([full - v([c for c in ids if c != k]) for k in ids])
        evaluations += num_clients + 1
    elif way == "tail-matmuls":
        ads_values, loo_values, evaluations = _tail_matmuls(num_clients, model, x)
    else:
        utility = TorchModelUtility(model, x, y)
        game = fedavg_round_game(ids, start, clients, weights, utility)
        valuation = value_round(game, ("ads", "loo"), AdsSettings(method="exact"))
        ads_values = valuation.results["ads"].values.to_numpy()
        loo_values = valuation.results["loo"].values.to_numpy()
        evaluations = game.num_evaluations
    seconds = time.perf_counter() - started
    return {
        "n": num_clients, "way": way, "seconds": seconds, "evaluations": evaluations,
        "ads": ads_values.tolist(), "loo": loo_values.tolist(),
        "peak_mb": _max_rss_mb(), "setup_mb": baseline, "threads": torch.get_num_threads(),
    }


def _tail_matmuls(num_clients: int, model, x) -> tuple[np.ndarray, np.ndarray, int]:
    """The floor of (c): only the matmuls after the first layer (200x200 and 200x10, with
    bias), for each of the 2^n states and each held-out batch, in the shapes and batches
    (c) runs them (each batch walked ``LinearStates.block_rows`` rows at a time, as the
    factored path of exact enumeration does), on fixed inputs and weights. No first-layer
    combination, activations, scoring, ADS or LOO: what is left of (c) once everything
    but this arithmetic is free."""
    import torch

    from fedvalue.scoring._scoring import scoring
    from fedvalue.scoring.linear import LinearStates
    from fedvalue.scoring.torch_utilities import TorchModelUtility

    batch_size = inspect.signature(TorchModelUtility).parameters["batch_size"].default
    block = LinearStates.block_rows
    generator = torch.Generator().manual_seed(0)
    layers = [m for m in model if isinstance(m, torch.nn.Linear)][1:]
    weights = [torch.randn(m.out_features, m.in_features, generator=generator) * 0.07 for m in layers]
    biases = [torch.randn(m.out_features, generator=generator) for m in layers]
    batches = [len(x[i : i + batch_size][j : j + block])
               for i in range(0, len(x), batch_size) for j in range(0, min(batch_size, len(x) - i), block)]
    hidden = torch.rand(batches[0], layers[0].in_features, generator=generator)
    outputs = [torch.empty(batches[0], m.out_features) for m in layers]
    with scoring():
        for _ in range(2**num_clients):
            for rows in batches:
                h = hidden[:rows]
                for weight, bias, out in zip(weights, biases, outputs):
                    h = torch.addmm(bias, h, weight.t(), out=out[:rows])
    return np.zeros(num_clients), np.zeros(num_clients), 2**num_clients


# --- the CNN: the fast path against the plain one and its floor, on real Fashion-MNIST rounds --------

CNN_HELD_OUT = 2_000


def _setup_cnn(num_clients: int, seed: int = 0):
    """A real FedAvg round of the CNN on Fashion-MNIST with ``CNN_HELD_OUT`` held-out test
    images (``bench/large_rounds.py``'s ``real_round``: a mid-training start, clients with 120
    images each, half noisy, trained locally; cached per n)."""
    from bench.large_rounds import real_round

    return real_round("cnn", num_clients, CNN_HELD_OUT, seed)


def _one_cnn(num_clients: int, way: str, threads: int = 0) -> dict:
    """One (n, way) of the CNN benchmark in this process: ``plain`` (every coalition's state
    built by FedAvg's rule and run whole), ``fedvalue`` (the first convolution's outputs once
    per client, combined per coalition) or ``floor`` (only the layers after the first
    convolution, 2^n times per held-out batch, on fixed inputs and weights)."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    from fedvalue.scoring._scoring import scoring
    from fedvalue.scoring.torch_utilities import TorchModelUtility
    from fedvalue.valuation.round_game import (
        fedavg_aggregator,
        fedavg_round_game,
        round_game,
        value_round,
    )
    from fedvalue.valuation.settings import AdsSettings

    model, x, y, start, clients, weights = _setup_cnn(num_clients)
    ids = list(range(num_clients))
    utility = TorchModelUtility(model, x, y)
    baseline = _max_rss_mb()
    started = time.perf_counter()
    ads_values = loo_values = np.zeros(num_clients)
    if way == "floor":
        split = utility.first_linear
        tail = split.tail
        with scoring():
            inputs = [split.prefix(utility.x[utility.batch_rows(b)]) for b in range(utility.num_batches)]
            hidden = [model[1](x_b) for x_b in inputs]  # the first convolution, once: not timed below
            started = time.perf_counter()
            for _ in range(2**num_clients):
                for h in hidden:
                    tail(h)
        evaluations = 2**num_clients
    else:
        game = (fedavg_round_game(ids, start, clients, weights, utility) if way == "fedvalue" else
                round_game(ids, start, fedavg_aggregator(ids, clients, weights), utility))
        valuation = value_round(game, ("ads", "loo"), AdsSettings(method="exact"))
        ads_values = valuation.results["ads"].values.to_numpy()
        loo_values = valuation.results["loo"].values.to_numpy()
        evaluations = game.num_evaluations
    return {"n": num_clients, "way": way, "seconds": time.perf_counter() - started, "evaluations": evaluations,
            "ads": ads_values.tolist(), "loo": loo_values.tolist(), "peak_mb": _max_rss_mb(), "setup_mb": baseline,
            "threads": torch.get_num_threads()}


def _cnn(sizes: list[int], repeats: int, threads: int) -> int:
    """Plain, fast and floor for the CNN, each (n, way) in a fresh child, alternating."""
    print(f"exact within-round ADS + LOO per round; LeNet-style CNN (conv 1-6, conv 6-16, 784-120-84-10) on "
          f"Fashion-MNIST, {CNN_HELD_OUT:,} held-out test images, accuracy; {repeats} run(s) each, median shown")
    print(f"torch threads per child: {threads or 'default'}; load average before: {_load()}", flush=True)
    print(f"{'n':>3} {'plain s':>9} {'fast s':>8} {'plain/fast':>11} {'floor s':>8} {'fast/floor':>11} "
          f"{'evals':>6} {'peak MB plain/fast':>19} {'max|plain-fast|':>16}")
    for n in sizes:
        runs: dict[str, list[dict]] = {"plain": [], "fedvalue": [], "floor": []}
        for _ in range(repeats):
            for way in runs:
                runs[way].append(_child(n, f"cnn-{way}", 0, threads))
        seconds = {way: float(np.median([r["seconds"] for r in records])) for way, records in runs.items()}
        plain, fast = runs["plain"][0], runs["fedvalue"][0]
        gap = max(float(np.max(np.abs(np.subtract(plain[k], fast[k])))) for k in ("ads", "loo"))
        print(f"{n:>3} {seconds['plain']:>9.2f} {seconds['fedvalue']:>8.2f} "
              f"{seconds['plain'] / seconds['fedvalue']:>11.2f} {seconds['floor']:>8.2f} "
              f"{seconds['fedvalue'] / seconds['floor']:>11.2f} {fast['evaluations']:>6} "
              f"{plain['peak_mb']:>9.0f}/{fast['peak_mb']:<9.0f} {gap:>16.1e}", flush=True)
    print(f"load average after: {_load()}")
    return 0


def _max_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


#: What a ``--before`` revision's tree must hold for its own ``--one`` to time its own code.
BEFORE_LAYOUT = ("bench/valuation.py", "fedvalue/scoring/linear.py")


def _child(num_clients: int, way: str, permutations: int, threads: int, tree: str | None = None) -> dict:
    """One (n, way) in a fresh process; ``tree``: a checkout whose own bench and code run instead."""
    from bench.large_rounds import json_from_child

    return json_from_child([sys.executable, "-m", "bench.valuation", "--one", str(num_clients), way, "--permutations",
                            str(permutations), "--threads", str(threads)], cwd=tree)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[6, 8, 10], help="clients per round")
    parser.add_argument("--permutations", type=int, default=200, help="permutations of way (b)")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each (n, way); the minimum is shown")
    parser.add_argument("--threads", type=int, default=0, help="torch threads per child (0: torch's default)")
    parser.add_argument("--against-floor", action="store_true",
                        help="only (c) and (d), alternating, every run printed (spread on a noisy machine)")
    parser.add_argument("--before", metavar="REV",
                        help="with --against-floor: also (c) as of git revision REV, in the same alternation")
    parser.add_argument("--model", choices=("mlp", "cnn"), default="mlp",
                        help="cnn: the LeNet-style CNN on Fashion-MNIST, plain against fast against floor")
    parser.add_argument("--spread", action="store_true",
                        help="identical rounds under each thread setting, with and without extra load")
    parser.add_argument("--loads", type=int, nargs="+", default=[0, 2],
                        help="with --spread: extra busy processes (default: 0 and 2)")
    parser.add_argument("--one", nargs=2, metavar=("N", "WAY"), help=argparse.SUPPRESS)
    parser.add_argument("--spread-child", nargs=2, type=int, help=argparse.SUPPRESS)
    parser.add_argument("--busy", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--keep", type=Path, metavar="FILE",
                        help="also keep what is printed in FILE, headed by the command and commit (a results file)")
    args = parser.parse_args(argv)
    with kept_output(args.keep, "python -m bench.valuation " + " ".join(sys.argv[1:] if argv is None else argv)):
        if args.busy:
            _busy(args.busy)
            return 0
        if args.spread_child:
            print(json.dumps(_spread_round(*args.spread_child)))
            return 0
        if args.spread:
            return _spread(args.repeats if args.repeats > 1 else 5, args.loads)
        if args.one and args.one[1].startswith("cnn-"):
            print(json.dumps(_one_cnn(int(args.one[0]), args.one[1].removeprefix("cnn-"), args.threads)))
            return 0
        if args.model == "cnn":
            return _cnn(args.sizes if args.sizes != [6, 8, 10] else [6, 8], args.repeats, args.threads)
        if args.one:
            record = _one(int(args.one[0]), args.one[1], args.permutations, args.threads)
            print(json.dumps(record))
            return 0
        if args.against_floor:
            if args.before is None:
                return _against_floor(args.sizes, args.repeats, args.threads)
            with tempfile.TemporaryDirectory() as tree:
                root = __import__("pathlib").Path(__file__).resolve().parents[1]
                archive = subprocess.run(["git", "-C", str(root), "archive", args.before], capture_output=True, check=False)
                if archive.returncode != 0:
                    parser.error(f"--before: expected a git revision of this repository; got {args.before!r} "
                                 f"({archive.stderr.decode().strip()})")
                subprocess.run(["tar", "-x", "-C", tree], input=archive.stdout, check=True)
                missing = [name for name in BEFORE_LAYOUT if not (Path(tree) / name).exists()]
                if missing:  # its own --one would not run, or would run this script on its older code
                    parser.error(f"--before: expected a revision laid out as this one ({', '.join(BEFORE_LAYOUT)}); "
                                 f"got {args.before!r}, whose tree lacks {', '.join(missing)}")
                return _against_floor(args.sizes, args.repeats, args.threads, (args.before, tree))

        ways = ("naive", "mc-no-cache", "fedvalue", "tail-matmuls")
        print(f"exact within-round ADS + LOO per round; MLP 784-{'-'.join(map(str, HIDDEN))}-10, "
              f"{NUM_HELD_OUT:,} held-out examples, accuracy; {args.repeats} run(s) each, minimum shown")
        print(f"torch threads per child: {args.threads or 'default'}; load average before: {_load()}", flush=True)
        header = (f"{'n':>3} {'(a) naive s':>12} {'(b) MC-200 s':>13} {'(c) ours s':>11} {'(a)/(c)':>8} "
                  f"{'(b)/(c)':>8} {'evals a/b/c':>16} {'peak MB a/b/c':>17} {'growth MB c':>12} "
                  f"{'max|a-c|':>9} {'MC err b':>9} {'(d) floor s':>12} {'(c)/(d)':>8}")
        print(header)
        for n in args.sizes:
            best: dict[str, dict] = {}
            for _ in range(args.repeats):
                for way in ways:
                    record = _child(n, way, args.permutations, args.threads)
                    if way not in best or record["seconds"] < best[way]["seconds"]:
                        best[way] = record
            a, b, c, d = (best[w] for w in ways)
            exact_gap = max(float(np.max(np.abs(np.subtract(a[k], c[k])))) for k in ("ads", "loo"))
            mc_error = float(np.max(np.abs(np.subtract(b["ads"], c["ads"]))))
            print(f"{n:>3} {a['seconds']:>12.2f} {b['seconds']:>13.2f} {c['seconds']:>11.2f} "
                  f"{a['seconds'] / c['seconds']:>8.1f} {b['seconds'] / c['seconds']:>8.1f} "
                  f"{a['evaluations']:>5}/{b['evaluations']:>4}/{c['evaluations']:>5} "
                  f"{a['peak_mb']:>5.0f}/{b['peak_mb']:>5.0f}/{c['peak_mb']:>5.0f} "
                  f"{c['peak_mb'] - c['setup_mb']:>12.0f} {exact_gap:>9.1e} {mc_error:>9.1e} "
                  f"{d['seconds']:>12.2f} {c['seconds'] / d['seconds']:>8.2f}", flush=True)
            if not math.isfinite(exact_gap) or exact_gap > 1e-6:
                print(f"    values of (a) and (c) differ by {exact_gap:.2e} > 1e-6", flush=True)
        print(f"threads used: {c['threads']}; load average after: {_load()}")
        return 0


def _against_floor(sizes: list[int], repeats: int, threads: int, before: tuple[str, str] | None = None) -> int:
    """(c) and (d) alternating, ``repeats`` pairs per n, each pair and the medians printed;
    with ``before`` = (revision, its tree), (c) of that revision too, in the same alternation,
    with its values checked equal to ours."""
    print(f"(c) ours against (d) its matmuls alone{f', and (c) as of {before[0]}' if before else ''}; "
          f"{repeats} alternating run(s) per n; torch threads: {threads or 'default'}; "
          f"load average before: {_load()}", flush=True)
    extra = f" {'(c) before s':>13} {'before/(d)':>11} {'values':>7}" if before else ""
    print(f"{'n':>3} {'pair':>4} {'(c) ours s':>11} {'(d) floor s':>12} {'(c)/(d)':>8} {'peak MB c':>10}{extra}")
    for n in sizes:
        ours, floor, old = [], [], []
        for pair in range(repeats):
            c = _child(n, "fedvalue", 0, threads)
            d = _child(n, "tail-matmuls", 0, threads)
            ours.append(c["seconds"])
            floor.append(d["seconds"])
            line = (f"{n:>3} {pair + 1:>4} {c['seconds']:>11.2f} {d['seconds']:>12.2f} "
                    f"{c['seconds'] / d['seconds']:>8.2f} {c['peak_mb']:>10.0f}")
            if before:
                b = _child(n, "fedvalue", 0, threads, before[1])
                old.append(b["seconds"])
                same = all(np.array_equal(b[k], c[k]) for k in ("ads", "loo"))
                line += f" {b['seconds']:>13.2f} {b['seconds'] / d['seconds']:>11.2f} {'equal' if same else 'DIFFER':>7}"
            print(line, flush=True)
        line = (f"{n:>3} {'med':>4} {np.median(ours):>11.2f} {np.median(floor):>12.2f} "
                f"{np.median(np.divide(ours, floor)):>8.2f}")
        if before:
            line += f" {'':>10} {np.median(old):>13.2f} {np.median(np.divide(old, floor)):>11.2f}"
        print(line, flush=True)
    print(f"load average after: {_load()}")
    return 0


# --- the spread of identical rounds: OpenMP threads on a loaded machine -----------------------

SPREAD_SETTINGS = {  # name -> (torch threads, environment)
    "2 threads, OpenMP default": (2, {}),
    "2 threads, OMP_WAIT_POLICY=PASSIVE": (2, {"OMP_WAIT_POLICY": "PASSIVE"}),
    "1 thread": (1, {}),
}


def _spread_round(threads: int, repeats: int) -> list[float]:
    """Seconds of ``repeats`` identical rounds: exact ADS + LOO of 10 clients (1,024 coalitions)
    on the digits main job's utility (MLP 64-200-200-10, 450 held-out images), clients around
    its initial state, each round on a fresh round game (nothing cached)."""
    import torch

    torch.set_num_threads(threads)
    from fedvalue.valuation.round_game import fedavg_round_game, value_round
    from fedvalue.valuation.settings import AdsSettings
    from simulations.experiments.noisy_clients.noisy_clients import (
        NoisyClientsConfig,
        build,
    )

    _, _, utility, _ = build(NoisyClientsConfig())
    rng = np.random.default_rng(0)
    start = {k: v.numpy().copy() for k, v in utility.model.state_dict().items()}
    clients = [{k: (v + 0.05 * rng.standard_normal(v.shape)).astype(v.dtype) for k, v in start.items()}
               for _ in range(10)]
    seconds = []
    for _ in range(repeats):
        began = time.perf_counter()
        value_round(fedavg_round_game(list(range(10)), start, clients, list(range(1, 11)), utility), ("ads", "loo"),
                    AdsSettings(method="exact"))
        seconds.append(time.perf_counter() - began)
    return seconds


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _spread(repeats: int, loads: list[int]) -> int:
    """Each setting in a fresh child (OpenMP reads its environment at start), ``repeats``
    rounds each, alternating settings, with ``load`` extra busy processes started and
    stopped by this script (by PID) around each child."""
    import os

    print(f"identical rounds (exact ADS + LOO, 10 clients, 1,024 coalitions; digits MLP, 450 held-out), "
          f"{repeats} per child; load average before: {_load()}", flush=True)
    print(f"{'extra busy processes':>20}  {'setting':<36} {'min s':>7} {'median s':>9} {'max s':>7}")
    for load in loads:
        results: dict[str, list[float]] = {name: [] for name in SPREAD_SETTINGS}
        for _ in range(2):  # two alternations of the settings
            for name, (threads, env) in SPREAD_SETTINGS.items():
                burners = [subprocess.Popen([sys.executable, "-m", "bench.valuation", "--busy", "600"]) for _ in range(load)]
                try:
                    command = [sys.executable, "-m", "bench.valuation", "--spread-child", str(threads), str(repeats)]
                    done = subprocess.run(command, capture_output=True, text=True, check=False,
                                          env={**os.environ, **env})
                finally:
                    for burner in burners:  # stopped by their own PIDs
                        burner.kill()
                        burner.wait()
                if done.returncode != 0:
                    raise RuntimeError(done.stderr[-3000:])
                results[name] += json.loads(done.stdout.strip().splitlines()[-1])
        for name, seconds in results.items():
            print(f"{load:>20}  {name:<36} {min(seconds):>7.2f} {np.median(seconds):>9.2f} {max(seconds):>7.2f}",
                  flush=True)
    print(f"load average after: {_load()}")
    return 0


def _load() -> str:
    import os

    return " ".join(f"{v:.2f}" for v in os.getloadavg())


if __name__ == "__main__":
    raise SystemExit(main())
