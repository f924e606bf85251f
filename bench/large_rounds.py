"""What a round of 20, 50 or 100 clients costs to value, and how far from its values a budget lands.

    python -m bench.large_rounds                       # MLP and CNN, n = 20, 50, 100 (hours on 2 shared cores)
    python -m bench.large_rounds --models mlp --sizes 20 50 --budgets 20 80 --reference 240
    python -m bench.large_rounds --plot docs/figures/large-rounds.png

Real Fashion-MNIST rounds (Debian's dataset-fashion-mnist): the global model after two
epochs of mini-batch SGD on 6,000 training images (a mid-training state), n clients with
120 class-balanced training images each, half of them with labels flipped at p = 0.7
([ADS] §6.2), each trained locally from that state (20 full-batch epochs, learning rate
0.05), FedAvg weights by examples, held-out accuracy on class-balanced test images
(``--held-out``: fewer for the CNN, whose every coalition is a forward pass of the tail).

For each n and model: a high-budget reference (``auto`` with ``--reference`` × n
evaluations, its own largest standard error printed), then each estimator at each budget
(``--budgets`` × n distinct coalition evaluations, ADS and LOO together, as
``--valuation-budget`` spends them): the estimator used, the round's valuation seconds
(``value_round`` wall clock, one thread), its evaluations, max and mean |φ − φ_ref| over
the clients, the largest standard error it booked, Spearman's ρ of its values against the
reference's, and the ROC AUC with which its values separate the clean clients from the
noisy ones (the reference's own AUC on its line: what a perfect estimate would give). The
reference line shows its largest and mean |φ| too (the scale the errors are to be read
against). Every run is a fresh game (no shared cache) and the reference has its own seed.
Exact ADS is out of reach at these n (2^20 = 1,048,576 coalitions). ``--json`` keeps every
record; ``--from-json A.json B.json`` prints the table and draws the plot from kept records
without running anything.

``--cost``: what every estimator costs a round, side by side in one process. For each model
and n in 10, 20, 50, 100 (``--sizes``), the same real round with U = −loss on the held-out
images (``neg_loss``: the expansions need a differentiable U), under each coalition rule
(``--rules``: fixed-weight, for which the expansions are exact to their order, and the
default renormalized), is valued by :data:`COST_ESTIMATORS`: exact ADS (n ≤ 10 only), MC-ADS
with 100 evaluations (2n + 1 where 100 do not fit MC's two samples a client), MC-ADS with
10·n, adaptive MC-ADS deciding a threshold at 0 (its own stop: every client settled or Alg. 1's
cap; ``--adaptive-budget`` caps it), and the first- and second-order expansions. Each
estimator's seconds are the median over ``--repeats`` valuations (one torch thread, a fresh
game each, the estimators interleaved within each repeat so that the machine's load falls on
all of them; one taking over ``--repeat-under`` seconds is timed once), after an untimed
warm-up; ``over_mc100`` is that median over MC-ADS-100's, measured in the same run. Per
estimator: its distinct evaluations, Spearman's ρ against the reference and the ROC AUC of its
values for clean against noisy clients (lower value = noisy). The reference is exact ADS for
n ≤ 10 and otherwise ``auto`` at ``--cost-reference`` × n evaluations with its own seed (a
sampled reference, its row in the file). ``--results PATH`` writes the rows headed by the
command and commit; ``--table PATH`` prints the docs' table of such a file; ``--quick``: the
MLP at n = 6 and 8 with 200 held-out images (well under a minute). ``--resume`` keeps the rows of
``--results`` and adds the (model, n, rule) it lacks, headed by each run's command in turn.

    python -m bench.large_rounds --cost --results docs/results/estimator_cost.csv
    python -m bench.large_rounds --cost --quick --results docs/results/estimator_cost.csv
    python -m bench.large_rounds --table docs/results/estimator_cost.csv
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import pickle
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
#: Seed of the reference's samples (the runs use 0).
REFERENCE_SEED = 10_000
#: ``--cost``'s clients per round (``--quick``'s), and the largest n valued exactly (the reference up to it).
COST_SIZES, QUICK_SIZES, EXACT_UP_TO = (10, 20, 50, 100), (6, 8), 10
#: ``--cost``'s estimators, in the order each repeat runs them (:func:`cost_settings`); BASELINE divides the seconds.
COST_ESTIMATORS = ("exact", "mc-100", "mc-10n", "adaptive", "first-order", "second-order")
BASELINE = "mc-100"
#: The columns of ``--cost``'s results file, one row per (model, n, rule, estimator) and the reference's.
COST_COLUMNS = ["model", "n", "rule", "held_out", "estimator", "method", "budget", "repeats", "seconds",
                "seconds_min", "seconds_max", "evaluations", "spearman", "auc", "over_mc100", "reference", "load"]


def real_round(kind: str, num_clients: int, held_out: int, seed: int = 0):
    """(model, x, y, start state, client states, weights) of a real Fashion-MNIST FedAvg round
    (module docstring); cached in the temporary directory per (kind, n, held_out, seed)."""
    cache = Path(tempfile.gettempdir()) / f"fedvalue-bench-round-{kind}-{num_clients}-{held_out}-{seed}.pkl"
    if cache.exists():
        return pickle.loads(cache.read_bytes())
    import torch

    from clients.behaviours import flip_labels
    from clients.training import get_model_arrays, train_locally
    from simulations.datasets.loaders import load_dataset, sample_per_class
    from simulations.datasets.models import make_model

    rng = np.random.default_rng(seed)
    test = load_dataset("fashion-mnist", split="test")
    held = sample_per_class(test.y, held_out, seed=rng)
    train = load_dataset("fashion-mnist", split="train")
    chosen = sample_per_class(train.y, 6_000 + 120 * num_clients, seed=rng)
    rng.shuffle(chosen)
    warm, pool = chosen[:6_000], chosen[6_000:]
    model = make_model(kind, 784, 10, seed=seed)
    train_locally(model, train.x[warm], train.y[warm], epochs=2, learning_rate=0.05, batch_size=64, seed=seed)
    start = get_model_arrays(model)
    clients, weights = [], []
    for k in range(num_clients):
        rows = pool[120 * k : 120 * (k + 1)]
        labels = train.y[rows]
        if k % 2:
            labels = flip_labels(labels, 0.7, 10, seed=[seed, k])
        local = make_model(kind, 784, 10, seed=seed)
        local.load_state_dict({name: torch.as_tensor(v) for name, v in start.items()})
        train_locally(local, train.x[rows], labels, epochs=20, learning_rate=0.05, seed=seed + 10 + k)
        clients.append(get_model_arrays(local))
        weights.append(float(len(rows)))
    result = (model, test.x[held], test.y[held], start, clients, weights)
    cache.write_bytes(pickle.dumps(result))
    return result


def value(kind: str, num_clients: int, held_out: int, method: str, budget: int, seed: int) -> dict:
    """One valuation of the round with ``method`` within ``budget`` evaluations (one thread;
    ``seed`` of the estimator's samples; the round itself is seed 0's)."""
    import torch

    torch.set_num_threads(1)
    from fedvalue.scoring.torch_utilities import TorchModelUtility
    from fedvalue.valuation.round_game import fedavg_round_game, value_round
    from fedvalue.valuation.settings import AdsSettings

    model, x, y, start, clients, weights = real_round(kind, num_clients, held_out)
    utility = TorchModelUtility(model, x, y)
    game = fedavg_round_game(list(range(num_clients)), start, clients, weights, utility)
    began = time.perf_counter()
    valuation = value_round(game, ("ads", "loo"), AdsSettings(method=method, budget=budget), seed=seed)
    seconds = time.perf_counter() - began
    result = valuation.results["ads"]
    return {"method": result.method, "seconds": seconds, "evaluations": valuation.num_evaluations,
            "values": result.values.tolist(), "stderr": result.stderr.tolist()}


def json_from_child(command: list[str], cwd: str | None = None) -> dict:
    """Run ``command`` (a bench script's ``--one``) in a fresh process and return the JSON
    object on its last line of output; RuntimeError with its stderr's tail when it fails."""
    import subprocess

    done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=cwd)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _child(*args) -> dict:
    return json_from_child([sys.executable, "-m", "bench.large_rounds", "--one", *map(str, args)])


