"""The procurement table's results files and its rendering, on made-up runs of the real format (no fine-tuning):
offers read back from ledgers, the files headed by the command, and the cells as the docs write them."""

from __future__ import annotations

import pandas as pd

from simulations.experiments.procurement.markdown import (
    PROCUREMENT_RESULTS,
    offer_values,
    procurement_table,
    results_frames,
)
from simulations.experiments.procurement.procurement import _band, paired_differences
from simulations.runner import read_results, write_results

RULES = ("ads", "loo", "random")
#: Per rule, per seed: AvgErr at stages 0..3 (ADS and LOO equal in seed 2, LOO lower in seed 1).
ERRORS = {"ads": [[9.0, 4.0, 3.0, 2.0], [9.0, 4.2, 3.1, 2.2], [9.0, 4.1, 3.2, 2.1]],
          "loo": [[9.0, 4.1, 3.1, 2.1], [9.0, 4.1, 3.0, 2.1], [9.0, 4.1, 3.2, 2.1]],
          "random": [[9.0, 6.0, 5.0, 4.0], [9.0, 6.5, 5.5, 4.5], [9.0, 5.5, 4.5, 3.5]]}
#: Per rule, the contributor bought at each (seed, stage), and the values of c30, c60, c90 at every state.
BOUGHT = {"ads": "c30", "loo": "c30", "random": "c90"}
VALUES = {"ads": (0.5, 0.2, -0.1), "loo": (0.3, 0.25, 0.0)}


def tables() -> dict:
    errors = pd.DataFrame([{"seed": s, "rule": r, "stage": t, "avgerr": e}
                           for r in RULES for s, curve in enumerate(ERRORS[r]) for t, e in enumerate(curve)])
    summary = (errors.groupby(["rule", "stage"], sort=False)["avgerr"].apply(lambda v: _band(v, 0.9)).unstack()
               .reset_index())
    purchases = pd.DataFrame([{"seed": s, "rule": r, "stage": t, "contributor": BOUGHT[r],
                               "noise_share": int(BOUGHT[r][1:]) / 100, "ads": 0.0, "loo": 0.0}
                              for r in RULES for s in range(3) for t in (1, 2, 3)])
    return {"avgerr": errors, "summary": summary, "purchases": purchases, "paired": paired_differences(errors, 0.9)}


def write_ledgers(out) -> None:
    for s in range(3):
        for r in RULES:
            rows = [{"round": t, "client_id": c, "method": m, "value": VALUES[m][k], "status": "ok", "noisy": "",
                     "reason": "", "stderr": "", "num_examples": 50}
                    for t in (1, 2, 3) for k, c in enumerate(("c30", "c60", "c90")) for m in ("ads", "loo")]
            (out / f"seed-{s}" / r).mkdir(parents=True)
            pd.DataFrame(rows).to_csv(out / f"seed-{s}" / r / "ledger.csv", index=False)


def test_offers_come_back_from_the_ledgers(tmp_path):
    write_ledgers(tmp_path)
    offers = offer_values(tmp_path, range(3), RULES)
    assert len(offers) == 3 * 3 * 3 * 3
    assert list(offers.columns) == ["seed", "rule", "stage", "contributor", "ads", "loo"]
    assert offers[(offers["contributor"] == "c60")]["loo"].eq(0.25).all()


def test_the_table_from_two_runs_results_files(tmp_path):
    write_ledgers(tmp_path / "runs")
    offers = offer_values(tmp_path / "runs", range(3), RULES)
    for folder in ("default", "full"):
        write_results(tmp_path / folder, results_frames(tables(), offers), f"fedvalue run procurement --results {folder}")
        assert (tmp_path / folder / PROCUREMENT_RESULTS[0]).read_text().startswith(
            f"# fedvalue run procurement --results {folder} (commit ")
    frames = [read_results(tmp_path / folder / name) for folder in ("default", "full") for name in PROCUREMENT_RESULTS]
    rows = procurement_table(*frames)
    assert rows[0] == "| | paper ([ADS] Figs. 5, 6, four LLMs) | minibatches of 10 (default) | full batch |"
    assert rows[1] == "|---|---|---|---|"
    cells = [row.split(" | ") for row in rows[2:]]
    assert [c[0] for c in cells] == [
        "| AvgErr after stage 3 (90% bands)", "| ADS − LOO, per seed, mean AvgErr over stages 1–3 (`paired.csv`)",
        "| ADS − random, same", "| AvgErr at stages 1, 2, 3 (start 9.00)",
        "| purchases of the 30% / 90%-noise offer (Fig. 6; 9 per rule)",
        "| same states: top offer is `c30` (ADS / LOO), the two agree, median gap top − runner-up (ADS / LOO)"]
    assert cells[0][2].startswith("ADS 2.10 [") and ", LOO 2.10 [" in cells[0][2]
    assert cells[1][2].endswith(", ADS lower in 1 of 3 seeds, LOO in 1, 1 equal")
    assert cells[2][2].startswith("−1.90 [") and cells[2][2].endswith(", 3 of 3")
    assert cells[3][2] == "ADS 4.10, 3.10, 2.10; LOO 4.10, 3.10, 2.10"
    assert cells[4][2] == "ADS 100.0% / 0%, LOO 100.0% / 0%, random 0% / 100.0%"
    assert cells[5][2:] == ["100.0% / 100.0%, 100.0%, 0.30 / 0.05", "100.0% / 100.0%, 100.0%, 0.30 / 0.05 |"]
