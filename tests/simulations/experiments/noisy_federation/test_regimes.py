"""The benchmark's regimes of bad clients (``--bad-kind``, ``--extra-bad-kind``, ``--mavericks``):
each kind is its public client behaviour at its strength, mavericks hold their class alone, the
paired test subtracts random seed by seed; a real run of a mixed federation is test_noisy_federation.py's
(``tiny.TINY``), and under ``-m slow`` every kind runs and audits intact."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest

import clients
from fedvalue.audit.checks import audit_run
from simulations.experiments.noisy_federation.cells import plan
from simulations.experiments.noisy_federation.config import (
    BAD_KINDS,
    KINDS_WITH_STRENGTH,
    NoisyFederationConfig,
    check_config,
)
from simulations.experiments.noisy_federation.data import (
    CONFUSED_PAIRS,
    bad_behaviour,
    behaviour_of,
    data_key,
    data_settings,
    federation,
)
from simulations.experiments.noisy_federation.measures import paired_differences
from simulations.experiments.noisy_federation.noisy_federation import (
    audit_from_run,
    run_benchmark,
)
from tests.simulations.experiments.noisy_federation.tiny import PLAIN

KIND_TYPES = {"label-flip": clients.LabelNoise, "class-swap": clients.ClassPairSwap,
              "feature-noise": clients.FeatureNoise, "free-rider": clients.FreeRider,
              "noisy-free-rider": clients.FreeRider, "stale-replayer": clients.StaleReplayer,
              "sign-flip": clients.SignFlip, "boosted-update": clients.BoostedUpdate,
              "noisy-update": clients.NoisyUpdate}


def test_every_bad_kind_is_a_public_client_behaviour_at_its_strength():
    assert set(KIND_TYPES) == set(BAD_KINDS) - {"none"}
    for kind, kind_type in KIND_TYPES.items():
        behaviour = bad_behaviour(kind, 0.5, seed=[0, 1])
        assert type(behaviour) is kind_type, kind
        if kind in KINDS_WITH_STRENGTH:
            assert behaviour.p == 0.5, kind
    assert bad_behaviour("class-swap", 1.0, seed=[0, 1]).pairs == tuple(sorted(CONFUSED_PAIRS))
    assert bad_behaviour("noisy-free-rider", 1.0, seed=[0, 1]).noise_std > 0
    with pytest.raises(ValueError, match="bad_kind"):
        bad_behaviour("none", 1.0, seed=[0, 1])


def test_the_bad_kind_plays_the_noisy_share_and_none_leaves_every_client_honest():
    config = dataclasses.replace(PLAIN, bad_kind="sign-flip", extra_bad_kind="noisy-update", extra_bad_fraction=0.25)
    fed = federation(data_settings(config))
    key = json.loads(data_key(0, 1.0))
    assert len(fed.noisy) == 4 and len(fed.extra_bad) == 2 and not fed.noisy & fed.extra_bad
    assert {type(behaviour_of(c, fed, key)) for c in fed.noisy} == {clients.SignFlip}
    assert {type(behaviour_of(c, fed, key)) for c in fed.extra_bad} == {clients.NoisyUpdate}
    assert {type(behaviour_of(c, fed, key)) for c in fed.clean} == {clients.HonestClient}
    honest = federation(data_settings(dataclasses.replace(PLAIN, bad_kind="none")))
    assert not honest.bad and len(honest.clean) == PLAIN.num_clients
    default = federation(data_settings(PLAIN))  # the same partitions and flippers whatever the kind
    assert fed.noisy == default.noisy and all(np.array_equal(a, b) for a, b in zip(fed.partitions, default.partitions))


def test_a_maverick_holds_every_example_of_its_class_and_no_one_else_holds_any():
    config = dataclasses.replace(PLAIN, num_clients=20, mavericks=2)
    fed, before = federation(data_settings(config)), federation(data_settings(dataclasses.replace(config, mavericks=0)))
    assert len(fed.mavericks) == 2 and not {c for _, c in fed.mavericks} & fed.bad
    labels = fed.pool.y
    assert np.array_equal(np.sort(np.concatenate(fed.partitions)), np.arange(len(labels)))  # still a partition
    for cls, holder in fed.mavericks:
        holding = [c for c, rows in enumerate(fed.partitions) if (labels[rows] == cls).any()]
        assert holding == [holder]
        assert (labels[fed.partitions[holder]] == cls).sum() == (labels == cls).sum()
    moved = [cls for cls, _ in fed.mavericks]
    for c, (rows, old) in enumerate(zip(fed.partitions, before.partitions)):  # the other examples stay where they were
        assert np.array_equal(rows[~np.isin(labels[rows], moved)], old[~np.isin(labels[old], moved)]), c


@pytest.mark.parametrize("change, match", [
    ({"bad_kind": "gremlin"}, "bad_kind: expected one of"),
    ({"extra_bad_kind": "none-such", "extra_bad_fraction": 0.1}, "extra_bad_kind: expected one of"),
    ({"bad_kind": "free-rider", "flip_probabilities": (1.0, 0.5)}, "flip_probabilities: the bad kind 'free-rider'"),
    ({"mavericks": 10}, "mavericks: expected at most 9"),
    ({"mavericks": -1}, "mavericks"),
    ({"mavericks": True}, "mavericks"),
])
def test_bad_regime_settings_name_the_field(change, match):
    with pytest.raises(ValueError, match=match):
        check_config(dataclasses.replace(PLAIN, **change))


def test_only_runs_whose_clients_remember_name_the_policy_in_their_data_key():
    remembering = dataclasses.replace(PLAIN, bad_kind="stale-replayer")
    keys = {c.policy: json.loads(c.data_key) for c in plan(remembering)}
    assert keys["random"]["run"] == "random" and keys["value-ucb"]["run"] == "value-ucb" and "run" not in keys["clean"]
    assert all("run" not in json.loads(c.data_key) for c in plan(PLAIN))


def test_the_paired_test_subtracts_random_seed_by_seed_and_censors_unreached_targets():
    rows = []
    for seed, (mine, theirs, r_mine, r_theirs) in enumerate([(0.8, 0.7, 3, 5), (0.6, 0.65, np.nan, 4), (0.9, 0.8, 2, 2)]):
        for policy, acc, rounds in (("value-ucb", mine, r_mine), ("random", theirs, r_theirs)):
            rows.append({"model": "mlp", "federation": "p1", "policy": policy, "seed": seed, "final_accuracy": acc,
                         "auc": acc, "rounds_to_95": rounds, "steady_seconds_to_95": rounds * 2.0})
    paired = paired_differences(pd.DataFrame(rows), rounds=10).iloc[0]
    assert paired["final_accuracy_diff"] == pytest.approx(np.mean([0.1, -0.05, 0.1]))
    assert paired["rounds_to_95_diff"] == pytest.approx(np.mean([-2, 11 - 4, 0]))  # never reached: T + 1
    assert (paired["final_accuracy_diff_above"], paired["final_accuracy_diff_below"]) == (2, 1)
    assert (paired["rounds_to_95_diff_above"], paired["rounds_to_95_diff_below"]) == (1, 1)  # and one seed equal
    assert paired["seconds_ratio"] == pytest.approx(np.mean([0.6, 1.0])) and paired["seconds_ratio_n"] == 2
    from scipy.stats import t
    diffs = np.array([0.1, -0.05, 0.1])
    assert paired["final_accuracy_diff_ci"] == pytest.approx(t.ppf(0.975, 2) * diffs.std(ddof=1) / np.sqrt(3))


@pytest.mark.slow  # the fast sibling: test_noisy_federation.py's mixed federation (stale replayers, noisy updates, a maverick)
@pytest.mark.parametrize("kind", [k for k in BAD_KINDS if k not in ("stale-replayer", "noisy-update")])
def test_every_bad_kind_runs_and_audits_intact(kind, tmp_path):
    config = dataclasses.replace(PLAIN, policies=("random", "value-ucb"), bad_kind=kind)
    tables = run_benchmark(config, tmp_path)
    assert len(tables["per_cell"]) == len(plan(config))
    for cell in plan(config):
        run_dir = cell.directory(tmp_path) / "run"
        report = audit_run(run_dir, **audit_from_run(json.loads((run_dir / "run.json").read_text())))
        assert report.intact, (kind, cell, report.problems, report.unverifiable)


def test_the_full_configuration_matches_the_public_benchmarks_protocol_and_the_documented_options():
    """--full --regimes matched-0.7 is 100 clients, 10 a round, 40% flipping labels at p = 0.7, 120 rounds; and it
    is the configuration the documented options of ``fedvalue run noisy-federation`` give, so a run begun from the
    command line continues under the bench (the benchmark compares every setting it may not change)."""
    from bench.regimes.study import regime_config
    from simulations.experiments.noisy_federation.noisy_federation import ADJUSTABLE

    policies = ("random", "value-guard")
    config = regime_config("matched-0.7", seed=1, seeds=2, policies=policies, quick=False, full=True)
    assert (config.num_clients, config.clients_per_round, config.noisy_fraction, config.flip_probabilities,
            config.rounds, config.bad_kind) == (100, 10, 0.4, (0.7,), 120, "label-flip")
    documented = NoisyFederationConfig(seed=1, seeds=2, policies=policies, flip_probabilities=(0.7,),
                                       noisy_fraction=0.4, rounds=120, final_window=10, validation_examples=2000,
                                       valuation_budget=200)
    fixed = lambda c: {k: v for k, v in c.as_dict().items() if k not in ADJUSTABLE}  # noqa: E731
    assert fixed(config) == fixed(documented)
    assert fixed(regime_config("label-flip-1.0", seed=1, seeds=2, policies=policies, quick=False)) != fixed(config)