def cost_settings(name: str, n: int, adaptive_budget: int | None = None):
    """The AdsSettings of ``--cost``'s estimator ``name`` at ``n`` clients, or None where it does not run
    (exact past :data:`EXACT_UP_TO`). MC-ADS's budget is raised to its minimum, 2n + 1 (two samples a
    client), where it does not fit; ``adaptive_budget`` (per client) caps adaptive MC-ADS, raised to its
    pilot's minimum likewise (None: its own stop)."""
    from fedvalue.valuation.plan import minimum_budget
    from fedvalue.valuation.settings import EXPANSION_METHODS, AdsSettings

    if name == "exact":
        return AdsSettings(method="exact") if n <= EXACT_UP_TO else None
    if name in ("mc-100", "mc-10n"):
        asked = 100 if name == "mc-100" else 10 * n
        return AdsSettings(method="mc", budget=max(asked, minimum_budget("mc", n)))
    if name == "adaptive":
        budget = None if adaptive_budget is None else max(adaptive_budget * n, minimum_budget("adaptive", n))
        return AdsSettings(method="adaptive", decision="threshold", cut=0.0, budget=budget)
    if name in EXPANSION_METHODS:
        return AdsSettings(method=name)
    raise ValueError(f"name: expected one of {list(COST_ESTIMATORS)}; got {name!r}.")


