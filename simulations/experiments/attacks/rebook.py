"""The attack study's identity attacks booked again by a value that pays a group of identities what their sum earns.

**Proposition (identities are paid their sum).** Round t of FedAvg's family starts from A = A_{t−1}; its valid
replies k ∈ I_t claim n_k examples and reply updates Δ_k; under the fixed-weight coalition rule a coalition's step
is x_S = Σ_{k∈S} u_k with u_k = p_k Δ_k, p_k = n_k / N, N = Σ_{j∈I_t} n_j. The Shapley value of the round game's
second-order expansion at A (:mod:`fedvalue.valuation.taylor`, ``"second-order"``) is

    φ_k = u_k · (g + ½ H s),   g = ∇U(A),  H = ∇²U(A),  s = Σ_{j∈I_t} u_j,

linear in u_k once the round's step s is fixed. So for every set T ⊆ I_t,

    Σ_{k∈T} φ_k = u_T · (g + ½ H s),   u_T = Σ_{k∈T} u_k,

which is what one client replying the weighted update u_T in its place is paid, in a round whose step s and total
claim N are the same; and every client outside T is paid u_j · (g + ½ H s), unchanged. Nothing in the bound depends
on how the identities share u_T among themselves: perturbations that cancel across them (near-duplicates moved
apart to pass a clustering test, colluders' perturbations) are paid exactly nothing, and no arrival order exists
to gain from. What identities can still move is u_T itself, and only as one client could:

* a **split** whose claims add up to the participant's examples (N unchanged) and whose shards train one
  full-batch gradient step of a mean loss gives n_D Δ_D = Σ_{k∈T} n_k Δ_k, so u_T = u_D: it gains exactly
  nothing. With several local steps the shards' sum differs from the whole's by the training's nonlinearity in
  its data (second order in the learning rate), which the study measures;
* **replicas** and **overlapping shards** claim more examples than the participant holds: u_T is the update of
  one client that inflated its claim to the identities' summed claims, the inflated-count attack, which only a
  review of claims against registered data sizes bounds.

The proof is the formula: the pairwise terms ½ u_jᵀHu_k of the expanded game are shared equally by the two
members of each pair, and a pair inside T is counted whole in T's sum (the derivation is in the taylor module).
The round game itself is not quadratic: the exact Shapley value of the fixed-weight game pays a split its
expansion's remainder besides, and the renormalized game's ([ADS] Remark 4.1, the default) rewards arriving in
pieces (a split arrives early more often: [ADS] Eq. 10 averages over uniform orders).

The study's runs kept their round records (A_{t−1}, every reply and claim), so every FedAvg round of an identity
attack's runs and of their attack-free runs is valued again here, with U = −loss on the server's held-out images
(the expansion needs a differentiable U; the study's booked utility is accuracy), by four books of one round seed
each (:data:`BOOKS`): ADS of the round game under its own rule and estimator (the run's booked game, under −loss),
the same under the fixed-weight rule, and that rule's first- and second-order expansions. Where the runs had the
defences on, a fifth (:data:`DEFENDED_BOOKS`) follows: the second-order values screened by the round's own
defences, φ^D_k = c_k φ_k (c_k = 0 for a flagged free-rider, n_max(C) / n_C in a near-duplicate cluster C, 1
alone: :mod:`fedvalue.rounds.defences.second_order`), the factors from each round's record, its defence settings
and previous global model (:func:`fedvalue.ledger.recorded_claim_factors`): what the live
``ads_fixed_second_order_defended`` rows pay, under −loss.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pandas as pd

from fedvalue import (
    COALITION_RULES,
    AdsSettings,
    mean_interval,
    paid_share,
    ratio_interval,
    seed_sums,
)
from fedvalue.ledger import read_round, recorded_claim_factors, value_recorded_rounds
from simulations.experiments.attacks.plan import plan_of
from simulations.experiments.attacks.study import StudyRun, utility_of
from simulations.runner import saved_config

RENORMALIZED, FIXED_WEIGHT = COALITION_RULES
#: Book -> (coalition rule, ADS method: None for the record's own estimator settings).
BOOKS: dict[str, tuple[str, str | None]] = {
    "ads": (RENORMALIZED, None),
    "ads_fixed_weight": (FIXED_WEIGHT, None),
    "ads_first_order": (FIXED_WEIGHT, "first-order"),
    "ads_second_order": (FIXED_WEIGHT, "second-order"),
}
#: Defended book -> the book of :data:`BOOKS` whose values it screens by the round's defences (c_k φ_k).
DEFENDED_BOOKS: dict[str, str] = {"ads_second_order_defended": "ads_second_order"}
#: The book every other one's cost to honest clients is measured against: the run's own game under −loss.
PLAIN = "ads"


def rebooked_totals(run_dir: Path, utility, books=tuple(BOOKS)) -> dict[str, dict[int, float]]:
    """Each client's total over ``run_dir``'s rounds under each of ``books`` (:data:`BOOKS`, :data:`DEFENDED_BOOKS`),
    every round valued again from its record with its round seed and U = ``utility``
    (:func:`fedvalue.ledger.value_recorded_rounds`; with the run's own U, ``ads`` is the booked ADS), a defended book
    its book's values times the round's claim factors. A round aggregated by the strategy's own code is refused
    (ValueError naming the round: the fixed-weight rule is FedAvg's), and a defended book of a run without the
    defences (ValueError naming ``defences``)."""
    totals: dict[str, dict[int, float]] = {book: {} for book in books}
    valued: dict[str, dict] = {}  # each book's rounds, valued once for it and for its defended book
    for book in books:
        screened = DEFENDED_BOOKS.get(book, book)
        if screened not in valued:
            rule, method = BOOKS[screened]
            estimator = None if method is None else AdsSettings(method=method)
            valued[screened] = value_recorded_rounds(run_dir, utility, rule=rule, estimator=estimator)
        for server_round, valuation in valued[screened].items():
            values = valuation.results["ads"].values
            if book in DEFENDED_BOOKS:
                factors = recorded_claim_factors(read_round(run_dir, server_round), list(values.index))
                values = values * values.index.map(factors).to_numpy(dtype=float)
            for client, value in values.items():
                totals[book][int(client)] = totals[book].get(int(client), 0.0) + float(value)
    return totals


def part_books(config) -> tuple[str, ...]:
    """The books a study part of ``config`` is booked again by: :data:`BOOKS`, and :data:`DEFENDED_BOOKS` when its
    runs had the defences on (their records hold the settings and the previous global model the screen needs)."""
    return (*BOOKS, *DEFENDED_BOOKS) if config.defences else tuple(BOOKS)


def rebooked_frames(part: Path, config_type, attacks: list[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A study part's FedAvg runs of ``attacks`` and their ``none`` runs booked again under U = −loss: (totals, a
    row per run and client with a column per book; runs, the part's runs.csv rows), the shapes of
    :func:`fedvalue.analysis.gains.gains_table`."""
    config = saved_config(config_type, json.loads((part / "run.json").read_text()), strict=False)
    config = dataclasses.replace(config, utility="neg_loss")
    runs = pd.read_csv(part / "runs.csv")
    runs = runs[(runs["strategy"] == "fedavg") & runs["attack"].isin(["none", *attacks])].reset_index(drop=True)
    books = part_books(config)
    rows = []
    for _, row in runs.iterrows():
        run = StudyRun(row["partition"], row["strategy"], int(row["seed"]),
                       plan_of(row["attack"], config.num_clients, config.attacker, config.colluders))
        totals = rebooked_totals(part / run.directory, utility_of(config, run), books)
        for client in sorted(totals[PLAIN]):
            rows.append({"partition": run.scheme, "strategy": run.strategy, "seed": run.seed,
                         "attack": run.plan.attack, "client_id": client}
                        | {book: totals[book][client] for book in books})
    return pd.DataFrame(rows), runs


def rebooked_books(totals: pd.DataFrame) -> list[str]:
    """The books of :data:`BOOKS` and :data:`DEFENDED_BOOKS` that ``totals`` holds a column of, in that order."""
    return [book for book in (*BOOKS, *DEFENDED_BOOKS) if book in totals.columns]


def rebooked_gains(totals: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """A row per (partition, strategy, attack, book): the identities' gain (:mod:`fedvalue.analysis.gains`: the
    ratio of seed means, paired by seed, with its 95% bootstrap interval), whether the seats' honest total is
    clearly positive, and the identities' paid share of a budget of 1 (share-of-positive, floor 0) beside the
    seats' honest share."""
    rows = []
    for (scheme, strategy), group in runs.groupby(["partition", "strategy"], sort=False):
        part = totals[(totals["partition"] == scheme) & (totals["strategy"] == strategy)]
        for attack in [a for a in dict.fromkeys(group["attack"]) if a != "none"]:
            for book in rebooked_books(totals):
                seeds = seed_sums(part, group, attack, book)
                gain, low, high = ratio_interval(seeds["attacked"].to_numpy(), seeds["honest"].to_numpy())
                honest_low = mean_interval(seeds["honest"].to_numpy())[1]
                rows.append({"partition": scheme, "strategy": strategy, "attack": attack, "book": book,
                             "seeds": len(seeds), "gain": gain, "gain_low": low, "gain_high": high,
                             "honest_positive": bool(seeds["honest"].mean() > 0 and not honest_low <= 0),
                             "paid": seeds["paid"].mean(), "paid_honest": seeds["paid_honest"].mean()})
    return pd.DataFrame(rows)


def rebooked_cost(totals: pd.DataFrame) -> pd.DataFrame:
    """Per (partition, strategy, book), in the attack-free runs: the mean and largest change of an honest client's
    paid share (budget 1, share-of-positive, floor 0) under the book against under :data:`PLAIN`, beside a typical
    share (the median of the clients' shares under :data:`PLAIN`)."""
    rows = []
    clean = totals[totals["attack"] == "none"]
    for (scheme, strategy), group in clean.groupby(["partition", "strategy"], sort=False):
        for book in rebooked_books(totals):
            if book == PLAIN:
                continue
            changes, typical = [], []
            for _, run in group.groupby("seed"):
                frame = run.set_index("client_id")
                shares = {b: {c: paid_share(frame[b], [c]) for c in frame.index} for b in (PLAIN, book)}
                changes += [shares[book][c] - shares[PLAIN][c] for c in frame.index]
                typical += list(shares[PLAIN].values())
            changes = np.abs(np.asarray(changes))
            rows.append({"partition": scheme, "strategy": strategy, "book": book,
                         "mean_share_change": float(changes.mean()), "max_share_change": float(changes.max()),
                         "typical_share": float(np.median(typical))})
    return pd.DataFrame(rows)
