"""Manipulation gain and what it costs: the attack study's tables from each run's totals
(:func:`gains_table`, :func:`honest_cost`), and the same table for runs of one's own
(:func:`manipulation_gains`: honest and attacked runs, paired by seed).

For attack a, book b (a ledger method summed over the rounds) and seed s, with I the attacker's
identities and J the honest seats they stand for (the attack study's plan,
``simulations/experiments/attacks/plan.py``):

    A_s = Σ_{i∈I} Φ_b(i) in the attack's run,   H_s = Σ_{j∈J} Φ_b(j) in the ``none`` run (same seed,
    data and strategy),   gain = mean_s A_s / mean_s H_s,

1.0 = what the participant earns honestly. The interval is a 95% percentile bootstrap over
seeds (2000 resamples of the seeds, the same for every book; seeded). A gain is only
meaningful when the honest earnings are clearly positive: ``honest_positive`` says whether the
bootstrap interval of mean_s H_s lies above 0 (LOO of interchangeable IID updates is about 0,
and a ratio to it says nothing). A defended book b' is
compared with the defended honest run (what the participant earns honestly with the defences
on). The books: ADS, LOO and TracIn outflow, each beside its defended counterpart, and, where the runs
booked it, the fixed-weight game's second-order book ``ads_fixed_second_order`` beside
``ads_fixed_second_order_defended`` (:mod:`fedvalue.rounds.kinds.fixed_second_order`). Payment: the share
of a budget of 1 paid to I under ``share-of-positive`` with floor 0 (:mod:`fedvalue.analysis.payout`),
against J's share in the ``none`` run. Accuracy change: the
final held-out accuracy of the run minus the ``none`` run's, mean over seeds with its bootstrap
interval. The cost of the defences to honest clients is read off the ``none`` runs: each honest
client's paid share with the defences against without.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from fedvalue.analysis.payout import paid_share
from fedvalue.analysis.run_summary import Run, load_run
from fedvalue.schema import Status

#: Plain book -> its defended counterpart.
BOOKS = {"ads": "ads_defended", "loo": "loo_defended", "tracin_outflow": "tracin_outflow_defended"}
#: The fixed-weight game's second-order book and its defended counterpart: in a table only where the runs booked it
#: (a study run with ``fixed_second_order``), so that the tables of runs without it read as before.
SECOND_ORDER_BOOKS = {"ads_fixed_second_order": "ads_fixed_second_order_defended"}
RESAMPLES = 2000
KEYS = ["partition", "strategy"]


def listed_clients(text) -> list[int]:
    """Client ids from runs.csv's space-separated list (a CSV reader may have made one id a float,
    and an empty list NaN)."""
    if isinstance(text, float) and text != text:
        return []
    return [int(float(part)) for part in str(text).split()]


def ratio_interval(attacked: np.ndarray, honest: np.ndarray, seed: int = 0) -> tuple[float, float, float]:
    """(mean attacked / mean honest, 2.5% and 97.5% bootstrap percentiles over the paired seeds)."""
    attacked, honest = np.asarray(attacked, float), np.asarray(honest, float)
    point = float(attacked.mean() / honest.mean()) if honest.mean() != 0 else float("nan")
    if len(attacked) < 2:
        return point, float("nan"), float("nan")
    picks = np.random.default_rng(seed).integers(0, len(attacked), size=(RESAMPLES, len(attacked)))
    with np.errstate(all="ignore"):
        ratios = attacked[picks].mean(axis=1) / honest[picks].mean(axis=1)
    low, high = np.nanpercentile(ratios, [2.5, 97.5])
    return point, float(low), float(high)


def mean_interval(values: np.ndarray, seed: int = 0) -> tuple[float, float, float]:
    values = np.asarray(values, float)
    if len(values) < 2:
        return float(values.mean()), float("nan"), float("nan")
    picks = np.random.default_rng(seed).integers(0, len(values), size=(RESAMPLES, len(values)))
    low, high = np.percentile(values[picks].mean(axis=1), [2.5, 97.5])
    return float(values.mean()), float(low), float(high)


def seed_sums(totals: pd.DataFrame, runs: pd.DataFrame, attack: str, book: str) -> pd.DataFrame:
    """Per seed of one (partition, strategy): the identities' sum, the seats' honest sum, paid shares."""
    rows = []
    for _, run in runs[runs["attack"] == attack].iterrows():
        mine = totals[(totals["seed"] == run["seed"]) & (totals["attack"] == attack)].set_index("client_id")[book]
        honest = totals[(totals["seed"] == run["seed"]) & (totals["attack"] == "none")].set_index("client_id")[book]
        identities, seats = listed_clients(run["identities"]), listed_clients(run["seats"])
        rows.append({"seed": run["seed"], "attacked": float(mine.reindex(identities).sum()),
                     "honest": float(honest.reindex(seats).sum()),
                     "paid": paid_share(mine, identities), "paid_honest": paid_share(honest, seats)})
    return pd.DataFrame(rows)


def booked_pairs(totals: pd.DataFrame) -> dict[str, str]:
    """:data:`BOOKS`, and :data:`SECOND_ORDER_BOOKS` where ``totals`` holds a value of its plain book."""
    found = {plain: defended for plain, defended in SECOND_ORDER_BOOKS.items()
             if plain in totals.columns and totals[plain].notna().any()}
    return BOOKS | found


def gains_table(totals: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """A row per (partition, strategy, attack, book): gain without and with the defences (and
    intervals), paid shares, and the accuracy change (module docstring); the second-order book's rows
    only for the (partition, strategy) whose runs booked it (:func:`booked_pairs`)."""
    rows = []
    for (scheme, strategy), group in runs.groupby(KEYS, sort=False):
        part = totals[(totals["partition"] == scheme) & (totals["strategy"] == strategy)]
        baseline = group[group["attack"] == "none"].set_index("seed")["accuracy"]
        for attack in [a for a in dict.fromkeys(group["attack"]) if a != "none"]:
            mine = group[group["attack"] == attack].set_index("seed")["accuracy"]
            change = mean_interval((mine - baseline.reindex(mine.index)).dropna().to_numpy())
            for plain, defended in booked_pairs(part).items():
                row = {"partition": scheme, "strategy": strategy, "attack": attack, "book": plain,
                       "seeds": len(mine)}
                for label, book in (("", plain), ("defended_", defended)):
                    seeds = seed_sums(part, group, attack, book)
                    gain, low, high = ratio_interval(seeds["attacked"].to_numpy(), seeds["honest"].to_numpy())
                    honest_low = mean_interval(seeds["honest"].to_numpy())[1]
                    row |= {f"{label}gain": gain, f"{label}gain_low": low, f"{label}gain_high": high,
                            f"{label}honest_positive": bool(seeds["honest"].mean() > 0 and not honest_low <= 0),
                            f"{label}paid": seeds["paid"].mean(), f"{label}paid_honest": seeds["paid_honest"].mean()}
                row |= {"accuracy_change": change[0], "accuracy_change_low": change[1],
                        "accuracy_change_high": change[2]}
                rows.append(row)
    return pd.DataFrame(rows)


def honest_cost(totals: pd.DataFrame) -> pd.DataFrame:
    """Per (partition, strategy, book), in the attack-free runs: the mean and largest change of an
    honest client's paid share (budget 1) when the defences are on, beside a typical share (the median of the
    clients' paid shares without the defences), and the free-rider flags raised; the second-order book's rows only
    where the runs booked it (:func:`booked_pairs`)."""
    rows = []
    clean = totals[totals["attack"] == "none"]
    for (scheme, strategy), group in clean.groupby(KEYS, sort=False):
        for plain, defended in booked_pairs(group).items():
            changes, typical = [], []
            for _, run in group.groupby("seed"):
                shares = {book: {c: paid_share(run.set_index("client_id")[book], [c]) for c in run["client_id"]}
                          for book in (plain, defended)}
                changes += [shares[defended][c] - shares[plain][c] for c in run["client_id"]]
                typical += list(shares[plain].values())
            changes = np.abs(np.asarray(changes))
            rows.append({"partition": scheme, "strategy": strategy, "book": plain,
                         "mean_share_change": float(changes.mean()), "max_share_change": float(changes.max()),
                         "typical_share": float(np.median(typical)),
                         "free_rider_flags": int(group["defence_free_rider"].sum())})
    return pd.DataFrame(rows)


#: The ledger methods a run's totals are summed over (the plain books and the defended ones).
TOTALS = ("ads", "loo", "tracin_outflow", "tracin_inflow", "ads_defended", "loo_defended", "tracin_outflow_defended",
          "defence_free_rider")
#: The ones :func:`manipulation_gains` sums over runs of one's own: :data:`TOTALS` and the second-order books (NaN
#: where a run did not book them, and then left out of its table).
OWN_TOTALS = (*TOTALS, *SECOND_ORDER_BOOKS, *SECOND_ORDER_BOOKS.values())


def manipulation_gains(honest, attacked, identities, seats=None, *, attack: str = "attack") -> pd.DataFrame:
    """The gain table (:func:`gains_table`) of one attack from runs of one's own: ``honest[s]`` and
    ``attacked[s]`` are the runs of seed s (run directories or :class:`fedvalue.ledger.Run`s,
    paired by position), ``identities`` the clients the attacker played in the attacked runs and
    ``seats`` the honest clients they stand for (default: the identities). A row per book that
    both runs hold (ads, loo, tracin_outflow): the gain with its bootstrap interval over the
    seeds, the paid shares and the accuracy change; ``partition`` and ``strategy`` read ``own``. Runs that booked the
    fixed-weight game's second-order book add its row (:data:`SECOND_ORDER_BOOKS`).
    """
    honest, attacked = [_loaded(run) for run in honest], [_loaded(run) for run in attacked]
    if not honest or len(honest) != len(attacked):
        raise ValueError(f"attacked: expected one attacked run per honest run (paired by seed); got {len(honest)} "
                         f"honest and {len(attacked)} attacked.")
    identities = _client_ids("identities", identities)
    seats = identities if seats is None else _client_ids("seats", seats)
    totals, runs = [], []
    for seed, pair in enumerate(zip(honest, attacked)):
        for name, run in zip(("none", attack), pair):
            common = {"partition": "own", "strategy": "own", "seed": seed, "attack": name}
            for client, row in _book_totals(run).iterrows():
                if not str(client).isdigit():
                    raise ValueError(f"{name} run of seed {seed}: expected partition ids as client ids (the valuation "
                                     f"mod's); it books {str(client)!r}.")
                totals.append({**common, "client_id": int(client), **{m: float(row[m]) for m in OWN_TOTALS}})
            runs.append({**common, "accuracy": float(run.rounds["utility_realized"].iloc[-1]),
                         "identities": " ".join(map(str, identities if name == attack else [])),
                         "seats": " ".join(map(str, seats))})
    frame = pd.DataFrame(totals)
    missing = sorted(set(identities) - set(frame.loc[frame["attack"] == attack, "client_id"]))
    if missing:
        raise ValueError(f"identities: expected clients booked in the attacked runs; {missing} are not.")
    table = gains_table(frame, pd.DataFrame(runs))
    return table[table["book"].isin([b for b in booked_pairs(frame) if frame[b].notna().any()])].reset_index(drop=True)


def _client_ids(name: str, ids) -> list[int]:
    try:
        found = [int(c) for c in ids if not isinstance(c, bool) and float(c) == int(c)]
    except (TypeError, ValueError):
        found = []
    if not found or len(found) != len(list(ids)):
        raise ValueError(f"{name}: expected partition ids (integers) of clients in the runs; got {list(ids)!r}.")
    return found


def _loaded(run) -> Run:
    return run if isinstance(run, Run) else load_run(run)


def _book_totals(run: Run) -> pd.DataFrame:
    """Each client's total per :data:`OWN_TOTALS` book over the run's booked rows (NaN where it has none)."""
    ledger = run.ledger[run.ledger["status"] == Status.OK]
    table = ledger[ledger["method"].isin(OWN_TOTALS)].pivot_table(index="client_id", columns="method", values="value",
                                                                  aggfunc="sum")
    return table.reindex(columns=list(OWN_TOTALS))
