"""Noisy-client detection from the valuation ledger ([ADS] §6.2, App. C.2, Figure 4c).

Scores are read from a ledger in long format (see :mod:`fedvalue.run.ledger_tables`): one row per
(round, client, method) with ``value``, ``status`` and the ground-truth ``noisy`` flag.
Several runs may be concatenated with a ``seed`` column; every statistic is computed per
run first. Lower scores are more suspicious throughout.

Rankings
    Within round t the clients valued in that round (``status == "ok"``), I_t^ok, are
    ranked by their within-round score φ_t(i) ascending (:func:`rank_rounds`). Across
    rounds a client's accumulated score is Φ_i = Σ_{t : i ∈ I_t^ok} φ_t(i)
    (:func:`rank_clients`, the paper's "overall LOO score is the sum of these per-round
    losses"). The pseudo-method ``"random"`` is the paper's random-ranking baseline: one
    U(0, 1) draw per (run, round, client) for within-round rankings and one per
    (run, client) for accumulated rankings, from an explicit ``seed``.

Cumulative detection curve (App. C.2)
    For every round with at least one noisy client among I_t^ok (n_t = |I_t^ok| clients,
    K_t of them noisy), rank the clients by φ_t ascending; with H_t(j) the number of noisy
    clients among the j lowest ranked,

        detection rate (``metric="recall"``, default):  D_t(j) = H_t(j) / K_t,
        precision (``metric="precision"``):              P_t(j) = H_t(j) / j.

    The paper "moves upward from the bottom of the ranking" and plots "the cumulative
    share of noisy contributors contained within the lowest ranked portion" (§6.2), its
    "cumulative detection rate" (Figure 4 caption): the share of the round's noisy clients
    found so far, D_t(j), which rises to 1 at j = n_t (at j = K_t for a perfect ranking;
    E[D_t(j)] = j / n_t for a random one, the hypergeometric mean). App. C.2's wording
    ("the fraction of noisy contributors among those revealed so far") can also be read as
    P_t(j), available as ``metric="precision"``. For j > n_t a round contributes its value
    at j = n_t (everything revealed). The curve is averaged over a run's eligible rounds,
    then over runs, with a normal-approximation confidence interval over runs (or over
    all (run, round) pairs with ``ci_over="round"``).

Ties
    ``ties="average"`` (default) gives the expectation over all orderings of tied scores,
    exactly: a tie block occupying ranks a+1..a+g that holds k noisy clients contributes
    (j − a)·k/g noisy clients to H_t(j) for a < j < a + g. A constant score therefore
    yields exactly the random baseline j / n_t. ``ties="client_id"`` breaks ties by
    client id (numeric ids in numeric order, then other ids as strings).

ROC AUC and precision@k
    Against the noisy flag, with lower Φ more likely noisy (Mann–Whitney form, ties ½):
    AUC = (1 / (K·C)) Σ_{i noisy} Σ_{c clean} ( 1[Φ_i < Φ_c] + ½·1[Φ_i = Φ_c] ),
    equal to ``sklearn.metrics.roc_auc_score(noisy, -Φ)``. Precision@k with k = K, the
    run's number of noisy clients, is H(K) / K on the accumulated ranking (ties as above).

Online flagging by the same scores lives in :mod:`fedvalue.analysis.flagging`.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

import numpy as np
import pandas as pd

from fedvalue._checks import check_choice, check_integer, check_open_unit, check_seed
from fedvalue.analysis._ledger_frames import (
    RANDOM,
    RUN_COLUMN,
    _check_ledger,
    _check_ledger_like,
    _check_methods,
    _interval,
    _noisy_of,
    _runs,
    _scores_and_flags,
    _sorted_by_id,
    _valued,
)
from fedvalue.schema import Method, client_sort_key

CURVE_METRICS = ("recall", "precision")
TIE_RULES = ("average", "client_id")


# ----------------------------------------------------------------------------- rankings


def expected_hits(values: Sequence[float], labels: Sequence[bool], *, ties: str = "average",
                  client_ids: Sequence[Hashable] | None = None) -> np.ndarray:
    """Expected number of labelled items among the j lowest values, j = 1..n.

    Parameters
    ----------
    values
        Scores (lower = ranked first).
    labels
        True for the items being detected (noisy clients).
    ties
        ``"average"``: expectation over all orderings of tied values, exactly — a tie
        block at ranks a+1..a+g holding k labelled items adds (j − a)·k/g for a < j < a+g.
        ``"client_id"``: ties broken by ``client_ids`` (numeric ids numerically).
    client_ids
        Needed for ``ties="client_id"``; defaults to positions 0..n−1.

    Returns
    -------
    numpy.ndarray
        H(j) for j = 1..n (float; integers when there are no ties at a cut).
    """
    ties = check_choice("ties", ties, TIE_RULES)
    values, labels = _scores_and_flags(values, labels, ("values", "value"), ("labels", "label"))
    n = len(values)
    if ties == "client_id":
        ids = list(range(n)) if client_ids is None else list(client_ids)
        if len(ids) != n:
            raise ValueError(f"client_ids: expected {n} ids; got {len(ids)}.")
        id_rank = np.empty(n, dtype=int)
        id_rank[sorted(range(n), key=lambda i: client_sort_key(ids[i]))] = np.arange(n)
        order = np.lexsort((id_rank, values))
        return np.cumsum(labels[order]).astype(float)
    order = np.argsort(values, kind="mergesort")
    sorted_values, sorted_labels = values[order], labels[order].astype(float)
    starts = np.flatnonzero(np.r_[True, sorted_values[1:] != sorted_values[:-1]])
    sizes = np.diff(np.r_[starts, n])
    positives = np.add.reduceat(sorted_labels, starts) if n else np.zeros(0)
    before = np.r_[0.0, np.cumsum(positives)[:-1]]
    block = np.repeat(np.arange(len(starts)), sizes)
    depth = np.arange(1, n + 1) - starts[block]  # how many of the block are revealed at j
    return before[block] + depth * positives[block] / sizes[block]


def _random_values(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.random(n)


# ----------------------------------------------------------------------------- rankings


def rank_rounds(ledger: pd.DataFrame, method: str, *, seed: int | np.random.Generator | None = 0) -> pd.DataFrame:
    """Within-round rankings: per round, the valued clients by φ_t(i) ascending.

    Parameters
    ----------
    ledger
        Long-format ledger (columns ``round, client_id, method, value, status, noisy``;
        optional ``seed`` telling runs apart).
    method
        A ledger method (``"ads"``, ``"loo"``, ``"tracin_outflow"``, ...) or ``"random"``
        (one U(0, 1) score per (run, round, client), drawn in run, round, client-id order).
    seed
        Seed of the random baseline (ignored for ledger methods).

    Returns
    -------
    pandas.DataFrame
        ``[seed,] round, client_id, value, noisy, rank, mid_rank`` sorted by run, round,
        rank: ``rank`` is 1 for the lowest score (most suspicious), ties broken by client
        id; ``mid_rank`` is the average rank of the tie block.
    """
    ledger = _check_ledger(ledger)
    (method,) = _check_methods(ledger, [method], name="method")
    rng = check_seed(seed)
    frames = []
    for key, run in _runs(ledger):
        valued = _valued(run, method)
        for server_round, rows in valued.groupby("round", sort=True):
            ids = _sorted_by_id(rows["client_id"])
            rows = rows.set_index("client_id").loc[ids].reset_index()
            values = _random_values(rng, len(rows)) if method == RANDOM else rows["value"].to_numpy(float)
            frame = _ranked(rows["client_id"].tolist(), values, rows["noisy"].tolist())
            frame.insert(0, "round", server_round)
            if key is not None:
                frame.insert(0, RUN_COLUMN, key)
            frames.append(frame)
    if not frames:
        raise ValueError(f"ledger: expected rows with status 'ok' for method {method!r}; got none.")
    return pd.concat(frames, ignore_index=True)


def _ranked(client_ids: list, values: np.ndarray, noisy: list) -> pd.DataFrame:
    id_rank = np.empty(len(client_ids), dtype=int)
    id_rank[sorted(range(len(client_ids)), key=lambda i: client_sort_key(client_ids[i]))] = np.arange(len(client_ids))
    order = np.lexsort((id_rank, values))
    frame = pd.DataFrame({
        "client_id": [client_ids[i] for i in order],
        "value": values[order],
        "noisy": pd.array([noisy[i] for i in order], dtype="boolean"),
        "rank": np.arange(1, len(order) + 1),
    })
    frame["mid_rank"] = frame.groupby("value")["rank"].transform("mean").astype(float)
    return frame


def accumulated_scores(ledger: pd.DataFrame, method: str, *,
                       seed: int | np.random.Generator | None = 0) -> pd.DataFrame:
    """Φ_i = Σ_t φ_t(i) over the rounds in which client i was valued, per run.

    For ``method="random"`` Φ_i is one U(0, 1) draw per (run, client), in run and
    client-id order (a sum of per-round draws would favour rarely sampled clients).

    Returns
    -------
    pandas.DataFrame
        ``[seed,] client_id, score, rounds, noisy`` (``noisy`` as booked, may be NA).
    """
    ledger = _check_ledger(ledger)
    (method,) = _check_methods(ledger, [method], name="method")
    rng = check_seed(seed)
    frames = []
    for key, run in _runs(ledger):
        valued = _valued(run, method)
        if valued.empty:
            continue
        grouped = valued.groupby("client_id", sort=False)
        frame = pd.DataFrame({
            "score": grouped["value"].sum() if method != RANDOM else np.nan,
            "rounds": grouped["round"].nunique(),
            "noisy": grouped["noisy"].first(),
        })
        frame = frame.loc[_sorted_by_id(frame.index)].rename_axis("client_id").reset_index()
        if method == RANDOM:
            frame["score"] = _random_values(rng, len(frame))
        frame["noisy"] = frame["noisy"].astype("boolean")
        if key is not None:
            frame.insert(0, RUN_COLUMN, key)
        frames.append(frame)
    if not frames:
        raise ValueError(f"ledger: expected rows with status 'ok' for method {method!r}; got none.")
    return pd.concat(frames, ignore_index=True)


def rank_clients(ledger: pd.DataFrame, method: str, *, seed: int | np.random.Generator | None = 0) -> pd.DataFrame:
    """Overall ranking per run by accumulated score Φ_i ascending (rank 1 = most suspicious).

    Returns
    -------
    pandas.DataFrame
        ``[seed,] client_id, score, rounds, noisy, rank, mid_rank``; ties broken by client
        id in ``rank``, averaged in ``mid_rank``.
    """
    scores = accumulated_scores(ledger, method, seed=seed)
    frames = []
    for key, run in _runs(scores):
        ranked = _ranked(run["client_id"].tolist(), run["score"].to_numpy(float), run["noisy"].tolist())
        ranked = ranked.rename(columns={"value": "score"})
        ranked.insert(2, "rounds", run.set_index("client_id").loc[ranked["client_id"], "rounds"].to_numpy())
        if key is not None:
            ranked.insert(0, RUN_COLUMN, key)
        frames.append(ranked)
    return pd.concat(frames, ignore_index=True)


# ----------------------------------------------------------------------------- curve


def round_detection_curves(ledger: pd.DataFrame, methods: str | Sequence[str] = (Method.ADS, Method.LOO, RANDOM), *,
                           metric: str = "recall", ties: str = "average",
                           seed: int | np.random.Generator | None = 0) -> pd.DataFrame:
    """Per eligible round, the curve D_t(j) (or P_t(j)) for j = 1..n_t (module docstring).

    A round is eligible when at least one of its valued clients is noisy.

    Returns
    -------
    pandas.DataFrame
        ``[seed,] method, round, j, n, n_noisy, value``.
    """
    ledger = _check_ledger(ledger)
    methods = _check_methods(ledger, methods)
    metric = check_choice("metric", metric, CURVE_METRICS)
    ties = check_choice("ties", ties, TIE_RULES)
    rng = check_seed(seed)
    frames = []
    for method in methods:
        for key, run in _runs(ledger):
            for server_round, rows in _valued(run, method).groupby("round", sort=True):
                flags = _noisy_of(rows, f"round {server_round}" + ("" if key is None else f", seed {key}"))
                ids = _sorted_by_id(flags)
                labels = np.array([flags[c] for c in ids])
                if not labels.any():
                    continue
                if method == RANDOM:
                    values = _random_values(rng, len(ids))
                else:
                    values = rows.set_index("client_id").loc[ids, "value"].to_numpy(float)
                hits = expected_hits(values, labels, ties=ties, client_ids=ids)
                j = np.arange(1, len(ids) + 1)
                curve = hits / labels.sum() if metric == "recall" else hits / j
                frame = pd.DataFrame({"method": method, "round": server_round, "j": j, "n": len(ids),
                                      "n_noisy": int(labels.sum()), "value": curve})
                if key is not None:
                    frame.insert(0, RUN_COLUMN, key)
                frames.append(frame)
    if not frames:
        raise ValueError("ledger: expected at least one round with a noisy client among its valued (status 'ok') "
                         "clients; got none. The detection curve needs runs with noisy clients.")
    return pd.concat(frames, ignore_index=True)


def detection_curve(ledger: pd.DataFrame, methods: str | Sequence[str] = (Method.ADS, Method.LOO, RANDOM), *,
                    metric: str = "recall", ties: str = "average", ci_over: str = "run",
                    confidence: float = 0.95, seed: int | np.random.Generator | None = 0) -> pd.DataFrame:
    """The cumulative detection curve of [ADS] App. C.2 (Figure 4c), averaged.

    Parameters
    ----------
    ledger
        Long-format ledger; several runs concatenated with a ``seed`` column.
    methods
        Ledger methods and/or ``"random"`` (the seeded random-ranking baseline).
    metric
        ``"recall"`` (default): D_t(j) = H_t(j)/K_t, the share of the round's noisy clients
        among its j lowest-ranked clients — the paper's cumulative detection rate.
        ``"precision"``: P_t(j) = H_t(j)/j, the share of the j lowest that are noisy.
    ties
        ``"average"`` (exact expectation over orderings of tied scores) or ``"client_id"``.
    ci_over
        ``"run"``: the mean is the mean over runs of each run's mean over its eligible
        rounds, with a normal-approximation interval over runs (NaN with one run).
        ``"round"``: mean and interval over all eligible (run, round) pairs.
    confidence
        Level of the interval, in (0, 1).
    seed
        Seed of the random baseline.

    Returns
    -------
    pandas.DataFrame
        ``method, metric, j, mean, ci_low, ci_high, n_runs, n_rounds`` for j = 1..max n_t;
        a round with n_t < j contributes its value at j = n_t; ``n_rounds`` counts the
        eligible rounds with n_t ≥ j, ``n_runs`` the runs with an eligible round.
    """
    ci_over = check_choice("ci_over", ci_over, ("run", "round"))
    confidence = check_open_unit("confidence", confidence)
    curves = round_detection_curves(ledger, methods, metric=metric, ties=ties, seed=seed)
    if RUN_COLUMN not in curves.columns:
        curves.insert(0, RUN_COLUMN, 0)
    rows = []
    for method in dict.fromkeys(curves["method"]):
        table = curves[curves["method"] == method].pivot_table(
            index=[RUN_COLUMN, "round"], columns="j", values="value", aggfunc="first")
        table = table.ffill(axis=1)  # rounds with n_t < j keep their value at n_t
        sizes = curves[curves["method"] == method].groupby([RUN_COLUMN, "round"])["n"].first()
        per_run = table.groupby(level=0).mean()
        for j in table.columns:
            samples = per_run[j].to_numpy() if ci_over == "run" else table[j].to_numpy()
            mean, low, high = _interval(samples, confidence)
            rows.append({"method": method, "metric": metric, "j": int(j), "mean": mean, "ci_low": low,
                         "ci_high": high, "n_runs": len(per_run), "n_rounds": int((sizes >= j).sum())})
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- AUC, precision@k


def roc_auc(scores: Sequence[float], noisy: Sequence[bool]) -> float:
    """ROC AUC of "lower score = noisy" (Mann–Whitney U with mid-ranks, ties count ½).

    AUC = (R_clean − C(C+1)/2) / (K·C), with R_clean the sum of the clean clients'
    mid-ranks of the scores ascending, K noisy and C clean clients; it equals
    P(Φ_noisy < Φ_clean) + ½·P(Φ_noisy = Φ_clean) and
    ``sklearn.metrics.roc_auc_score(noisy, -scores)``.

    Raises
    ------
    ValueError
        When ``noisy`` holds only one class or the lengths differ.
    """
    scores, noisy = _scores_and_flags(scores, noisy, ("scores", "score"), ("noisy", "flag"))
    n_noisy = int(noisy.sum())
    n_clean = len(noisy) - n_noisy
    if n_noisy == 0 or n_clean == 0:
        raise ValueError(f"noisy: expected both noisy and clean clients; got {n_noisy} noisy and {n_clean} clean.")
    order = np.argsort(scores, kind="mergesort")
    sorted_scores = scores[order]
    starts = np.flatnonzero(np.r_[True, sorted_scores[1:] != sorted_scores[:-1]])
    sizes = np.diff(np.r_[starts, len(scores)])
    mid = starts + (sizes + 1) / 2.0  # 1-based mid-rank of each tie block
    ranks = np.empty(len(scores))
    ranks[order] = np.repeat(mid, sizes)
    rank_sum_clean = float(ranks[~noisy].sum())
    return (rank_sum_clean - n_clean * (n_clean + 1) / 2.0) / (n_noisy * n_clean)


def precision_at_k(scores: Sequence[float], noisy: Sequence[bool], k: int | None = None, *,
                   ties: str = "average", client_ids: Sequence[Hashable] | None = None) -> float:
    """Share of noisy clients among the k lowest scores, H(k)/k; k defaults to the number noisy.

    Ties at the cut follow ``ties`` (see :func:`expected_hits`).
    """
    noisy_arr = np.asarray(noisy, dtype=bool)
    if k is None:
        k = int(noisy_arr.sum())
        if k == 0:
            raise ValueError("noisy: expected at least one noisy client for k = number of noisy; got none.")
    k = check_integer("k", k, 1)
    if k > len(noisy_arr):
        raise ValueError(f"k: expected at most the {len(noisy_arr)} clients; got {k}.")
    return float(expected_hits(scores, noisy_arr, ties=ties, client_ids=client_ids)[k - 1] / k)


def detection_metrics(ledger: pd.DataFrame, methods: str | Sequence[str] = (Method.ADS, Method.LOO, RANDOM), *,
                      ties: str = "average", seed: int | np.random.Generator | None = 0) -> pd.DataFrame:
    """Per run and method: ROC AUC and precision@K of the accumulated ranking Φ.

    K is the run's number of noisy clients among those valued at least once. Runs with no
    noisy (or no clean) client get NaN.

    Returns
    -------
    pandas.DataFrame
        ``[seed,] method, n_clients, n_noisy, auc, precision_at_k``.
    """
    ledger = _check_ledger(ledger)
    methods = _check_methods(ledger, methods)
    ties = check_choice("ties", ties, TIE_RULES)
    rng = check_seed(seed)
    rows = []
    for method in methods:
        scores = accumulated_scores(ledger, method, seed=rng)
        for key, run in _runs(scores):
            flags = _noisy_of(run, "accumulated" + ("" if key is None else f", seed {key}"))
            labels = np.array([flags[c] for c in run["client_id"]])
            values = run["score"].to_numpy(float)
            both = 0 < labels.sum() < len(labels)
            row = {"method": method, "n_clients": len(labels), "n_noisy": int(labels.sum()),
                   "auc": roc_auc(values, labels) if both else math.nan,
                   "precision_at_k": precision_at_k(values, labels, ties=ties, client_ids=run["client_id"].tolist())
                   if both else math.nan}
            if key is not None:
                row = {RUN_COLUMN: key, **row}
            rows.append(row)
    frame = pd.DataFrame(rows)
    if frame[["auc"]].isna().all().all():
        raise ValueError("ledger: expected at least one run with both noisy and clean valued clients; got none.")
    return frame


def summarize_metrics(per_run: pd.DataFrame, *, confidence: float = 0.95) -> pd.DataFrame:
    """Mean over runs (NaN runs skipped) with a normal-approximation interval, per method.

    Parameters
    ----------
    per_run
        The output of :func:`detection_metrics`.

    Returns
    -------
    pandas.DataFrame
        ``method, n_runs, auc_mean, auc_ci_low, auc_ci_high, precision_at_k_mean,
        precision_at_k_ci_low, precision_at_k_ci_high``.
    """
    _check_ledger_like(per_run, ("method", "auc", "precision_at_k"), "per_run")
    confidence = check_open_unit("confidence", confidence)
    rows = []
    for method, rows_m in per_run.groupby("method", sort=False):
        row: dict[str, object] = {"method": method}
        valid = rows_m.dropna(subset=["auc"])
        row["n_runs"] = len(valid)
        for column in ("auc", "precision_at_k"):
            samples = valid[column].to_numpy(float)
            mean, low, high = _interval(samples, confidence) if len(samples) else (math.nan,) * 3
            row.update({f"{column}_mean": mean, f"{column}_ci_low": low, f"{column}_ci_high": high})
        rows.append(row)
    return pd.DataFrame(rows)
