"""Noisy-client detection from the valuation ledger ([ADS] §6.2, App. C.2, Figure 4c).

Scores are read from a ledger in long format (see :mod:`fedvalue.ledger`): one row per
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

Online flagging (:class:`FlaggingRule`)
    ``kind="robust_z"``: per round, over the round's valued clients,
    z_i = (φ_t(i) − med) / (1.4826·MAD) with med the median and MAD the median absolute
    deviation of the round's scores; when MAD = 0 the mean absolute deviation is used,
    z_i = (φ_t(i) − med) / (1.2533·MeanAD); when both are 0 every z_i = 0. The scale is
    taken within the round because within-round scores shrink as the model converges.
    A client is flagged once z_i < −threshold in ``patience`` consecutive rounds in which
    it was valued. ``kind="threshold"``: flagged once its accumulated Φ_i so far is below
    ``threshold`` after ``patience`` consecutive rounds in which it was valued.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Hashable, Iterable, Mapping, Sequence
from statistics import NormalDist

import numpy as np
import pandas as pd

from fedvalue._checks import check_open_unit, check_seed
from fedvalue.schema import CLIENT_STATUSES

#: Name of the seeded random-ranking baseline (not a ledger method).
RANDOM = "random"
#: Columns every detection function needs.
REQUIRED_COLUMNS = ("round", "client_id", "method", "value", "status", "noisy")
#: Column that tells concatenated runs apart.
RUN_COLUMN = "seed"
CURVE_METRICS = ("recall", "precision")
TIE_RULES = ("average", "client_id")
FLAGGING_KINDS = ("robust_z", "threshold")
#: 1 / Φ^{-1}(3/4): makes the MAD a consistent estimator of a normal standard deviation.
MAD_SCALE = 1.482602218505602
#: sqrt(π / 2): the same for the mean absolute deviation.
MEAN_AD_SCALE = 1.2533141373155001


# ----------------------------------------------------------------------------- helpers


def _id_key(client_id: Hashable) -> tuple:
    """Sort key for client ids: integers (or integer strings) numerically, then strings."""
    text = str(client_id)
    try:
        return (0, int(text), "")
    except ValueError:
        return (1, 0, text)


def _scores_and_flags(scores, flags, score_names: tuple[str, str], flag_names: tuple[str, str]):
    """Finite float scores and one boolean flag per score, or a ValueError naming the parameter."""
    scores = np.asarray(scores, dtype=float)
    flags = np.asarray(flags, dtype=bool)
    if scores.ndim != 1 or flags.shape != scores.shape:
        raise ValueError(f"{flag_names[0]}: expected one {flag_names[1]} per {score_names[1]} ({scores.shape}); "
                         f"got shape {flags.shape}.")
    if not np.isfinite(scores).all():
        raise ValueError(f"{score_names[0]}: expected finite numbers; got {scores.tolist()}.")
    return scores, flags


def _check_choice(name: str, value: object, choices: Sequence[str]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name}: expected one of {list(choices)}; got {value!r}.")
    return value


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name}: expected an integer ≥ {minimum}; got {value!r}.")
    return int(value)


def _check_ledger(ledger: object, columns: Sequence[str] = REQUIRED_COLUMNS, name: str = "ledger") -> pd.DataFrame:
    if not isinstance(ledger, pd.DataFrame):
        raise TypeError(f"{name}: expected a pandas DataFrame in the ledger's long format; "
                        f"got {type(ledger).__name__}. Read one with fedvalue.ledger.read_ledger_csv.")
    missing = [c for c in columns if c not in ledger.columns]
    if missing:
        raise ValueError(f"{name}: expected columns {list(columns)}; missing {missing} in "
                         f"{list(ledger.columns)}.")
    if ledger.empty:
        raise ValueError(f"{name}: expected at least one row; got an empty frame.")
    bad = sorted(set(ledger["status"].astype(str)) - set(CLIENT_STATUSES))
    if bad:
        raise ValueError(f"{name}['status']: expected values in {list(CLIENT_STATUSES)}; got {bad}.")
    if RUN_COLUMN in ledger.columns and ledger[RUN_COLUMN].isna().any():
        raise ValueError(f"{name}['{RUN_COLUMN}']: expected a run key on every row; got missing values.")
    ok = ledger["status"] == "ok"
    values = pd.to_numeric(ledger.loc[ok, "value"], errors="coerce")
    if not np.isfinite(values.to_numpy(dtype=float)).all():
        rows = ledger.loc[ok][~np.isfinite(values.to_numpy(dtype=float))].head(3)
        raise ValueError(f"{name}['value']: expected a finite value on every row with status 'ok'; got "
                         f"{rows[['round', 'client_id', 'method', 'value']].to_dict('records')}.")
    return ledger


def _check_methods(ledger: pd.DataFrame, methods: object, name: str = "methods") -> list[str]:
    if isinstance(methods, str):
        methods = [methods]
    if not isinstance(methods, Iterable):
        raise TypeError(f"{name}: expected a method name or a list of them; got {type(methods).__name__}.")
    methods = list(methods)
    if not methods:
        raise ValueError(f"{name}: expected at least one method; got none.")
    available = sorted(set(ledger["method"].astype(str)))
    for method in methods:
        if method != RANDOM and method not in available:
            raise ValueError(f"{name}: expected ledger methods from {available} or {RANDOM!r}; got {method!r}.")
    if len(set(methods)) != len(methods):
        raise ValueError(f"{name}: expected each method once; got {methods}.")
    return methods


def _runs(ledger: pd.DataFrame) -> list[tuple[object, pd.DataFrame]]:
    """(run key, rows) per run, in sorted key order; a single run has key None."""
    if RUN_COLUMN not in ledger.columns:
        return [(None, ledger)]
    return [(key, rows) for key, rows in ledger.groupby(RUN_COLUMN, sort=True)]


def _noisy_of(rows: pd.DataFrame, what: str) -> dict[Hashable, bool]:
    """Noisy flag per client id; raises when a flag is missing or inconsistent."""
    flags: dict[Hashable, bool] = {}
    for client_id, noisy in zip(rows["client_id"], rows["noisy"]):
        if noisy is None or pd.isna(noisy):
            raise ValueError(
                f"ledger['noisy']: expected True/False for every valued client; got a missing flag for "
                f"client {client_id!r} ({what}). Record runs with their noisy set (an empty set for a "
                f"clean run), or fill a run known to be clean with ledger['noisy'].fillna(False).")
        if not isinstance(noisy, (bool, np.bool_)):
            raise ValueError(f"ledger['noisy']: expected booleans (True/False/NA); got {noisy!r} for client "
                             f"{client_id!r} ({what}). Read ledgers with fedvalue.ledger.read_ledger_csv.")
        noisy = bool(noisy)
        if flags.setdefault(client_id, noisy) != noisy:
            raise ValueError(f"ledger['noisy']: expected one flag per client; client {client_id!r} has both "
                             f"True and False ({what}).")
    return flags


def _valued(rows: pd.DataFrame, method: str) -> pd.DataFrame:
    """Rows of clients valued (status ok) under ``method``; for RANDOM, one row per ok client."""
    ok = rows[rows["status"] == "ok"]
    if method == RANDOM:
        return ok.drop_duplicates(["round", "client_id"])
    ok = ok[ok["method"] == method]
    duplicated = ok.duplicated(["round", "client_id"])
    if duplicated.any():
        first = ok[duplicated].iloc[0]
        raise ValueError(f"ledger: expected one {method!r} row per (round, client); got several for client "
                         f"{first['client_id']!r} in round {first['round']!r}.")
    return ok


def _sorted_by_id(client_ids: Iterable[Hashable]) -> list[Hashable]:
    return sorted(client_ids, key=_id_key)


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
    ties = _check_choice("ties", ties, TIE_RULES)
    values, labels = _scores_and_flags(values, labels, ("values", "value"), ("labels", "label"))
    n = len(values)
    if ties == "client_id":
        ids = list(range(n)) if client_ids is None else list(client_ids)
        if len(ids) != n:
            raise ValueError(f"client_ids: expected {n} ids; got {len(ids)}.")
        id_rank = np.empty(n, dtype=int)
        id_rank[sorted(range(n), key=lambda i: _id_key(ids[i]))] = np.arange(n)
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
    id_rank[sorted(range(len(client_ids)), key=lambda i: _id_key(client_ids[i]))] = np.arange(len(client_ids))
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


def _interval(samples: np.ndarray, confidence: float) -> tuple[float, float, float]:
    mean = float(np.mean(samples))
    if len(samples) < 2:
        return mean, math.nan, math.nan
    half = NormalDist().inv_cdf(0.5 + confidence / 2) * float(np.std(samples, ddof=1)) / math.sqrt(len(samples))
    return mean, mean - half, mean + half


def round_detection_curves(ledger: pd.DataFrame, methods: str | Sequence[str] = ("ads", "loo", RANDOM), *,
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
    metric = _check_choice("metric", metric, CURVE_METRICS)
    ties = _check_choice("ties", ties, TIE_RULES)
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


def detection_curve(ledger: pd.DataFrame, methods: str | Sequence[str] = ("ads", "loo", RANDOM), *,
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
    ci_over = _check_choice("ci_over", ci_over, ("run", "round"))
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
    k = _check_int("k", k, 1)
    if k > len(noisy_arr):
        raise ValueError(f"k: expected at most the {len(noisy_arr)} clients; got {k}.")
    return float(expected_hits(scores, noisy_arr, ties=ties, client_ids=client_ids)[k - 1] / k)


def detection_metrics(ledger: pd.DataFrame, methods: str | Sequence[str] = ("ads", "loo", RANDOM), *,
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
    ties = _check_choice("ties", ties, TIE_RULES)
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


def _check_ledger_like(frame: object, columns: Sequence[str], name: str) -> None:
    if not isinstance(frame, pd.DataFrame):
        raise TypeError(f"{name}: expected a pandas DataFrame; got {type(frame).__name__}.")
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"{name}: expected columns {list(columns)}; missing {missing}.")


# ----------------------------------------------------------------------------- online flagging


def robust_z(values: Sequence[float]) -> np.ndarray:
    """Robust z-scores (v − median) / (1.4826·MAD); MeanAD·1.2533 when MAD = 0; zeros when both are 0."""
    values = np.asarray(values, dtype=float)
    if values.ndim != 1 or not np.isfinite(values).all():
        raise ValueError(f"values: expected a 1-d array of finite numbers; got {values.tolist()}.")
    if len(values) == 0:
        return values
    deviation = values - np.median(values)
    mad = float(np.median(np.abs(deviation)))
    if mad > 0:
        return deviation / (MAD_SCALE * mad)
    mean_ad = float(np.mean(np.abs(deviation)))
    if mean_ad > 0:
        return deviation / (MEAN_AD_SCALE * mean_ad)
    return np.zeros_like(values)


class FlaggingRule:
    """Online flagging of suspicious clients as rounds arrive (deterministic).

    Parameters
    ----------
    method
        Ledger method whose within-round values are judged (``"ads"``, ``"loo"``, ...).
    kind
        ``"robust_z"``: round-wise robust z-score z_t(i) (module docstring) below
        −``threshold``; ``"threshold"``: accumulated value Φ_i so far below ``threshold``.
    threshold
        For ``robust_z`` a positive number (default 1.0); for ``threshold`` any finite
        value in the units of the method (e.g. 0.0: a client whose books are negative).
    patience
        Consecutive rounds in which the client was valued (status ok) and met the
        condition before it is flagged (≥ 1). A valued round that does not meet it resets
        the count; rounds in which it was not sampled, failed, or (robust_z) that had
        fewer than ``min_clients`` valued clients leave the count unchanged.
    min_clients
        Least number of valued clients for a round's robust z-scores to count (≥ 2).

    Notes
    -----
    Flags are permanent. ``update`` takes one round's ledger rows (DataFrame or iterable
    of row mappings, as the valuing strategy books them); rounds must arrive in increasing
    order. The defaults are not calibrated: measure a setting with :func:`evaluate_flagging`.
    """

    def __init__(self, method: str = "ads", *, kind: str = "robust_z", threshold: float = 1.0,
                 patience: int = 2, min_clients: int = 3) -> None:
        if not isinstance(method, str) or not method or method == RANDOM:
            raise ValueError(f"method: expected the name of a ledger method such as 'ads'; got {method!r}.")
        self.kind = _check_choice("kind", kind, FLAGGING_KINDS)
        if isinstance(threshold, bool) or not isinstance(threshold, numbers.Real) or not math.isfinite(threshold):
            raise ValueError(f"threshold: expected a finite number; got {threshold!r}.")
        if self.kind == "robust_z" and threshold <= 0:
            raise ValueError(f"threshold: expected a number > 0 for kind='robust_z' (clients with z < −threshold "
                             f"are suspicious); got {threshold!r}.")
        self.method = method
        self.threshold = float(threshold)
        self.patience = _check_int("patience", patience, 1)
        self.min_clients = _check_int("min_clients", min_clients, 2)
        self.reset()

    def __repr__(self) -> str:
        return (f"FlaggingRule(method={self.method!r}, kind={self.kind!r}, threshold={self.threshold!r}, "
                f"patience={self.patience!r}, min_clients={self.min_clients!r})")

    def reset(self) -> None:
        """Forget every round seen."""
        self._flagged_at: dict[Hashable, object] = {}
        self.streaks: dict[Hashable, int] = {}
        self.totals: dict[Hashable, float] = {}
        self.last_round: object = None
        self.last_scores: dict[Hashable, float] = {}

    def clone(self) -> FlaggingRule:
        """A fresh rule with the same parameters."""
        return FlaggingRule(self.method, kind=self.kind, threshold=self.threshold, patience=self.patience,
                            min_clients=self.min_clients)

    @property
    def flagged(self) -> frozenset:
        """Every client flagged so far."""
        return frozenset(self._flagged_at)

    @property
    def flagged_at(self) -> dict:
        """Client id -> the round in which it was flagged."""
        return dict(self._flagged_at)

    def update(self, round_frame: pd.DataFrame | Iterable[Mapping[str, object]]) -> set:
        """Take one round's rows; return the set of clients newly flagged by it."""
        frame = round_frame if isinstance(round_frame, pd.DataFrame) else pd.DataFrame(list(round_frame))
        _check_ledger_like(frame, ("round", "client_id", "method", "value", "status"), "round_frame")
        rounds = pd.unique(frame["round"])
        if len(rounds) != 1:
            raise ValueError(f"round_frame: expected the rows of one round; got rounds {sorted(rounds.tolist())}.")
        server_round = rounds[0]
        if RUN_COLUMN in frame.columns and frame[RUN_COLUMN].nunique(dropna=False) > 1:
            raise ValueError(f"round_frame: expected the rows of one run; got several '{RUN_COLUMN}' values.")
        if self.last_round is not None and not server_round > self.last_round:
            raise ValueError(f"round_frame['round']: expected a round after {self.last_round!r}; got {server_round!r}.")
        rows = frame[frame["method"] == self.method]
        if rows.empty:
            raise ValueError(f"method: expected {self.method!r} among round_frame's methods "
                             f"{sorted(set(frame['method']))}; got no rows for it.")
        ok = rows[rows["status"] == "ok"]
        if ok["client_id"].duplicated().any():
            raise ValueError(f"round_frame: expected one {self.method!r} row per client; got duplicates "
                             f"{sorted(set(ok.loc[ok['client_id'].duplicated(), 'client_id']), key=_id_key)}.")
        values = pd.to_numeric(ok["value"], errors="coerce").to_numpy(float)
        if not np.isfinite(values).all():
            raise ValueError(f"round_frame['value']: expected finite values on rows with status 'ok'; got "
                             f"{values.tolist()}.")
        ids = ok["client_id"].tolist()
        self.last_round = server_round
        if self.kind == "robust_z":
            if len(ids) < self.min_clients:
                self.last_scores = {}
                return set()
            scores = robust_z(values)
            suspicious = scores < -self.threshold
        else:
            for client_id, value in zip(ids, values):
                self.totals[client_id] = self.totals.get(client_id, 0.0) + float(value)
            scores = np.array([self.totals[c] for c in ids])
            suspicious = scores < self.threshold
        self.last_scores = dict(zip(ids, scores.tolist()))
        new = set()
        for client_id, hit in zip(ids, suspicious):
            self.streaks[client_id] = self.streaks.get(client_id, 0) + 1 if hit else 0
            if self.streaks[client_id] >= self.patience and client_id not in self._flagged_at:
                self._flagged_at[client_id] = server_round
                new.add(client_id)
        return new

    def apply(self, ledger: pd.DataFrame) -> dict:
        """Feed a one-run ledger round by round; return {round: newly flagged set}."""
        _check_ledger_like(ledger, ("round", "client_id", "method", "value", "status"), "ledger")
        if RUN_COLUMN in ledger.columns and ledger[RUN_COLUMN].nunique(dropna=False) > 1:
            raise ValueError(f"ledger: expected one run; got several '{RUN_COLUMN}' values "
                             "(use evaluate_flagging for several runs).")
        return {server_round: self.update(rows) for server_round, rows in ledger.groupby("round", sort=True)}


