"""A large federation end to end: wall time, memory per round, ledger size, reading it back.

    python -m bench.scale                                  # 1,000 clients, 50 a round, 50 rounds, flows
    python -m bench.scale --clients 200 --per-round 20 --rounds 10 --out /tmp/scale
    python -m bench.scale --rounds 3 --projection-dim 2048 --audit   # projected records, then fedvalue audit
    python -m bench.scale --flow-cost --projection-dim 2048           # the server's flows arithmetic, by part
    python -m bench.scale --rounds 3 --no-records --vs-batch 32 --repeats 2   # idle queries: all at once against 32

Fashion-MNIST (Debian's dataset-fashion-mnist): the 60,000 training images split IID
among the clients, each client's share cut 80/20 into a training and an inference split
(TracIn flows need the gradient of every client's inference split at A_{t−1}: with
``flows`` every client, sampled or not, is asked for it every round); the 784-200-200-10
MLP, 5 local full-batch epochs at learning rate 0.05, FedAvg over the round's sampled
clients (seeded, by partition id), accuracy on 1,000 class-balanced test images; each
round valued by ADS + LOO within ``--budget`` coalition evaluations (``auto``: at 50
clients a sampler) and the flows booked. Everything runs through ``simulate()``:
Flower's simulation engine and Ray, real files.

With ``--projection-dim K`` the flows are booked through a seeded random projection to K numbers
(``BookSettings(flows_projection_dim=K)``, :mod:`fedvalue.flows.projected_flows`): a round record then
keeps K float32 numbers per client for its inference gradient instead of its p = 199,210, beside
the sampled clients' full replies that the valuation's audit needs (``--projection-dim 2048``:
1,000 · 2,048 · 4 bytes = 8.2 MB of gradients and 50 · 2,048 · 8 of updates, where the replies
take 50 · 199,210 · 4 bytes = 39.8 MB). ``--audit`` then runs ``fedvalue audit OUT --utility
bench.scale:held_out_utility`` on the run and prints its verdict and seconds.

``--flow-cost`` runs no federation: it times the server's TracIn flows arithmetic of one round of these shapes
(A_{t−1} of the MLP, ``--per-round`` replies, every client's float32 inference gradient, filled with seeded random
numbers) by part, without a projection (:func:`fedvalue.flows.round_flows.fedavg_round_flows`, and its flattening
of the gradients to float64 alone) and with it (:func:`fedvalue.flows.projected_flows.project_round`,
:func:`~fedvalue.flows.projected_flows.projected_round_flows`), and the bytes of the round record each way; each
timing the least of 3.

``--vs-batch B`` runs the configuration as child processes, alternately with the idle clients' gradient queries
all at once and ``B`` at a time (``IntakeSettings(query_batch=B)``), ``--repeats`` pairs, and prints each run's
seconds a round after the first (the first holds the engine's start and the node directory's queries) and wall
time, and the batched runs' seconds a round over the unbatched ones, pair by pair: measured side by side, so that the
machine's load falls on both.

Printed: per round, the wall clock, the valuation's seconds, and the resident memory of
the server process and of its whole process tree (the Ray workers included), so that
memory flat in rounds can be seen; at the end, the run's wall time, peak memory (server,
tree), the run directory's size (ledger, records, seals) and its records per round, and the
seconds of ``load_run`` and of ``fedvalue report`` on it.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from bench import kept_output

ROOT = Path(__file__).resolve().parents[1]


def client_data(partition_id: int, *, num_clients: int, seed: int):
    """Client ``partition_id``'s IID share of the training split, 80% to train, 20% to infer."""
    from clients.app import ClientData

    train = _train_split()
    order = np.random.default_rng(seed).permutation(len(train))
    rows = np.array_split(order, num_clients)[partition_id]
    cut = int(round(0.8 * len(rows)))
    return ClientData(partition_id=partition_id, x_train=train.x[rows[:cut]], y_train=train.y[rows[:cut]],
                      x_infer=train.x[rows[cut:]], y_infer=train.y[rows[cut:]])


@functools.lru_cache(maxsize=1)
def _train_split():
    from simulations.datasets.loaders import load_dataset

    return load_dataset("fashion-mnist", split="train")


