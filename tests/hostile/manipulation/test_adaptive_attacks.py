"""The adaptive attacks (clients.attacks.adaptive) sit where they say, by each defence's own measure:
on a real torch model trained by the client code (no Flower, no Ray), every produced update lies at
(1 + margin) × its defence's threshold, the defence's own function does not fire for margin > 0 and
fires for a negative margin (a control inside the threshold); the same seed gives the same reply and
every claim is true. Then the study's plan: names, margins and bad input, before Ray starts."""

from __future__ import annotations

import json
from itertools import combinations

import numpy as np
import pytest
from flwr.app import RecordDict

from clients.attacks import (
    AdaptiveCraftedUpdate,
    AdaptiveReplayer,
    AdaptiveReplica,
    AdaptiveShard,
    overlapping_shard_indices,
    shard_indices,
)
from clients.behaviours import HonestClient
from fedvalue.rounds.defences.clusters import near_duplicate_clusters
from fedvalue.rounds.defences.free_riders import REPLAY, free_rider_flags, off_line_share
from fedvalue.rounds.defences.quotient import _clip_factors
from fedvalue.rounds.defences.random_order import exact_random_order_values
from fedvalue.rounds.defences.settings import DUPLICATE_TOLERANCE, REPLAY_TOLERANCE, DefenceSettings
from fedvalue.valuation.game import CoalitionGame
from tests.hostile.manipulation.test_attack_behaviours import A1, A2, FACTORY, X, flat, reply

#: float32 replies: a statistic of the update is its float64 design to about this relative error.
ROUNDING = 1e-4


def _replicas(identities: int, margin: float, *, secret: int = 7, server_round: int = 2):
    replies = [reply(AdaptiveReplica(j, identities, margin=margin, secret=secret), A1, partition=j,
                     server_round=server_round) for j in range(identities)]
    return [flat(arrays, A1) for arrays, _ in replies], [count for _, count in replies]


@pytest.mark.parametrize("identities", [2, 4])
@pytest.mark.parametrize("margin", [0.05, 0.5])
def test_replicas_sit_at_one_plus_margin_times_the_clustering_threshold_and_stay_unclustered(identities, margin):
    updates, counts = _replicas(identities, margin)
    honest, honest_count = reply(HonestClient(), A1)
    assert counts == [honest_count] * identities  # each claims the participant's full size: true, it holds it all
    for a, b in combinations(updates, 2):
        ratio = np.linalg.norm(a - b) / min(np.linalg.norm(a), np.linalg.norm(b))
        assert ratio == pytest.approx((1 + margin) * DUPLICATE_TOLERANCE, rel=ROUNDING)
    np.testing.assert_allclose(np.mean(updates, axis=0), flat(honest, A1), rtol=0, atol=1e-6)  # their mean is Δ
    clusters = near_duplicate_clusters(dict(enumerate(updates)), DefenceSettings().duplicate_tolerance)
    assert clusters == [(j,) for j in range(identities)]  # the defence's own clustering links none


def test_replicas_inside_the_threshold_are_one_cluster_and_the_same_secret_gives_the_same_replies():
    inside, _ = _replicas(3, -0.2)
    assert near_duplicate_clusters(dict(enumerate(inside)), DUPLICATE_TOLERANCE) == [(0, 1, 2)]
    again, _ = _replicas(3, 0.2)
    assert all(np.array_equal(a, b) for a, b in zip(again, _replicas(3, 0.2)[0]))
    other_secret, _ = _replicas(3, 0.2, secret=8)
    other_round, _ = _replicas(3, 0.2, server_round=3)
    assert not np.allclose(other_secret[0], again[0]) and not np.allclose(other_round[0], again[0])
    with pytest.raises(ValueError, match=r"margin: expected a number > -1|margin: expected a finite number > -1"):
        AdaptiveReplica(0, 2, margin=-1.0)
    with pytest.raises(ValueError, match="identity: expected an identity in"):
        AdaptiveReplica(2, 2, margin=0.1)


