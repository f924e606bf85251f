"""Contributors and a broker in a data market: who is paid under DS and ADS ([ADS] §6.1.2, Figure 3).

Contributors each own an equal random share of the originals (digits, embedded, or MNIST
from local files); a broker adds instances derived from them. Values are exact: KNN-DS
([KNNSV], one group) and KNN-ADS ([ADS] Thm 5.1, σ = (originals, broker)), summed per
contributor ([ADS] Alg. 2, line 15); "contributors" is the sum over contributors.

* **Replication** (Figure 3a): the broker adds 0, 1, ..., ``max_copies`` exact copies of every
  original. Under ADS the contributors' total is v(originals) − v(∅) in every configuration
  (group efficiency, [ADS] Prop. 4.2) and the broker gets v(all) − v(originals); under DS a
  copy is worth its original (they are symmetric players), so contributors keep
  1/(copies + 1) of v(all) − v(∅) ([ADS] Lemma 3.1's split) — exactly when no two different
  images tie in distance to a test point, nearly otherwise (the tie rule, index order, then
  puts some originals and copies of other images in between).
* **Augmentation** (Figure 3b): the broker adds one augmented image per original; each method
  values them on originals ∪ augmentations, the broker keeps those it values > 0, and the
  method values the final set again. ADS leaves the contributors v(originals) − v(∅); DS
  hands part of it to the broker.

Writes totals.csv (scenario, configuration, method, party, total), contributors.csv (each
contributor's value), figure3.png and run.json; ``--results FOLDER`` keeps the totals table the run prints as
:data:`PRINTED_RESULTS`, headed by the command and the commit.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from fedvalue import knn_ads
from simulations.experiments.synthetic_data.synthetic_data import (
    IMAGE_DATASETS,
    OriginalsAndSynthetic,
    images_with_augmentations,
)
from simulations.runner import (
    Simulation,
    check_integers,
    check_numbers,
    prepare_run_dir,
    write_results,
    write_run_config,
)

BROKER = "broker"
#: The results file of the totals table the run prints, which the docs quote as a block.
PRINTED_RESULTS = "replication_market_printed.txt"


@dataclass(frozen=True)
class ReplicationMarketConfig:
    seed: int = 0
    dataset: str = "digits"
    mnist_path: str = ""
    contributors: int = 10
    train_per_class: int = 50
    test_per_class: int = 50
    k: int = 5
    max_copies: int = 2
    rotation: float = 45.0
    shift: float = 0.0625
    scale: float = 0.1

    def check(self) -> None:
        check_integers(self, ("contributors", "train_per_class", "test_per_class", "k", "max_copies"))
        check_integers(self, ("seed",), minimum=0)
        check_numbers(self, ("rotation", "shift", "scale"), zero_ok=True)
        if self.dataset not in IMAGE_DATASETS:
            raise ValueError(f"dataset: expected one of {list(IMAGE_DATASETS)}; got {self.dataset!r}.")
        if self.dataset == "mnist" and not self.mnist_path:
            raise ValueError("mnist_path: expected a directory of MNIST IDX files or an .npz for the mnist dataset "
                             "(MNIST is never downloaded); got none.")
        if self.scale >= 1:
            raise ValueError(f"scale: expected a zoom range 1 ± scale with scale < 1; got {self.scale!r}.")


def value_market(x: np.ndarray, y: np.ndarray, data: OriginalsAndSynthetic, owners: np.ndarray, k: int,
                 scenario: str, configuration: str) -> tuple[list[dict], list[dict]]:
    """DS and ADS totals of contributors and broker for one training set (originals first)."""
    n_original = data.num_original
    labels = [f"contributor {o}" for o in owners] + [BROKER] * (len(y) - n_original)
    sigma = {"DS": [np.arange(len(y))], "ADS": [np.arange(n_original), np.arange(n_original, len(y))]}
    if len(y) == n_original:
        sigma["ADS"] = sigma["DS"]
    totals, per_contributor = [], []
    for method, groups in sigma.items():
        result = knn_ads(x, y, data.x_test, data.y_test, groups, k=k, contributors=labels)
        by_party = result.contributors
        broker = float(by_party.get(BROKER, 0.0))
        contributors = float(by_party.drop(BROKER, errors="ignore").sum())
        common = {"scenario": scenario, "configuration": configuration, "method": method,
                  "num_broker_instances": len(y) - n_original,
                  "utility_all": result.instances.prefix_utilities[-1],
                  "utility_originals": result.instances.prefix_utilities[1] if method == "ADS"
                  else float("nan")}
        totals += [common | {"party": "contributors", "total": contributors},
                   common | {"party": "broker", "total": broker}]
        per_contributor += [{"scenario": scenario, "configuration": configuration, "method": method,
                             "party": party, "value": float(value)} for party, value in by_party.items()]
    return totals, per_contributor


def run_replication_market(config: ReplicationMarketConfig, out: str | Path, *, overwrite: bool = False,
                           on_stage: Callable[[str], None] | None = None) -> str:
    """Both scenarios; writes the tables and figure to ``out`` and returns the totals as text."""

    config.check()
    out = prepare_run_dir(out, overwrite=overwrite)
    say = on_stage or (lambda line: None)
    started = time.perf_counter()
    data_rng, owner_rng = np.random.default_rng(config.seed).spawn(2)
    data = images_with_augmentations(config.dataset, config.mnist_path, config.train_per_class,
                                     config.test_per_class, data_rng, rotation=config.rotation, shift=config.shift,
                                     scale=config.scale)
    n_original = data.num_original
    if config.contributors > n_original:
        raise ValueError(f"contributors: expected at most one contributor per original ({n_original}); got "
                         f"{config.contributors}.")
    owners = owner_rng.permutation(np.arange(n_original) % config.contributors)
    say(f"data: {n_original} originals owned by {config.contributors} contributors, {len(data.y_test)} test "
        f"({time.perf_counter() - started:.1f}s)")

    started = time.perf_counter()
    totals, per_contributor = [], []
    for copies in range(config.max_copies + 1):
        x = np.vstack([data.x_original] * (copies + 1))
        y = np.concatenate([data.y_original] * (copies + 1))
        name = "original" if copies == 0 else f"copied {copies}x"
        rows, parties = value_market(x, y, data, owners, config.k, "replication", name)
        totals += rows
        per_contributor += parties
    say(f"replication: {config.max_copies + 1} configurations valued by KNN-DS and KNN-ADS "
        f"({time.perf_counter() - started:.1f}s)")

    started = time.perf_counter()
    rows, parties = value_market(data.x_original, data.y_original, data, owners, config.k, "augmentation", "original")
    totals += rows
    per_contributor += parties
    x_all, y_all = data.x_train, data.y_train
    for method, groups in {"DS": [np.arange(len(y_all))],
                           "ADS": [np.arange(n_original), np.arange(n_original, len(y_all))]}.items():
        values = knn_ads(x_all, y_all, data.x_test, data.y_test, groups, k=config.k).instances.values.sort_index()
        kept = n_original + np.flatnonzero(values.to_numpy(float)[n_original:] > 0)
        members = np.concatenate([np.arange(n_original), kept])
        rows, parties = value_market(x_all[members], y_all[members], data, owners, config.k, "augmentation",
                                     "augmented, positive kept")
        totals += [row | {"kept": len(kept)} for row in rows if row["method"] == method]
        per_contributor += [row for row in parties if row["method"] == method]
    say(f"augmentation: augmentations valued, positive ones kept, final sets valued "
        f"({time.perf_counter() - started:.1f}s)")

    totals_frame = pd.DataFrame(totals)
    totals_frame.to_csv(out / "totals.csv", index=False)
    pd.DataFrame(per_contributor).to_csv(out / "contributors.csv", index=False)
    write_run_config(out, {"simulation": "replication-market", **dataclasses.asdict(config)})
    plot(totals_frame, out / "figure3.png")
    say(f"wrote totals.csv, contributors.csv, figure3.png to {out}")
    return format_totals(totals_frame)


def format_totals(totals: pd.DataFrame) -> str:
    table = totals.pivot_table(index=["scenario", "configuration"], columns=["method", "party"], values="total",
                               sort=False)
    lines = [f"{'scenario':<13} {'configuration':<26} {'DS contrib.':>12} {'DS broker':>10} {'ADS contrib.':>13} "
             f"{'ADS broker':>11}"]
    for (scenario, configuration), row in table.iterrows():
        lines.append(f"{scenario:<13} {configuration:<26} {row[('DS', 'contributors')]:>12.4f} "
                     f"{row[('DS', 'broker')]:>10.4f} {row[('ADS', 'contributors')]:>13.4f} "
                     f"{row[('ADS', 'broker')]:>11.4f}")
    return "\n".join(lines)


def plot(totals: pd.DataFrame, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(12, 4), constrained_layout=True)
    for axis, scenario, title in zip(axes, ("replication", "augmentation"),
                                     ("(a) replication", "(b) augmentation, positive kept")):
        part = totals[totals["scenario"] == scenario]
        configurations = list(dict.fromkeys(part["configuration"]))
        for offset, method in ((-0.2, "DS"), (0.2, "ADS")):
            mine = part[part["method"] == method].set_index(["configuration", "party"])["total"]
            positions = np.arange(len(configurations)) + offset
            contributors = np.array([mine[(c, "contributors")] for c in configurations])
            broker = np.array([mine[(c, "broker")] for c in configurations])
            axis.bar(positions, contributors, width=0.38, color="tab:blue" if method == "DS" else "tab:green",
                     label=f"{method}: contributors")
            axis.bar(positions, broker, width=0.38, bottom=contributors,
                     color="tab:orange" if method == "DS" else "tab:red", label=f"{method}: broker")
        axis.set_xticks(np.arange(len(configurations)), configurations)
        axis.set_ylabel("total value")
        axis.set_title(title)
        axis.legend(fontsize=8)
    figure.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(figure)


__all__ = ["ReplicationMarketConfig", "run_replication_market"]


def cli_main(config, options) -> int:
    """``fedvalue run replication-market``: the runs, the table and the figure."""
    table = run_replication_market(config, options.out, overwrite=options.overwrite, on_stage=options.say())
    print(table)
    if options.results:
        written = write_results(options.results, {PRINTED_RESULTS: table}, options.command)
        print(f"results file: {written[0]}")
    print(f"done in {options.elapsed():.1f}s; tables and figure in {options.out}")
    return 0


#: This experiment's entry in ``fedvalue run`` (:mod:`simulations.cli.registry`).
SIMULATION = Simulation("replication-market", ReplicationMarketConfig, cli_main, results=(PRINTED_RESULTS,))