def loss_valuation(round_: tuple, rule: str, settings, seed: int):
    """``value_round`` of ADS alone on a fresh game of ``round_`` (:func:`real_round`'s tuple) under the
    coalition ``rule``, with U = −loss on its held-out images."""
    from fedvalue.scoring.torch_utilities import TorchModelUtility
    from fedvalue.valuation.round_game import fedavg_round_game, value_round

    model, x, y, start, clients, weights = round_
    utility = TorchModelUtility(model, x, y, metric="neg_loss")
    game = fedavg_round_game(list(range(len(clients))), start, clients, weights, utility, rule)
    return value_round(game, ("ads",), settings, seed=seed)


def _round_values(valuation) -> np.ndarray:
    values = valuation.results["ads"].values
    return values.reindex(range(len(values))).to_numpy()


def cost_rows(round_: tuple, model: str, rule: str, *, repeats: int = 3, repeat_under: float = 60.0,
              reference_budget: int = 400, adaptive_budget: int | None = None) -> list[dict]:
    """``--cost``'s rows (:data:`COST_COLUMNS`) of one round under one rule: each estimator of
    :func:`cost_settings` timed ``repeats`` times, interleaved, after an untimed warm-up (an expansion and
    MC-ADS at its minimum); then the reference (exact's values up to :data:`EXACT_UP_TO` clients, else
    ``auto`` at ``reference_budget`` × n evaluations with :data:`REFERENCE_SEED`, a row of its own)."""
    from fedvalue.valuation.plan import minimum_budget
    from fedvalue.valuation.settings import AdsSettings

    n = len(round_[4])
    chosen = {name: cost_settings(name, n, adaptive_budget) for name in COST_ESTIMATORS}
    chosen = {name: settings for name, settings in chosen.items() if settings is not None}
    # Untimed: torch's first autograd calls, and the first linear scorer's.
    loss_valuation(round_, rule, cost_settings("second-order", n), 0)
    loss_valuation(round_, rule, AdsSettings(method="mc", budget=minimum_budget("mc", n)), 0)
    first, seconds = {}, {name: [] for name in chosen}
    for repeat in range(repeats):
        for name, settings in chosen.items():
            if repeat and seconds[name][0] > repeat_under:
                continue
            load = os.getloadavg()[0]
            valuation = loss_valuation(round_, rule, settings, 0)
            seconds[name].append(valuation.seconds)
            first.setdefault(name, (valuation, load))
    if "exact" in first:
        reference, label = first["exact"][0], "exact"
    else:
        load = os.getloadavg()[0]
        settings = AdsSettings(method="auto", budget=reference_budget * n)
        reference = loss_valuation(round_, rule, settings, REFERENCE_SEED)
        label = f"{reference.results['ads'].method}, {settings.budget} evaluations asked, seed {REFERENCE_SEED}"
        chosen["reference"], seconds["reference"], first["reference"] = settings, [reference.seconds], (reference, load)
    reference_values = _round_values(reference)
    baseline = float(np.median(seconds[BASELINE]))
    rows = []
    for name, (valuation, load) in first.items():
        rho, auc = _agreement(_round_values(valuation), reference_values)
        times = seconds[name]
        rows.append({"model": model, "n": n, "rule": rule, "held_out": len(round_[2]), "estimator": name,
                     "method": valuation.results["ads"].method, "budget": chosen[name].budget, "repeats": len(times),
                     "seconds": float(np.median(times)), "seconds_min": min(times), "seconds_max": max(times),
                     "evaluations": valuation.num_evaluations, "spearman": None if name == "reference" else rho,
                     "auc": auc, "over_mc100": float(np.median(times)) / baseline, "reference": label, "load": load})
    return rows