def _replayed(margin: float, *, seed: int = 3):
    state = RecordDict()
    first, _ = reply(AdaptiveReplayer(margin, seed=seed), A1, state=state, server_round=1)
    second, count = reply(AdaptiveReplayer(margin, seed=seed), A2, state=state, server_round=2)
    return first, flat(second, A2), count


@pytest.mark.parametrize("margin", [0.05, 0.2, 1.0])
def test_the_replayer_sits_at_one_plus_margin_times_the_replay_threshold_and_is_not_flagged(margin):
    first, update, count = _replayed(margin)
    honest, honest_count = reply(HonestClient(), A1)
    assert all(np.array_equal(first[k], honest[k]) for k in A1)  # no step to replay in its first round: trained
    step = flat(A2, A1)
    assert count == honest_count
    assert off_line_share(update, step) == pytest.approx((1 + margin) * REPLAY_TOLERANCE, rel=ROUNDING)
    assert np.linalg.norm(update) == pytest.approx(np.linalg.norm(step), rel=ROUNDING)  # the step, turned
    settings = DefenceSettings()
    flags = free_rider_flags({"replayer": update}, {"replayer": count}, step, zero_tolerance=settings.zero_tolerance,
                             replay_tolerance=settings.replay_tolerance,
                             collusion_tolerance=settings.collusion_tolerance)
    assert flags == {}


def test_a_replayer_inside_the_threshold_is_flagged_and_its_seed_fixes_its_turn():
    _, inside, count = _replayed(-0.2)
    flags = free_rider_flags({"replayer": inside}, {"replayer": count}, flat(A2, A1), zero_tolerance=None,
                             replay_tolerance=REPLAY_TOLERANCE, collusion_tolerance=None)
    assert flags["replayer"].test == REPLAY
    assert np.array_equal(_replayed(0.2)[1], _replayed(0.2)[1])
    assert not np.allclose(_replayed(0.2)[1], _replayed(0.2, seed=4)[1])
    with pytest.raises(ValueError, match="margin: expected at most 1/ρ − 1 = 19"):
        AdaptiveReplayer(19.5)


def test_overlapping_shards_with_margin_0_are_the_plain_split():
    for shard in range(3):
        np.testing.assert_array_equal(overlapping_shard_indices(40, shard, 3, 0.0, seed=5),
                                      shard_indices(40, shard, 3, seed=5))


@pytest.mark.parametrize("margin", [0.25, 0.5, 1.0])
def test_split_identities_claim_each_its_true_share_and_the_claims_add_up_to_one_plus_margin(margin):
    rows = [overlapping_shard_indices(len(X), j, 3, margin, seed=5) for j in range(3)]
    sizes = [len(part) for part in np.array_split(np.arange(len(X)), 3)]
    assert [len(r) for r in rows] == [round((1 + margin) * n) for n in sizes]
    assert sum(len(r) for r in rows) == pytest.approx((1 + margin) * len(X), abs=3)  # each shard rounds once
    assert all(len(np.unique(r)) == len(r) for r in rows)  # a shard holds each of its rows once
    assert set(np.concatenate(rows).tolist()) == set(range(len(X)))  # every row in one shard at least
    claims = [reply(AdaptiveShard(j, 3, margin=margin, seed=5), A1, partition=j + 1)[1] for j in range(3)]
    assert claims == [len(r) for r in rows]  # each claim is the examples it trained on: true
    assert claims == [reply(AdaptiveShard(j, 3, margin=margin, seed=5), A1, partition=j + 1)[1] for j in range(3)]


