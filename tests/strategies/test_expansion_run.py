"""The expansion methods through a run (in-process grid, real FedAvg and torch training, no Ray): a run valued by
``AdsSettings(method="second-order")`` under the fixed-weight rule books ``ads-second-order`` with its anchors'
two evaluations (plus LOO's), a free-rider 0.0, the expansion's remainder as its efficiency gap, and its audit
recomputes every value and reports intact, holding these rounds to no group efficiency; the booked values are
the closed form u_k·(g + ½ H U) of the run's own round. A strategy that aggregates by its own code, a utility
scoring accuracy and the books that value other games are refused when the strategy is made, naming
``method``."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from flwr.serverapp.strategy import FedAvg, FedMedian

from fedvalue.analysis.run_summary import load_run
from fedvalue.audit.checks import audit_run
from fedvalue.rounds.defences.settings import DefenceSettings
from fedvalue.run.archive import read_round_record, round_record_paths
from fedvalue.scoring.torch_utilities import TorchModelUtility
from fedvalue.valuation.settings import AdsSettings, ValuationSettings
from strategies import BookSettings, PartitionSampler, ValuingStrategy
from tests.strategies.harness.inprocess import InProcessGrid
from tests.strategies.test_coalition_rule import FREE_RIDER, handler
from tests.strategies.test_valuing import NODE_OF, initial_arrays, make_model, utility  # noqa: F401

SECOND = ValuationSettings(("ads", "loo"), AdsSettings(method="second-order"), coalition_rule="fixed-weight")


def test_a_second_order_run_books_the_closed_form_and_its_audit_recomputes_it(tmp_path, utility):  # noqa: F811
    run_dir = tmp_path / "run"
    strategy = ValuingStrategy(FedAvg(fraction_evaluate=0.0), utility, run_dir=str(run_dir),
                               sampler=PartitionSampler(4, schedule="even", seed=1), seed=0, valuation=SECOND)
    strategy.start(InProcessGrid(NODE_OF.values(), handler), initial_arrays(), num_rounds=3, timeout=10)
    rounds = pd.read_csv(run_dir / "rounds.csv")
    assert (rounds["ads_method"] == "ads-second-order").all()
    assert (rounds["num_evaluations"] == 2 + 4).all()  # v(∅), v(I_t), and LOO's four I_t∖{i}
    assert (rounds["efficiency_gap"].abs() > 0).all()  # the remainder of the expansion, booked as it is
    ledger = load_run(run_dir).ledger
    ads_rows = ledger[ledger["method"] == "ads"]
    assert (ads_rows["stderr"] == 0.0).all()
    free_rider = ads_rows.loc[ads_rows["client_id"] == str(FREE_RIDER), "value"].tolist()
    assert free_rider and free_rider == [0.0] * len(free_rider)  # sampled, and a null player exactly

    t, path = next((t, p) for t, p in round_record_paths(run_dir).items())
    record = read_round_record(path)
    start, ok = record.start_arrays, list(record.replies)
    total = sum(record.weights[c] for c in ok)
    shares = {c: record.weights[c] / total for c in ok}
    updates = {c: {k: (record.replies[c][k] - start[k]).astype(np.float64) for k in start} for c in ok}
    step = {k: sum(shares[c] * updates[c][k] for c in ok) for k in start}
    gradient, curvature = utility.gradient(start), utility.hessian_vector_product(start, step)
    booked = ads_rows[ads_rows["round"] == t].set_index("client_id")["value"]
    for c in ok:
        expected = shares[c] * sum(float((updates[c][k] * (gradient[k] + 0.5 * curvature[k])).sum()) for k in start)
        assert booked[str(c)] == pytest.approx(expected, rel=1e-9, abs=1e-15)

    report = audit_run(run_dir, utility=utility)
    assert report.intact, report.problems
    assert any(line.startswith("recomputed every value of 3 rounds") for line in report.checks), report.checks
    assert any(line.startswith("group efficiency not held in 3 rounds valued by a first- or second-order expansion")
               for line in report.checks), report.checks


def test_what_the_expansion_cannot_value_is_refused_when_the_strategy_is_made(utility):  # noqa: F811
    first = ValuationSettings(("ads",), AdsSettings(method="first-order"))
    with pytest.raises(ValueError, match="method: 'first-order' expands the round game of FedAvg's weighted mean; "
                                         "FedMedian aggregates by its own code"):
        ValuingStrategy(FedMedian(fraction_evaluate=0.0), utility, valuation=first)
    rng = np.random.default_rng(0)
    accuracy = TorchModelUtility(make_model(), rng.normal(size=(20, 5)).astype(np.float32), rng.integers(0, 3, 20))
    with pytest.raises(ValueError, match="method: 'first-order' expands the round game at A_{t−1} and needs a "
                                         "differentiable utility .* got TorchModelUtility with metric='accuracy' "
                                         r"\(not differentiable\)"):
        ValuingStrategy(FedAvg(fraction_evaluate=0.0), accuracy, valuation=first)
    with pytest.raises(ValueError, match="method: 'first-order' values the accuracy game from its expansion; the "
                                         "defences books"):
        ValuingStrategy(FedAvg(fraction_evaluate=0.0), utility, valuation=first,
                        books=BookSettings(defences=DefenceSettings()))
    # LOO alone never reads the ADS method: nothing to refuse.
    ValuingStrategy(FedMedian(fraction_evaluate=0.0), utility,
                    valuation=ValuationSettings(("loo",), AdsSettings(method="first-order")))
