"""Where the time of the noisy-clients study goes, and what the engine costs on top.

    python bench/study.py                # 20 seeds (about 10 minutes on 2 cores)
    python bench/study.py --seeds 4

Runs, one after the other in this process:

1. the study through Flower and Ray (``simulations.study.run_study``: one engine for
   every seed), timing the rounds, the valuation inside them, and the rest (engine
   start and stop, partition queries, ledger writes);
2. the same computation with no engine: the same clients trained by the same
   ``clients.app.train_client`` with the same seeds, the same valuation
   (``fedavg_round_game`` + ``value_round``) and the same top-k retrains, in one process.

Prints the shares of training, valuation and engine overhead, and the ratio of the
engine's wall time to the bare arithmetic's.
"""

from __future__ import annotations

import argparse
import functools
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from clients.app import train_client  # noqa: E402
from fedvalue.rounds import fedavg_round_game, value_round, weighted_mean  # noqa: E402
from fedvalue.selection import top_k  # noqa: E402
from simulations.noisy_clients import build  # noqa: E402
from simulations.study import RANKINGS, NoisyClientsStudyConfig, _base, run_study  # noqa: E402
from strategies.sampling import PartitionSampler  # noqa: E402


def bare_study(config: NoisyClientsStudyConfig) -> dict:
    """The study's arithmetic without Flower or Ray: returns seconds of training and valuation."""
    seconds = {"training": 0.0, "valuation": 0.0}
    for seed in range(config.first_seed, config.first_seed + config.seeds):
        base = _base(config, seed)
        loader, model_factory, utility, _ = build(base)
        initial = {k: v.detach().numpy() for k, v in model_factory().state_dict().items()}
        sampler = PartitionSampler(config.clients_per_round, schedule=config.schedule, seed=seed)
        schedule = {t: sampler.sample(t, list(range(config.num_clients))) for t in range(1, config.rounds + 1)}
        train = functools.partial(train_client, model_factory=model_factory, learning_rate=config.learning_rate,
                                  local_epochs=config.local_epochs, batch_size=config.batch_size, seed=seed)

        def round_replies(state, server_round):
            started = time.perf_counter()
            replies = {c: train(loader(c), global_arrays=state, server_round=server_round) for c in schedule[server_round]}
            seconds["training"] += time.perf_counter() - started
            return replies

        state, accepted = initial, {}
        for t in range(1, config.rounds + 1):  # the scored run
            replies = round_replies(state, t)
            ids = list(replies)
            started = time.perf_counter()
            valuation = value_round(fedavg_round_game(ids, state, [replies[c][0] for c in ids],
                                                      [replies[c][1] for c in ids], utility), ("ads", "loo"))
            seconds["valuation"] += time.perf_counter() - started
            accepted[t] = {m: valuation.results[m].values.to_dict() for m in ("ads", "loo")}
            state = weighted_mean([replies[c][0] for c in ids], [replies[c][1] for c in ids])
        for k in config.ks:  # the retrains
            for ranking in RANKINGS:
                state = initial
                for t in range(1, config.rounds + 1):
                    replies = round_replies(state, t)
                    ids = list(replies)
                    if ranking == "random":
                        rng = np.random.default_rng([seed, t, 99])
                        chosen = sorted(rng.choice(ids, size=min(k, len(ids)), replace=False).tolist())
                    else:
                        chosen = top_k(accepted[t][ranking], k, ids)
                    chosen = [c for c in ids if c in set(chosen)]
                    state = weighted_mean([replies[c][0] for c in chosen], [replies[c][1] for c in chosen])
                    utility(state)  # the retrain books its accuracy
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=20)
    args = parser.parse_args(argv)
    config = NoisyClientsStudyConfig(seeds=args.seeds)

    with tempfile.TemporaryDirectory() as out:
        started = time.perf_counter()
        timings = run_study(config, str(Path(out) / "study"))["timings"]
        engine_total = time.perf_counter() - started
    started = time.perf_counter()
    bare = bare_study(config)
    bare_total = time.perf_counter() - started

    training = timings["rounds"] - timings["valuation"]
    overhead = engine_total - timings["rounds"]
    print(f"noisy-clients study, {args.seeds} seeds, {timings['runs']} runs of {config.rounds} rounds")
    print(f"{'':34}{'seconds':>10}{'share':>8}")
    print(f"{'engine run, total':34}{engine_total:>10.1f}{1:>8.0%}")
    print(f"{'  rounds: training + messaging':34}{training:>10.1f}{training / engine_total:>8.0%}")
    print(f"{'  rounds: valuation':34}{timings['valuation']:>10.1f}{timings['valuation'] / engine_total:>8.0%}")
    print(f"{'  engine start/stop, queries, I/O':34}{overhead:>10.1f}{overhead / engine_total:>8.0%}")
    print(f"{'bare arithmetic, total':34}{bare_total:>10.1f}")
    print(f"{'  training':34}{bare['training']:>10.1f}")
    print(f"{'  valuation':34}{bare['valuation']:>10.1f}")
    print(f"engine / bare wall time: {engine_total / bare_total:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