@pytest.mark.parametrize("margin", [0.0, 0.5, 1.0])
def test_arrivals_by_size_give_the_split_its_whole_share_only_at_margin_0(margin):
    """The defence's own random-order values, on the round where any non-empty coalition is worth 1
    (interchangeable updates): whole, the participant (n = 40) earns n / (n + n_B) against B; split
    into identities whose true claims add up to (1 + margin) n, it earns Λ / (Λ + n_B), Λ their sum."""
    claims = [len(overlapping_shard_indices(40, j, 3, margin, seed=5)) for j in range(3)]
    split = CoalitionGame(lambda s: float(bool(s)), ["s0", "s1", "s2", "B"])
    shares = exact_random_order_values(split, ["s0", "s1", "s2", "B"], [*claims, 40])
    whole = CoalitionGame(lambda s: float(bool(s)), ["A", "B"])
    alone = exact_random_order_values(whole, ["A", "B"], [40, 40])[0]
    assert sum(shares[:3]) == pytest.approx(sum(claims) / (sum(claims) + 40), abs=1e-12)
    if margin == 0:
        assert sum(shares[:3]) == pytest.approx(alone, abs=1e-12)  # the defence cancels the split
    else:
        assert sum(shares[:3]) > alone + 0.05  # past it: more arrivals than whole


def _crafted(norm_cap: float, margin: float):
    state = RecordDict()
    attacker = lambda: AdaptiveCraftedUpdate(FACTORY, others=3, norm_cap=norm_cap, margin=margin,  # noqa: E731
                                             budget=0.5, steps=30)
    reply(attacker(), A1, state=state, server_round=1)
    arrays, count = reply(attacker(), A2, state=state, server_round=2)
    return flat(arrays, A2), count


@pytest.mark.parametrize("margin", [0.05, 0.3])
def test_the_crafted_update_sits_at_the_norm_cap_over_one_plus_margin_and_is_not_clipped(margin):
    crafted, count = _crafted(1.25, margin)
    honest_arrays, honest_count = reply(HonestClient(), A2)
    honest = flat(honest_arrays, A2)
    assert count == honest_count
    assert np.linalg.norm(crafted) == pytest.approx(1.25 * np.linalg.norm(honest) / (1 + margin), rel=ROUNDING)
    assert not np.allclose(crafted / np.linalg.norm(crafted), honest / np.linalg.norm(honest), atol=1e-3)  # crafted
    # A round whose median update norm is the attacker's honest one: the defence's cap clips nothing of it.
    round_updates = {"attacker": crafted, "b": honest, "c": -honest}
    assert _clip_factors(round_updates, ["attacker"], 1.25) == {}
    inside, _ = _crafted(1.25, -0.2)
    factors = _clip_factors({**round_updates, "attacker": inside}, ["attacker"], 1.25)
    assert factors["attacker"] == pytest.approx(0.8, rel=ROUNDING)  # a control inside the cap is clipped
    assert np.array_equal(_crafted(1.25, margin)[0], crafted)  # deterministic


# --- The study's plan: names, margins, bad input (nothing here starts Ray) -----------------------------------


def test_the_plan_reads_adaptive_names_into_identities_margins_and_behaviours():
    from simulations.experiments.attacks.plan import AttackSettings, adaptive_parts, behaviour_of, plan_of

    assert adaptive_parts("adaptive-cluster-4@0.2") == ("adaptive-cluster", 4, 0.2)
    assert adaptive_parts("adaptive-replay@0") == ("adaptive-replay", 1, 0.0)
    assert adaptive_parts("sybil-split-2") is None
    plan = plan_of("adaptive-split-3@0.5", 6, 0, 3)
    assert plan.participants == (0, 1, 2, 3, 4, 5, 6, 7) and plan.identities == (0, 6, 7) and plan.seats == (0,)
    assert plan.kind == "adaptive-split" and plan.margin == 0.5
    settings = AttackSettings(4, 1e-3, 50.0, 5.0, 0.0, 0.3, 1, 0.5, 5, norm_cap=1.25)
    built = {name: behaviour_of(plan_of(name, 6, 0, 3), 0, settings, counts={}, model_factory=FACTORY)
             for name in ("adaptive-cluster-2@0.1", "adaptive-replay@0.1", "adaptive-split-2@0.1",
                          "adaptive-crafted@0.1")}
    assert [type(b) for b in built.values()] == [AdaptiveReplica, AdaptiveReplayer, AdaptiveShard,
                                                 AdaptiveCraftedUpdate]
    assert all(b.margin == 0.1 for b in built.values()) and built["adaptive-crafted@0.1"].norm_cap == 1.25
    assert type(behaviour_of(plan_of("adaptive-replay@0.1", 6, 0, 3), 3, settings, counts={},
                             model_factory=FACTORY)) is HonestClient