def write_cost(path: Path, rows: list[dict], command: str, earlier: tuple[str, ...] = ()) -> None:
    """``--cost``'s rows as a CSV headed by the command and commit (:func:`bench.results_header`), after the
    ``earlier`` header lines of the runs whose rows it resumed (:func:`cost_commands`)."""
    from bench import results_header

    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        handle.writelines(f"{line}\n" for line in earlier)
        handle.write(results_header(command))
        writer = csv.DictWriter(handle, fieldnames=COST_COLUMNS)
        writer.writeheader()
        writer.writerows([{k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()} for row in rows])


def cost_commands(path: Path) -> tuple[str, ...]:
    """The header lines of a file :func:`write_cost` wrote: one a run that made its rows, in order."""
    return tuple(line for line in Path(path).read_text().splitlines() if line.startswith("#"))


def read_cost(path: Path) -> list[dict]:
    """The rows of a file :func:`write_cost` wrote, as strings (its first line, the command, skipped)."""
    lines = Path(path).read_text().splitlines()
    return list(csv.DictReader(line for line in lines if not line.startswith("#")))


COST_TABLE_HEADER = ("| model | n | rule | estimator | budget | evaluations | seconds (median) | min–max s | repeats "
                     "| ÷ MC-100's seconds | ρ vs reference | AUC |")


