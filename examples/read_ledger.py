"""Read a run's books with pandas: totals per client, what top-k selection keeps, detection.

    python examples/read_ledger.py RUN_DIR [--k 2]

``ledger.csv`` is long format: one row per round, client and method (``ads``, ``loo``,
``tracin_inflow`` ...), with the ``status`` of the client in that round (``ok``: valued) and
``noisy`` where the simulation knows it. ``fedvalue.ledger.load_run(RUN_DIR)`` reads the same
tables into DataFrames.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
from sklearn.metrics import roc_auc_score


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("run_dir", help="a run directory (fedvalue run, simulate, a ValuingStrategy's run_dir)")
    parser.add_argument("--k", type=int, default=2, help="clients per round a top-k selection keeps")
    args = parser.parse_args()
    run_dir = Path(args.run_dir)

    ledger = pd.read_csv(run_dir / "ledger.csv", dtype={"client_id": str})
    rounds = pd.read_csv(run_dir / "rounds.csv", dtype={"clients": str, "hash": str})
    # Booked rows: "ok" (valued in its round) and "idle" (not sampled: TracIn inflow only);
    # "failed" and "rejected" rows say why a client was not valued.
    booked = ledger[ledger["status"].isin(["ok", "idle"])]

    # Each client's total per method: Φ_i = Σ_t φ_t(i) over the rounds it was valued in.
    totals = booked.pivot_table(index="client_id", columns="method", values="value", aggfunc="sum")
    method = "ads" if "ads" in totals else totals.columns[0]
    totals = totals.sort_values(method, ascending=False)
    print(f"total value per client (sorted by {method}):")
    print(totals.to_string(float_format=lambda v: f"{v:.4f}"))

    # What a top-k selection keeps: each round's k highest within-round values.
    scored = booked[(booked["method"] == method) & (booked["status"] == "ok")]
    kept = scored.sort_values(["round", "value"], ascending=[True, False]).groupby("round").head(args.k)
    print(f"\ntop-{args.k} by {method} per round:")
    print(kept.groupby("round")["client_id"].apply(" ".join).to_string())

    # Detection, where the ledger knows the noisy clients: lower total = more suspicious.
    # Only clients valued at least once have a total to rank.
    noisy = ledger.dropna(subset=["noisy"]).groupby("client_id")["noisy"].first()
    ranked = totals[method].dropna()
    noisy = noisy.astype(str).str.lower().eq("true").reindex(ranked.index)
    if noisy.notna().all() and noisy.nunique() == 2:
        k_noisy = int(noisy.sum())
        auc = roc_auc_score(noisy, -ranked)
        precision = noisy.loc[ranked.nsmallest(k_noisy).index].mean()
        print(f"\nnoisy clients: {k_noisy} of {len(noisy)} valued; ROC AUC of -{method} total {auc:.3f}; "
              f"precision at {k_noisy} (lowest totals) {precision:.3f}")

    print(f"\nutility per round (U(A_t) realized):\n{rounds[['round', 'utility_realized']].to_string(index=False)}")


if __name__ == "__main__":
    main()