def test_adaptive_split_identities_register_and_train_on_their_overlapping_shards():
    from simulations.experiments.attacks.attacks import AttacksConfig
    from simulations.experiments.attacks.study import StudyRun, registered_sizes, study_client_data

    config = AttacksConfig(attacks=("adaptive-split-2@0.5",), num_clients=4)
    from simulations.experiments.attacks.plan import plan_of

    run = StudyRun("iid", "fedavg", 0, plan_of("adaptive-split-2@0.5", 4, 0, 3))
    sizes = registered_sizes(config, run)
    whole = sizes[1]  # an honest client of the same IID share size
    assert sizes[0] + sizes[4] == pytest.approx(1.5 * whole, abs=2)
    for identity in (0, 4):
        data = study_client_data(identity, run.key, config_json=json.dumps(config.as_dict()),
                                 config_type=AttacksConfig)
        x, y = data.behaviour.transform_training_data(data.x_train, data.y_train, np.random.default_rng(0))
        assert len(x) == sizes[identity]  # the claim review's registered size is what it trains on: its claim


@pytest.mark.parametrize(("attack", "said"), [
    ("adaptive-replay@-0.1", "--attacks: adaptive-replay@-0.1: expected a margin M >= 0 after '@'"),
    ("adaptive-replay@x", "--attacks: adaptive-replay@x: expected a margin M >= 0 after '@'"),
    ("adaptive-replay", "--attacks: expected adaptive-cluster-K@M, adaptive-replay@M, adaptive-split-K@M"),
    ("adaptive-cluster-1@0.1", "--attacks: adaptive-cluster-1@0.1: expected K >= 2 identities; got 1."),
    ("adaptive-split-2@1.5", "--attacks: adaptive-split-2@1.5: margin: expected at most K − 1 = 1"),
    ("adaptive-crafted@0.1", "--norm-cap: adaptive-crafted@0.1 stays within the defences' norm cap; expected a cap"),
])
def test_a_bad_adaptive_attack_is_one_line_naming_the_parameter_before_ray_starts(tmp_path, capsys, attack, said):
    from simulations.cli.main import main

    assert main(["run", "attacks", "--attacks", attack, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedvalue: error: ") and said in err and err.count("\n") == 1, err
    assert not (tmp_path / "run").exists()


def test_the_benchmark_sweep_names_every_adaptive_attack_at_every_margin_and_refuses_another_sweeps_part(tmp_path):
    from bench.attack_study import ADAPTIVE, parse_margins, run_sweep, sweep_attacks
    from simulations.experiments.attacks.attacks import AttacksConfig, check

    attacks = sweep_attacks([0.05, 0.5]).split(",")
    assert attacks[0] == "none" and len(attacks) == 1 + 2 * len(ADAPTIVE) and "adaptive-split-4@0.5" in attacks
    check(AttacksConfig(attacks=tuple(attacks), norm_cap=1.25, defences=1))  # the study takes every name
    assert parse_margins("0.05,0.2,0.5") == [0.05, 0.2, 0.5]
    for bad in ("0.1,-0.1", "0.1,0.1", "x", "inf"):
        with pytest.raises(ValueError, match="--margins: expected distinct margins M >= 0"):
            parse_margins(bad)
    held = tmp_path / "iid-fedavg-adaptive"
    held.mkdir()
    (held / "run.json").write_text(json.dumps({"attacks": ["none", "adaptive-replay@0.3"]}))
    with pytest.raises(ValueError, match="holds a sweep of other attacks"):  # before any part runs
        run_sweep(tmp_path, [0.05], [], {"fedavg": 1, "fedmedian": 1})
