"""The attack study's runs valued again on test images the server's valuation never used.

A crafted update ([ACE]) raises its own within-round value; whether that is manipulation turns on what it
raises. If the update games the estimator (fits the held-out set the server scores with, or the structure of
the round game), its value on other images from the same distribution falls back; if it is a better update,
its value there is as high. Every round record keeps A_{t−1} and every reply, so each FedAvg round of a run is
valued again by the same round game v_t(S) = U'(Agg_t(A_{t−1}; S)) ([ADS] §3, Remark 4.1), the same estimator
and the same round seed (:func:`fedvalue.ledger.value_recorded_rounds`), with U' the held-out accuracy on an
*unseen split*: a class-balanced sample of as many Fashion-MNIST test images as the server's held-out set,
drawn from the test images that set does not hold (its own seed). With U' = U this reproduces the booked ADS
exactly (tested), so any difference is the split's.

Per run: each identity's ADS total over the rounds on the unseen split (``ads_unseen``) beside the booked one,
and the final model's accuracy on it (``accuracy_unseen``: v_T(I_T), the last round's game at its full
coalition, which is U'(A_T) for FedAvg).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import pandas as pd

from fedvalue import listed_clients, mean_interval, ratio_interval
from fedvalue.ledger import value_recorded_rounds
from fedvalue.utilities import TorchModelUtility
from simulations.datasets import sample_per_class
from simulations.experiments.attacks.plan import plan_of
from simulations.experiments.attacks.study import (
    StudyRun,
    cached_dataset,
    holdout_rows,
    model_factory,
    utility_of,
)
from simulations.runner import saved_config

#: The unseen split's seed, beside the study's data seeds ([seed, 41]).
UNSEEN_SEED = 43


@functools.lru_cache(maxsize=16)
def unseen_rows(seed: int, holdout_examples: int) -> np.ndarray:
    """Test rows outside the server's held-out set of ``seed``: a class-balanced sample of as many images
    (ValueError when the held-out set is the whole test set: nothing is left unseen)."""
    labels = cached_dataset("fashion-mnist", "test").y
    if not holdout_examples:
        raise ValueError("holdout_examples: expected a held-out sample smaller than the test set (the unseen split "
                         "is drawn from the rest); got 0, the whole test set")
    rest = np.setdiff1d(np.arange(len(labels)), holdout_rows(labels, seed, holdout_examples))
    return rest[sample_per_class(labels[rest], holdout_examples, seed=[seed, UNSEEN_SEED], name="holdout_examples")]


def unseen_utility(config, seed: int) -> TorchModelUtility:
    """The study's utility on the unseen split of ``seed`` (same model and metric as the server's)."""
    if config.dataset != "fashion-mnist":
        raise ValueError(f"dataset: the unseen split needs Fashion-MNIST's separate test set; got {config.dataset!r}")
    test = cached_dataset("fashion-mnist", "test").subset(unseen_rows(seed, config.holdout_examples))
    return TorchModelUtility(model_factory(config)(), test.x, test.y, metric=config.utility)


def revalued(run_dir: Path, utility) -> tuple[dict[int, float], float]:
    """Each client's ADS total over the run's FedAvg rounds under ``utility`` (each round's own estimator and
    seed: :func:`fedvalue.ledger.value_recorded_rounds`) and the final model's utility, v_T(I_T)."""
    totals: dict[int, float] = {}
    final = float("nan")
    for valuation in value_recorded_rounds(run_dir, utility).values():
        for client, value in valuation.results["ads"].values.items():
            totals[int(client)] = totals.get(int(client), 0.0) + float(value)
        final = float(valuation.utility_after)
    return totals, final


