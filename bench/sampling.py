"""Max error against coalition evaluations: the seed's permutation MC, antithetic
permutations and paired KernelSHAP (fedvalue.valuation.shapley_sampling), on real round games and
on closed-form games.

    python -m bench.sampling                          # real n = 12, 16; closed form n = 12, 16, 20
    python -m bench.sampling --real 12 16 20          # n = 20 real: 2^20 exact evaluations first (~15 min)
    python -m bench.sampling --closed 20 24 --real    # closed-form games only

Real round games are those of ``bench/estimators.py`` (digits, MLP 64-200-200-10 after a
few FedAvg rounds, n clients of which every second has 70% flipped labels, FedAvg
coalitions, held-out accuracy); every coalition is scored once up front (the exact
reference needs them all), and each estimator then reads that table through a fresh
cache, so "evaluations" is the distinct coalitions it alone asked for. The closed-form
game is v(S) = 0.7 + Σ_T c_T [T ⊆ S] with a few hundred random dividends c_T of orders
1–3 (Shapley: Σ_{T∋i} c_T / |T|), near-additive like FL rounds.

For each budget of samples (MC: permutations; antithetic: pairs of permutations, the same
evaluations; kernelshap: coalition pairs, about MC's evaluations at the same row) the
mean over ``--repeats`` seeds of the max |φ̂ − φ| and of the evaluations is printed. The
row "mc m*" is the seed's estimator, MC-ADS with m* = ⌈log(2n/δ)/(2ε²)⌉ permutations at
ε = 0.1, δ = 0.05; the last lines give, per estimator, the fewest evaluations at which its
mean max error is at most that row's, and that as a fraction of MC m*'s evaluations.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from bench import kept_output
from fedvalue.valuation.ads import ads
from fedvalue.valuation.game import CoalitionGame
from fedvalue.valuation.plan import mc_num_permutations
from fedvalue.valuation.shapley_sampling import SAMPLERS

#: Permutations per budget, as fractions of m* (antithetic draws half as many pairs).
FRACTIONS = (1 / 32, 1 / 16, 1 / 8, 1 / 4, 1 / 2, 1)


def table_game(table: np.ndarray, n: int) -> CoalitionGame:
    """A fresh cache over precomputed v(mask) (bit k = player k)."""
    def batch(coalitions):
        return [float(table[sum(1 << k for k in c)]) for c in coalitions]
    return CoalitionGame(None, list(range(n)), batch_utility=batch)


def real_table(n: int) -> tuple[np.ndarray, np.ndarray, float]:
    from bench.estimators import round_inputs
    from fedvalue.valuation.round_game import fedavg_round_game

    state, clients, weights, utility = round_inputs(n)
    started = time.perf_counter()
    game = fedavg_round_game(list(range(n)), state, clients, weights, utility)
    table = game.values(range(1 << n))
    exact = ads(game, [list(range(n))], method="exact").values.to_numpy()
    return table, exact, time.perf_counter() - started


def dividend_table(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    masks = np.arange(1 << n, dtype=np.int64)
    table = np.full(1 << n, 0.7)
    shapley = np.zeros(n)
    for _ in range(20 * n):
        order = int(rng.choice([1, 1, 2, 2, 3]))
        members = rng.choice(n, order, replace=False)
        c = float(rng.normal(0, 0.03 / order))
        t = int(sum(1 << int(i) for i in members))
        table[(masks & t) == t] += c
        shapley[members] += c / order
    return table, shapley


def curve(table: np.ndarray, reference: np.ndarray, n: int, repeats: int) -> list[tuple[str, float, float]]:
    m_star = mc_num_permutations(n, 0.1, 0.05)
    rows = []
    errors, evaluations = [], []
    for r in range(repeats):
        game = table_game(table, n)
        result = ads(game, [list(range(n))], method="mc", seed=np.random.default_rng([1, n, r]))
        errors.append(float(np.abs(result.values.to_numpy() - reference).max()))
        evaluations.append(game.num_evaluations)
    rows.append(("mc m*", m_star, float(np.mean(evaluations)), float(np.mean(errors))))
    for name, kind in SAMPLERS.items():
        for fraction in FRACTIONS:
            permutations = max(2, round(fraction * m_star))
            samples = {"mc": permutations, "antithetic": max(2, permutations // 2),
                       "stratified": max(2, round(permutations / (2 * n))),
                       "kernelshap": max(2, permutations * n // 2)}[name]
            errors, evaluations = [], []
            for r in range(repeats):
                game = table_game(table, n)
                sampler = kind(game, 0, np.arange(n), np.random.default_rng([2, n, r]))
                values, _ = sampler.run(samples, None)
                errors.append(float(np.abs(values - reference).max()))
                evaluations.append(game.num_evaluations)
            rows.append((name, samples, float(np.mean(evaluations)), float(np.mean(errors))))
    return rows


def report(label: str, n: int, rows) -> None:
    for name, samples, evaluations, error in rows:
        print(f"{label:<8}{n:>3}  {name:<11}{samples:>8}{evaluations:>13.0f}{error:>16.4f}", flush=True)
    target_evals, target_error = rows[0][2], rows[0][3]
    for name in SAMPLERS:
        meeting = [e for m, _, e, err in rows[1:] if m == name and err <= target_error]
        if meeting:
            print(f"{label:<8}{n:>3}  -> {name:<11} reaches mc m*'s error {target_error:.4f} with "
                  f"{min(meeting):.0f} evaluations = {min(meeting) / target_evals:.2f} of mc m*'s", flush=True)
        else:
            print(f"{label:<8}{n:>3}  -> {name:<11} does not reach mc m*'s error {target_error:.4f} "
                  f"within m*'s budget", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--real", type=int, nargs="*", default=[12, 16], help="clients of real round games")
    parser.add_argument("--closed", type=int, nargs="*", default=[12, 16, 20], help="players of closed-form games")
    parser.add_argument("--repeats", type=int, default=10, help="seeds per row (means printed)")
    parser.add_argument("--keep", type=Path, metavar="FILE",
                        help="also keep what is printed in FILE, headed by the command and commit (a results file)")
    args = parser.parse_args(argv)
    with kept_output(args.keep, "python -m bench.sampling " + " ".join(sys.argv[1:] if argv is None else argv)):
        print(f"{'game':<8}{'n':>3}  {'estimator':<11}{'samples':>8}{'evaluations':>13}{'max |φ − φ*|':>16}")
        for n in args.real:
            table, exact, seconds = real_table(n)
            print(f"# real round game, n = {n}: 2^{n} coalitions scored and exact ADS in {seconds:.1f} s", flush=True)
            report("real", n, curve(table, exact, n, args.repeats))
        for n in args.closed:
            table, shapley = dividend_table(n)
            report("closed", n, curve(table, shapley, n, args.repeats))
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