def held_out_utility(held_out: int = 1000, seed: int = 0):
    """U: the MLP's accuracy on ``held_out`` class-balanced Fashion-MNIST test images (what the
    run is valued on; ``fedvalue audit --utility bench.scale:held_out_utility`` rebuilds it)."""
    from fedvalue.scoring.torch_utilities import TorchModelUtility
    from simulations.datasets.loaders import load_dataset, sample_per_class

    test = load_dataset("fashion-mnist", split="test")
    held = sample_per_class(test.y, held_out, seed=seed)
    return TorchModelUtility(_model_factory(seed)(), test.x[held], test.y[held])


def _model_factory(seed: int):
    from simulations.datasets.models import make_mlp

    return functools.partial(make_mlp, 784, 10, hidden=(200, 200), seed=seed)


#: The MLP's arrays (784-200-200-10), as make_mlp names them.
SHAPES = {"0.weight": (200, 784), "0.bias": (200,), "2.weight": (200, 200), "2.bias": (200,),
          "4.weight": (10, 200), "4.bias": (10,)}


def synthetic_round(clients: int, trained: int, seed: int = 0):
    """(A_{t−1}, the trained clients' arrays, their weights, every client's gradient), seeded."""
    rng = np.random.default_rng(seed)
    start = {key: (0.05 * rng.standard_normal(shape)).astype(np.float32) for key, shape in SHAPES.items()}
    replies = {c: {key: (v + 0.01 * rng.standard_normal(v.shape)).astype(np.float32) for key, v in start.items()}
               for c in range(trained)}
    weights = {c: float(48 + c % 3) for c in replies}
    gradients = {c: {key: rng.standard_normal(v.shape).astype(np.float32) for key, v in start.items()}
                 for c in range(clients)}
    return start, replies, weights, gradients


def flow_cost(clients: int, trained: int, dim: int, repeats: int = 3) -> int:
    """``--flow-cost`` (module docstring): the flows arithmetic of one synthetic round, by part."""
    from fedvalue.flows.projected_flows import FlowsProjection, project_round, projected_round_flows
    from fedvalue.flows.round_flows import fedavg_round_flows
    from fedvalue.run.archive import RoundRecord, record_bytes
    from fedvalue.run.settings import RoundSettings
    from fedvalue.schema import ClientEntry
    from fedvalue.scoring.projection import flatten

    start, replies, weights, gradients = synthetic_round(clients, trained)
    p, keys = sum(v.size for v in start.values()), list(start)
    projection = FlowsProjection.of_run(dim, 0)
    print(f"{clients} clients, {trained} trained, p = {p:,}, k = {dim} ({projection.kind})")

    def timed(name: str, compute, repeats: int = repeats):
        best, result = None, None
        for _ in range(repeats):
            began = time.perf_counter()
            result = compute()
            seconds = time.perf_counter() - began
            best = seconds if best is None else min(best, seconds)
        print(f"  {name:44s} {best:7.3f} s", flush=True)
        return result

    settings = RoundSettings(methods=("ads",), flows=True)
    full = RoundRecord(round=1, start_arrays=start, replies=replies, accepted=list(replies),
                       entries=[ClientEntry(c, "ok", w, int(w)) for c, w in weights.items()],
                       gradients=gradients, losses={c: 1.0 for c in gradients}, settings=settings)
    print("without a projection")
    timed("flatten every gradient to float64", lambda: [flatten(g, keys=keys) for g in gradients.values()])
    timed("fedavg_round_flows (the flows, whole)", lambda: fedavg_round_flows(start, replies, weights, gradients))
    size = len(timed("record_bytes (every gradient)", lambda: record_bytes(full), repeats=1)) / 2**20
    print(f"  record {size:.1f} MB")
    print("with the projection")
    drawn = projection.for_round(p, 1)
    projected, updates = timed("project_round (gradients and updates)",
                               lambda: project_round(drawn, start, gradients, replies))
    timed("projected_round_flows (the flows)", lambda: projected_round_flows(updates, projected, weights))
    kept = dataclasses.replace(full, gradients={}, projected_gradients=projected, projected_updates=updates,
                               settings=dataclasses.replace(settings, flows_projection=projection.as_json()))
    size = len(timed("record_bytes (projected vectors)", lambda: record_bytes(kept), repeats=1)) / 2**20
    print(f"  record {size:.1f} MB")
    return 0



