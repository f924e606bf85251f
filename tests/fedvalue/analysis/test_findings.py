"""Detection and selection read from a run's books, against the detection module and a brute-force
top-k; the ROC curve drawn in the report against the AUC."""

from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from fedvalue.analysis.detection import detection_metrics, roc_auc
from fedvalue.analysis.findings import findings_lines, run_findings
from fedvalue.analysis.run_summary import load_run
from fedvalue.analysis.report import roc_points
from tests.fedvalue.analysis.test_report import CLIENTS, PER_ROUND, ROUNDS, write_books


def test_detection_is_the_detection_modules_and_selection_each_rounds_top_k(tmp_path):
    write_books(tmp_path, flows=True, seed=4)
    run = load_run(tmp_path)
    findings = run_findings(run)
    expected = detection_metrics(run.ledger, methods=["ads", "loo"])
    pd.testing.assert_frame_equal(findings.detection, expected)
    assert findings.method == "ads" and findings.k == PER_ROUND // 2
    ads = run.ledger[(run.ledger["method"] == "ads") & (run.ledger["status"] == "ok")]
    noisy = {str(c) for c in ("0", "3")}
    for row in findings.selection.itertuples():
        rows = ads[ads["round"] == row.round]
        best = rows.sort_values("value", ascending=False, kind="mergesort")["client_id"].astype(str).tolist()
        assert row.kept.split() == best[:findings.k] and sorted(row.dropped.split()) == sorted(best[findings.k:])
        assert row.kept_noisy == len(noisy & set(row.kept.split()))
        assert row.dropped_noisy == len(noisy & set(row.dropped.split()))
    lines = findings_lines(findings)
    assert lines[0].startswith(f"noisy-client detection from the booked values (2 noisy of {CLIENTS} valued")
    assert f"ads  ROC AUC {expected['auc'].iloc[0]:.3f}, precision at 2 {expected['precision_at_k'].iloc[0]:.3f}" \
        in lines[1]
    kept = sum(len(text.split()) for text in findings.selection["kept"])
    assert lines[-1].startswith(f"top-1 selection by ads each round keeps {kept} of {ROUNDS * PER_ROUND} valued")
    assert run_findings(run, k=2).selection["kept"].str.split().str.len().eq(2).all()


def test_without_known_noisy_clients_only_the_selection_is_read(tmp_path):
    write_books(tmp_path, flows=False)
    run = load_run(tmp_path)
    unknown = pd.concat([run.ledger.assign(noisy=pd.array([pd.NA] * len(run.ledger), dtype="boolean"))])
    findings = run_findings(type(run)(ledger=unknown, rounds=run.rounds, config=run.config))
    assert findings.detection is None and "kept_noisy" not in findings.selection
    assert [line.split(" each")[0] for line in findings_lines(findings)] == ["top-1 selection by ads"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(-3, 3), st.booleans()), min_size=2, max_size=30)
       .filter(lambda pairs: 0 < sum(flag for _, flag in pairs) < len(pairs)))
def test_the_roc_curve_drawn_has_the_reported_area(pairs):
    scores = np.array([float(s) for s, _ in pairs])  # small integers: many ties
    noisy = np.array([flag for _, flag in pairs])
    fpr, tpr = roc_points(scores, noisy)
    assert (fpr[0], tpr[0], fpr[-1], tpr[-1]) == (0.0, 0.0, 1.0, 1.0)
    assert np.all(np.diff(fpr) >= 0) and np.all(np.diff(tpr) >= 0)
    area = float(np.sum(np.diff(fpr) * (tpr[1:] + tpr[:-1]) / 2))  # trapezoids: ties count one half
    assert abs(area - roc_auc(scores, noisy)) < 1e-12