def cost_table(rows: list[dict]) -> list[str]:
    """The docs' table of ``--cost``'s rows (:func:`read_cost`'s strings): one line a row, in the file's order."""
    def number(text: str, digits: int = 3) -> str:
        return "" if text in ("", "nan", "None") else f"{float(text):.{digits}g}"

    lines = [COST_TABLE_HEADER, "|---|--:|---|---|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for row in rows:
        name = row["estimator"]
        if name == "reference":
            name = f"reference ({row['method'].removeprefix('ads-')}, seed {REFERENCE_SEED})"
        span = f"{number(row['seconds_min'])}–{number(row['seconds_max'])}"
        rho = "" if row["spearman"] in ("", "nan", "None") else f"{float(row['spearman']):.3f}"
        auc = "" if row["auc"] in ("", "nan", "None") else f"{float(row['auc']):.3f}"
        lines.append(f"| {row['model']} | {row['n']} | {row['rule']} | {name} | {row['budget']} | {row['evaluations']} "
                     f"| {number(row['seconds'])} | {span} | {row['repeats']} | {number(row['over_mc100'])} | {rho} "
                     f"| {auc} |")
    return lines


def cost_main(args: argparse.Namespace, command: str) -> int:
    """``--cost``: every estimator's rows per (model, n, rule), printed as they come and kept with ``--results``."""
    import torch

    torch.set_num_threads(1)
    models, sizes, held = (["mlp"], QUICK_SIZES, (200, 200)) if args.quick else (
        args.models, args.sizes or COST_SIZES, args.held_out)
    references = dict(zip(("mlp", "cnn"), args.cost_reference))
    print(f"estimator cost, U = -loss; one torch thread; load average before: "
          f"{' '.join(f'{v:.1f}' for v in os.getloadavg())}", flush=True)
    results = Path(args.results) if args.results else None
    earlier: tuple[str, ...] = ()
    rows: list[dict] = []
    if args.resume:  # the file's rows stay, and their (model, n, rule) are not run again
        if results is None or not results.is_file():
            raise SystemExit(f"--resume: expected --results naming a file an earlier --cost run wrote; got "
                             f"{args.results!r}")
        earlier, rows = cost_commands(results), read_cost(results)
    done = {(row["model"], int(row["n"]), row["rule"]) for row in rows}
    for kind in models:
        for n in sizes:
            if all((kind, n, rule) in done for rule in args.rules):
                print(f"{kind} n={n}: in {results}, kept", flush=True)
                continue
            round_ = real_round(kind, n, held[0] if kind == "mlp" else held[1])
            for rule in args.rules:
                if (kind, n, rule) in done:
                    continue
                found = cost_rows(round_, kind, rule, repeats=args.repeats, repeat_under=args.repeat_under,
                                  reference_budget=references[kind], adaptive_budget=args.adaptive_budget)
                for row in found:
                    print("  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()
                                    if k not in ("held_out", "reference")), flush=True)
                rows += found
                if results:  # kept as it goes: a long run cut short keeps its finished rounds
                    write_cost(results, rows, command, earlier)
    return 0