def _tree_rss_mb(pid: int) -> tuple[float, float]:
    """(resident MB of ``pid``, of ``pid`` and all its descendants)."""
    import psutil

    process = psutil.Process(pid)
    own = process.memory_info().rss
    total = own
    for child in process.children(recursive=True):
        try:
            total += child.memory_info().rss
        except psutil.Error:  # a worker that just exited
            pass
    return own / 2**20, total / 2**20


def _size_mb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 2**20


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--per-round", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--budget", type=int, default=1000, help="coalition evaluations per round (ADS and LOO)")
    parser.add_argument("--held-out", type=int, default=1000)
    parser.add_argument("--no-flows", action="store_true")
    parser.add_argument("--no-records", action="store_true",
                        help="save no round records (with flows a record holds every client's inference gradient: "
                             "0.8 MB per client per round for this MLP)")
    parser.add_argument("--projection-dim", type=int, default=None, metavar="K",
                        help="book the flows through a seeded random projection to K numbers: a record keeps K "
                             "per client instead of 199,210 (BookSettings(flows_projection_dim=K))")
    parser.add_argument("--query-batch", type=int, default=None, metavar="B",
                        help="send the idle clients' gradient queries B at a time (IntakeSettings(query_batch=B); "
                             "default: all at once)")
    parser.add_argument("--vs-batch", type=int, default=None, metavar="B",
                        help="run the configuration alternately with the idle queries all at once and B at a time, "
                             "--repeats pairs, and print the seconds a round of each")
    parser.add_argument("--repeats", type=int, default=2, help="--vs-batch: pairs of runs")
    parser.add_argument("--audit", action="store_true",
                        help="run fedvalue audit on the run afterwards (values recomputed with "
                             "--utility bench.scale:held_out_utility) and print its verdict")
    parser.add_argument("--flow-cost", action="store_true",
                        help="time the server's flows arithmetic of one round by part (no federation) and exit")
    parser.add_argument("--out", default="/tmp/fedvalue-scale")
    parser.add_argument("--json", default=None, help="write the per-round records here")
    parser.add_argument("--keep", type=Path, metavar="FILE",
                        help="also keep what is printed in FILE, headed by the command and commit (a results file)")
    args = parser.parse_args(argv)
    if args.vs_batch is not None and (args.vs_batch < 1 or args.repeats < 1 or args.rounds < 2):
        parser.error(f"--vs-batch, --repeats, --rounds: expected a batch >= 1, repeats >= 1 and rounds >= 2 (a round "
                     f"after the first to time); got {args.vs_batch}, {args.repeats}, {args.rounds}")
    shown = sys.argv[1:] if argv is None else argv
    with kept_output(args.keep, "python -m bench.scale " + " ".join(shown)):
        return _batches_side_by_side(args, shown) if args.vs_batch is not None else _scale(args)


#: Options of a ``--vs-batch`` run its children do not take (each child gets its own output, batch and record).
PARENT_ONLY = {"--vs-batch": 1, "--repeats": 1, "--keep": 1, "--json": 1, "--query-batch": 1, "--out": 1, "--audit": 0}


def child_options(shown: list[str]) -> list[str]:
    """``shown`` without the options of :data:`PARENT_ONLY` (and their values, given apart or after "=")."""
    kept, items = [], iter(shown)
    for item in items:
        name = item.split("=")[0]
        if name in PARENT_ONLY:
            if "=" not in item:
                for _ in range(PARENT_ONLY[name]):
                    next(items, None)
            continue
        kept.append(item)
    return kept


