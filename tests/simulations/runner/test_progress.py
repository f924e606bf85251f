"""The valuation progress display and the valuation budget's parsing and timing."""

from __future__ import annotations

import numpy as np
import pytest

from simulations.runner.budget import ValuationBudget, check_budget, parse_budget, seconds_per_evaluation
from simulations.runner.progress import ValuationProgress


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_lines_every_interval_with_count_share_and_eta():
    clock, lines = Clock(), []
    progress = ValuationProgress(delay=1.0, interval=10.0, write=lines.append, terminal=False, clock=clock)
    progress(3, 0, 1000)  # the round starts
    clock.now = 0.5
    progress(3, 100, 1000)  # within the delay: nothing
    clock.now = 10.0
    progress(3, 250, 1000)
    clock.now = 15.0
    progress(3, 400, 1000)  # within the interval of the last line: nothing
    clock.now = 20.0
    progress(3, 500, 1000)
    clock.now = 30.0
    progress(3, 880, 880)  # a sampler stopped before its plan: the valuation is over
    assert lines == ["round 3 valuation: 250/1,000 coalitions (25%), 10.0 s, ETA 30 s",
                     "round 3 valuation: 500/1,000 coalitions (50%), 20.0 s, ETA 20 s",
                     "round 3 valuation: 880/880 coalitions (100%), 30.0 s"]
    clock.now = 31.0
    progress(4, 64, 64)  # a round valued at once shows nothing
    progress(4, 64, 64)
    assert len(lines) == 3


def test_short_valuations_show_nothing_and_a_bar_is_taken_down():
    clock, lines = Clock(), []
    progress = ValuationProgress(delay=1.0, interval=10.0, write=lines.append, terminal=False, clock=clock)
    for done in range(0, 65, 16):
        progress(1, done, 64)
    assert lines == []
    bar = ValuationProgress(delay=0.0, terminal=True, clock=clock)
    bar(2, 0, 100)
    bar(2, 40, 100)
    assert bar._bar is not None
    bar(2, 100, 100)
    assert bar._bar is None
    bar(3, 10, 100)
    bar.close()  # a run stopped mid-valuation
    assert bar._bar is None


def test_budgets_parse_and_bad_ones_are_named():
    assert parse_budget("") is None and parse_budget("  ") is None
    assert parse_budget("2000") == ValuationBudget(evaluations=2000)
    assert parse_budget("30s") == ValuationBudget(seconds=30.0) == parse_budget(" 30 s ")
    assert parse_budget("2.5s") == ValuationBudget(seconds=2.5)
    for bad in ("0", "-5", "0s", "many", "10m", "1e3"):
        with pytest.raises(ValueError, match="valuation_budget: expected coalition evaluations"):
            parse_budget(bad)
    assert ValuationBudget(evaluations=7).evaluations_for(None, 6) == 7
    with pytest.raises(ValueError, match="valuation_budget: a budget in seconds"):
        ValuationBudget(seconds=1.0).evaluations_for(None, 6)


def test_budget_checked_against_the_round_before_a_run():
    check_budget(64, "auto", 6, ("ads", "loo"))  # exact fits
    check_budget(63, "auto", 6, ("ads", "loo"))  # kernelshap after LOO's 7
    with pytest.raises(ValueError, match="valuation_budget: 63 evaluations per round do not fit: exact ADS"):
        check_budget(63, "exact", 6, ("ads", "loo"))
    with pytest.raises(ValueError, match="valuation_budget: 6 evaluations .* LOO alone needs 7"):
        check_budget(6, "auto", 6, ("ads", "loo"))
    with pytest.raises(ValueError, match="stratified needs at least"):
        check_budget(500, "stratified", 20, ("ads",))


def test_seconds_are_timed_on_the_utility():
    from fedvalue.scoring.torch_utilities import TorchModelUtility
    from simulations.datasets.models import make_mlp

    rng = np.random.default_rng(0)
    utility = TorchModelUtility(make_mlp(12, 3, hidden=(16,), seed=0), rng.random((300, 12), dtype=np.float32),
                                rng.integers(0, 3, 300))
    fixed, per_coalition = seconds_per_evaluation(utility, 8)
    assert fixed >= 0 and 0 < per_coalition < 1
    evaluations = ValuationBudget(seconds=1.0).evaluations_for(utility, 8)
    assert isinstance(evaluations, int) and evaluations >= 1
    assert ValuationBudget(seconds=1e-9).evaluations_for(utility, 8) == 1  # never below one