def main(argv: list[str] | None = None) -> int:
    from bench import kept_output

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", choices=("mlp", "cnn"), default=["mlp", "cnn"])
    parser.add_argument("--sizes", type=int, nargs="+", default=None,
                        help="clients per round (20 50 100; --cost: 10 20 50 100)")
    parser.add_argument("--budgets", type=int, nargs="+", default=[20, 80],
                        help="budgets per client: n × each, distinct coalition evaluations per round")
    parser.add_argument("--reference", type=int, default=400, help="the reference's budget per client")
    parser.add_argument("--estimators", nargs="+", default=["auto", "mc", "kernelshap", "stratified"])
    parser.add_argument("--held-out", type=int, nargs=2, default=[1000, 300], metavar=("MLP", "CNN"),
                        help="held-out test images for the MLP and for the CNN")
    parser.add_argument("--plot", default=None, help="write the error-against-evaluations figure here")
    parser.add_argument("--json", default=None, help="write every record here")
    parser.add_argument("--from-json", nargs="+", default=None, metavar="JSON",
                        help="print the table (and --plot) from records kept by --json; runs nothing")
    parser.add_argument("--one", nargs=6, help=argparse.SUPPRESS)
    parser.add_argument("--cost", action="store_true", help="every estimator's cost side by side (module docstring)")
    parser.add_argument("--quick", action="store_true", help="--cost: the MLP at n = 6 and 8, 200 held-out images")
    parser.add_argument("--rules", nargs="+", choices=("fixed-weight", "renormalized"),
                        default=["fixed-weight", "renormalized"], help="--cost: the coalition rules")
    parser.add_argument("--repeats", type=int, default=3, help="--cost: timed valuations an estimator (median)")
    parser.add_argument("--repeat-under", type=float, default=60.0,
                        help="--cost: an estimator whose first valuation took longer is timed once")
    parser.add_argument("--cost-reference", type=int, nargs=2, default=[400, 240], metavar=("MLP", "CNN"),
                        help="--cost: the sampled reference's budget per client past exact")
    parser.add_argument("--adaptive-budget", type=int, default=None,
                        help="--cost: cap adaptive MC-ADS at this many evaluations per client (default: its own stop)")
    parser.add_argument("--results", default=None, help="--cost: write the rows here (CSV)")
    parser.add_argument("--resume", action="store_true",
                        help="--cost: keep --results' rows and run only the (model, n, rule) it lacks, after them")
    parser.add_argument("--table", default=None, metavar="CSV", help="print the docs' table of a --cost results file")
    parser.add_argument("--keep", type=Path, metavar="FILE",
                        help="also keep what is printed in FILE, headed by the command and commit (a results file)")
    args = parser.parse_args(argv)
    with kept_output(args.keep, "python -m bench.large_rounds " + " ".join(sys.argv[1:] if argv is None else argv)):
        if args.table:
            print("\n".join(cost_table(read_cost(Path(args.table)))))
            return 0
        if args.cost:
            shown = sys.argv[1:] if argv is None else argv
            return cost_main(args, " ".join(["python -m bench.large_rounds", *shown]))
        args.sizes = args.sizes or [20, 50, 100]
        if args.from_json:
            records = [r for path in args.from_json for r in json.loads(Path(path).read_text())]
            _print_kept(records)
            if args.plot:
                _plot(records, Path(args.plot))
                print(f"wrote {args.plot}")
            return 0
        if args.one:
            kind, n, held, method, budget, seed = args.one
            print(json.dumps(value(kind, int(n), int(held), method, int(budget), int(seed))))
            return 0
        from fedvalue.valuation.plan import budget_method

        print(f"real Fashion-MNIST rounds; held-out images: MLP {args.held_out[0]}, CNN {args.held_out[1]}; one torch "
              f"thread; load average before: {' '.join(f'{v:.1f}' for v in os.getloadavg())}", flush=True)
        print(HEADER, flush=True)
        records = []
        for kind in args.models:
            held = args.held_out[0] if kind == "mlp" else args.held_out[1]
            for n in args.sizes:
                # Its own seed: sharing the runs' first samples would make their errors look small.
                reference = {"model": kind, "n": n, "budget": args.reference * n, "reference": True,
                             **_child(kind, n, held, "auto", args.reference * n, REFERENCE_SEED)}
                print(_line(reference, reference), flush=True)
                records.append(reference)
                for per_client in args.budgets:
                    budget = per_client * n
                    for estimator in args.estimators:
                        try:  # an estimator whose minimum does not fit is left out (and said so)
                            budget_method(estimator, [n], budget - (n + 1), None)
                        except ValueError:
                            print(f"{kind:>5} {n:>4} {budget:>7} {estimator:<22} does not fit", flush=True)
                            continue
                        record = {"model": kind, "n": n, "budget": budget, "estimator": estimator,
                                  **_child(kind, n, held, estimator, budget, 0)}
                        error = np.abs(np.array(record["values"]) - np.array(reference["values"]))
                        record.update(max_error=float(error.max()), mean_error=float(error.mean()))
                        print(_line(record, reference), flush=True)
                        records.append(record)
        if args.json:
            Path(args.json).write_text(json.dumps(records, indent=1))
        if args.plot:
            _plot(records, Path(args.plot))
            print(f"wrote {args.plot}")
        return 0


HEADER = (f"{'model':>5} {'n':>4} {'budget':>7} {'estimator':<22} {'seconds':>8} {'evals':>7} {'max err':>8} "
          f"{'mean err':>9} {'max stderr':>11} {'rho':>6} {'AUC':>6}")


