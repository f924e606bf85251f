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
"""

from __future__ import annotations

import argparse
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
    from fedvalue.valuation.settings import AdsSettings
    from fedvalue.valuation.round_game import fedavg_round_game, value_round
    from fedvalue.scoring.torch_utilities import TorchModelUtility

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", choices=("mlp", "cnn"), default=["mlp", "cnn"])
    parser.add_argument("--sizes", type=int, nargs="+", default=[20, 50, 100], help="clients per round")
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
    args = parser.parse_args(argv)
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