def _batches_side_by_side(args: argparse.Namespace, shown: list[str]) -> int:
    """``--vs-batch``: the same run as child processes, all at once then batched, ``--repeats`` times."""
    import subprocess
    import tempfile

    base = child_options(shown)
    print(f"{args.clients} clients, {args.per_round} a round, {args.rounds} rounds; idle queries all at once against "
          f"{args.vs_batch} at a time, {args.repeats} pairs; load average "
          f"{' '.join(f'{v:.1f}' for v in os.getloadavg())}", flush=True)
    print(f"{'pair':>4}  {'queries':>9}  {'s a round (rounds 2+)':>22}  {'wall s':>7}  {'batched / all':>13}")
    ratios = []
    with tempfile.TemporaryDirectory(prefix="scale-vs-batch-") as scratch:
        for pair in range(1, args.repeats + 1):
            per_round = {}
            for batch in (None, args.vs_batch):
                name = "all" if batch is None else str(batch)
                record = Path(scratch) / f"{pair}-{name}.json"
                command = [sys.executable, "-m", "bench.scale", *base, "--out", str(Path(scratch) / name),
                           "--json", str(record), *([] if batch is None else ["--query-batch", str(batch)])]
                done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
                if done.returncode != 0 or not record.exists():
                    print(f"pair {pair}, queries {name}: the run failed (exit {done.returncode}):\n"
                          + done.stderr[-2000:])
                    return 1
                measured = json.loads(record.read_text())
                elapsed = [r["elapsed_s"] for r in measured["rounds"]]
                per_round[name] = (elapsed[-1] - elapsed[0]) / (len(elapsed) - 1)
                ratio = "" if batch is None else f"{per_round[name] / per_round['all']:13.3f}"
                print(f"{pair:>4}  {name:>9}  {per_round[name]:22.1f}  {measured['wall_s']:7.0f}  {ratio}".rstrip(),
                      flush=True)
            ratios.append(per_round[str(args.vs_batch)] / per_round["all"])
    print(f"batched / all, seconds a round: median {np.median(ratios):.3f}, min {min(ratios):.3f}, "
          f"max {max(ratios):.3f} over {len(ratios)} pairs")
    return 0


