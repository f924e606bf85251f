"""What a run's books add up to: per-client totals (:func:`client_summary`), the TracIn flows per
round and client (:func:`flow_rounds`), the first-order check of the flows (:func:`first_order_error`)
and the run-level figures (:func:`run_summary`), and :class:`Run`, a run directory's tables
(:class:`fedvalue.run.ledger_reader.LedgerTables`) with these summaries as methods, which
:func:`load_run` reads.

Reciprocity of the clients' total inflows and outflows is [RECIP] Def. 2.1
(:mod:`fedvalue.flows.reciprocity_measures`); group efficiency is [ADS] Prop. 4.2.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pandas as pd

from fedvalue.flows.reciprocity_measures import DEFAULT_P, reciprocity, reciprocity_ratio
from fedvalue.run.ledger_reader import LedgerTables, read_tables
from fedvalue.run.rundir import RunDir
from fedvalue.schema import CLAIM_PREFIX, FLOW_METHODS, Status


@dataclass(frozen=True)
class Run(LedgerTables):
    """A run directory's books as :func:`load_run` reads them: its tables (``ledger``, ``rounds``,
    ``config``, ``first_order``; typed rows through :meth:`rows` and :meth:`round_rows`) and
    their summaries."""

    def summary(self) -> pd.DataFrame:
        """Per client: total value per method, rounds participated, noisy flag (and flows)."""
        return client_summary(self.ledger)

    def run_summary(self, p: float = DEFAULT_P) -> dict:
        """Run-level figures: see :func:`run_summary`."""
        return run_summary(self, p=p)

    def flows(self) -> pd.DataFrame:
        """Per round and client: ``inflow``, ``outflow``, ``self`` (booked rows only)."""
        return flow_rounds(self.ledger)


def load_run(run_dir: str | os.PathLike | RunDir) -> Run:
    """Read a run directory (:func:`fedvalue.run.ledger_reader.read_tables`) as a :class:`Run`.

    Raises
    ------
    FileNotFoundError
        ``run_dir`` holds no ledger.csv.
    ValueError
        Its tables are not a ledger's (:func:`fedvalue.run.ledger_reader.check_tables`), or a
        file is a link, special or too large (:class:`fedvalue.run.rundir.UnsafeRunFile`).
    """
    tables = read_tables(run_dir)
    return Run(ledger=tables.ledger, rounds=tables.rounds, config=tables.config, first_order=tables.first_order)


def flow_rounds(ledger: pd.DataFrame) -> pd.DataFrame:
    """The TracIn rows of a ledger as one row per (round, client): inflow, outflow, self."""
    rows = ledger[ledger["method"].isin(list(FLOW_METHODS)) & ledger["status"].isin([Status.OK, Status.IDLE])]
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
    booked = ledger[ledger["status"].isin([Status.OK, Status.IDLE]) & ~is_claim]
    totals = booked.pivot_table(index="client_id", columns="method", values="value", aggfunc="sum")
    totals.columns = [f"total_{m}" for m in totals.columns]
    sampled = ledger[(ledger["status"] != Status.IDLE) & ~is_claim]
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
