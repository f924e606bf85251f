"""Every sampling estimator books a standard error per client, with and without a budget,
and a budgeted run is recomputed by the audit to the bit (in-process grid, no Ray)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from flwr.serverapp.strategy import FedAvg

from fedvalue.audit.checks import audit_run
from fedvalue.analysis.run_summary import load_run
from strategies import PartitionSampler, ValuingStrategy
from fedvalue.valuation.settings import AdsSettings, ValuationSettings

from tests.strategies.harness.inprocess import InProcessGrid
from tests.strategies.test_valuing import NODE_OF, initial_arrays, make_handler, utility  # noqa: F401 - the fixture


def _run(tmp_path, held_out_utility, **options):
    progress: list[tuple[int, int, int]] = []
    valuation = ValuationSettings(ads=AdsSettings(**options))
    strategy = ValuingStrategy(FedAvg(fraction_evaluate=0.0), held_out_utility, run_dir=str(tmp_path),
                               sampler=PartitionSampler(6, seed=3), seed=0, valuation=valuation)
    strategy.on_progress = lambda *call: progress.append(call)
    strategy.start(InProcessGrid(NODE_OF.values(), make_handler()), initial_arrays(), num_rounds=2, timeout=10)
    return load_run(tmp_path), progress


# Every sampler, each with or without a budget (both modes in the set; each run is audited).
@pytest.mark.parametrize(("method", "budget"), [("mc", None), ("tmc", 300), ("antithetic", 300),
                                                ("stratified", None), ("kernelshap", 300)])
def test_sampling_estimators_book_standard_errors_and_audit_intact(tmp_path, utility, method, budget):  # noqa: F811
    options = {"method": method, "epsilon": 0.3, "budget": budget}
    run, progress = _run(tmp_path, utility, **options)
    ads = run.ledger[run.ledger["method"] == "ads"]
    assert len(ads) == 12 and np.isfinite(ads["stderr"]).all() and (ads["stderr"] > 0).all()
    assert (run.ledger.loc[run.ledger["method"] == "loo", "stderr"] == 0).all()
    assert (run.rounds["ads_method"] == f"ads-{method}").all()
    if budget is not None:
        assert (run.rounds["num_evaluations"] <= budget).all()
    # The progress callback saw every round's evaluations, ending at what the round booked.
    for server_round, booked in zip(run.rounds["round"], run.rounds["num_evaluations"]):
        calls = [(done, planned) for r, done, planned in progress if r == server_round]
        assert calls[-1] == (booked, booked)
        assert [done for done, _ in calls] == sorted(done for done, _ in calls)
    report = audit_run(tmp_path, utility=utility)
    assert report.intact, report.problems


def test_auto_with_a_budget_takes_exact_when_it_fits_and_a_sampler_when_not(tmp_path, utility):  # noqa: F811
    fits, _ = _run(tmp_path / "fits", utility, budget=64)
    assert (fits.rounds["ads_method"] == "ads-exact").all() and (fits.rounds["num_evaluations"] == 64).all()
    tight, _ = _run(tmp_path / "tight", utility, budget=63)
    assert (tight.rounds["ads_method"] == "ads-kernelshap").all()  # stratified's 230 do not fit
    assert (tight.rounds["num_evaluations"] <= 63).all()
    # Exact values and LOO are the same as without a budget (the same coalitions, scored alike).
    plain, _ = _run(tmp_path / "plain", utility)
    pd.testing.assert_frame_equal(fits.ledger, plain.ledger)
