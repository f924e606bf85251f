"""The valuation ledger: per-round, per-client books written as each round completes.

A run directory holds

``ledger.csv`` / ``ledger.parquet``
    Long format, one row per (round, client, method): ``round``, ``client_id``,
    ``method``, ``value``, ``stderr``, ``num_examples``, ``status`` (ok, failed, rejected,
    idle: :mod:`fedvalue.schema`), ``noisy``, ``reason`` (why a failed or rejected
    client was not valued; empty otherwise).
``rounds.csv``
    One row per round: ``round``, ``clients`` (space-separated ids in reply order),
    ``num_clients``, ``num_failed``, ``utility_before`` (v_t(∅) = U(A_{t−1})),
    ``utility_after`` (v_t(I_t)), ``utility_realized`` (U(A_t), the state the run
    moved to), ``num_evaluations``, ``valuation_seconds``, ``ads_method``,
    ``efficiency_gap`` (Σφ_t − (v_t(I_t) − v_t(∅)), [ADS] Prop. 4.2),
    ``num_unaggregatable`` (coalitions the inner strategy returned no arrays for, valued
    at v_t(∅) as Flower keeps the state), ``hash``:
    SHA-256 over the previous round's hash, the round's ledger.csv lines as written and
    its rounds.csv line without the hash; round 1 chains from the SHA-256 of run.json.
    Changing any recorded value breaks the chain from that round on
    (``fedvalue audit DIR`` checks it).
``first_order.csv`` (runs with TracIn flows)
    Per round and client: its summed inference loss at A_{t−1} and at A_t, the actual
    change and the change its flows predict, −(inflow + self) ([RECIP], Remark 2.5).
``run.json``
    The full configuration, seed and package versions.

Rows are appended and fsynced after every round, so a crash loses no completed round.
Values are written with Python's shortest round-trip float repr: the same run gives
the same bytes.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from fedvalue import rundir
from fedvalue.archive import replace_durably
from fedvalue.seals import Signer, write_manifest
from fedvalue.reciprocity import DEFAULT_P, reciprocity, reciprocity_ratio
from fedvalue.schema import (
    CLAIM_PREFIX,
    CLIENT_STATUSES,
    FIRST_ORDER_FILE,
    FLOW_METHODS,
    LEDGER_COLUMNS,
    LEDGER_FILE,
    LEDGER_PARQUET_FILE,
    ROUND_COLUMNS,
    ROUNDS_FILE,
    RUN_CONFIG_FILE,
)

#: A run's chain starts from the hash of its run.json (or this, when it has none).
GENESIS_HASH = "0" * 64


def _cell(value: object) -> str:
    """One CSV cell: shortest round-trip repr for floats, empty for missing."""
    if value is None:
        return ""
    if isinstance(value, (bool, np.bool_)):
        return "true" if value else "false"
    if isinstance(value, (float, np.floating)):
        value = float(value)
        return "" if math.isnan(value) else repr(value)
    return str(value)


def csv_lines(columns: Iterable[str], rows: Iterable[Mapping[str, object]]) -> list[str]:
    """Rows as the CSV lines the ledger writes (each ending in a newline)."""
    columns = list(columns)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    lines = []
    for row in rows:
        writer.writerow([_cell(row.get(c)) for c in columns])
        lines.append(buffer.getvalue())
        buffer.seek(0)
        buffer.truncate()
    return lines


def _append_lines(path: Path, columns: Iterable[str], lines: list[str]) -> None:
    rundir.check_file(path.parent, path.name)  # never append through a link of a received directory
    new_file = not path.exists()
    with open(path, "a", newline="", encoding="utf-8") as handle:
        if new_file:
            handle.write(",".join(columns) + "\n")
        handle.writelines(lines)
        handle.flush()
        os.fsync(handle.fileno())


def _append_rows(path: Path, columns: Iterable[str], rows: Iterable[Mapping[str, object]]) -> None:
    columns = list(columns)
    _append_lines(path, columns, csv_lines(columns, rows))


def chain_hash(previous: str, ledger_lines: Iterable[str], round_line_without_hash: str) -> str:
    """SHA-256 link of one round: previous hash, its ledger lines, its round line (sans hash)."""
    digest = hashlib.sha256(previous.encode("ascii"))
    for line in ledger_lines:
        digest.update(line.encode("utf-8"))
    digest.update(round_line_without_hash.encode("utf-8"))
    return digest.hexdigest()


def chain_heads(run_dir: str | os.PathLike) -> list[str]:
    """Every round's chain hash recomputed from the run's files; ValueError naming the
    first round whose recorded hash does not match (a file was changed by hand)."""
    run_dir = rundir.resolve(run_dir)
    if not rundir.exists(run_dir, ROUNDS_FILE):
        return []
    ledger = rundir.read_text(run_dir, LEDGER_FILE).splitlines(keepends=True)[1:] \
        if rundir.exists(run_dir, LEDGER_FILE) else []
    by_round: dict[str, list[str]] = {}
    for line in ledger:
        by_round.setdefault(line.split(",", 1)[0], []).append(line)
    previous, heads = genesis_hash(run_dir), []
    for line in rundir.read_text(run_dir, ROUNDS_FILE).splitlines(keepends=True)[1:]:
        body, _, recorded = line.rstrip("\n").rpartition(",")
        key = body.split(",", 1)[0]
        if chain_hash(previous, by_round.get(key, []), body + "\n") != recorded:
            raise ValueError(f"{ROUNDS_FILE}: round {key[:20]} does not match its recorded hash; the run directory "
                             "was changed by hand.")
        previous = recorded
        heads.append(recorded)
    return heads


def genesis_hash(run_dir: Path) -> str:
    if not rundir.exists(run_dir, RUN_CONFIG_FILE):
        return GENESIS_HASH
    return hashlib.sha256(rundir.read_bytes(run_dir, RUN_CONFIG_FILE, max_bytes=rundir.MAX_JSON_BYTES)).hexdigest()


def _last_hash(rounds_path: Path) -> str | None:
    if not rundir.exists(rounds_path.parent, rounds_path.name):
        return None
    text = rundir.read_text(rounds_path.parent, rounds_path.name)
    rows = list(csv.DictReader(io.StringIO(text, newline="")))
    return rows[-1]["hash"] if rows else None


class LedgerWriter:
    """Appends each completed round to a run directory (see module docstring).

    Parameters
    ----------
    run_dir
        The run directory (created if missing).
    config
        The run's configuration, written to ``run.json`` (the hash chain starts from it).
    resume
        Continue a run already in ``run_dir``: ``run.json`` is kept and must equal
        ``config`` when one is given (a changed configuration would break the chain and
        the promise of the same ledger as an uninterrupted run).
    """

    def __init__(self, run_dir: str | os.PathLike, *, config: Mapping | None = None, resume: bool = False) -> None:
        self.run_dir = rundir.resolve(run_dir)
        if resume:
            self._check_same_config(config)
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if config is not None:
            write_json(self.run_dir / RUN_CONFIG_FILE, config)

    def _check_same_config(self, config: Mapping | None) -> None:
        if not rundir.exists(self.run_dir, RUN_CONFIG_FILE):
            raise ValueError(f"resume: expected a run directory holding run.json; {self.run_dir} has none.")
        if config is None:
            return
        saved = read_run_config(self.run_dir)
        given = json.loads(json.dumps(config, sort_keys=True, default=str))
        changed = sorted(k for k in set(saved) | set(given) if saved.get(k) != given.get(k))
        if changed:
            key = changed[0]
            raise ValueError(
                f"resume: the run in {self.run_dir} was started with {key}={saved.get(key)!r}; got "
                f"{key}={given.get(key)!r} (differing keys: {changed}). Resume with the same configuration, "
                "or start a new run in another directory."
            )

    @property
    def ledger_path(self) -> Path:
        return self.run_dir / LEDGER_FILE

    @property
    def rounds_path(self) -> Path:
        return self.run_dir / ROUNDS_FILE

    def write_round(self, round_row: Mapping[str, object], ledger_rows: list[Mapping[str, object]]) -> str:
        """Append one round: its ledger rows first, then its rounds.csv row (the commit mark);
        returns the round's chain hash (the run's head)."""
        for row in ledger_rows:
            if row.get("status") not in CLIENT_STATUSES:
                raise ValueError(
                    f"status: expected one of {list(CLIENT_STATUSES)}; got {row.get('status')!r}."
                )
        ledger_lines = csv_lines(LEDGER_COLUMNS, ledger_rows)
        previous = _last_hash(self.rounds_path) or genesis_hash(self.run_dir)
        round_line = csv_lines(ROUND_COLUMNS[:-1], [round_row])[0]
        round_row = {**round_row, "hash": chain_hash(previous, ledger_lines, round_line)}
        _append_lines(self.ledger_path, LEDGER_COLUMNS, ledger_lines)
        _append_rows(self.rounds_path, ROUND_COLUMNS, [round_row])
        self.write_parquet()
        return round_row["hash"]

    def write_parquet(self) -> None:
        """Mirror ledger.csv as ledger.parquet, replaced whole so it is always a complete file."""
        parquet = rundir.check_file(self.run_dir, LEDGER_PARQUET_FILE)
        if not rundir.exists(self.run_dir, LEDGER_FILE):
            parquet.unlink(missing_ok=True)
            return
        tmp = rundir.check_file(self.run_dir, LEDGER_PARQUET_FILE + ".tmp")
        ledger = io.StringIO(rundir.read_text(self.run_dir, LEDGER_FILE), newline="")
        read_ledger_csv(ledger).to_parquet(tmp, index=False)
        replace_durably(tmp, parquet)

    def committed_rounds(self) -> list[dict]:
        """The rows of rounds.csv written so far (as the writer's caller booked them)."""
        if not self.rounds_path.exists():
            return []
        return read_rounds_csv(self.rounds_path).to_dict("records")

    def close(self, planned_rounds: int, *, sealed: bool = False, signer: Signer | None = None) -> dict:
        """Write the run's final manifest (:mod:`fedvalue.seals`): its rounds, its chain head and
        the digest of every file. Called once the run has done all ``planned_rounds``."""
        heads = chain_heads(self.run_dir)
        return write_manifest(self.run_dir, rounds=len(heads), planned_rounds=planned_rounds,
                              head=heads[-1] if heads else None, sealed=sealed, signer=signer)

    def append_table(self, name: str, columns: Iterable[str], rows: list[Mapping[str, object]]) -> None:
        """Append rows to a side table of the run (written before the round's commit mark)."""
        if rows:
            _append_rows(self.run_dir / name, columns, rows)


def read_run_config(run_dir: str | os.PathLike) -> dict:
    """run.json as a dict ({} when absent); ValueError when it is not a JSON object."""
    if not rundir.exists(run_dir, RUN_CONFIG_FILE):
        return {}
    try:
        config = json.loads(rundir.read_text(run_dir, RUN_CONFIG_FILE, max_bytes=rundir.MAX_JSON_BYTES))
    except rundir.UnsafeRunFile:
        raise
    except ValueError as error:
        raise ValueError(f"{RUN_CONFIG_FILE}: expected the run's configuration as JSON; it does not parse "
                         f"({error}).") from None
    if not isinstance(config, dict):
        raise ValueError(f"{RUN_CONFIG_FILE}: expected a JSON object of settings; got a {type(config).__name__}.")
    return config


def write_json(path: Path, data: Mapping) -> None:
    rundir.check_file(path.parent, path.name)
    tmp = rundir.check_file(path.parent, path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")
    replace_durably(tmp, path)


def read_ledger_csv(path: str | os.PathLike) -> pd.DataFrame:
    """ledger.csv as a DataFrame with stable dtypes (client ids stay strings)."""
    frame = pd.read_csv(
        path,
        dtype={"client_id": str, "method": str, "status": str, "noisy": str, "reason": str},
        keep_default_na=False,
        na_values={"value": [""], "stderr": [""], "num_examples": [""]},
    )
    frame["noisy"] = frame["noisy"].map({"true": True, "false": False, "": pd.NA}).astype("boolean")
    return frame




def read_rounds_csv(path: str | os.PathLike) -> pd.DataFrame:
    """rounds.csv as a DataFrame (client lists and hashes stay strings, missing values NaN)."""
    return pd.read_csv(path, dtype={"clients": str, "ads_method": str, "hash": str}, keep_default_na=False,
                       na_values={"efficiency_gap": [""], "utility_after": [""], "utility_realized": [""]})


@dataclass(frozen=True)
class Run:
    """A run directory loaded as DataFrames."""

    ledger: pd.DataFrame
    rounds: pd.DataFrame
    config: dict
    first_order: pd.DataFrame | None = None

    def summary(self) -> pd.DataFrame:
        """Per client: total value per method, rounds participated, noisy flag (and flows)."""
        return client_summary(self.ledger)

    def run_summary(self, p: float = DEFAULT_P) -> dict:
        """Run-level figures: see :func:`run_summary`."""
        return run_summary(self, p=p)

    def flows(self) -> pd.DataFrame:
        """Per round and client: ``inflow``, ``outflow``, ``self`` (booked rows only)."""
        return flow_rounds(self.ledger)


def flow_rounds(ledger: pd.DataFrame) -> pd.DataFrame:
    """The TracIn rows of a ledger as one row per (round, client): inflow, outflow, self."""
    rows = ledger[ledger["method"].isin(list(FLOW_METHODS)) & ledger["status"].isin(["ok", "idle"])]
    if rows.empty:
        return pd.DataFrame(columns=["round", "client", "inflow", "outflow", "self"])
    wide = rows.pivot_table(index=["round", "client_id"], columns="method", values="value", aggfunc="sum")
    wide = wide.reindex(columns=list(FLOW_METHODS)).rename(columns=FLOW_METHODS).reset_index()
    return wide.rename(columns={"client_id": "client"}).rename_axis(columns=None)


def first_order_error(first_order: pd.DataFrame | None) -> dict:
    """The first-order check of TracIn flows ([RECIP], Remark 2.5 / Fig. 5).

    Per round t and client v, actual = L_v(A_t) − L_v(A_{t−1}) and predicted =
    −(inflow_v + self_v). Returns ``relative_error`` = Σ|actual − predicted| / Σ|actual|
    over all rows, ``median_round_relative_error`` (the same ratio per round, median over
    rounds) and ``rounds_checked``; NaN/0 when there is nothing to check.
    """
    if first_order is None or first_order.empty:
        return {"first_order_relative_error": float("nan"), "first_order_median_round_error": float("nan"),
                "first_order_rounds_checked": 0}
    gap = (first_order["actual_change"] - first_order["predicted_change"]).abs()
    actual = first_order["actual_change"].abs()
    per_round = gap.groupby(first_order["round"]).sum() / actual.groupby(first_order["round"]).sum()
    total = float(actual.sum())
    return {
        "first_order_relative_error": float(gap.sum()) / total if total > 0 else float("nan"),
        "first_order_median_round_error": float(per_round.median()),
        "first_order_rounds_checked": int(per_round.size),
    }


def run_summary(run: Run, *, p: float = DEFAULT_P) -> dict:
    """Run-level figures of a run directory.

    Always: ``rounds``, ``utility_start`` (U(A_0)), ``utility_end`` (U of the last realized
    state), ``max_efficiency_gap`` (largest |Σφ_t − (v_t(I_t) − v_t(∅))|),
    ``num_evaluations`` and ``valuation_seconds`` (sums over rounds), ``failed_replies``.
    With TracIn flows: reciprocity of the clients' total inflows and outflows ([RECIP]
    Def. 2.1: ``alpha`` at ``p``, ``pearson``, ``spearman``, ``negative_inflow_share``,
    ``negative_outflow_share``, ...; prefixed ``reciprocity_``), ``flow_balance_gap``
    (Σ inflow − Σ outflow, zero up to rounding) and :func:`first_order_error`.
    """
    rounds = run.rounds
    summary: dict = {"rounds": int(len(rounds))}
    if len(rounds):
        summary.update({
            "utility_start": float(rounds["utility_before"].iloc[0]),
            "utility_end": float(rounds["utility_realized"].iloc[-1]),
            "max_efficiency_gap": float(rounds["efficiency_gap"].abs().max()) if rounds["efficiency_gap"].notna().any()
            else float("nan"),
            "num_evaluations": int(rounds["num_evaluations"].sum()),
            "valuation_seconds": float(rounds["valuation_seconds"].sum()),
            "failed_replies": int(rounds["num_failed"].sum()),
        })
    flows = flow_rounds(run.ledger)
    if not flows.empty:
        totals = flows.groupby("client")[["inflow", "outflow"]].sum()
        report = reciprocity(totals["inflow"], totals["outflow"], p=p)
        summary.update({f"reciprocity_{k}": v for k, v in report.to_dict().items()})
        summary["flow_balance_gap"] = float(totals["inflow"].sum() - totals["outflow"].sum())
        summary.update(first_order_error(run.first_order))
    return summary


def client_summary(ledger: pd.DataFrame) -> pd.DataFrame:
    """Per client: ``total_<method>`` for every valuation method, ``rounds``, ``noisy``; with
    TracIn flows ``inflow``, ``outflow``, ``self``, ``balance``, ``ratio``; with a claim review
    ``claim_flags`` (rows flagging a claimed weight: their values are claimed counts, not
    values, so they are counted, not summed).

    Sorted by total ADS (or the first method) descending.
    """
    is_claim = ledger["method"].str.startswith(CLAIM_PREFIX)
    booked = ledger[ledger["status"].isin(["ok", "idle"]) & ~is_claim]
    totals = booked.pivot_table(index="client_id", columns="method", values="value", aggfunc="sum")
    totals.columns = [f"total_{m}" for m in totals.columns]
    sampled = ledger[(ledger["status"] != "idle") & ~is_claim]
    rounds = sampled.groupby("client_id")["round"].nunique().rename("rounds")
    summary = totals.join(rounds, how="outer")
    summary["rounds"] = summary["rounds"].fillna(0).astype(int)
    if is_claim.any():
        flags = ledger[is_claim].groupby("client_id").size().rename("claim_flags")
        summary = summary.join(flags, how="left")
        summary["claim_flags"] = summary["claim_flags"].fillna(0).astype(int)
    if "total_tracin_inflow" in summary:
        for method, name in FLOW_METHODS.items():
            summary[name] = summary.pop(f"total_{method}").fillna(0.0)
        summary["balance"] = summary["inflow"] - summary["outflow"]
        summary["ratio"] = reciprocity_ratio(summary["inflow"].to_numpy(), summary["outflow"].to_numpy())
    if "noisy" in ledger:
        summary = summary.join(ledger.groupby("client_id")["noisy"].first())
    key = "total_ads" if "total_ads" in summary else summary.columns[0]
    return summary.sort_values(key, ascending=False, kind="mergesort")


def load_run(run_dir: str | os.PathLike) -> Run:
    """Read a run directory written by :class:`LedgerWriter`."""
    run_dir = rundir.resolve(run_dir)
    if not rundir.exists(run_dir, LEDGER_FILE):
        raise FileNotFoundError(
            f"run_dir: expected a fedvalue run directory holding ledger.csv; {run_dir} has none."
        )

    def table(name: str) -> io.StringIO:  # read safely (no links, no FIFOs), then parsed
        return io.StringIO(rundir.read_text(run_dir, name), newline="")

    try:
        rounds = read_rounds_csv(table(ROUNDS_FILE))
        ledger = read_ledger_csv(table(LEDGER_FILE))
        first_order = (pd.read_csv(table(FIRST_ORDER_FILE), dtype={"client_id": str})
                       if rundir.exists(run_dir, FIRST_ORDER_FILE) else None)
    except rundir.UnsafeRunFile:
        raise
        for frame, columns in ((ledger, ("round", "value", "stderr", "num_examples")),
                               (rounds, ("round", "utility_before", "utility_realized", "num_evaluations"))):
            odd = [c for c in columns if c not in frame or not pd.api.types.is_numeric_dtype(frame[c])]
            if odd:
                raise ValueError(f"columns {odd} are missing or not numbers")
    except (ValueError, KeyError, TypeError, pd.errors.ParserError, pd.errors.EmptyDataError) as error:
        raise ValueError(f"run_dir: {run_dir} holds tables that are not a fedvalue ledger ({error}).") from None
    return Run(ledger=ledger, rounds=rounds, config=read_run_config(run_dir), first_order=first_order)
