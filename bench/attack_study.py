"""The attack study of docs/faults-and-audit.md: manipulation gain per attack and book, with and
without the defences, over seeds, IID and Dirichlet data, FedAvg and FedMedian.

    python -m bench.attack_study --out DIR            # the quick configuration (hours on 2 shared cores)
    python -m bench.attack_study --out DIR --full     # the full one (a bigger machine)
    python -m bench.attack_study --out DIR --tables   # only combine what the parts wrote

Each (partition, strategy) is one ``fedvalue run attacks`` child process writing DIR/<partition>-<strategy>/
(FedAvg over 20 seeds, FedMedian over 5 in the quick configuration; the KNN-ADS group split one
more, DIR/group-split/; the norm cap on crafted updates two more, DIR/<partition>-fedavg-norm-cap/,
tabled apart in DIR/norm-cap-table.md; the defence that also aggregates only one update per
near-duplicate cluster and no free-rider's, ``--defences 2``, four more, DIR/<partition>-<strategy>-aggregation/,
tabled in DIR/aggregation-table.md); a part that already wrote its gains.csv is
skipped, and a part whose Ray engine fails to start (a loaded machine) is tried again, so the
command can be run again until every part is done. Then the parts' totals.csv and runs.csv are
combined into DIR/gains.csv, DIR/honest_cost.csv, DIR/shells.csv and DIR/table.md (the docs'
tables). With ``--results FOLDER`` the tables behind the docs go there too, each headed by the command and
commit that made it (attack_*.csv, :data:`RESULTS`); the docs' tables are rendered from those files alone:

    python -m bench.attack_study --out DIR --results docs/results   # the study, and its results files
    python -m bench.attack_study --markdown docs/results            # the docs' tables, from the files

The adaptive attacks (``clients.attacks.adaptive``: each stays a margin M outside one defence's threshold) are a
sweep of their own, run only when asked for: ``--margins 0.05,0.2,0.5`` runs, per (partition, strategy), one part
DIR/<partition>-<strategy>-adaptive/ with every attack of :data:`ADAPTIVE` at every margin (and the norm cap of
the crafted parts, which ``adaptive-crafted`` stays within), tabled in DIR/adaptive-table.md and
DIR/adaptive-gains.csv (``--results``: attack_gains_adaptive.csv). A part holds one sweep: other margins need
another DIR.

    python -m bench.attack_study --out DIR --margins 0.05,0.2,0.5   # the adaptive sweep

With ``--duplicate-median-fraction κ`` (κ in (0, 1); 0.25 is the documented setting) the sweep also runs, beside each
of its parts (the fixed-τ control, same seeds), DIR/<partition>-<strategy>-adaptive-relative/: the same options plus
``--duplicate-median-fraction κ``, the defences' relative clusters (:mod:`fedvalue.rounds.defences.relative_clusters`).
``--fixed-second-order`` adds, for FedAvg, DIR/<partition>-fedavg-adaptive-second-order/ and its ``-relative`` part:
the same under ``--utility neg_loss --fixed-second-order`` (both second-order books booked live). The pairs are tabled
as ``--relative`` tables them (below); every part is checked before the first runs, and a part of other settings in
DIR is refused (another --out).

    python -m bench.attack_study --out DIR --margins 0.05,0.5 --duplicate-median-fraction 0.25 --fixed-second-order \
        --results docs/results   # the adaptive sweep against the relative clusters, and under the second-order books

``--unseen`` runs nothing new: the FedAvg runs of the crafted updates (``crafted-update``, ``adaptive-crafted@M``)
and their honest runs, in every part of DIR that holds them, are valued again on test images the server's
valuation never used (:mod:`simulations.experiments.attacks.unseen_split`), tabled in DIR/unseen-table.md and
DIR/unseen-gains.csv (``--results``: attack_gains_unseen.csv): is the crafted update's gain the estimator's or the
model's?

    python -m bench.attack_study --out DIR --unseen --results docs/results

``--identity-seeds N`` runs one more part, DIR/dirichlet-fedavg-identities-N/ (``--identity-strategy fedmedian``:
DIR/dirichlet-fedmedian-identities-N/, attack_gains_identities_fedmedian.csv): the identity attacks alone
(:data:`IDENTITIES`, every one participant's data under several identities) and the attack-free runs, on
Dirichlet data under FedAvg, over N seeds, where 20 leave the defended gains' intervals too wide to place
against the goal; tabled in DIR/identities-table.md (``--results``: attack_gains_identities.csv).

    python -m bench.attack_study --out DIR --identity-seeds 100 --results docs/results

``--rebook`` runs nothing new either: the identity attacks' FedAvg runs (:data:`REBOOKED`: splits, replicas, the
adaptive clusters and overlapping shards, the colluding ring) and their honest runs, in every part of DIR that holds
them, are booked again under U = −loss by the fixed-weight round game's second-order expansion, which pays any group
of identities what one client replying their summed weighted update is paid, and beside it by the run's own game,
the fixed-weight game and its first-order expansion (:mod:`simulations.experiments.attacks.rebook`), tabled in
DIR/rebook-table.md (``--results``: attack_gains_second_order.csv, attack_honest_cost_second_order.csv). A part run
with the defences (the quick and full configurations' ``--defences 1``) adds the defended second-order book,
``ads_second_order_defended`` (free-riders 0, a near-duplicate cluster one claim, each round screened again from its
record), as a book of both files and a column of the table. To book both second-order books live instead, a study
runs with ``fedvalue run attacks --fixed-second-order --utility neg_loss`` (FedAvg parts only), and its gains.csv
has them as the book ``ads_fixed_second_order``, defended gain and all.

    python -m bench.attack_study --out DIR --rebook --results docs/results

``--relative PART,PART`` runs nothing either: DIR's parts that ``fedvalue run attacks --duplicate-median-fraction κ``
wrote (the adaptive attacks against the defences' relative clusters, :mod:`fedvalue.rounds.defences.relative_clusters`)
and their controls combined into DIR/relative-table.md (``--results``: attack_gains_relative.csv,
attack_honest_cost_relative.csv; parts run with ``--fixed-second-order`` in their own table and files,
attack_*_relative_second_order.csv): what the sweep with κ tables itself, for parts run by hand.

    python -m bench.attack_study --out DIR --relative iid-fedavg-relative,dirichlet-fedavg-relative --results docs/results

``--digits RUN_DIR`` runs nothing either: the single-seed digits measurement of ``fedvalue run attacks --out RUN_DIR``
(its attacks.csv) as the docs' table, kept as attack_digits.csv with ``--results``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from bench import results_header
from fedvalue import gains_table, honest_cost
from simulations.experiments.attacks.attacks import AttacksConfig, check
from simulations.experiments.attacks.plan import adaptive_parts
from simulations.experiments.attacks.rebook import (
    BOOKS,
    DEFENDED_BOOKS,
    rebooked_cost,
    rebooked_frames,
    rebooked_gains,
)
from simulations.experiments.attacks.unseen_split import unseen_frames, unseen_gains
from simulations.runner.engine_settings import flat_fields, nest_settings


ATTACKS = ("none,sybil-split-2,sybil-split-4,sybil-split-8,sybil-replica-2,sybil-replica-4,sybil-replica-8,"
           "colluding-free-riders,delta-weights,dynamic-free-rider,crafted-update")
QUICK = ["--dataset", "fashion-mnist", "--num-clients", "6", "--train-examples", "3000", "--holdout-examples", "1000",
         "--rounds", "3", "--local-epochs", "2", "--learning-rate", "0.1", "--defences", "1",
         "--valuation-budget", "1000", "--craft-steps", "30"]
FULL = ["--dataset", "fashion-mnist", "--num-clients", "10", "--train-examples", "20000", "--holdout-examples",
        "2000", "--rounds", "5", "--local-epochs", "5", "--learning-rate", "0.1", "--defences", "1"]
#: Seeds per inner strategy: FedAvg's runs take seconds once the engine is up, FedMedian's a minute
#: (every coalition aggregated by its own code), so FedAvg gets more (tighter intervals on non-IID data).
SEEDS = {"quick": {"fedavg": 20, "fedmedian": 5}, "full": {"fedavg": 20, "fedmedian": 10}}
PARTS = [(p, s) for p in ("iid", "dirichlet") for s in ("fedavg", "fedmedian")]
#: The defence that also changes the aggregation (--defences 2: one update per near-duplicate cluster,
#: no free-rider's), for the attacks it can drop anything of; the others' runs would be the books-only ones.
AGGREGATION = ("none,sybil-replica-2,sybil-replica-4,sybil-replica-8,colluding-free-riders,delta-weights,"
               "dynamic-free-rider")
#: The norm cap (crafted updates), FedAvg only (the cap clips in weighted-mean rounds): its own parts.
CAPPED = ("none,crafted-update", ["--norm-cap", "1.25"])
#: The adaptive attacks of the sweep (--margins), each run at every margin as NAME@M.
ADAPTIVE = ("adaptive-cluster-2", "adaptive-cluster-4", "adaptive-replay", "adaptive-split-2", "adaptive-split-4",
            "adaptive-crafted")
TRIES = 3
#: The goal: no attack earns more than 1.05 times the honest earnings with the defences on.
GOAL = 1.05
#: The results files the docs' tables are rendered from, by what each holds (the prefix of DIR's own tables).
RESULTS = {"gains": "attack_gains.csv", "aggregation": "attack_gains_aggregation.csv",
           "cost": "attack_honest_cost.csv", "norm-cap-gains": "attack_gains_norm_cap.csv",
           "norm-cap-cost": "attack_honest_cost_norm_cap.csv", "shells": "attack_shells.csv",
           "adaptive-gains": "attack_gains_adaptive.csv", "adaptive-cost": "attack_honest_cost_adaptive.csv",
           "unseen": "attack_gains_unseen.csv", "digits": "attack_digits.csv",
           "identities": "attack_gains_identities.csv",
           "identities-fedmedian": "attack_gains_identities_fedmedian.csv", "rebook-gains": "attack_gains_second_order.csv",
           "rebook-cost": "attack_honest_cost_second_order.csv", "relative-gains": "attack_gains_relative.csv",
           "relative-cost": "attack_honest_cost_relative.csv",
           "relative-second-order-gains": "attack_gains_relative_second_order.csv",
           "relative-second-order-cost": "attack_honest_cost_relative_second_order.csv"}
#: The identity attacks of the study: one participant's data under several identities (split or replicated).
IDENTITIES = ("sybil-split-2", "sybil-split-4", "sybil-split-8", "sybil-replica-2", "sybil-replica-4",
              "sybil-replica-8")
#: The attacks ``--rebook`` books again (by name, or an adaptive attack by its kind): every way of presenting one
#: participant's data under several identities the study runs, and the colluding ring (perturbations that cancel).
REBOOKED = (*IDENTITIES, "adaptive-cluster", "adaptive-split", "colluding-free-riders")
#: The adaptive sweep's cost table's header note: its parts run with the crafted parts' norm cap on.
ADAPTIVE_COST = ", norm cap on"
#: The attacks whose runs ``--unseen`` values again on the unseen split: the crafted updates.
CRAFTED = ("crafted-update", "adaptive-crafted")


def run_part(out: Path, name: str, options: list[str]) -> bool:
    """One ``fedvalue run attacks`` child (tried again when it fails); whether it finished."""
    target = out / name
    done_file = "shells.csv" if name == "group-split" else "gains.csv"
    for attempt in range(1, TRIES + 1):
        if (target / done_file).exists():
            return True
        command = [sys.executable, "-m", "simulations.cli", "run", "attacks", *options, "--out", str(target),
                   "--overwrite"]
        print(f"{name}: try {attempt}: {' '.join(command[2:])}", flush=True)
        subprocess.run(command, check=False)
    return (target / done_file).exists()


def combine(out: Path, names: list[str], prefix: str = "") -> tuple[pd.DataFrame, pd.DataFrame] | None:
    """DIR/<prefix>gains.csv and <prefix>honest_cost.csv from the parts that finished; (gains, cost). The cost
    table counts, per data and strategy, the rows the defences clustered in the attack-free runs."""
    parts = [out / n for n in names if (out / n / "totals.csv").exists()]
    if not parts:
        return None
    totals = pd.concat([pd.read_csv(p / "totals.csv") for p in parts], ignore_index=True)
    runs = pd.concat([pd.read_csv(p / "runs.csv") for p in parts], ignore_index=True)
    gains, cost = gains_table(totals, runs), honest_cost(totals)
    clean = runs[runs["attack"] == "none"].groupby(["partition", "strategy"])["clustered_rows"].sum()
    cost["clustered_rows"] = [int(clean.get((p, s), 0)) for p, s in zip(cost["partition"], cost["strategy"])]
    gains.to_csv(out / f"{prefix}gains.csv", index=False)
    cost.to_csv(out / f"{prefix}honest_cost.csv", index=False)
    (out / f"{prefix}cost.md").write_text(cost_markdown(cost))
    return gains, cost


def relative_study(out: Path, names: list[str], option: str = "--relative") -> dict[str, pd.DataFrame]:
    """``--relative``: the parts ``names`` of ``out``, each a ``fedvalue run attacks`` study of one data partition,
    run with the defences' relative clusters (``--duplicate-median-fraction κ``) or with the fixed threshold alone
    (κ = 0: the control of the same seeds), combined part by part as :func:`combine` does into
    DIR/relative-gains.csv, relative-honest_cost.csv and relative-table.md; κ and, per attack, the mean rows the
    defences clustered are columns (ValueError naming ``option``, the one that named the parts, for a part that is
    missing or unfinished, or for parts none of which was run with κ)."""
    settings = {}
    for name in names:
        files = [out / name / file for file in ("run.json", "totals.csv", "runs.csv")]
        try:  # regular files only: a FIFO would block the read, a link could point anywhere
            finished = all(f.is_file() and not f.is_symlink() for f in files)
            settings[name] = json.loads(files[0].read_text()) if finished else None
        except (OSError, ValueError):
            settings[name] = None
        if not isinstance(settings[name], dict):
            raise ValueError(f"{option}: expected a finished study part {str(out / name)!r} (run.json, totals.csv, "
                             "runs.csv: regular files)")
    kappas = {name: float(saved.get("duplicate_median_fraction") or 0.0) for name, saved in settings.items()}
    if not any(kappas.values()):
        raise ValueError(f"{option}: expected at least one part run with --duplicate-median-fraction; every part "
                         "named was run with the fixed threshold")
    frames: dict[str, list[pd.DataFrame]] = {}
    for name, kappa in kappas.items():
        part_gains, part_cost = combine(out, [name], f"{name}-")
        runs = pd.read_csv(out / name / "runs.csv")
        clustered = runs.groupby("attack")["clustered_rows"].mean()
        # A part that booked the second-order books (under -loss) is tabled apart from the accuracy parts.
        key = "relative-second-order" if settings[name].get("fixed_second_order") else "relative"
        # --defences 2 (one update a cluster aggregated) is a row of its own; its honest cost is not the table's.
        defences = int(settings[name].get("defences", 1))  # a part run without defences is 0, not 1
        frames.setdefault(f"{key}-gains", []).append(part_gains.assign(
            duplicate_median_fraction=kappa, defences=defences, clustered_rows=part_gains["attack"].map(clustered)))
        if defences == 1:
            frames.setdefault(f"{key}-cost", []).append(part_cost.assign(duplicate_median_fraction=kappa))
    combined = {key: pd.concat(parts, ignore_index=True) for key, parts in frames.items()}
    tables = [relative_markdown(combined[key]) for key in ("relative-gains", "relative-second-order-gains")
              if key in combined]
    (out / "relative-table.md").write_text("\n".join(tables))
    return combined


#: The second-order book of a study run with ``--fixed-second-order`` (its defended book is its defended gain).
SECOND_ORDER_BOOK = "ads_fixed_second_order"


def relative_markdown(gains: pd.DataFrame) -> str:
    """The relative clusters' table: a row per (data, strategy, attack) and clustering rule (the fixed τ, or κ ×
    the round's median distance; a part run with ``--defences 2`` adds ", one update a cluster"), the adaptive attacks by kind and margin M past their defence's threshold (τ for
    the adaptive replicas, the header's word where they are the only adaptive attacks), the mean rows the defences
    clustered a run, each payable book's gain with the defences on and the identities' paid share of defended ADS
    beside their seats' honest one; for parts that booked the second-order books (under −loss), that book's gain
    plain and defended and the defended book's paid share instead of outflow and LOO."""
    if "defences" not in gains:  # results kept before the column: every part ran --defences 1
        gains = gains.assign(defences=1)
    second = SECOND_ORDER_BOOK in set(gains["book"])
    books = "second order | second order, defended | paid, second order defended (honestly)" if second else \
        "outflow, defended | LOO, defended"
    parts = [adaptive_parts(a) or (a, 0, float("nan")) for a in gains["attack"]]
    # The sweep's replayer, split and crafted update stay outside other thresholds than τ (:data:`OUTSIDE`).
    threshold = "τ" if {kind for kind, size, _ in parts if size} <= {"adaptive-cluster"} else "its defence's threshold"
    lines = [f"| data | strategy | attack | margin M past {threshold} | clusters | rows clustered (a run) | ADS, defended | "
             f"paid, defended (honestly) | {books} |", "|" + "---|" * (10 + second)]
    # Size 1 (the replayer, the crafted update) is no size: adaptive-replay, not adaptive-replay-1.
    order = gains.assign(_kind=[f"{kind}-{size}" if size > 1 else kind for kind, size, _ in parts],
                         _margin=[margin for _, _, margin in parts], _first=gains["attack"] != "none")
    order = order.sort_values(["partition", "strategy", "_first", "_kind", "_margin", "duplicate_median_fraction",
                               "defences"], kind="stable")
    for key in dict.fromkeys(zip(order["partition"], order["strategy"], order["attack"],
                                 order["duplicate_median_fraction"], order["defences"])):
        rows = gains[(gains["duplicate_median_fraction"] == key[3]) & (gains["defences"] == key[4])]
        ads = _row(rows, key[:3], "ads")
        kind, size, margin = adaptive_parts(key[2]) or (key[2], 0, float("nan"))
        name, past = (f"{kind}-{size}" if size > 1 else kind), (f"{margin:g}" if size else "—")
        rule = (f"κ = {key[3]:g} × median" if key[3] else "τ = 0.05") + (", one update a cluster" if key[4] == 2 else "")
        cells = [key[0], key[1], name, past, rule, f"{ads['clustered_rows']:g}", _interval(ads, "defended_"),
                 f"{ads['defended_paid']:.3f} ({ads['defended_paid_honest']:.3f})"]
        if second:
            book = _row(rows, key[:3], SECOND_ORDER_BOOK)
            cells += [_interval(book, ""), _interval(book, "defended_"),
                      f"{book['defended_paid']:.3f} ({book['defended_paid_honest']:.3f})"]
        else:
            cells += [_interval(_row(rows, key[:3], "tracin_outflow"), "defended_"),
                      _interval(_row(rows, key[:3], "loo"), "defended_")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_tables(out: Path, names: list[str], capped: list[str], aggregated: list[str],
                 adaptive: list[str] = ()) -> dict[str, pd.DataFrame]:
    """DIR/table.md (the gains), norm-cap-table.md, adaptive-table.md, cost.md files and shells.md from the parts'
    tables; the tables behind them, by their :data:`RESULTS` key (those of parts that finished)."""
    frames = {}
    for prefix, parts in (("", names), ("norm-cap-", capped), ("aggregation-", aggregated),
                          ("adaptive-", adaptive)):
        combined = combine(out, parts, prefix)
        if combined is not None:
            frames[f"{prefix}gains"], frames[f"{prefix}cost"] = combined
    frames["aggregation"] = frames.pop("aggregation-gains", None)
    frames.pop("aggregation-cost", None)
    if "gains" in frames:
        (out / "table.md").write_text(markdown(frames["gains"], frames["aggregation"]))
    if "norm-cap-gains" in frames:
        (out / "norm-cap-table.md").write_text(markdown(frames["norm-cap-gains"]))
    if "adaptive-gains" in frames:
        (out / "adaptive-table.md").write_text(adaptive_markdown(frames["adaptive-gains"]))
    if (out / "group-split" / "shells.csv").exists():
        frames["shells"] = pd.read_csv(out / "group-split" / "shells.csv")
        frames["shells"].to_csv(out / "shells.csv", index=False)
        (out / "shells.md").write_text(shells_markdown(frames["shells"]))
    return {key: frame for key, frame in frames.items() if frame is not None}


def write_results(folder: Path, frames: dict[str, pd.DataFrame], command: str) -> None:
    """The docs' tables' files in ``folder`` (:data:`RESULTS`), each headed by ``command`` and the commit."""
    folder.mkdir(parents=True, exist_ok=True)
    for key, frame in frames.items():
        (folder / RESULTS[key]).write_text(results_header(command) + frame.to_csv(index=False))


def read_results(folder: Path) -> dict[str, pd.DataFrame]:
    """The :data:`RESULTS` files ``folder`` holds, by key (the header line skipped)."""
    return {key: pd.read_csv(folder / name, comment="#") for key, name in RESULTS.items()
            if (folder / name).is_file()}


def docs_tables(frames: dict[str, pd.DataFrame]) -> list[str]:
    """The docs' tables, in the docs' order, each as its markdown text: the gains (ADS, then outflow and LOO),
    their cost to honest clients, the norm cap's gains and cost, the shell groups; from the results alone."""
    tables = []
    if "digits" in frames:
        tables.append(digits_markdown(frames["digits"]).rstrip("\n"))
    if "gains" in frames:
        tables += markdown(frames["gains"], frames.get("aggregation")).rstrip("\n").split("\n\n")
    if "cost" in frames:
        tables.append(cost_markdown(frames["cost"]).rstrip("\n"))
    if "norm-cap-gains" in frames:
        tables += markdown(frames["norm-cap-gains"]).rstrip("\n").split("\n\n")
    if "norm-cap-cost" in frames:
        tables.append(cost_markdown(frames["norm-cap-cost"]).rstrip("\n"))
    if "shells" in frames:
        tables.append(shells_markdown(frames["shells"]).rstrip("\n"))
    if "adaptive-gains" in frames:
        tables.append(adaptive_markdown(frames["adaptive-gains"]).rstrip("\n"))
    if "adaptive-cost" in frames:
        tables.append(cost_markdown(frames["adaptive-cost"], ADAPTIVE_COST).rstrip("\n"))
    if "unseen" in frames:
        tables.append(unseen_markdown(frames["unseen"]).rstrip("\n"))
    for key in ("identities", "identities-fedmedian"):
        if key in frames:
            tables.append(identities_markdown(frames[key]).rstrip("\n"))
    if "rebook-gains" in frames:
        tables.append(rebook_markdown(frames["rebook-gains"]).rstrip("\n"))
    if "rebook-cost" in frames:
        tables.append(rebook_cost_markdown(frames["rebook-cost"]).rstrip("\n"))
    for key in ("relative", "relative-second-order"):
        if f"{key}-gains" in frames:
            tables.append(relative_markdown(frames[f"{key}-gains"]).rstrip("\n"))
        if f"{key}-cost" in frames:
            cost = frames[f"{key}-cost"][frames[f"{key}-cost"]["duplicate_median_fraction"] > 0]
            kappa = ", ".join(f"{k:g}" for k in sorted(set(cost["duplicate_median_fraction"])))
            tables.append(cost_markdown(cost, f", relative clusters κ = {kappa}").rstrip("\n"))
    return tables


def _interval(row: pd.Series | None, prefix: str) -> str:
    if row is None:
        return "—"
    gain, low, high = row[f"{prefix}gain"], row[f"{prefix}gain_low"], row[f"{prefix}gain_high"]
    if not np.isfinite(gain) or not row[f"{prefix}honest_positive"]:
        return "n/a"
    return f"{gain:.2f} [{low:.2f}, {high:.2f}]" + (" ✗" if gain > GOAL else "")


def _row(gains: pd.DataFrame | None, key: tuple, book: str) -> pd.Series | None:
    if gains is None:
        return None
    found = gains[(gains["partition"] == key[0]) & (gains["strategy"] == key[1]) & (gains["attack"] == key[2])
                  & (gains["book"] == book)]
    return None if found.empty else found.iloc[0]


def markdown(gains: pd.DataFrame, aggregation: pd.DataFrame | None = None) -> str:
    """The docs' two gain tables: ADS with paid shares and accuracy, then TracIn outflow and LOO;
    each book without defences, with the defences' books (--defences 1) and with the aggregation
    defence too (--defences 2; "—" where the attack's run would be the books-only one)."""
    ads = ["| data | strategy | attack | ADS | ADS, books | ADS, books + aggregation | paid | paid, books | "
           "paid, books + aggregation | paid honestly (plain / books) | accuracy change | accuracy change, books + "
           "aggregation |",
           "|" + "---|" * 12]
    flows = ["| data | strategy | attack | outflow | outflow, books | outflow, books + aggregation | LOO | "
             "LOO, books | LOO, books + aggregation |", "|" + "---|" * 9]
    for key in dict.fromkeys(zip(gains["partition"], gains["strategy"], gains["attack"])):
        plain, agg = _row(gains, key, "ads"), _row(aggregation, key, "ads")
        paid_agg = "—" if agg is None else f"{agg['defended_paid']:.3f}"
        change_agg = "—" if agg is None else f"{agg['accuracy_change']:+.3f}"
        ads.append(f"| {' | '.join(key)} | {_interval(plain, '')} | {_interval(plain, 'defended_')} | "
                   f"{_interval(agg, 'defended_')} | {plain['paid']:.3f} | {plain['defended_paid']:.3f} | {paid_agg} | "
                   f"{plain['paid_honest']:.3f} / {plain['defended_paid_honest']:.3f} | "
                   f"{plain['accuracy_change']:+.3f} [{plain['accuracy_change_low']:+.3f}, "
                   f"{plain['accuracy_change_high']:+.3f}] | {change_agg} |")
        cells = []
        for book in ("tracin_outflow", "loo"):
            row, agg_row = _row(gains, key, book), _row(aggregation, key, book)
            cells += [_interval(row, ""), _interval(row, "defended_"), _interval(agg_row, "defended_")]
        flows.append(f"| {' | '.join(key)} | " + " | ".join(cells) + " |")
    return "\n".join(ads) + "\n\n" + "\n".join(flows) + "\n"


def identities_markdown(gains: pd.DataFrame) -> str:
    """The identity attacks over more seeds (``--identity-seeds``): a row per attack, each payable book's gain
    with the defences on (ADS also without) with its interval, and the accuracy change."""
    lines = ["| data | strategy | attack | seeds | ADS | ADS, defended | outflow, defended | LOO, defended | "
             "accuracy change |", "|" + "---|" * 9]
    for key in dict.fromkeys(zip(gains["partition"], gains["strategy"], gains["attack"])):
        ads, outflow, loo = (_row(gains, key, book) for book in ("ads", "tracin_outflow", "loo"))
        lines.append(f"| {' | '.join(key)} | {int(ads['seeds'])} | {_interval(ads, '')} | "
                     f"{_interval(ads, 'defended_')} | {_interval(outflow, 'defended_')} | "
                     f"{_interval(loo, 'defended_')} | {ads['accuracy_change']:+.3f} "
                     f"[{ads['accuracy_change_low']:+.3f}, {ads['accuracy_change_high']:+.3f}] |")
    return "\n".join(lines) + "\n"


#: The defence each adaptive attack stays outside of, by its kind (``clients.attacks.adaptive``).
OUTSIDE = {"adaptive-cluster": "near-duplicate clusters", "adaptive-replay": "replay test",
           "adaptive-split": "arrivals by claimed size", "adaptive-crafted": "norm cap"}


def adaptive_markdown(gains: pd.DataFrame) -> str:
    """The adaptive sweep's table: a row per (data, strategy, attack, margin), the defence the attack stays
    outside of, and each payable book's gain with the defences on (ADS also without), the identities' paid
    share of ADS with the defences on beside their seats' honest one, and the accuracy change."""
    lines = ["| data | strategy | attack | stays outside | margin M | ADS | ADS, defended | paid, defended "
             "(honestly) | outflow, defended | LOO, defended | accuracy change |", "|" + "---|" * 11]
    for key in dict.fromkeys(zip(gains["partition"], gains["strategy"], gains["attack"])):
        kind, size, margin = adaptive_parts(key[2])
        ads, outflow, loo = (_row(gains, key, book) for book in ("ads", "tracin_outflow", "loo"))
        name = kind if kind in ("adaptive-replay", "adaptive-crafted") else f"{kind}-{size}"
        lines.append(f"| {key[0]} | {key[1]} | {name} | {OUTSIDE[kind]} | {margin:g} | {_interval(ads, '')} | "
                     f"{_interval(ads, 'defended_')} | {ads['defended_paid']:.3f} ({ads['defended_paid_honest']:.3f}) | "
                     f"{_interval(outflow, 'defended_')} | {_interval(loo, 'defended_')} | "
                     f"{ads['accuracy_change']:+.3f} [{ads['accuracy_change_low']:+.3f}, "
                     f"{ads['accuracy_change_high']:+.3f}] |")
    return "\n".join(lines) + "\n"


def cost_markdown(cost: pd.DataFrame, setting: str = "") -> str:
    """The defences' cost to honest clients in the attack-free runs (:func:`combine`'s cost table); ``setting``
    names what differs from the study's defences (the adaptive sweep's norm cap) in the header."""
    lines = [f"| data | strategy | book | mean change of an honest client's paid share{setting} | largest | "
             "typical share (median, no defences) | free-rider flags | clustered rows |", "|---|---|---|---|---|---|---|---|"]
    for _, row in cost.iterrows():
        typical = f"{row['typical_share']:.4f}" if "typical_share" in row else "—"
        lines.append(f"| {row['partition']} | {row['strategy']} | {row['book']} | {row['mean_share_change']:.4f} | "
                     f"{row['max_share_change']:.4f} | {typical} | {row['free_rider_flags']} | {row['clustered_rows']} |")
    return "\n".join(lines) + "\n"


def shells_markdown(shells: pd.DataFrame) -> str:
    table = shells.groupby(["shells", "method"], sort=False)["gain"].agg(["mean", "min", "max"]).reset_index()
    lines = ["| shells | method | gain (mean over seeds) | min | max |", "|---|---|---|---|---|"]
    lines += [f"| {r['shells']} | {r['method']} | {r['mean']:.3f} | {r['min']:.3f} | {r['max']:.3f} |"
              for _, r in table.iterrows()]
    return "\n".join(lines) + "\n"


def sweep_attacks(margins: list[float]) -> str:
    """--attacks of an adaptive part: the honest run, then every attack of :data:`ADAPTIVE` at every margin."""
    return ",".join(["none"] + [f"{name}@{margin:g}" for name in ADAPTIVE for margin in margins])


def parse_margins(text: str) -> list[float]:
    """--margins as numbers ≥ 0 (ValueError naming the option and what it got)."""
    try:
        margins = [float(part) for part in text.split(",")]
    except ValueError:
        margins = []
    if not margins or any(not (0 <= m < float("inf")) for m in margins) or len(set(margins)) != len(margins):
        raise ValueError(f"--margins: expected distinct margins M >= 0, comma-separated (e.g. 0.05,0.2,0.5); "
                         f"got {text!r}")
    return margins


def parse_duplicate_median_fraction(text: str) -> float:
    """--duplicate-median-fraction as κ in (0, 1) (ValueError naming the option and what it got)."""
    try:
        kappa = float(text)
    except ValueError:
        kappa = float("nan")
    if not 0 < kappa < 1:  # NaN fails too
        raise ValueError(f"--duplicate-median-fraction: expected κ, a number in (0, 1) (0.25 is the documented "
                         f"setting); got {text!r}")
    return kappa


def sweep_parts(margins: list[float], options: list[str], seeds: dict[str, int], kappa: float = 0.0,
                second_order: bool = False) -> list[tuple[str, list[str]]]:
    """The adaptive sweep's parts as (name, the options of its ``fedvalue run attacks`` child), FedAvg's first
    (minutes each, where FedMedian's take an hour, so a sitting cut short still tables them).

    Per (partition, strategy) of :data:`PARTS` whose strategy ``seeds`` counts: <partition>-<strategy>-adaptive,
    every attack of :data:`ADAPTIVE` at every margin with the crafted parts' norm cap, which also serves as the
    fixed-τ control of its relative part; with κ > 0, <partition>-<strategy>-adaptive-relative beside it, the same
    options and seeds plus ``--duplicate-median-fraction κ`` (the defences' relative clusters), so the two differ
    in the clustering rule alone. With ``second_order``, for FedAvg (the only strategy the fixed-weight coalition
    rule is defined for), <partition>-fedavg-adaptive-second-order and its -relative part: the control's and the
    relative part's options under U = −loss with both second-order books booked live. ValueError naming the option
    for κ outside [0, 1) (0: off), or ``second_order`` without κ (its parts are tabled against the relative
    clusters) or without a FedAvg part."""
    if not 0 <= kappa < 1:
        raise ValueError(f"--duplicate-median-fraction: expected κ, a number in (0, 1) (0.25 is the documented "
                         f"setting), or 0 for none; got {kappa!r}")
    strategies = [strategy for strategy in dict.fromkeys(s for _, s in PARTS) if strategy in seeds]
    if second_order and not kappa:
        raise ValueError("--fixed-second-order: expected --duplicate-median-fraction κ too (its parts are tabled "
                         "beside the relative clusters'); got no κ")
    if second_order and "fedavg" not in strategies:
        raise ValueError(f"--fixed-second-order: expected FedAvg among the sweep's strategies (the fixed-weight "
                         f"coalition rule is FedAvg's); got {', '.join(strategies) or 'none'}")
    relative = ["--duplicate-median-fraction", str(kappa)]
    books = ["--utility", "neg_loss", "--fixed-second-order"]
    parts = []
    for partition, strategy in sorted((p for p in PARTS if p[1] in seeds), key=lambda part: part[1] != "fedavg"):
        name = f"{partition}-{strategy}-adaptive"
        control = ["--attacks", sweep_attacks(margins), *options, *CAPPED[1], "--partitions", partition,
                   "--strategies", strategy, "--seeds", str(seeds[strategy])]
        parts.append((name, control))
        if kappa:
            parts.append((f"{name}-relative", [*control, *relative]))
        if second_order and strategy == "fedavg":
            parts += [(f"{name}-second-order", [*control, *books]),
                      (f"{name}-second-order-relative", [*control, *books, *relative])]
    return parts


def part_config(options: list[str]) -> AttacksConfig:
    """The settings ``fedvalue run attacks`` takes from a part's ``options``, read by its own parser (no Ray)."""
    from simulations.cli.main import build_parser

    args = build_parser().parse_args(["run", "attacks", *options, "--out", "part"])
    return AttacksConfig(**nest_settings(AttacksConfig, {f.name: getattr(args, f.name)
                                                         for f in flat_fields(AttacksConfig)}))


#: Besides the attacks (--margins), the settings that tell one sweep's part from another's, by the option of this
#: script that sets them: a part run with another κ or other books is not this sweep's.
SWEEP_SETTINGS = {"duplicate_median_fraction": "--duplicate-median-fraction", "utility": "--fixed-second-order",
                  "fixed_second_order": "--fixed-second-order"}


def check_sweep(out: Path, parts: list[tuple[str, list[str]]]) -> None:
    """Before any part runs: each part's options are ones ``fedvalue run attacks`` takes (its own check, as its child
    would run it: a margin a split cannot reach is said here, not by three failed children), and no part of ``out``
    holds a run of other settings (its gains.csv would be taken as this sweep's). ValueError naming the option."""
    from simulations.cli.main import build_parser
    from simulations.cli.options import command_line_options, in_cli_words

    defaults = AttacksConfig()
    for name, options in parts:
        config = part_config(options)
        saved_file = out / name / "run.json"
        if saved_file.is_file():
            try:
                saved = json.loads(saved_file.read_text())
            except (OSError, ValueError):
                saved = None
            if not isinstance(saved, dict):
                raise ValueError(f"--margins: expected {saved_file} to hold a study part's settings; it does not: "
                                 "give another --out")
            held = saved.get("attacks")
            if held is not None and list(held) != list(config.attacks):
                raise ValueError(f"--margins: {out / name} holds a sweep of other attacks ({','.join(held)}); "
                                 f"expected {','.join(config.attacks)}: give another --out")
            for key, option in SWEEP_SETTINGS.items():
                was, wanted = saved.get(key, getattr(defaults, key)), getattr(config, key)
                if was != wanted:
                    raise ValueError(f"{option}: {out / name} was run with {key} = {was!r}; expected {wanted!r}: "
                                     "give another --out")
        try:
            check(config)
        except ValueError as error:
            said = in_cli_words(str(error), command_line_options(build_parser()))
            raise ValueError(f"--margins: fedvalue run attacks refuses part {name}: {said}") from None


def run_sweep(out: Path, margins: list[float], options: list[str], seeds: dict[str, int], kappa: float = 0.0,
              second_order: bool = False) -> list[str]:
    """The adaptive sweep's parts (:func:`sweep_parts`), each run unless it already finished; their names. Every
    part is checked before the first runs (:func:`check_sweep`: ValueError naming the option)."""
    parts = sweep_parts(margins, options, seeds, kappa, second_order)
    check_sweep(out, parts)
    for name, part_options in parts:
        run_part(out, name, part_options)
    return [name for name, _ in parts]


#: The single-seed digits measurement's attacks (``fedvalue run attacks``, its attacks.csv), as the docs label them;
#: ``none`` is the honest baseline the prose quotes, not a row.
DIGITS_LABELS = {"free-rider": "free-rider `FreeRider()`", "free-rider-noise": "free-rider + noise {noise_std:g}",
                 "inflated-count": "inflated count ×{inflation:g}", "inflated-count-reviewed": "inflated count, reviewed",
                 "replicator": "replicator of client {source}", "sign-flip": "sign-flip", "boost": "boost ×{boost:g}"}


#: The settings that name the digits measurement's attacks, kept beside its rows in the results file.
DIGITS_SETTINGS = ("noise_std", "inflation", "source", "boost")


def digits_results(run_dir: Path) -> pd.DataFrame:
    """The results-file frame of a ``fedvalue run attacks`` directory: its attacks.csv with the settings that name
    the attacks (:data:`DIGITS_SETTINGS`) from its run.json (ValueError naming ``--digits`` for another folder)."""
    if not ((run_dir / "attacks.csv").is_file() and (run_dir / "run.json").is_file()):
        raise ValueError(f"--digits: expected a fedvalue run attacks directory (attacks.csv, run.json); got "
                         f"{str(run_dir)!r}")
    saved = json.loads((run_dir / "run.json").read_text())
    return pd.read_csv(run_dir / "attacks.csv").assign(**{key: saved.get(key) for key in DIGITS_SETTINGS})


def _figure(value: float, decimals: int = 3) -> str:
    """A table figure: 0 as 0, |x| ≥ 1 rounded to a whole number, else ``decimals`` places; minus as U+2212."""
    if value == 0:
        return "0"
    text = f"{value:.0f}" if abs(value) >= 1 else f"{value:.{decimals}f}"
    return text.replace("-", "−")


def digits_markdown(attacks: pd.DataFrame, settings: dict | None = None) -> str:
    """The single-seed digits table of docs/faults-and-audit.md from ``fedvalue run attacks``' attacks.csv: per
    attack, the attacker's totals beside the honest clients' mean (ADS, LOO, TracIn outflow and inflow) and the
    accuracy change; the attacks are named by their settings (:data:`DIGITS_SETTINGS`: the file's columns of them,
    else ``settings``, else the run's defaults)."""
    named = {"noise_std": 1e-3, "inflation": 50.0, "source": 7, "boost": 5.0}
    named |= {key: attacks[key].iloc[0] for key in DIGITS_SETTINGS if key in attacks} | (settings or {})
    lines = ["| attack | ADS (honest) | LOO (honest) | TracIn outflow (honest) | inflow (honest) | accuracy change |",
             "|---|---|---|---|---|---|"]
    for _, row in attacks[attacks["attack"] != "none"].iterrows():
        cells = [f"{_figure(row[book])} ({_figure(row[f'{book}_honest'])})" for book in ("ads", "loo")]
        cells += [f"{_figure(row[book], 2)} ({_figure(row[f'{book}_honest'], 2)})" for book in ("outflow", "inflow")]
        label = DIGITS_LABELS.get(row["attack"], row["attack"]).format(**named)
        lines.append(f"| {label} | {' | '.join(cells)} | {_figure(row['accuracy_change'])} |")
    return "\n".join(lines) + "\n"


def unseen_study(out: Path) -> pd.DataFrame | None:
    """DIR/unseen-gains.csv and unseen-table.md: the crafted updates' runs of every part under ``out`` valued on
    the unseen split (None when no part holds one)."""
    tables = []
    for part in sorted(p for p in out.iterdir() if (p / "runs.csv").is_file()):
        ran = pd.read_csv(part / "runs.csv")
        crafted = sorted({a for a in ran.loc[ran["strategy"] == "fedavg", "attack"]
                          if str(a).split("@")[0] in CRAFTED})
        if crafted:
            print(f"{part.name}: valuing {', '.join(crafted)} again on the unseen split", flush=True)
            tables.append(unseen_gains(*unseen_frames(part, AttacksConfig, crafted)).assign(part=part.name))
    if not tables:
        return None
    gains = pd.concat(tables, ignore_index=True)
    gains.to_csv(out / "unseen-gains.csv", index=False)
    (out / "unseen-table.md").write_text(unseen_markdown(gains))
    return gains


def _rebooked(attack: str) -> bool:
    """Whether ``attack`` is one :data:`REBOOKED` names (an adaptive one by its kind, ``adaptive-split-2@0.2``)."""
    return attack in REBOOKED or attack.split("@")[0].rsplit("-", 1)[0] in REBOOKED


def rebook_study(out: Path) -> tuple[pd.DataFrame, pd.DataFrame] | None:
    """DIR/rebook-gains.csv, rebook-cost.csv and rebook-table.md: the identity attacks' FedAvg runs of every part
    under ``out`` (those that aggregate every reply: not ``-aggregation``) booked again (None when no part holds
    one)."""
    gains, costs = [], []
    for part in sorted(p for p in out.iterdir() if (p / "runs.csv").is_file() and not p.name.endswith("-aggregation")):
        ran = pd.read_csv(part / "runs.csv")
        attacks = [a for a in dict.fromkeys(ran.loc[ran["strategy"] == "fedavg", "attack"]) if _rebooked(str(a))]
        if attacks:
            print(f"{part.name}: booking {len(attacks)} identity attacks again", flush=True)
            totals, runs = rebooked_frames(part, AttacksConfig, attacks)
            gains.append(rebooked_gains(totals, runs).assign(part=part.name))
            costs.append(rebooked_cost(totals).assign(part=part.name))
    if not gains:
        return None
    gains, costs = pd.concat(gains, ignore_index=True), pd.concat(costs, ignore_index=True)
    gains.to_csv(out / "rebook-gains.csv", index=False)
    costs.to_csv(out / "rebook-cost.csv", index=False)
    (out / "rebook-table.md").write_text(rebook_markdown(gains) + "\n" + rebook_cost_markdown(costs))
    return gains, costs


def _gain(row: pd.Series) -> str:
    if not np.isfinite(row["gain"]) or not row["honest_positive"]:
        return "n/a"
    return f"{row['gain']:.3f} [{row['gain_low']:.3f}, {row['gain_high']:.3f}]" + (" ✗" if row["gain"] > GOAL else "")


def rebook_markdown(gains: pd.DataFrame) -> str:
    """``--rebook``'s gains: a row per (part, attack), each book's gain under −loss with its interval, and the
    identities' paid share of the second-order book beside their seats' honest share; where the file holds the
    defended second-order book (parts run with the defences on), its gain and paid share too, "—" in a part without
    it (a file without it renders as before)."""
    heads = {"ads": "ADS, the run's game", "ads_fixed_weight": "ADS, fixed-weight game",
             "ads_first_order": "first order", "ads_second_order": "second order",
             "ads_second_order_defended": "second order, defended"}
    defended = [b for b in DEFENDED_BOOKS if b in set(gains["book"])]
    shown = [*BOOKS, *defended]
    paid = ["paid, second order (honestly)"] + [f"paid, {heads[b]} (honestly)" for b in defended]
    lines = ["| part | attack | seeds | " + " | ".join([*(heads[b] for b in shown), *paid]) + " |",
             "|" + "---|" * (len(shown) + len(paid) + 3)]
    for (part, attack), group in gains.groupby(["part", "attack"], sort=False):
        books = group.set_index("book")
        second = books.loc["ads_second_order"]
        cells = [_gain(books.loc[b]) if b in books.index else "—" for b in shown]
        cells += [_paid(books, b) for b in ("ads_second_order", *defended)]
        lines.append(f"| {part} | {attack} | {int(second['seeds'])} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _paid(books: pd.DataFrame, book: str) -> str:
    """The identities' paid share under ``book`` beside their seats' honest one ("—" where the part lacks it)."""
    if book not in books.index:
        return "—"
    return f"{books.loc[book, 'paid']:.3f} ({books.loc[book, 'paid_honest']:.3f})"


def rebook_cost_markdown(cost: pd.DataFrame) -> str:
    """``--rebook``'s cost to honest clients: per part and book, the change of an honest client's paid share
    against the run's own game under −loss, beside a typical share."""
    lines = ["| part | book | mean change of an honest client's paid share against the run's game | largest | "
             "typical share (median, the run's game) |", "|---|---|---|---|---|"]
    for _, row in cost.iterrows():
        lines.append(f"| {row['part']} | {row['book']} | {row['mean_share_change']:.4f} | "
                     f"{row['max_share_change']:.4f} | {row['typical_share']:.4f} |")
    return "\n".join(lines) + "\n"


def _ratio(row: pd.Series, prefix: str, signed: bool = False) -> str:
    form = "{:+.3f}" if signed else "{:.2f}"
    return (form.format(row[prefix]) + " [" + form.format(row[f"{prefix}_low"]) + ", "
            + form.format(row[f"{prefix}_high"]) + "]")


def unseen_markdown(gains: pd.DataFrame) -> str:
    """The unseen split's table: per study part (its folder: data, strategy and the defences it ran with, e.g.
    ``-norm-cap``, ``-adaptive``) and crafted attack, its ADS gain and the other clients' ratio on the server's
    held-out set and on the unseen split, and the accuracy change on each."""
    lines = ["| part (data-strategy-defences) | attack | seeds | ADS gain, held-out | ADS gain, unseen | "
             "others' ADS, held-out | others' ADS, unseen | accuracy change, held-out | accuracy change, unseen |",
             "|" + "---|" * 9]
    for _, row in gains.iterrows():
        lines.append(f"| {row['part']} | {row['attack']} | {row['seeds']} | {_ratio(row, 'gain_held_out')} | "
                     f"{_ratio(row, 'gain_unseen')} | {_ratio(row, 'others_held_out')} | "
                     f"{_ratio(row, 'others_unseen')} | {_ratio(row, 'accuracy_change_held_out', True)} | "
                     f"{_ratio(row, 'accuracy_change_unseen', True)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.attack_study", allow_abbrev=False,
                                     description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--out", type=Path, help="the study's folder (its parts and combined tables)")
    parser.add_argument("--full", action="store_true", help="the full configuration instead of the quick one")
    parser.add_argument("--tables", action="store_true", help="only combine the parts already written")
    parser.add_argument("--results", type=Path, help="also write the docs' tables' files (attack_*.csv) here")
    parser.add_argument("--margins", metavar="M,M,...",
                        help="run only the adaptive sweep: every adaptive attack at each margin M >= 0 (how far "
                             "outside its defence's threshold), e.g. 0.05,0.2,0.5")
    parser.add_argument("--duplicate-median-fraction", metavar="κ",
                        help="with --margins: also run each adaptive part against the defences' relative clusters "
                             "(fedvalue run attacks --duplicate-median-fraction κ, κ in (0, 1), e.g. 0.25) beside it, "
                             "its fixed-threshold control, and table both (relative-table.md; with --results: "
                             "attack_gains_relative.csv, attack_honest_cost_relative.csv)")
    parser.add_argument("--fixed-second-order", action="store_true",
                        help="with --margins and --duplicate-median-fraction: also run the FedAvg parts under "
                             "U = -loss with both second-order books booked live (fedvalue run attacks --utility "
                             "neg_loss --fixed-second-order), with and without the relative clusters")
    parser.add_argument("--unseen", action="store_true",
                        help="run nothing new: value the crafted updates' FedAvg runs of DIR's parts again on test "
                             "images the server's valuation never used")
    parser.add_argument("--rebook", action="store_true",
                        help="run nothing new: book the identity attacks' FedAvg runs of DIR's parts again by the "
                             "fixed-weight game's second-order expansion (and beside it three more books), U = -loss")
    parser.add_argument("--digits", type=Path, metavar="RUN_DIR",
                        help="run nothing: the single-seed digits measurement of `fedvalue run attacks --out RUN_DIR` "
                             "as the docs' table (with --results: attack_digits.csv)")
    parser.add_argument("--identity-seeds", type=int, metavar="N",
                        help="run only the identity attacks on Dirichlet data over N seeds (with --results: "
                             "attack_gains_identities.csv, or attack_gains_identities_fedmedian.csv)")
    parser.add_argument("--identity-strategy", choices=("fedavg", "fedmedian"), default="fedavg",
                        help="with --identity-seeds: the inner strategy of that part (default: fedavg)")
    parser.add_argument("--relative", metavar="PART,PART",
                        help="run nothing: table DIR's parts run with --duplicate-median-fraction (the adaptive "
                             "attacks against the relative clusters; with --results: attack_gains_relative.csv, "
                             "attack_honest_cost_relative.csv)")
    parser.add_argument("--markdown", type=Path, metavar="FOLDER",
                        help="print the docs' tables from FOLDER's attack_*.csv alone (runs nothing)")
    args = parser.parse_args(argv)
    try:
        margins = None if args.margins is None else parse_margins(args.margins)
        kappa = None if args.duplicate_median_fraction is None else \
            parse_duplicate_median_fraction(args.duplicate_median_fraction)
    except ValueError as error:
        parser.error(str(error))
    # Both only add parts to the adaptive sweep: alone they would be ignored without a word.
    if kappa is not None and margins is None:
        parser.error("--duplicate-median-fraction: expected --margins M,M,... too (κ runs the adaptive sweep's parts "
                     f"against the relative clusters); got --duplicate-median-fraction {args.duplicate_median_fraction}"
                     " without --margins")
    if args.fixed_second_order and (margins is None or kappa is None):
        parser.error("--fixed-second-order: expected --margins M,M,... and --duplicate-median-fraction κ too (it books "
                     "the sweep's FedAvg parts, tabled beside the relative clusters'); got --fixed-second-order "
                     "without " + " and ".join(option for option, value in (("--margins", margins),
                                                                         ("--duplicate-median-fraction", kappa))
                                               if value is None))
    if args.markdown is not None:
        frames = read_results(args.markdown)
        if not frames:
            parser.error(f"--markdown: expected a folder holding attack_*.csv; got {str(args.markdown)!r}")
        print("\n\n".join(docs_tables(frames)))
        return
    if args.digits is not None:
        try:
            frame = digits_results(args.digits)
        except ValueError as error:
            parser.error(str(error))
        if args.results is not None:
            write_results(args.results, {"digits": frame}, "python -m bench.attack_study "
                          + " ".join(argv if argv is not None else sys.argv[1:]))
        print(digits_markdown(frame))
        return
    if args.out is None:
        parser.error("--out: expected the study's folder")
    options, seeds = (FULL, SEEDS["full"]) if args.full else (QUICK, SEEDS["quick"])
    if args.relative is not None:
        try:
            frames = relative_study(args.out, [name for name in args.relative.split(",") if name])
        except ValueError as error:
            parser.error(str(error))
        if args.results is not None:
            write_results(args.results, frames, "python -m bench.attack_study "
                          + " ".join(argv if argv is not None else sys.argv[1:]))
        print((args.out / "relative-table.md").read_text())
        return
    if args.unseen or args.rebook:
        if not args.out.is_dir():
            parser.error(f"--out: expected the study's folder holding its parts; got {str(args.out)!r}")
        if args.unseen:
            gains = unseen_study(args.out)
            frames = None if gains is None else {"unseen": gains}
            option, missing, table = "--unseen", "a FedAvg run of a crafted update", "unseen-table.md"
        else:
            booked = rebook_study(args.out)
            frames = None if booked is None else {"rebook-gains": booked[0], "rebook-cost": booked[1]}
            option, missing, table = "--rebook", "a FedAvg run of an identity attack", "rebook-table.md"
        if frames is None:
            parser.error(f"{option}: no part of {str(args.out)!r} holds {missing}")
        if args.results is not None:
            write_results(args.results, frames, "python -m bench.attack_study "
                          + " ".join(argv if argv is not None else sys.argv[1:]))
        print((args.out / table).read_text())
        return
    args.out.mkdir(parents=True, exist_ok=True)
    names = [f"{p}-{s}" for p, s in PARTS]
    capped = [f"{p}-fedavg-norm-cap" for p in ("iid", "dirichlet")]
    aggregated = [f"{name}-aggregation" for name in names]
    adaptive = [f"{name}-adaptive" for name in names]
    if args.identity_strategy != "fedavg" and args.identity_seeds is None:
        parser.error(f"--identity-strategy: expected with --identity-seeds N; got {args.identity_strategy} alone")
    if args.identity_seeds is not None:
        if args.identity_seeds < 2:
            parser.error(f"--identity-seeds: expected a whole number of seeds >= 2; got {args.identity_seeds}")
        strategy = args.identity_strategy
        name = f"dirichlet-{strategy}-identities-{args.identity_seeds}"
        run_part(args.out, name, ["--attacks", ",".join(("none", *IDENTITIES)), *options, "--partitions",
                                  "dirichlet", "--strategies", strategy, "--seeds", str(args.identity_seeds)])
        combined = combine(args.out, [name], "identities-")
        if combined is None:
            print("no part finished")
            return
        gains = combined[0][combined[0]["attack"].isin(IDENTITIES)].reset_index(drop=True)
        (args.out / "identities-table.md").write_text(identities_markdown(gains))
        if args.results is not None:
            key = "identities" if strategy == "fedavg" else "identities-fedmedian"
            write_results(args.results, {key: gains}, "python -m bench.attack_study "
                          + " ".join(argv if argv is not None else sys.argv[1:]))
        print((args.out / "identities-table.md").read_text())
        return
    if margins is not None and not args.tables:
        try:
            run_sweep(args.out, margins, options, seeds, kappa or 0.0, args.fixed_second_order)
        except ValueError as error:
            parser.error(str(error))
    elif not args.tables:
        for (partition, strategy), name in zip(PARTS, names):
            run_part(args.out, name, ["--attacks", ATTACKS, *options, "--partitions", partition,
                                      "--strategies", strategy, "--seeds", str(seeds[strategy])])
        run_part(args.out, "group-split", ["--attacks", "group-split", "--dataset", "fashion-mnist",
                                           "--seeds", str(seeds["fedmedian"]), "--quiet"])
        for partition, name in zip(("iid", "dirichlet"), capped):
            run_part(args.out, name, ["--attacks", CAPPED[0], *options, *CAPPED[1], "--partitions", partition,
                                      "--strategies", "fedavg", "--seeds", str(seeds["fedavg"])])
        for (partition, strategy), name in zip(PARTS, aggregated):
            run_part(args.out, name, ["--attacks", AGGREGATION, *options, "--defences", "2", "--partitions",
                                      partition, "--strategies", strategy, "--seeds", str(seeds[strategy])])
    frames = write_tables(args.out, names, capped, aggregated, adaptive)
    relative = False
    if kappa is not None:
        # The finished ones only: a sitting cut short still tables the pairs it ran (FedAvg's come first).
        finished = [name for name, _ in sweep_parts(margins, options, seeds, kappa, args.fixed_second_order)
                    if (args.out / name / "gains.csv").is_file()]
        relative = any(name.endswith("-relative") for name in finished)
        if relative:
            try:
                frames |= relative_study(args.out, finished, "--duplicate-median-fraction")
            except ValueError as error:
                parser.error(str(error))
    if args.results is not None and frames:
        write_results(args.results, frames, "python -m bench.attack_study "
                      + " ".join(argv if argv is not None else sys.argv[1:]))
    shown = args.out / ("relative-table.md" if relative else "adaptive-table.md" if margins is not None
                        else "table.md")
    print(shown.read_text() if shown.exists() else "no part finished")


if __name__ == "__main__":
    main()
