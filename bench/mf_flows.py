"""Cost of the matrix-factorization flows ([RECIP] Remark A.2) on the MovieLens stand-in.

Prints, measured side by side in one process on one 80:20 split of the dslabs ratings
(movies with ≥ 10 ratings): CPU and wall time per full-batch step of

* training alone (``mf_fit``), the cost of gradient descent;
* training with every step's flows per user (``mf_flows``), [RECIP]'s claim being that the
  sparse computation costs the same order as the gradient step;
* the same with the BLAS left at its default thread count (what ``threadpoolctl`` avoids).

    python -m bench.mf_flows [--steps 50] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

from fedvalue.flows import mf_flows as mf
from simulations.experiments.reciprocity.movielens import load_movielens, split_ratings


def _timed(function, repeats: int) -> tuple[float, float]:
    """Median CPU and wall seconds of ``function()`` over ``repeats`` calls."""
    cpu, wall = [], []
    for _ in range(repeats):
        c, w = time.process_time(), time.perf_counter()
        function()
        cpu.append(time.process_time() - c)
        wall.append(time.perf_counter() - w)
    return statistics.median(cpu), statistics.median(wall)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    data = load_movielens(10)
    train, infer = split_ratings(data, 0.8, np.random.default_rng(0))
    training = mf.MfTraining(steps=args.steps)
    common = dict(num_users=data.num_users, num_items=data.num_items, training=training, seed=0)
    sides = mf._Side.of(train, data.num_users, data.num_items), mf._Side.of(infer, data.num_users, data.num_items)
    regs = mf._regularizers(train, data.num_users, data.num_items, training.regularization)
    users, items = mf._initial(data.num_users, data.num_items, training.dimension, training.init_scale, 0)

    def flows_default_threads():  # the step loop of mf_flows without its thread limit
        for _ in range(args.steps):
            mf._step(users, items, *sides, *regs, training.learning_rate)

    threads = max((pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"), default=1)
    rows = [
        ("training alone (mf_fit)", _timed(lambda: mf.mf_fit(train, **common), args.repeats)),
        ("training + flows (mf_flows)", _timed(lambda: mf.mf_flows(train, infer, **common), args.repeats)),
        (f"flows, BLAS at {threads} threads", _timed(flows_default_threads, args.repeats)),
    ]
    with threadpool_limits(1, user_api="blas"):
        rows.append(("flows, BLAS at 1 thread", _timed(flows_default_threads, args.repeats)))
    print(f"{len(train)} training and {len(infer)} inference ratings, {data.num_users} users, {data.num_items} "
          f"movies, d = {training.dimension}; {args.steps} steps, median of {args.repeats}")
    print(f"{'':34}{'CPU ms/step':>12}{'wall ms/step':>14}")
    for name, (cpu, wall) in rows:
        print(f"{name:34}{1000 * cpu / args.steps:12.2f}{1000 * wall / args.steps:14.2f}")
    base = rows[0][1][0]
    print(f"flows / training alone (CPU): {rows[1][1][0] / base:.2f}")
    print(f"default BLAS threads / one thread (CPU): {rows[2][1][0] / rows[3][1][0]:.2f}")


if __name__ == "__main__":
    main()
