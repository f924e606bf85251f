"""What a run's books say about its clients: who is detected as noisy, whom a selection keeps.

Both read the booked values only, per valuation method booked (``ads``, ``loo``):

Detection ([ADS] §6.2, App. C.2)
    Where the ledger knows the noisy clients: ROC AUC of "lower accumulated value
    Φ_i = Σ_t φ_t(i) = more likely noisy" and precision at K, the share of noisy clients among
    the K lowest Φ with K the true number of noisy clients among those valued
    (:func:`fedvalue.analysis.detection.detection_metrics`; a random ranking scores AUC 0.5 and
    precision K/n in expectation).
Selection ([ADS] §6.2, top-k)
    Each round's k highest within-round values φ_t(i) (ties to the earlier reply), as the
    top-k acceptance keeps them (:func:`fedvalue.analysis.top_k_selection.retrain_plan`); k defaults to half
    the clients valued in a round. Where the noisy clients are known: how many of them the
    selection keeps and drops.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from fedvalue._checks import check_integer
from fedvalue.analysis.detection import detection_metrics
from fedvalue.analysis.run_summary import Run
from fedvalue.schema import VALUATION_METHODS, Status, client_sort_key
from fedvalue.analysis.top_k_selection import retrain_plan

__all__ = ["Findings", "findings_lines", "run_findings"]


@dataclass(frozen=True)
class Findings:
    """Detection and selection read from one run's books.

    Attributes
    ----------
    detection
        Per method: ``method, n_clients, n_noisy, auc, precision_at_k`` (None: the ledger does
        not know both noisy and clean valued clients).
    selection
        Per round: ``round, valued, kept, dropped`` (client ids, space-separated) and, where the
        noisy clients are known, ``kept_noisy``, ``dropped_noisy`` (None: nothing valued).
    method, k
        The method the selection ranks by (``ads`` when booked) and its k.
    """

    detection: pd.DataFrame | None
    selection: pd.DataFrame | None
    method: str | None
    k: int | None


def _noisy_flags(ledger: pd.DataFrame) -> dict[str, bool] | None:
    """Noisy flag per client when the ledger knows it for every client, else None."""
    flags = ledger.groupby("client_id")["noisy"].first()
    if flags.isna().any():
        return None
    return {str(c): bool(v) for c, v in flags.items()}


def run_findings(run: Run, *, k: int | None = None) -> Findings:
    """Detection and selection of ``run`` (module docstring).

    Parameters
    ----------
    run
        A run's books (:func:`fedvalue.analysis.run_summary.load_run`).
    k
        Clients a round's selection keeps; default half the clients valued in the run's
        fullest round (at least 1).
    """
    ledger = run.ledger
    methods = [m for m in VALUATION_METHODS if ((ledger["method"] == m) & (ledger["status"] == Status.OK)).any()]
    if not methods:
        return Findings(None, None, None, None)
    noisy = _noisy_flags(ledger[ledger["method"].isin(methods) & (ledger["status"] == Status.OK)])
    detection = None
    if noisy is not None and 0 < sum(noisy.values()) < len(noisy):
        detection = detection_metrics(ledger, methods=methods)
    method = methods[0]
    valued = ledger[(ledger["method"] == method) & (ledger["status"] == Status.OK)]
    if k is None:
        k = max(1, int(valued.groupby("round").size().max()) // 2)
    k = check_integer("k", k)
    sampled, accepted = retrain_plan(ledger, method, k)
    rows = []
    for server_round, clients in sampled.items():
        ok = [str(c) for c in valued.loc[valued["round"] == server_round, "client_id"]]
        kept = [str(c) for c in accepted[server_round]]
        dropped = [c for c in ok if c not in kept]
        row = {"round": server_round, "valued": " ".join(ok), "kept": " ".join(kept), "dropped": " ".join(dropped)}
        if noisy is not None:
            row.update(kept_noisy=sum(noisy[c] for c in kept), dropped_noisy=sum(noisy[c] for c in dropped))
        rows.append(row)
    return Findings(detection, pd.DataFrame(rows), method, k)


def findings_lines(findings: Findings) -> list[str]:
    """The findings as a few lines of text (what ``fedvalue run`` and ``fedvalue report`` print)."""
    lines = []
    if findings.detection is not None:
        first = findings.detection.iloc[0]
        count = int(first["n_noisy"])
        lines.append(f"noisy-client detection from the booked values ({count} noisy of {int(first['n_clients'])} "
                     f"valued clients; lower total value = more suspicious):")
        for row in findings.detection.itertuples():
            lines.append(f"  {row.method:<4} ROC AUC {row.auc:.3f}, precision at {count} {row.precision_at_k:.3f}")
        lines.append(f"  (a random ranking: ROC AUC 0.5, precision at {count} {count / first['n_clients']:.3f})")
    if findings.selection is not None and len(findings.selection):
        table = findings.selection
        kept = sorted({c for text in table["kept"] for c in text.split()}, key=client_sort_key)
        line = (f"top-{findings.k} selection by {findings.method} each round keeps {sum(len(t.split()) for t in table['kept'])} "
                f"of {sum(len(t.split()) for t in table['valued'])} valued replies ({len(kept)} clients)")
        if "kept_noisy" in table:
            noisy_valued = int(table["kept_noisy"].sum() + table["dropped_noisy"].sum())
            line += (f"; of the {noisy_valued} noisy replies it keeps {int(table['kept_noisy'].sum())} and drops "
                     f"{int(table['dropped_noisy'].sum())}")
        lines.append(line)
    return lines