def unseen_frames(part: Path, config_type, attacks: list[str] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A study part's FedAvg runs valued on the unseen split: (totals with ``ads`` and ``ads_unseen`` per run and
    client, runs with ``accuracy_recomputed`` (the server's held-out set) and ``accuracy_unseen``), in the study's
    table shapes (:func:`.study.run_frames`), for the ``attacks`` given (all the part ran when None) and its ``none`` runs."""
    config = saved_config(config_type, json.loads((part / "run.json").read_text()), strict=False)
    runs = pd.read_csv(part / "runs.csv")
    runs = runs[(runs["strategy"] == "fedavg")
                & (runs["attack"].isin(["none", *attacks]) if attacks is not None else True)]
    totals_rows, run_rows = [], []
    for _, row in runs.iterrows():
        run = StudyRun(row["partition"], row["strategy"], int(row["seed"]),
                       plan_of(row["attack"], config.num_clients, config.attacker, config.colluders))
        seen, seen_final = revalued(part / run.directory, utility_of(config, run))
        unseen, unseen_final = revalued(part / run.directory, unseen_utility(config, run.seed))
        common = {"partition": run.scheme, "strategy": run.strategy, "seed": run.seed, "attack": run.plan.attack}
        for client in sorted(seen):
            role = "identity" if client in run.plan.identities else "honest"
            totals_rows.append({**common, "client_id": client, "role": role, "ads": seen[client],
                                "ads_unseen": unseen[client]})
        run_rows.append({**row.to_dict(), "accuracy_recomputed": seen_final, "accuracy_unseen": unseen_final})
    return pd.DataFrame(totals_rows), pd.DataFrame(run_rows)


def unseen_gains(totals: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """Per (partition, strategy, attack): the identities' ADS gain on the server's held-out set and on the unseen
    split (:mod:`fedvalue.analysis.gains`' ratio of seed means, paired by seed, with its 95% bootstrap interval),
    the same ratio for every other client (the honest clients that are no seat of the attack: below 1, the
    attack's gain is partly taken from them), and the final accuracy change on each split."""
    rows = []
    for (scheme, strategy), group in runs.groupby(["partition", "strategy"], sort=False):
        part = totals[(totals["partition"] == scheme) & (totals["strategy"] == strategy)]
        honest_runs = group[group["attack"] == "none"].set_index("seed")
        for attack in [a for a in dict.fromkeys(group["attack"]) if a != "none"]:
            sums = {key: [] for key in ("mine", "seat", "others", "honest_others")}
            changes = {"ads": [], "ads_unseen": []}
            for _, run in group[group["attack"] == attack].iterrows():
                seed = run["seed"]
                mine, seats = set(listed_clients(run["identities"])), set(listed_clients(run["seats"]))
                books = ["ads", "ads_unseen"]
                attacked = part[(part["seed"] == seed) & (part["attack"] == attack)].set_index("client_id")[books]
                honest = part[(part["seed"] == seed) & (part["attack"] == "none")].set_index("client_id")[books]
                others = [c for c in honest.index if c not in seats and c not in mine]
                sums["mine"].append(attacked.loc[sorted(mine)].sum())
                sums["seat"].append(honest.loc[sorted(seats)].sum())
                sums["others"].append(attacked.loc[others].sum())
                sums["honest_others"].append(honest.loc[others].sum())
                for book, accuracy in (("ads", "accuracy_recomputed"), ("ads_unseen", "accuracy_unseen")):
                    changes[book].append(run[accuracy] - honest_runs.loc[seed, accuracy])
            row = {"partition": scheme, "strategy": strategy, "attack": attack, "seeds": len(changes["ads"])}
            for book, label in (("ads", "held_out"), ("ads_unseen", "unseen")):
                mine_total = np.array([s[book] for s in sums["mine"]])
                seat_total = np.array([s[book] for s in sums["seat"]])
                others_total = np.array([s[book] for s in sums["others"]])
                honest_others = np.array([s[book] for s in sums["honest_others"]])
                for name, (attacked, honest) in (("gain", (mine_total, seat_total)),
                                                 ("others", (others_total, honest_others))):
                    point, low, high = ratio_interval(attacked, honest)
                    row |= {f"{name}_{label}": point, f"{name}_{label}_low": low, f"{name}_{label}_high": high}
                point, low, high = mean_interval(np.array(changes[book]))
                row |= {f"accuracy_change_{label}": point, f"accuracy_change_{label}_low": low,
                        f"accuracy_change_{label}_high": high}
            rows.append(row)
    return pd.DataFrame(rows)