def evaluate_flagging(rule: FlaggingRule, ledger: pd.DataFrame) -> pd.DataFrame:
    """Run a fresh copy of ``rule`` on every run of ``ledger``; count whom it flags.

    The clients of a run are those valued (status ok) under ``rule.method`` at least once.

    Returns
    -------
    pandas.DataFrame
        One row per run: ``[seed,] n_clients, n_noisy, n_flagged, false_positives,
        detections, false_positive_rate`` (flagged clean / clean), ``detection_rate``
        (flagged noisy / noisy; NaN without noisy clients), ``clean_run`` (no noisy
        client), ``mean_flag_round`` (mean round at which noisy clients were flagged).
    """
    if not isinstance(rule, FlaggingRule):
        raise TypeError(f"rule: expected a FlaggingRule; got {type(rule).__name__}.")
    ledger = _check_ledger(ledger)
    _check_methods(ledger, [rule.method], name="rule.method")
    rows = []
    for key, run in _runs(ledger):
        valued = _valued(run, rule.method)
        if valued.empty:
            continue
        flags = _noisy_of(valued, "evaluate_flagging" + ("" if key is None else f", seed {key}"))
        fresh = rule.clone()
        fresh.apply(run)
        flagged_at = fresh.flagged_at
        noisy = {c for c, f in flags.items() if f}
        clean = set(flags) - noisy
        false_positives = len(clean & set(flagged_at))
        detections = len(noisy & set(flagged_at))
        rounds_noisy = [flagged_at[c] for c in noisy if c in flagged_at]
        row = {"n_clients": len(flags), "n_noisy": len(noisy), "n_flagged": len(flagged_at),
               "false_positives": false_positives, "detections": detections,
               "false_positive_rate": false_positives / len(clean) if clean else math.nan,
               "detection_rate": detections / len(noisy) if noisy else math.nan,
               "clean_run": not noisy,
               "mean_flag_round": float(np.mean(rounds_noisy)) if rounds_noisy else math.nan}
        rows.append(row if key is None else {RUN_COLUMN: key, **row})
    if not rows:
        raise ValueError(f"ledger: expected rows with status 'ok' for method {rule.method!r}; got none.")
    return pd.DataFrame(rows)


