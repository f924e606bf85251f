"""Cheaper ADS estimators against exact on real round games: error, evaluations, time.

    python -m bench.estimators              # n = 6, 8, 10, 12, 14 (about a minute on 2 cores)
    python -m bench.estimators --sizes 6 10
    python -m bench.estimators --adaptive --sizes 14 --seeds 3   # fixed against adaptive MC-ADS (about 5 minutes)

``--adaptive`` puts fixed MC-ADS with a standard-error target beside adaptive MC-ADS
(``AdsSettings(method="adaptive")``, :mod:`fedvalue.valuation.adaptive`) with the same target, for two
decisions: is the client harmful (a cut at 0) and the top half. Per estimator and seed it prints the
evaluations spent, how many clients the decision calls settled (fixed MC: |φ̂ − c| ≥ 2 se, or intervals
of ±2 se apart, at its one stop; adaptive: its own looks), how many of those sides agree with exact ADS's,
and how many of all clients' sides agree (the sign of φ̂ − c, or membership of the top half by φ̂).

Each round game is real: the embedded digits data, an MLP 64-200-200-10 trained for a
few rounds of FedAvg, then n clients (every second one with 70% flipped labels) each
train 20 local epochs from that state; FedAvg coalitions, held-out accuracy (450
examples: one example is 2.2e-3 of accuracy, so a truncation tolerance below that
truncates only at exact ties). Every estimator starts from an empty cache, so
"evaluations" is what it alone costs; MC uses ε = 0.1, δ = 0.05 (m* permutations),
and "|gap|" is the group-efficiency gap (below the tolerance for tmc).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from bench import kept_output
from clients.behaviours import flip_labels
from clients.training import get_model_arrays, set_model_arrays, train_locally
from fedvalue.scoring.torch_utilities import TorchModelUtility
from fedvalue.valuation.adaptive import Decision
from fedvalue.valuation.round_game import fedavg_round_game, value_round, weighted_mean
from fedvalue.valuation.settings import AdsSettings
from simulations.datasets.loaders import load_dataset, split_holdout
from simulations.datasets.models import make_mlp
from simulations.datasets.partitions import partition_iid

ESTIMATORS = {
    "exact": {"method": "exact"},
    "mc (m*)": {"method": "mc"},
    "mc, stderr<=0.005": {"method": "mc", "stderr_target": 0.005},
    "mc, stderr<=0.01": {"method": "mc", "stderr_target": 0.01},
    "mc, stderr<=0.02": {"method": "mc", "stderr_target": 0.02},
    "tmc, tol 1e-3": {"method": "tmc", "truncation_tolerance": 1e-3},
    "tmc, tol 5e-3": {"method": "tmc", "truncation_tolerance": 5e-3},
    "tmc, tol 2e-2": {"method": "tmc", "truncation_tolerance": 2e-2},
    "tmc 5e-3 + stderr<=0.01": {"method": "tmc", "truncation_tolerance": 5e-3, "stderr_target": 0.01},
    "antithetic, stderr<=0.01": {"method": "antithetic", "stderr_target": 0.01},
    "stratified, stderr<=0.01": {"method": "stratified", "stderr_target": 0.01},
    "stratified, stderr<=0.005": {"method": "stratified", "stderr_target": 0.005},
    "kernelshap, stderr<=0.01": {"method": "kernelshap", "stderr_target": 0.01},
    "auto, stderr<=0.01": {"method": "auto", "stderr_target": 0.01},
}


def round_inputs(num_clients: int, seed: int = 0):
    data = load_dataset("digits")
    rng = np.random.default_rng(seed)
    train, holdout = split_holdout(data, 0.25, seed=rng)
    parts = partition_iid(len(train.y), num_clients, seed=rng)
    model = make_mlp(64, 10, hidden=(200, 200), seed=seed)
    state = get_model_arrays(model)
    for warm in range(3):  # a few FedAvg rounds so the round is not the first
        updates = []
        for k, part in enumerate(parts):
            local = set_model_arrays(make_mlp(64, 10, hidden=(200, 200), seed=seed), state)
            train_locally(local, train.x[part], train.y[part], epochs=10, learning_rate=0.1, seed=[seed, warm, k])
            updates.append(get_model_arrays(local))
        state = weighted_mean(updates, [len(p) for p in parts])
    clients, weights = [], []
    for k, part in enumerate(parts):
        y = train.y[part]
        if k % 2:
            y = flip_labels(y, 0.7, 10, seed=[seed, k])
        local = set_model_arrays(make_mlp(64, 10, hidden=(200, 200), seed=seed), state)
        train_locally(local, train.x[part], y, epochs=20, learning_rate=0.1, seed=[seed, 9, k])
        clients.append(get_model_arrays(local))
        weights.append(float(len(part)))
    utility = TorchModelUtility(make_mlp(64, 10, hidden=(200, 200), seed=seed), holdout.x, holdout.y)
    return state, clients, weights, utility


#: The standard-error targets of the fixed and adaptive rows of ``--adaptive``.
ADAPTIVE_TARGETS = (0.01, 0.005)


def decision_sides(values: np.ndarray, stderr: np.ndarray, decision: str, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Each client's side of ``decision`` (``"cut 0"``: φ ≥ 0; ``"top half"``: in the top n // 2) and whether
    ±2 se settles it at one look (the same rule as :class:`fedvalue.valuation.adaptive.Decision`, at z = 2)."""
    rule = Decision("threshold", 0.0, None, 2.0) if decision == "cut 0" else Decision("top-k", None, n // 2, 2.0)
    side = values >= 0.0 if decision == "cut 0" else rule.top_mask(values)
    return side, rule.settled(values, stderr, 2.0)


def adaptive_comparison(sizes: list[int], seeds: int) -> None:
    """Fixed MC-ADS against adaptive MC-ADS at the same standard-error targets (module docstring); a fixed MC
    run serves both decisions (it does not depend on them)."""
    print(f"{'n':>3}  {'decision':<9}{'estimator':<27}{'seed':>5}{'evaluations':>13}{'settled':>9}"
          f"{'agree (settled)':>17}{'agree (all)':>13}{'max |φ − exact|':>17}")
    for n in sizes:
        state, clients, weights, utility = round_inputs(n)
        ids = list(range(n))
        exact = value_round(fedavg_round_game(ids, state, clients, weights, utility), ("ads",),
                            AdsSettings(method="exact")).results["ads"].values.to_numpy()
        decisions = {"cut 0": {"decision": "threshold", "cut": 0.0},
                     "top half": {"decision": "top-k", "top_k": n // 2}}
        rows = []
        for target in ADAPTIVE_TARGETS:
            for seed in range(seeds):
                fixed = _valued(n, (state, clients, weights, utility), AdsSettings(method="mc", stderr_target=target),
                                seed)
                for k, (decision, wanted) in enumerate(decisions.items()):
                    adaptive = _valued(n, (state, clients, weights, utility),
                                       AdsSettings(method="adaptive", stderr_target=target, **wanted), seed)
                    for j, (name, (result, evaluations)) in enumerate(
                            ((f"mc, stderr<={target}", fixed), (f"adaptive, stderr<={target}", adaptive))):
                        rows.append(((k, target != ADAPTIVE_TARGETS[0], j, seed),
                                     _decision_row(n, decision, name, seed, result, evaluations, exact)))
        for _, row in sorted(rows, key=lambda r: r[0]):
            print(row, flush=True)


def _valued(n: int, inputs, settings: AdsSettings, seed: int):
    """(ADS result, evaluations) of the round of ``inputs`` from an empty cache."""
    game = fedavg_round_game(list(range(n)), *inputs)
    return value_round(game, ("ads",), settings, seed=np.random.default_rng([seed, n])).results["ads"], \
        game.num_evaluations


def _decision_row(n: int, decision: str, name: str, seed: int, result, evaluations: int, exact: np.ndarray) -> str:
    truth, _ = decision_sides(exact, np.zeros(n), decision, n)
    values, stderr = result.values.to_numpy(), result.stderr.to_numpy()
    side, settled = decision_sides(values, stderr, decision, n)
    if result.settled is not None:  # adaptive: its own looks settled them
        settled = result.settled.to_numpy()
    agree = side == truth
    return (f"{n:>3}  {decision:<9}{name:<27}{seed:>5}{evaluations:>13}{f'{settled.sum()}/{n}':>9}"
            f"{f'{agree[settled].sum()}/{settled.sum()}':>17}{f'{agree.sum()}/{n}':>13}"
            f"{np.abs(values - exact).max():>17.4f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[6, 8, 10, 12, 14])
    parser.add_argument("--adaptive", action="store_true",
                        help="fixed against adaptive MC-ADS: evaluations and decisions against exact")
    parser.add_argument("--seeds", type=int, default=5, help="--adaptive: seeds of each estimator")
    parser.add_argument("--keep", type=Path, metavar="FILE",
                        help="also keep what is printed in FILE, headed by the command and commit (a results file)")
    args = parser.parse_args(argv)
    with kept_output(args.keep, "python -m bench.estimators " + " ".join(sys.argv[1:] if argv is None else argv)):
        if args.adaptive:
            adaptive_comparison(args.sizes, args.seeds)
            return 0
        print(f"{'n':>3}  {'estimator':<25}{'max |φ − exact|':>16}{'evaluations':>13}{'permutations':>14}"
              f"{'|gap|':>10}{'seconds':>9}")
        for n in args.sizes:
            state, clients, weights, utility = round_inputs(n)
            ids = list(range(n))
            exact = None
            for name, options in ESTIMATORS.items():
                game = fedavg_round_game(ids, state, clients, weights, utility)
                started = time.perf_counter()
                result = value_round(game, ("ads",), AdsSettings(**options),
                                     seed=np.random.default_rng([0, n])).results["ads"]
                seconds = time.perf_counter() - started
                if exact is None:
                    exact = result.values
                error = float((result.values - exact).abs().max())
                if name.startswith("auto"):
                    name = f"auto ({result.method[4:]}), <=0.01"
                print(f"{n:>3}  {name:<25}{error:>16.4f}{game.num_evaluations:>13}"
                      f"{result.num_permutations or '-':>14}{result.max_efficiency_gap:>10.1e}{seconds:>9.2f}",
                      flush=True)
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
