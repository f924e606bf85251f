"""The valuation ledger: per-round, per-client books written as each round completes.

A run directory holds

``ledger.csv`` / ``ledger.parquet``
    Long format, one row per (round, client, method): ``round``, ``client_id``,
    ``method``, ``value``, ``stderr``, ``num_examples``, ``status``, ``noisy``.
``rounds.csv``
    One row per round: ``round``, ``clients`` (space-separated ids in reply order),
    ``num_clients``, ``num_failed``, ``utility_before`` (v_t(∅) = U(A_{t−1})),
    ``utility_after`` (v_t(I_t)), ``utility_realized`` (U(A_t), the state the run
    moved to), ``num_evaluations``, ``valuation_seconds``, ``ads_method``,
    ``efficiency_gap`` (Σφ_t − (v_t(I_t) − v_t(∅)), seed 004 Prop. 4.2), ``hash``:
    SHA-256 over the previous round's hash, the round's ledger.csv lines as written and
    its rounds.csv line without the hash; round 1 chains from the SHA-256 of run.json.
    Changing any recorded value breaks the chain from that round on
    (``fedvalue audit DIR`` checks it).
``first_order.csv`` (runs with TracIn flows)
    Per round and client: its summed inference loss at A_{t−1} and at A_t, the actual
    change and the change its flows predict, −(inflow + self) (seed 000, Remark 2.5).
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

LEDGER_COLUMNS = ("round", "client_id", "method", "value", "stderr", "num_examples", "status", "noisy")
ROUND_COLUMNS = (
    "round", "clients", "num_clients", "num_failed", "utility_before", "utility_after",
    "utility_realized", "num_evaluations", "valuation_seconds", "ads_method", "efficiency_gap", "hash",
)
#: A run's chain starts from the hash of its run.json (or this, when it has none).
GENESIS_HASH = "0" * 64
#: ok: valued this round; failed: sampled but no usable reply (error, timeout, malformed);
#: rejected: replied with NaN/inf arrays, kept out of the aggregate and booked with the harm it
#: would have done; idle: not sampled, booked only for what it received (TracIn inflow).
CLIENT_STATUSES = ("ok", "failed", "rejected", "idle")
#: The first-order check of TracIn flows (seed 000, Remark 2.5): per round and client, the
#: actual change of its inference loss against the change its flows predict.
FIRST_ORDER_FILE = "first_order.csv"
FIRST_ORDER_COLUMNS = ("round", "client_id", "loss_before", "loss_after", "actual_change", "predicted_change")


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


def genesis_hash(run_dir: Path) -> str:
    config = run_dir / "run.json"
    return hashlib.sha256(config.read_bytes()).hexdigest() if config.exists() else GENESIS_HASH


def _last_hash(rounds_path: Path) -> str | None:
    if not rounds_path.exists():
        return None
    with open(rounds_path, encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle))
    return rows[-1]["hash"] if rows else None


class LedgerWriter:
    """Appends each completed round to a run directory (see module docstring)."""

    def __init__(self, run_dir: str | os.PathLike, *, config: Mapping | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if config is not None:
            write_json(self.run_dir / "run.json", config)

    @property
    def ledger_path(self) -> Path:
        return self.run_dir / "ledger.csv"

    @property
    def rounds_path(self) -> Path:
        return self.run_dir / "rounds.csv"

    def write_round(self, round_row: Mapping[str, object], ledger_rows: list[Mapping[str, object]]) -> None:
        """Append one round: its ledger rows first, then its rounds.csv row (the commit mark)."""
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
        # Parquet mirrors the CSV; rewritten whole so it is always a complete file.
        ledger = read_ledger_csv(self.ledger_path)
        tmp = self.run_dir / "ledger.parquet.tmp"
        ledger.to_parquet(tmp, index=False)
        os.replace(tmp, self.run_dir / "ledger.parquet")


    def append_table(self, name: str, columns: Iterable[str], rows: list[Mapping[str, object]]) -> None:
        """Append rows to a side table of the run (written before the round's commit mark)."""
        if rows:
            _append_rows(self.run_dir / name, columns, rows)


def write_json(path: Path, data: Mapping) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def read_ledger_csv(path: str | os.PathLike) -> pd.DataFrame:
    """ledger.csv as a DataFrame with stable dtypes (client ids stay strings)."""
    frame = pd.read_csv(
        path,
        dtype={"client_id": str, "method": str, "status": str, "noisy": str},
        keep_default_na=False,
        na_values={"value": [""], "stderr": [""], "num_examples": [""]},
    )
    frame["noisy"] = frame["noisy"].map({"true": True, "false": False, "": pd.NA}).astype("boolean")
    return frame


@dataclass(frozen=True)
class Run:
    """A run directory loaded as DataFrames."""

    ledger: pd.DataFrame
    rounds: pd.DataFrame
    config: dict

    def summary(self) -> pd.DataFrame:
        """Per client: total value per method, rounds participated, noisy flag."""
        return client_summary(self.ledger)


def client_summary(ledger: pd.DataFrame) -> pd.DataFrame:
    """Per client: ``total_<method>`` for every method, ``rounds``, ``noisy``.

    Sorted by total ADS (or the first method) descending.
    """
    booked = ledger[ledger["status"].isin(["ok", "idle"])]
    totals = booked.pivot_table(index="client_id", columns="method", values="value", aggfunc="sum")
    totals.columns = [f"total_{m}" for m in totals.columns]
    sampled = ledger[ledger["status"] != "idle"]
    rounds = sampled.groupby("client_id")["round"].nunique().rename("rounds")
    summary = totals.join(rounds, how="outer")
    summary["rounds"] = summary["rounds"].fillna(0).astype(int)
    if "total_tracin_inflow" in summary:
        summary["inflow"] = summary.pop("total_tracin_inflow").fillna(0.0)
        summary["outflow"] = summary.pop("total_tracin_outflow").fillna(0.0)
        summary["self"] = summary.pop("total_tracin_self").fillna(0.0)
        summary["balance"] = summary["inflow"] - summary["outflow"]
        summary["ratio"] = reciprocity_ratio(summary["inflow"].to_numpy(), summary["outflow"].to_numpy())
    if "noisy" in ledger:
        summary = summary.join(ledger.groupby("client_id")["noisy"].first())
    key = "total_ads" if "total_ads" in summary else summary.columns[0]
    return summary.sort_values(key, ascending=False, kind="mergesort")


def load_run(run_dir: str | os.PathLike) -> Run:
    """Read a run directory written by :class:`LedgerWriter`."""
    run_dir = Path(run_dir)
    ledger_path = run_dir / "ledger.csv"
    if not ledger_path.exists():
        raise FileNotFoundError(
            f"run_dir: expected a fedvalue run directory holding ledger.csv; {run_dir} has none."
        )
    rounds = pd.read_csv(run_dir / "rounds.csv", dtype={"clients": str, "ads_method": str, "hash": str},
                         keep_default_na=False,
                         na_values={"efficiency_gap": [""], "utility_after": [""], "utility_realized": [""]})
    config_path = run_dir / "run.json"
    config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.exists() else {}
    return Run(ledger=read_ledger_csv(ledger_path), rounds=rounds, config=config)


def reciprocity_ratio(inflow, outflow):  # TEMPORARY until fedvalue.reciprocity lands
    inflow, outflow = np.asarray(inflow, float), np.asarray(outflow, float)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.minimum(inflow / outflow, outflow / inflow)
    return np.where(np.sign(inflow) != np.sign(outflow), 0.0, np.nan_to_num(r, nan=1.0))
