"""Staged procurement accounting (fedvalue.analysis.staged_procurement) on a learner with closed-form answers.

The learner estimates one number: fine-tuning moves its state a fixed fraction ``rate`` of
the way to the mean of the union's data, so every coalition's state, utility and the ADS
of each offer can be computed by hand and by brute force over permutations.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from fedvalue.audit.checks import audit_run
from fedvalue.analysis.run_summary import load_run
from fedvalue.analysis.staged_procurement import Learner, Offer, procure_stage, run_procurement, stage_books

TARGET = 1.0


class MeanLearner:
    """State {"w": [w]}; fine_tune: w + rate · (mean of the union − w), + seed-dependent jitter."""

    def __init__(self, rate: float = 0.5, jitter: float = 0.0):
        self.rate, self.jitter = rate, jitter

    def fine_tune(self, state, datasets, *, seed):
        data = np.concatenate([np.asarray(d, dtype=np.float64) for d in datasets])
        w = float(state["w"][0])
        moved = w + self.rate * (data.mean() - w) + self.jitter * np.random.default_rng(seed).normal()
        return {"w": np.array([moved])}

    def predict(self, state, inputs):
        return np.full(len(inputs), float(state["w"][0]))


def utility(state) -> float:
    return -abs(float(state["w"][0]) - TARGET)


def offers_of(values: dict[str, list[float]]) -> list[Offer]:
    return [Offer(c, np.array(v), len(v)) for c, v in values.items()]


def brute_force_shapley(players, value) -> dict:
    """The permutation form: average marginal over all n! orders."""
    totals = dict.fromkeys(players, 0.0)
    orders = list(itertools.permutations(players))
    for order in orders:
        prefix: list = []
        for player in order:
            totals[player] += value(prefix + [player]) - value(prefix)
            prefix.append(player)
    return {p: t / len(orders) for p, t in totals.items()}


def test_the_learner_fits_the_protocol():
    assert isinstance(MeanLearner(), Learner)


def test_stage_values_equal_the_permutation_form_and_loo_by_hand():
    learner = MeanLearner()
    start = {"w": np.array([0.0])}
    offers = offers_of({"good": [1.0, 1.0], "half": [0.5, 0.5, 0.5, 0.5], "bad": [-1.0]})
    data = {o.contributor_id: o.data for o in offers}

    def value(coalition) -> float:
        if not coalition:
            return utility(start)
        ordered = [c for c in ("good", "half", "bad") if c in coalition]  # stage order, as the game passes it
        return utility(learner.fine_tune(start, [data[c] for c in ordered], seed=7))

    outcome = procure_stage(learner, start, offers, utility, rule="ads", fine_tune_seed=7)
    expected = brute_force_shapley(["good", "half", "bad"], value)
    for client, phi in outcome.values("ads").items():
        assert phi == pytest.approx(expected[client], abs=1e-12)
    everyone = value(["good", "half", "bad"])
    for client, psi in outcome.values("loo").items():
        assert psi == pytest.approx(everyone - value([c for c in data if c != client]), abs=1e-12)
    assert sum(outcome.values("ads").values()) == pytest.approx(everyone - value([]), abs=1e-12)
    # By hand: "good" alone moves w halfway to 1, w = 0.5; every other coalition ends farther from 1.
    assert outcome.purchased == ("good",)
    assert outcome.utility_realized == pytest.approx(-0.5)
    assert outcome.state["w"][0] == pytest.approx(0.5)
    assert outcome.num_fine_tunes == 7  # every non-empty coalition once, the purchase reused


def test_buying_every_offer_reaches_the_state_the_game_scored_for_all_offers():
    learner = MeanLearner(jitter=0.05)  # seed-dependent: only the same fine-tune reproduces it
    start = {"w": np.array([0.2])}
    offers = offers_of({"a": [0.9, 1.4], "b": [0.1], "c": [2.0, 0.0, 1.0]})
    outcome = procure_stage(learner, start, offers, utility, rule="loo", budget=3, fine_tune_seed=11)
    assert outcome.purchased == ("a", "b", "c")
    assert outcome.utility_realized == outcome.valuation.utility_after
    independent = learner.fine_tune(start, [o.data for o in offers], seed=11)
    assert utility(independent) == outcome.valuation.utility_after
    assert np.array_equal(outcome.state["w"], independent["w"])


def test_with_one_offer_per_stage_every_rule_walks_the_same_trajectory():
    learner = MeanLearner(jitter=0.1)
    rng = np.random.default_rng(3)
    stages = [[Offer("only", rng.normal(1.0, 1.0, size=5), 5)] for _ in range(6)]
    runs = {rule: run_procurement(learner, {"w": np.array([0.0])}, stages, utility, rule=rule, seed=5)
            for rule in ("ads", "loo", "random")}
    frames = [run.to_frame().drop(columns="seconds") for run in runs.values()]
    for frame in frames[1:]:
        assert frame.equals(frames[0])
    assert len(set(frames[0]["utility_realized"])) > 2  # it did move


def test_rules_see_the_same_offers_and_seeds_and_differ_only_by_purchases():
    learner = MeanLearner(jitter=0.02)
    rng = np.random.default_rng(0)
    stages = [offers_of({"clean": rng.normal(1.0, 0.1, 4), "noisy": rng.normal(-1.0, 0.1, 4)}) for _ in range(8)]
    ads = run_procurement(learner, {"w": np.array([0.0])}, stages, utility, rule="ads", seed=1)
    loo = run_procurement(learner, {"w": np.array([0.0])}, stages, utility, rule="loo", seed=1)
    rand = run_procurement(learner, {"w": np.array([0.0])}, stages, utility, rule="random", seed=1)
    assert all(s.purchased == ("clean",) for s in ads.stages + loo.stages)
    assert ads.to_frame().drop(columns="seconds").equals(loo.to_frame().drop(columns="seconds"))
    assert {s.purchased for s in rand.stages} == {("clean",), ("noisy",)}
    assert rand.stages[-1].utility_realized < ads.stages[-1].utility_realized
    again = run_procurement(learner, {"w": np.array([0.0])}, stages, utility, rule="random", seed=1)
    assert [s.purchased for s in again.stages] == [s.purchased for s in rand.stages]


def test_books_are_a_federated_runs_and_pass_the_audit(tmp_path):
    learner = MeanLearner(jitter=0.01)
    rng = np.random.default_rng(2)
    stages = [offers_of({"x": rng.normal(1, 0.5, 3), "y": rng.normal(0, 0.5, 3), "z": rng.normal(2, 0.5, 3)})
              for _ in range(4)]
    run = run_procurement(learner, {"w": np.array([0.0])}, stages, utility, rule="ads", seed=0,
                          run_dir=str(tmp_path), config={"what": "test"})
    books = load_run(tmp_path)
    assert list(books.rounds["round"]) == [1, 2, 3, 4]
    assert set(books.ledger["method"]) == {"ads", "loo", "selected"}
    selected = books.ledger[books.ledger["method"] == "selected"]
    assert selected.groupby("round")["value"].sum().tolist() == [1.0] * 4
    for outcome, row in zip(run.stages, books.rounds.itertuples()):
        assert row.utility_realized == outcome.utility_realized
        assert row.clients == " ".join(outcome.offers)
    report = audit_run(tmp_path)
    assert report.ok, report.problems
    ledger = (tmp_path / "ledger.csv").read_text().splitlines()
    forged = next(k for k, line in enumerate(ledger) if ",ads," in line)
    ledger[forged] = ledger[forged].replace(",ads,", ",ads,9", 1)  # a forged value
    (tmp_path / "ledger.csv").write_text("\n".join(ledger) + "\n")
    assert not audit_run(tmp_path).ok


def test_stage_books_mark_the_purchase_and_the_efficiency_gap():
    offers = offers_of({"a": [1.0], "b": [0.0]})
    outcome = procure_stage(MeanLearner(), {"w": np.array([0.0])}, offers, utility, rule="ads", stage=3)
    round_row, rows = stage_books(outcome, offers)
    assert round_row["round"] == 3 and round_row["ads_method"] == "ads-exact"
    assert math.isclose(round_row["efficiency_gap"], 0.0, abs_tol=1e-12)
    marks = {r.client_id: r.value for r in rows if r.method == "selected"}
    assert marks == {"a": 1.0, "b": 0.0}
    assert {r.noisy for r in rows} == {None}  # the books know no ground truth: the writer joins it


def test_the_books_writer_marks_the_noisy_contributors(tmp_path):
    offers = offers_of({"a": [1.0], "b": [0.0]})
    run_procurement(MeanLearner(), {"w": np.array([0.0])}, [offers, offers], utility, seed=0,
                    run_dir=str(tmp_path), noisy={"a": False, "b": True})
    ledger = load_run(tmp_path).ledger
    assert ledger.groupby("client_id")["noisy"].unique().map(list).to_dict() == {"a": [False], "b": [True]}


@pytest.mark.parametrize(("kwargs", "named"), [
    ({"rule": "shapley"}, "rule"),
    ({"budget": 0}, "budget"),
    ({"budget": True}, "budget"),
    ({"rule": "loo", "methods": ("ads",)}, "methods"),
    ({"rule": "random", "pick_rng": None}, "pick_rng"),
])
def test_bad_stage_arguments_name_the_parameter(kwargs, named):
    offers = offers_of({"a": [1.0], "b": [0.0]})
    with pytest.raises(ValueError, match=f"^{named}: expected"):
        procure_stage(MeanLearner(), {"w": np.array([0.0])}, offers, utility, **kwargs)


def test_bad_offers_and_methods_name_the_parameter():
    start = {"w": np.array([0.0])}
    with pytest.raises(ValueError, match="^offers: expected at least one offer at stage 1"):
        procure_stage(MeanLearner(), start, [], utility)
    with pytest.raises(ValueError, match="^offers: expected distinct contributor ids"):
        procure_stage(MeanLearner(), start, offers_of({"a": [1.0]}) * 2, utility)
    with pytest.raises(ValueError, match="^methods: expected distinct names"):
        run_procurement(MeanLearner(), start, [offers_of({"a": [1.0]})], utility, methods=("ads", "tracin"))
    with pytest.raises(ValueError, match="^seed: expected"):
        run_procurement(MeanLearner(), start, [offers_of({"a": [1.0]})], utility, seed=-3)


def test_a_refused_run_writes_nothing_and_an_existing_ledger_is_never_appended_to(tmp_path):
    start, stages = {"w": np.array([0.0])}, [offers_of({"a": [1.0], "b": [0.5]})]
    with pytest.raises(ValueError, match="^rule: expected"):
        run_procurement(MeanLearner(), start, stages, utility, rule="best", run_dir=str(tmp_path / "refused"))
    assert not (tmp_path / "refused").exists()
    run_procurement(MeanLearner(), start, stages, utility, run_dir=str(tmp_path / "books"))
    before = (tmp_path / "books" / "ledger.csv").read_bytes()
    with pytest.raises(ValueError, match="^run_dir: expected a new or empty directory"):
        run_procurement(MeanLearner(), start, stages, utility, run_dir=str(tmp_path / "books"))
    assert (tmp_path / "books" / "ledger.csv").read_bytes() == before
