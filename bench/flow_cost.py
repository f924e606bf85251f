"""The server's TracIn flows arithmetic of one round of ``bench.scale``, by part, with and without a projection.

    python -m bench.flow_cost                      # 1,000 clients, 50 trained, the 784-200-200-10 MLP, k = 2048
    python -m bench.flow_cost --clients 200 --projection-dim 1024

One round of the shapes ``bench.scale`` books (A_{t−1} of the MLP, p = 199,210 float32 parameters; 50 replies;
every client's float32 inference gradient), filled with seeded random numbers, no engine: the flows without a
projection (:func:`fedvalue.flows.round_flows.fedavg_round_flows`, and its flattening of the gradients to
float64 alone), the bytes of the round record keeping every gradient; then with the projection
(:func:`fedvalue.flows.projected_flows.project_round`, :func:`~fedvalue.flows.projected_flows.projected_round_flows`)
and the bytes of the record keeping the projected vectors. Each timing is the least of ``--repeats``.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--trained", type=int, default=50)
    parser.add_argument("--projection-dim", type=int, default=2048, metavar="K")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)

    from fedvalue.flows.projected_flows import FlowsProjection, project_round, projected_round_flows
    from fedvalue.flows.round_flows import fedavg_round_flows
    from fedvalue.run.archive import RoundRecord, record_bytes
    from fedvalue.run.settings import RoundSettings
    from fedvalue.schema import ClientEntry
    from fedvalue.scoring.projection import flatten

    start, replies, weights, gradients = synthetic_round(args.clients, args.trained)
    p, keys = sum(v.size for v in start.values()), list(start)
    projection = FlowsProjection.of_run(args.projection_dim, 0)
    print(f"{args.clients} clients, {args.trained} trained, p = {p:,}, k = {args.projection_dim} ({projection.kind})")

    def timed(name: str, compute, repeats: int = args.repeats):
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


if __name__ == "__main__":
    raise SystemExit(main())