def _scale(args: argparse.Namespace) -> int:
    """The run (or, with ``--flow-cost``, the flows arithmetic alone) of :func:`main`'s parsed options."""
    if args.flow_cost:
        return flow_cost(args.clients, args.per_round, args.projection_dim or 2048)

    import subprocess

    import simulations  # noqa: F401 - sets OMP_WAIT_POLICY before torch loads, as the CLI does
    from flwr.serverapp.strategy import FedAvg

    from fedvalue.analysis.run_summary import load_run
    from fedvalue.valuation.settings import AdsSettings, ValuationSettings
    from fedvalue.run.settings import RunSettings
    from fedvalue.schema import RoundRow
    from simulations.runner.api import simulate
    from strategies import BookSettings, IntakeSettings, PartitionSampler, RunCallbacks, train_config

    seed = 0
    books = BookSettings(flows=not args.no_flows, flows_projection_dim=args.projection_dim)  # refuses a bad K first
    model_factory = _model_factory(seed)
    utility = held_out_utility(args.held_out, seed)
    # The loader travels to Ray's workers by reference to this module (its cache must stay
    # there): they find it on the PYTHONPATH they inherit.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    from bench import scale

    loader = functools.partial(scale.client_data, num_clients=args.clients, seed=seed)
    pid = os.getpid()
    started = time.perf_counter()
    records: list[dict] = []
    peak = [0.0, 0.0]

    def on_round(row: RoundRow) -> None:
        own, tree = _tree_rss_mb(pid)
        peak[0], peak[1] = max(peak[0], own), max(peak[1], tree)
        record = {"round": row.round, "elapsed_s": time.perf_counter() - started,
                  "valuation_s": row.valuation_seconds, "evaluations": row.num_evaluations,
                  "method": row.ads_method, "server_mb": own, "tree_mb": tree}
        records.append(record)
        print(f"round {row.round:>3}: elapsed {record['elapsed_s']:8.1f} s, valuation {row.valuation_seconds:6.1f} s "
              f"({row.num_evaluations} evaluations, {row.ads_method}), server {own:7.0f} MB, tree {tree:7.0f} MB",
              flush=True)

    print(f"{args.clients} clients, {args.per_round} a round, {args.rounds} rounds, flows {not args.no_flows}, "
          f"projection {args.projection_dim or 'none'}, records {not args.no_records}, budget {args.budget}, "
          f"query batch {args.query_batch or 'all'}; load "
          f"average {' '.join(f'{v:.1f}' for v in os.getloadavg())}", flush=True)
    run = simulate(
        strategy=FedAvg(fraction_evaluate=0.0), model_factory=model_factory, load_client_data=loader,
        num_clients=args.clients, num_rounds=args.rounds, utility=utility, out=args.out, overwrite=True,
        train_config=train_config(learning_rate=0.05, local_epochs=5, batch_size=0, seed=seed),
        sampler=PartitionSampler(args.per_round, schedule="random", seed=seed), seed=seed,
        valuation=ValuationSettings(ads=AdsSettings(budget=args.budget)), books=books,
        intake=IntakeSettings(query_timeout=600.0, query_batch=args.query_batch), run=RunSettings(save_records=not args.no_records),
        callbacks=RunCallbacks(on_round=on_round),
        round_timeout=3600.0,
    )
    wall = time.perf_counter() - started
    out = Path(args.out)
    began = time.perf_counter()
    loaded = load_run(out)
    load_seconds = time.perf_counter() - began
    began = time.perf_counter()
    report = subprocess.run([sys.executable, "-m", "simulations.cli", "report", str(out)], capture_output=True,
                            text=True, check=False, cwd=ROOT)
    report_seconds = time.perf_counter() - began
    first, last = records[0], records[-1]
    middle = records[len(records) // 2]
    print(f"wall time {wall:.0f} s ({wall / args.rounds:.1f} s a round); accuracy {run.rounds['utility_realized'].iloc[-1]:.4f}")
    print(f"peak resident memory: server {peak[0]:.0f} MB, process tree {peak[1]:.0f} MB; server at rounds "
          f"{first['round']}/{middle['round']}/{last['round']}: {first['server_mb']:.0f}/{middle['server_mb']:.0f}/"
          f"{last['server_mb']:.0f} MB (slope {_slope(records)} MB a round)")
    files = {name: (out / name).stat().st_size / 2**20 for name in ("ledger.csv", "ledger.parquet", "rounds.csv")
             if (out / name).exists()}
    records_mb = _size_mb(out / "records") if (out / "records").exists() else 0.0
    print(f"run directory {_size_mb(out):.1f} MB (" + ", ".join(f"{k} {v:.1f} MB" for k, v in files.items())
          + f", records {records_mb:.1f} MB, {records_mb / args.rounds:.1f} MB a round); ledger rows "
          f"{len(loaded.ledger):,}")
    print(f"load_run {load_seconds:.2f} s; fedvalue report {report_seconds:.2f} s (exit {report.returncode})")
    if args.audit:
        _audit(out, args.held_out)
    if args.json:
        Path(args.json).write_text(json.dumps({"rounds": records, "wall_s": wall, "peak_server_mb": peak[0],
                                               "peak_tree_mb": peak[1], "load_run_s": load_seconds,
                                               "report_s": report_seconds, "files_mb": files,
                                               "records_mb": records_mb}, indent=1))
    return 0


def _slope(records: list[dict]) -> str:
    """The server's memory growth a round, fitted over the rounds (none to fit for one round)."""
    if len(records) < 2:
        return "n/a"
    return f"{np.polyfit([r['round'] for r in records], [r['server_mb'] for r in records], 1)[0]:+.2f}"


def _audit(out: Path, held_out: int) -> None:
    """``fedvalue audit OUT --utility bench.scale:held_out_utility``: its verdict and seconds."""
    import subprocess

    if held_out != 1000:
        print("audit: not run (bench.scale:held_out_utility rebuilds the default --held-out 1000 only)")
        return
    began = time.perf_counter()
    audit = subprocess.run([sys.executable, "-m", "simulations.cli", "audit", str(out), "--utility",
                            "bench.scale:held_out_utility"], capture_output=True, text=True, check=False, cwd=ROOT)
    lines = [line for line in audit.stdout.splitlines() if line.strip()]
    shown = [line for line in lines if "recomputed every value" in line or line.startswith(("FAILED", "NOT"))]
    print(f"fedvalue audit {time.perf_counter() - began:.1f} s (exit {audit.returncode}): {lines[-1] if lines else ''}")
    for line in shown[:6] or audit.stderr.splitlines()[-3:]:
        print(f"  {line[:300]}")


if __name__ == "__main__":
    raise SystemExit(main())
