"""Where the time of the noisy-clients study goes, and what the engine costs on top.

    python -m bench.study                # 20 seeds (about 15 minutes on 2 cores: 10 engine, 5 bare)
    python -m bench.study --seeds 4
    python -m bench.study --seeds 20 --study-dir ~/fedvalue-runs/study   # reuse a finished study's engine timings

Runs, one after the other in this process:

1. the study through Flower and Ray (``simulations.experiments.noisy_clients.study.run_study``: one engine for
   every seed), timing the rounds, the valuation inside them, and the rest (engine
   start and stop, partition queries, ledger writes);
2. the same computation with no engine: the same clients trained by the same
   ``clients.app.train_client`` with the same seeds, the same valuation
   (``fedavg_round_game`` + ``value_round``) and the same top-k retrains, in one process.

Prints where the engine run's time goes (engine start and stop, waiting for training
replies split into the clients' handlers and the messaging around them, the partition
queries, the server's valuation and books), the same for the bare arithmetic, the ratio
of the engine's wall time to the bare arithmetic's, and whether both produced the same
accuracies (they do, to the bit: the bare side uses one torch thread, as the engine's
Ray clients and the study's server process do). The clients' handler times come from a
client mod writing each ``train`` handler's duration to a file (``--study-dir`` runs
have none).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from bench import kept_output
from clients.app import train_client
from fedvalue.analysis.top_k_selection import top_k
from fedvalue.valuation.round_game import fedavg_round_game, value_round, weighted_mean
from simulations.experiments.noisy_clients.noisy_clients import build
from simulations.experiments.noisy_clients.study import (
    RANKINGS,
    NoisyClientsStudyConfig,
    _base,
    run_study,
)
from simulations.runner.engine import torch_threads
from strategies.policies.sampling import PartitionSampler


def _timed_training(log_path: str, message, context, call_next):
    """Client mod: append ``pid seconds`` of the ``train`` handler to ``log_path``."""
    started = time.perf_counter()
    reply = call_next(message, context)
    with open(log_path, "a") as log:
        log.write(f"{os.getpid()} {time.perf_counter() - started:.6f}\n")
    return reply


def handler_seconds(log_path: Path) -> tuple[float, float, int]:
    """Seconds of the clients' training handlers: warm-up (each actor's first: imports,
    data), the rest, and the number of actors."""
    first: dict[str, float] = {}
    rest = 0.0
    for line in log_path.read_text().splitlines() if log_path.exists() else []:
        pid, seconds = line.split()
        if pid in first:
            rest += float(seconds)
        else:
            first[pid] = float(seconds)
    return sum(first.values()), rest, len(first)


def bare_study(config: NoisyClientsStudyConfig) -> tuple[dict, pd.DataFrame]:
    """The study's arithmetic without Flower or Ray.

    Returns seconds of training and valuation, and the accuracy per (seed, method, k,
    round) in the layout of the study's ``accuracy.csv`` (to check it is the same computation).
    """
    with torch_threads(1):  # as the engine's clients (Ray: one CPU each) and its server (study.py)
        return _bare_study(config)


def _bare_study(config: NoisyClientsStudyConfig) -> tuple[dict, pd.DataFrame]:
    seconds = {"training": 0.0, "valuation": 0.0}
    rows: list[dict] = []
    for seed in range(config.seed, config.seed + config.seeds):
        sampler = PartitionSampler(config.clients_per_round, schedule=config.schedule, seed=seed)
        schedule = {t: sampler.sample(t, list(range(config.num_clients))) for t in range(1, config.rounds + 1)}

        def round_replies(train, loader, state, server_round):
            started = time.perf_counter()
            replies = {c: train(loader(c), global_arrays=state, server_round=server_round) for c in schedule[server_round]}
            seconds["training"] += time.perf_counter() - started
            return replies

        def scored_run(clean: bool, method_name: str):
            """A run with every sampled client aggregated and valued by ADS and LOO."""
            loader, model_factory, utility, _ = build(_base(config, seed, clean=clean))
            train = functools.partial(train_client, model_factory=model_factory, learning_rate=config.learning_rate,
                                      local_epochs=config.local_epochs, batch_size=config.batch_size, seed=seed)
            state = {k: v.detach().numpy() for k, v in model_factory().state_dict().items()}
            scores = {}
            for t in range(1, config.rounds + 1):
                replies = round_replies(train, loader, state, t)
                ids = list(replies)
                started = time.perf_counter()
                valuation = value_round(fedavg_round_game(ids, state, [replies[c][0] for c in ids],
                                                          [replies[c][1] for c in ids], utility), ("ads", "loo"))
                seconds["valuation"] += time.perf_counter() - started
                scores[t] = {m: valuation.results[m].values.to_dict() for m in ("ads", "loo")}
                state = weighted_mean([replies[c][0] for c in ids], [replies[c][1] for c in ids])
                rows.append({"seed": seed, "method": method_name, "k": config.clients_per_round, "round": t,
                             "accuracy": float(utility(state))})
            return scores, loader, train, model_factory, utility

        if config.clean_runs:
            scored_run(True, "clean")
        scores, loader, train, model_factory, utility = scored_run(False, "all")
        initial = {k: v.detach().numpy() for k, v in model_factory().state_dict().items()}
        for k in config.ks:  # the retrains
            for ranking in RANKINGS:
                state = initial
                for t in range(1, config.rounds + 1):
                    replies = round_replies(train, loader, state, t)
                    ids = list(replies)
                    if ranking == "random":
                        rng = np.random.default_rng([seed, t, 99])
                        chosen = sorted(rng.choice(ids, size=min(k, len(ids)), replace=False).tolist())
                    else:
                        chosen = top_k(scores[t][ranking], k, ids)
                    chosen = [c for c in ids if c in set(chosen)]
                    state = weighted_mean([replies[c][0] for c in chosen], [replies[c][1] for c in chosen])
                    rows.append({"seed": seed, "method": ranking, "k": k, "round": t,
                                 "accuracy": float(utility(state))})  # the retrain books its accuracy
    return seconds, pd.DataFrame(rows)


def _finished_study(study_dir: Path, config: NoisyClientsStudyConfig) -> tuple[float, dict]:
    """Timings and accuracies of a study run with ``config``'s settings (its engine wall time
    is ``timings.json``'s total: engine start to stop, without the output tables and figure)."""
    saved = json.loads((study_dir / "run.json").read_text())
    for name, value in config.as_dict().items():  # as run.json has them, the engine settings flat
        if json.loads(json.dumps(value)) != saved.get(name):
            raise ValueError(f"study_dir: expected a study with {name}={value!r} (the default settings and "
                             f"--seeds {config.seeds}); {study_dir} has {saved.get(name)!r}.")
    timings = json.loads((study_dir / "timings.json").read_text())
    return float(timings["total"]), {"timings": timings, "accuracy": pd.read_csv(study_dir / "accuracy.csv")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--study-dir", metavar="DIR",
                        help="take the engine's side from a study already run with `fedvalue run "
                             "noisy-clients-study --seeds N --out DIR` (default settings) instead of running it again")
    parser.add_argument("--keep", type=Path, metavar="FILE",
                        help="also keep what is printed in FILE, headed by the command and commit (a results file)")
    args = parser.parse_args(argv)
    with kept_output(args.keep, "python -m bench.study " + " ".join(sys.argv[1:] if argv is None else argv)):
        config = NoisyClientsStudyConfig(seeds=args.seeds)

        handlers = None
        if args.study_dir:
            engine_total, result = _finished_study(Path(args.study_dir), config)
        else:
            with tempfile.TemporaryDirectory() as out:
                log_path = Path(out) / "handlers.txt"
                started = time.perf_counter()
                result = run_study(config, str(Path(out) / "study"),
                                   client_mods=[functools.partial(_timed_training, str(log_path))])
                engine_total = time.perf_counter() - started
                handlers = handler_seconds(log_path)
        timings = result["timings"]
        started = time.perf_counter()
        bare, bare_accuracy = bare_study(config)
        bare_total = time.perf_counter() - started
        keys = ["seed", "method", "k", "round"]
        both = result["accuracy"].merge(bare_accuracy, on=keys, suffixes=("_engine", "_bare"), validate="one_to_one")
        if len(both) != len(bare_accuracy) or len(both) != len(result["accuracy"]):
            raise RuntimeError(f"bare_study: expected the engine's {len(result['accuracy'])} accuracy rows; "
                               f"matched {len(both)} of the bare run's {len(bare_accuracy)}.")
        gap = (both["accuracy_engine"] - both["accuracy_bare"]).abs()

        print(f"noisy-clients study, {args.seeds} seeds, {timings['runs']} runs of {config.rounds} rounds")
        print(f"{'':44}{'seconds':>10}{'share':>8}")

        def row(label: str, seconds: float, share: bool = True) -> None:
            print(f"{label:44}{seconds:>10.1f}" + (f"{seconds / engine_total:>8.0%}" if share else ""))

        row("engine run, total", engine_total)
        if handlers is not None:  # run here: its tables and figure are written within engine_total
            row("  output tables and figure", engine_total - timings["total"])
        row("  engine start/stop, between runs", timings["total"] - timings["rounds"] if handlers is not None
            else engine_total - timings["rounds"])
        waiting, messages = timings.get("waiting", {}), timings.get("messages", {})
        if waiting:  # studies run before the grid counted its messages have the total only
            train_wait, query_wait = waiting.get("train", 0.0), waiting.get("query", 0.0)
            row(f"  rounds: waiting for {messages.get('train', 0)} training replies", train_wait)
            if handlers is not None:
                warm_up, handled, actors = handlers
                row(f"    client warm-up (imports, data; {actors} actors)", warm_up / actors)
                row(f"    client training handlers (sum / {actors} actors)", handled / actors)
                row("    messaging, the rest", train_wait - (warm_up + handled) / actors)
            row(f"  rounds: {messages.get('query', 0)} partition-id queries (actor start)", query_wait)
            row("  rounds: server valuation", timings["valuation"])
            row("  rounds: server books (records, ledger, seals)",
                timings["rounds"] - train_wait - query_wait - timings["valuation"])
        else:
            row("  rounds: training + messaging + books", timings["rounds"] - timings["valuation"])
            row("  rounds: server valuation", timings["valuation"])
        row("bare arithmetic, total", bare_total, share=False)
        row("  training", bare["training"], share=False)
        row("  valuation", bare["valuation"], share=False)
        row("  data, models, state accuracies", bare_total - bare["training"] - bare["valuation"], share=False)
        print(f"engine / bare wall time: {engine_total / bare_total:.2f}   (bare: one process, one torch thread; "
              f"engine: {os.cpu_count()} cores, clients in Ray workers)")
        print(f"same computation: {int((gap < 1e-9).sum())} of {len(gap)} (seed, method, k, round) accuracies equal, "
              f"largest difference {gap.max():.4f}")
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
