"""A round record's settings are one typed object from the strategy to every reader: the
records of a real run read into it and write back byte for byte, any settings survive their
JSON, and a record whose settings are wrong is refused with the field named."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given, settings as hypothesis_settings, strategies as st

from fedvalue.run.archive import (
    npz_bytes,
    npz_from_bytes,
    read_round_record,
    record_bytes,
    round_record_from_bytes,
    round_record_paths,
)
from fedvalue.run.settings import (
    BY_STRATEGY,
    ROUND_FACTS,
    WEIGHTED_MEAN,
    FairnessNote,
    RoundSettings,
    round_facts_as_json,
    round_facts_from_json,
)
from fedvalue.valuation.settings import AdsSettings


def test_every_record_of_a_real_run_reads_typed_and_writes_back_byte_for_byte(signed_run):
    run_dir, _, _ = signed_run
    paths = round_record_paths(run_dir)
    assert len(paths) == 3
    config = json.loads((run_dir / "run.json").read_text())
    for path in paths.values():
        record = read_round_record(path)
        assert isinstance(record.settings, RoundSettings) and isinstance(record.settings.valuation, AdsSettings)
        assert record.settings.seed == config["seed"] and list(record.settings.methods) == config["methods"]
        assert not record.settings.by_strategy and record.settings.by_examples
        assert record_bytes(record) == path.read_bytes()


ids = st.one_of(st.integers(0, 10**6), st.text("abc", min_size=1, max_size=3))
rules = st.one_of(st.none(), st.fixed_dictionaries({"rule": st.sampled_from(["drop-k", "ijack"]),
                                                   "score": st.sampled_from(["influence", "ads"]),
                                                   "k": st.integers(1, 3)}))
round_settings = st.builds(
    RoundSettings,
    methods=st.lists(st.sampled_from(["ads", "loo"]), unique=True).map(tuple),
    valuation=st.builds(AdsSettings, method=st.sampled_from(["auto", "exact", "mc", "tmc"]),
                        epsilon=st.floats(0.01, 1.0), max_evaluations=st.one_of(st.none(), st.integers(1, 10**6))),
    seed=st.integers(0, 2**63), strategy=st.sampled_from(["FedAvg", "FedProx", "MyStrategy"]),
    aggregation=st.sampled_from([WEIGHTED_MEAN, BY_STRATEGY]), weighted_by_key=st.sampled_from(["num-examples", "w"]),
    flows=st.booleans(), reject_non_finite=st.booleans(), selection=st.booleans(),
    fairness=st.one_of(st.none(), st.builds(FairnessNote, gap=st.sampled_from(["dp", "eop"]),
                                            utility_gap=st.one_of(st.none(), st.just("acc")),
                                            rule=rules.filter(bool), damping=st.one_of(st.none(), st.floats(0.01, 10))),
                       st.builds(FairnessNote, gap=st.just("eo"), rule=st.none())),
    weighting=st.one_of(st.none(), st.fixed_dictionaries({"score": st.just("ads"), "rule": st.just("clip")})),
    defences=st.one_of(st.none(), st.fixed_dictionaries({"norm_cap": st.floats(0.1, 5.0)})),
    acceptance=st.one_of(st.none(), st.just("representatives")),
    notes=st.one_of(st.none(), st.fixed_dictionaries({"my_kind": st.fixed_dictionaries({"k": st.integers(0, 9)})})),
    coalition_rule=st.sampled_from(["renormalized", "fixed-weight"]),
    fixed_second_order=st.booleans(),
)
round_facts = st.fixed_dictionaries({
    "replay_missing": st.one_of(st.none(), st.text(max_size=20)),
    "available": st.one_of(st.none(), st.lists(ids, max_size=5).map(tuple)),
    "passed": st.one_of(st.none(), st.lists(st.integers(0, 50), max_size=5).map(tuple)),
})


@hypothesis_settings(max_examples=200, deadline=None)
@given(round_settings)
def test_any_settings_survive_their_json(settings):
    written = json.loads(json.dumps(settings.as_json(), sort_keys=True))
    assert RoundSettings.from_json(written) == settings
    assert written.keys() >= {"methods", "valuation", "seed", "aggregation"}
    for name in ("fairness", "weighting", "defences", "acceptance", "notes"):
        assert (name in written) == (getattr(settings, name) is not None)  # absent, not null: older bytes unchanged
    assert ("coalition_rule" in written) == (settings.coalition_rule != "renormalized")  # the default: absent
    assert ("fixed_second_order" in written) == settings.fixed_second_order  # off: absent


@hypothesis_settings(max_examples=100, deadline=None)
@given(round_facts)
def test_a_rounds_own_facts_survive_their_json_beside_the_settings(facts):
    written = json.loads(json.dumps(round_facts_as_json(**facts), sort_keys=True))
    assert round_facts_from_json(written) == {k: v for k, v in facts.items() if v is not None}
    assert set(written) <= set(ROUND_FACTS) and not set(written) & {f.name for f in dataclasses.fields(RoundSettings)}
    for name, value in facts.items():
        assert (name in written) == (value is not None)  # absent, not null: older bytes unchanged


GOOD = RoundSettings(methods=("ads",), seed=3).as_json()


@pytest.mark.parametrize("change, named", [
    ({"methods": "ads"}, "methods: expected a list"),
    ({"methods": ["ads", 1]}, "methods: expected text"),
    ({"seed": True}, "seed: expected an integer"),
    ({"seed": 1.5}, "seed: expected an integer"),
    ({"valuation": [1]}, "valuation: expected a JSON object"),
    ({"valuation": {**GOOD["valuation"], "epsilon": -1}}, "valuation.epsilon"),
    ({"valuation": {**GOOD["valuation"], "sybil": 1}}, "valuation: expected only the keys"),
    ({"aggregation": "median"}, "aggregation: expected one of"),
    ({"flows": "yes"}, "flows: expected true or false"),
    ({"fairness": {"gap": 3}}, "fairness.gap: expected text"),
    ({"fairness": {"gap": "dp", "curvature": {"damping": "x"}}}, "fairness.curvature.damping"),
    ({"notes": {"my_kind": 3}}, "notes.my_kind: expected a JSON object"),
    ({"coalition_rule": "shapley"}, "coalition_rule: expected one of"),
    ({"fixed_second_order": 1}, "fixed_second_order: expected true or false"),
    ({"secret": 1}, "settings: expected only the keys"),
    ({"available": [1]}, "settings: expected only the keys"),  # a round's fact, not a setting of the run
])
def test_wrong_settings_are_refused_with_the_field_named(change, named):
    with pytest.raises(ValueError, match=named.replace(".", r"\.").replace("(", r"\(")):
        RoundSettings.from_json({**GOOD, **change})


@pytest.mark.parametrize("change, named", [
    ({"available": [1, None]}, "available: expected a list of client ids"),
    ({"passed": [0, "1"]}, "passed: expected an integer"),
    ({"replay_missing": 3}, "replay_missing: expected text"),
])
def test_wrong_round_facts_are_refused_with_the_field_named(change, named):
    with pytest.raises(ValueError, match=named):
        round_facts_from_json(change)


@pytest.mark.parametrize("missing", ["methods", "valuation", "seed"])
def test_settings_without_what_every_version_wrote_are_refused(missing):
    with pytest.raises(ValueError, match=f"settings: expected the key '{missing}'"):
        RoundSettings.from_json({k: v for k, v in GOOD.items() if k != missing})


def test_a_record_with_wrong_settings_is_not_a_record_and_says_which_field(signed_run):
    path = next(iter(round_record_paths(signed_run[0]).values()))
    record = read_round_record(path)
    data = record_bytes(dataclasses.replace(record, settings=RoundSettings(methods=("ads",), seed=-1)))
    assert round_record_from_bytes(data, "x").settings.seed == -1
    arrays, meta = npz_from_bytes(data, "x")
    meta["meta"]["seed"] = "1"
    garbled = npz_bytes(arrays, meta)
    with pytest.raises(ValueError, match=r"x: not a round record written by fedvalue .*seed: expected an integer"):
        round_record_from_bytes(garbled, "x")


def test_a_record_that_does_not_say_how_it_aggregated_is_not_taken_for_a_weighted_mean():
    older = {k: v for k, v in GOOD.items() if k != "aggregation"}
    assert RoundSettings.from_json(older).by_strategy