def _agreement(values, reference_values) -> tuple[float, float]:
    """(Spearman's ρ against the reference's values, ROC AUC of the values for clean against
    noisy clients: client k is noisy when k is odd, as :func:`real_round` flips them)."""
    from scipy.stats import spearmanr
    from sklearn.metrics import roc_auc_score

    values = np.asarray(values)
    clean = np.arange(len(values)) % 2 == 0
    return float(spearmanr(values, reference_values).statistic), float(roc_auc_score(clean, values))


def _line(record: dict, reference: dict) -> str:
    """One row of the table (the reference's row adds the scale of its values)."""
    rho, auc = _agreement(record["values"], reference["values"])
    head = f"{record['model']:>5} {record['n']:>4} {record['budget']:>7} "
    if record.get("reference"):
        phi = np.abs(np.array(record["values"]))
        return (head + f"{'reference: ' + record['method']:<22} {record['seconds']:>8.1f} {record['evaluations']:>7} "
                f"{'':>8} {'':>9} {max(record['stderr']):>11.4f} {'':>6} {auc:>6.3f}  (max |φ| {phi.max():.4f}, "
                f"mean |φ| {phi.mean():.4f})")
    label = (f"auto ({record['method'].removeprefix('ads-')})" if record["estimator"] == "auto"
             else record["estimator"])
    return (head + f"{label:<22} {record['seconds']:>8.1f} {record['evaluations']:>7} {record['max_error']:>8.4f} "
            f"{record['mean_error']:>9.4f} {max(record['stderr']):>11.4f} {rho:>6.3f} {auc:>6.3f}")


def _print_kept(records: list[dict]) -> None:
    """The table of kept records, each run against its (model, n)'s reference."""
    references = {(r["model"], r["n"]): r for r in records if r.get("reference")}
    print(HEADER)
    for record in records:
        print(_line(record, references[record["model"], record["n"]]))


def _plot(records: list[dict], path: Path) -> None:
    """Max error against evaluations, one panel per (model, n), one colour per estimator; the
    dotted line is the reference's mean |φ| (the scale of the values)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    runs = [r for r in records if not r.get("reference")]
    references = {(r["model"], r["n"]): r for r in records if r.get("reference")}
    panels = sorted({(r["model"], r["n"]) for r in runs}, key=lambda p: (p[0] != "mlp", p[1]))
    estimators = sorted({r["estimator"] for r in runs})
    styles = {e: (f"C{i}", "os^D"[i % 4], (9, 6, 5, 6)[i % 4]) for i, e in enumerate(estimators)}
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 3.4), squeeze=False)
    for ax, (kind, n) in zip(axes[0], panels):
        for estimator in estimators:
            rows = sorted((r for r in runs if (r["model"], r["n"], r["estimator"]) == (kind, n, estimator)),
                          key=lambda r: r["evaluations"])
            if rows:
                color, marker, size = styles[estimator]
                ax.plot([r["evaluations"] for r in rows], [r["max_error"] for r in rows], marker=marker,
                        markersize=size, color=color, label=estimator)
        if (kind, n) in references:
            ax.axhline(np.abs(references[kind, n]["values"]).mean(), color="grey", linestyle=":",
                       label="reference mean |φ|")
        ax.set_xscale("log")
        ax.set_yscale("log")
        budgets = sorted({r["budget"] for r in runs if (r["model"], r["n"]) == (kind, n)})
        ax.set_xticks(budgets, [f"{b:,}" for b in budgets])  # the budgets asked for (evaluations spent: the points)
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_title(f"{kind.upper()}, {n} clients")
        ax.set_xlabel("coalition evaluations per round")
        ax.set_ylabel("max |φ − φ_ref|")
        ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)

if __name__ == "__main__":
    raise SystemExit(main())