def flagging_rates(rules: FlaggingRule | Sequence[FlaggingRule], ledgers: pd.DataFrame | Sequence[pd.DataFrame], *,
                   confidence: float = 0.95) -> pd.DataFrame:
    """Each rule's false-positive and detection rates over runs, with intervals over runs.

    Parameters
    ----------
    rules
        Flagging rules to measure (each is applied afresh to every run).
    ledgers
        One ledger or several (for example the noisy runs and the clean runs of a study,
        each possibly holding several runs told apart by ``seed``). A run whose valued
        clients are all clean is a *clean run*.
    confidence
        Level of the normal-approximation intervals over runs, in (0, 1).

    Returns
    -------
    pandas.DataFrame
        One row per rule: ``method, kind, threshold, patience, n_clean_runs,
        n_noisy_runs``; ``false_positive_rate`` — the mean over clean runs of the share of
        clients flagged (every flag there is false), with ``_ci_low``/``_ci_high``;
        ``false_positive_rate_noisy_runs`` — the mean share of clean clients flagged in
        runs with noisy clients; ``detection_rate`` — the mean share of noisy clients
        flagged in runs with noisy clients, with its interval; ``mean_flag_round`` — the
        mean round at which noisy clients were flagged. NaN where no run of the kind exists.
    """
    rules = [rules] if isinstance(rules, FlaggingRule) else list(rules)
    if not rules or not all(isinstance(rule, FlaggingRule) for rule in rules):
        raise TypeError(f"rules: expected a FlaggingRule or a non-empty list of them; got {rules!r}.")
    ledgers = [ledgers] if isinstance(ledgers, pd.DataFrame) else list(ledgers)
    if not ledgers:
        raise ValueError("ledgers: expected at least one ledger; got none.")
    confidence = check_open_unit("confidence", confidence)
    rows = []
    for rule in rules:
        per_run = pd.concat([evaluate_flagging(rule, ledger) for ledger in ledgers], ignore_index=True)
        clean = per_run[per_run["clean_run"].astype(bool)]
        dirty = per_run[~per_run["clean_run"].astype(bool)]
        row: dict[str, object] = {"method": rule.method, "kind": rule.kind, "threshold": rule.threshold,
                                  "patience": rule.patience, "n_clean_runs": len(clean), "n_noisy_runs": len(dirty)}
        for name, samples in (("false_positive_rate", clean["false_positive_rate"]),
                              ("detection_rate", dirty["detection_rate"])):
            samples = samples.dropna().to_numpy(float)
            mean, low, high = _interval(samples, confidence) if len(samples) else (math.nan,) * 3
            row.update({name: mean, f"{name}_ci_low": low, f"{name}_ci_high": high})
        noisy_fpr = dirty["false_positive_rate"].dropna()
        row["false_positive_rate_noisy_runs"] = float(noisy_fpr.mean()) if len(noisy_fpr) else math.nan
        flag_rounds = dirty["mean_flag_round"].dropna()
        row["mean_flag_round"] = float(flag_rounds.mean()) if len(flag_rounds) else math.nan
        rows.append(row)
    return pd.DataFrame(rows)


def summarize_flagging(per_run: pd.DataFrame) -> dict[str, float]:
    """Rates over runs from :func:`evaluate_flagging`.

    Returns
    -------
    dict
        ``false_positive_rate`` (mean over clean runs), ``false_positive_rate_noisy_runs``
        (mean share of clean clients flagged in runs with noisy clients),
        ``detection_rate`` (mean over runs with noisy clients), ``n_clean_runs``,
        ``n_noisy_runs``; NaN where no run of the kind exists.
    """
    _check_ledger_like(per_run, ("clean_run", "false_positive_rate", "detection_rate"), "per_run")
    clean = per_run[per_run["clean_run"].astype(bool)]
    dirty = per_run[~per_run["clean_run"].astype(bool)]
    return {
        "false_positive_rate": float(clean["false_positive_rate"].mean()) if len(clean) else math.nan,
        "false_positive_rate_noisy_runs": float(dirty["false_positive_rate"].mean()) if len(dirty) else math.nan,
        "detection_rate": float(dirty["detection_rate"].mean()) if len(dirty) else math.nan,
        "n_clean_runs": len(clean),
        "n_noisy_runs": len(dirty),
    }
