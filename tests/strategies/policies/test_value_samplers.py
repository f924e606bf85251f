"""GreedyFed and the value-elimination sampler on hand-built ledger rows: their rules, worked by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedvalue.analysis.flagging import FlaggingRule
from fedvalue.schema import LedgerRow, Status
from strategies import GreedyFedSampler, ValueEliminationSampler


def rows(server_round: int, values: dict, method: str = "ads", failed: tuple = ()) -> list[LedgerRow]:
    booked = [LedgerRow(server_round, c, method, v, 0.0, 10, Status.OK, None, None) for c, v in values.items()]
    return booked + [LedgerRow(server_round, c, method, None, None, None, Status.FAILED, None, "crashed")
                     for c in failed]


def test_greedyfed_goes_round_robin_through_every_client_then_takes_the_top_means():
    sampler = GreedyFedSampler(3, seed=2)
    ids = list(range(10))
    assert sampler.warm_start_rounds(10) == 4
    warm = [sampler.sample(t, ids) for t in range(1, 5)]
    assert len({c for chosen in warm[:3] for c in chosen}) == 9  # three disjoint blocks of a permutation,
    assert {c for chosen in warm for c in chosen} == set(ids)       # then the last one wraps round
    assert warm == [GreedyFedSampler(3, seed=2).sample(t, ids) for t in range(1, 5)]
    values = {c: 0.1 * c for c in ids}
    values[9] = -1.0
    sampler.observe(rows(1, values))
    assert sampler.sample(5, ids) == [6, 7, 8]
    sampler.observe(rows(5, {8: -0.5, 7: 0.7, 6: 0.6}))  # 8's mean (0.8 - 0.5) / 2 = 0.15; 7: 0.7; 6: 0.6
    assert sampler.estimates[8] == pytest.approx(0.15) and sampler.counts[8] == 2
    assert sampler.sample(6, ids) == [5, 6, 7]


def test_greedyfed_with_memory_keeps_an_exponential_average_and_tries_unvalued_clients_first():
    sampler = GreedyFedSampler(2, memory=0.25)
    sampler.observe(rows(1, {0: 1.0, 1: 0.5}, failed=(2,)))
    sampler.observe(rows(2, {0: -1.0}))
    assert sampler.estimates[0] == pytest.approx(0.25 * 1.0 + 0.75 * -1.0)
    assert 2 not in sampler.estimates
    assert sampler.sample(3, [0, 1, 2]) == [1, 2]  # round 3 is past ⌈3/2⌉ = 2: greedy, the unvalued first
    sampler.observe(rows(3, {1: 0.0}, method="loo"))  # another method's rows are not this sampler's
    assert sampler.counts == {0: 2, 1: 1}


def test_value_elimination_rules_out_a_client_once_its_upper_bound_is_negative():
    sampler = ValueEliminationSampler(2, confidence=0.5, seed=1)
    sampler.observe(rows(1, {0: 0.02, 1: -0.04, 2: 0.01, 3: -0.01}))  # scale 0.04: r = 0.5, -1, 0.25, -0.25
    assert sampler.upper_bound(1) == pytest.approx(-1 + 0.5) and sampler.upper_bound(3) == pytest.approx(0.25)
    assert sampler.upper_bound(7) == math.inf
    assert sampler.eliminated == {1}
    sampler.observe(rows(2, {3: -0.3, 0: 0.3}))  # 3: mean (-0.25 - 1) / 2 + 0.5 / √2 < 0
    assert sampler.eliminated == {1, 3}
    for t in range(3, 40):
        chosen = sampler.sample(t, range(6))
        assert len(chosen) == 2 and not set(chosen) & {1, 3}
    draws = {tuple(sampler.sample(t, range(6))) for t in range(3, 200)}
    assert {c for d in draws for c in d} == {0, 2, 4, 5}  # uniform among the rest: every one is drawn


def test_value_elimination_fills_a_round_with_the_least_harmful_ruled_out_clients():
    sampler = ValueEliminationSampler(3, confidence=0.1, seed=0)
    sampler.observe(rows(1, {0: -1.0, 1: -0.5, 2: 0.2, 3: -0.9}))
    assert sampler.eliminated == {0, 1, 3}
    assert sampler.sample(2, range(4)) == [1, 2, 3]  # 2 allowed; then 1 (ub -0.4), 3 (ub -0.8)


def test_value_elimination_waits_min_rounds_and_honours_a_flagging_rule():
    flagging = FlaggingRule("ads", kind="threshold", threshold=0.0, patience=1)
    sampler = ValueEliminationSampler(2, confidence=0.1, min_rounds=2, flagging=flagging)
    sampler.observe(rows(1, {0: -1.0, 1: 0.5, 2: 0.4}))
    assert sampler.eliminated == frozenset() and sampler.flagged == {0}  # flagged by the rule, not yet by values
    sampler.observe(rows(2, {0: -1.0, 1: 0.5}))
    assert sampler.eliminated == {0}
    sampler.observe(rows(3, {}, failed=(1,)))  # a round without valued rows changes nothing
    assert sampler.flagged == {0} and sampler.counts == {0: 2, 1: 2, 2: 1}


def test_the_same_seed_and_values_give_the_same_draws():
    def draws(seed):
        sampler = ValueEliminationSampler(3, seed=seed)
        sampler.observe(rows(1, {c: float(np.sin(c)) for c in range(10)}))
        return [sampler.sample(t, range(10)) for t in range(2, 12)]
    assert draws(4) == draws(4) and draws(4) != draws(5)


@pytest.mark.parametrize("make, match", [
    (lambda: ValueEliminationSampler(2, confidence=0.0), "confidence"),
    (lambda: ValueEliminationSampler(2, method="tracin_outflow"), "method: expected 'ads' or 'loo'"),
    (lambda: ValueEliminationSampler(2, min_rounds=0), "min_rounds"),
    (lambda: ValueEliminationSampler(2, flagging="z"), "flagging: expected a fedvalue.analysis.flagging.FlaggingRule"),
    (lambda: GreedyFedSampler(2, memory=1.0), "memory"),
    (lambda: GreedyFedSampler(0), "clients_per_round"),
])
def test_bad_settings_name_the_parameter(make, match):
    with pytest.raises((ValueError, TypeError), match=match):
        make()


def test_a_round_larger_than_the_clients_is_refused():
    with pytest.raises(ValueError, match="clients_per_round: expected at most the 2 available clients"):
        ValueEliminationSampler(3).sample(1, [0, 1])
    with pytest.raises(ValueError, match="clients_per_round: expected at most the 2 available clients"):
        GreedyFedSampler(3).sample(1, [0, 1])


def test_value_elimination_with_a_warm_start_values_every_client_once_first():
    sampler = ValueEliminationSampler(3, warm_start=True, seed=2)
    warm = [sampler.sample(t, range(10)) for t in range(1, 5)]
    assert warm == [GreedyFedSampler(3, seed=2).sample(t, range(10)) for t in range(1, 5)]  # GreedyFed's order
    sampler.observe(rows(1, {c: (-1.0 if c < 5 else 1.0) for c in range(10)}))
    assert sampler.eliminated == {0, 1, 2, 3, 4}
    assert not {c for t in range(5, 30) for c in sampler.sample(t, range(10))} & {0, 1, 2, 3, 4}
    with pytest.raises(TypeError, match="warm_start: expected True or False"):
        ValueEliminationSampler(3, warm_start=1)


def test_value_elimination_by_ucb_tries_every_client_then_trains_the_largest_upper_bounds():
    sampler = ValueEliminationSampler(2, confidence=0.5, selection="ucb", seed=3)
    first = sampler.sample(1, range(4))
    sampler.observe(rows(1, {first[0]: 0.5, first[1]: -1.0}))  # r = 0.5 and -1: the second is ruled out
    second = sampler.sample(2, range(4))
    assert set(second) == set(range(4)) - set(first)  # never valued: +inf, tried first
    sampler.observe(rows(2, {second[0]: 1.0, second[1]: 0.2}))  # r = 1 and 0.2
    assert sampler.upper_bound(second[0]) == pytest.approx(1.5) and sampler.upper_bound(first[0]) == pytest.approx(1.0)
    assert sampler.sample(3, range(4)) == sorted([second[0], first[0]])  # 1.5 and 1.0 beat 0.7; -0.5 is out
    with pytest.raises(ValueError, match="selection: expected one of"):
        ValueEliminationSampler(2, selection="greedy")


@pytest.mark.parametrize("selection", ["uniform", "ucb"])
def test_exploration_trains_a_ruled_out_client_at_exactly_its_stated_rate(selection):
    """With ε M = e exploration slots, a ruled-out client is not among the rule's M − e picks, so it is
    drawn with probability e / (N − M + e) in every round: the frequency over many rounds matches that
    rate within a binomial 4-sigma band, and the rule's own picks never include it."""
    n, m, explore = 20, 5, 0.4  # e = 2 slots
    sampler = ValueEliminationSampler(m, confidence=0.1, selection=selection, explore=explore, seed=6)
    sampler.observe(rows(1, {c: (-1.0 if c < 4 else 0.5) for c in range(n)}))
    assert sampler.eliminated == {0, 1, 2, 3}
    rounds = range(2, 3002)
    draws = [sampler.sample(t, range(n)) for t in rounds]
    assert all(len(d) == m == len(set(d)) for d in draws)
    assert all(len(sampler.explored[t]) == 2 and sampler.explored[t] <= set(d) for t, d in zip(rounds, draws))
    assert all(not (set(d) - sampler.explored[t]) & {0, 1, 2, 3} for t, d in zip(rounds, draws))  # rule's picks
    rate, trials = 2 / (n - m + 2), len(draws)
    for client in range(4):
        seen = sum(client in d for d in draws)
        assert abs(seen / trials - rate) <= 4 * math.sqrt(rate * (1 - rate) / trials), (client, seen / trials, rate)


def test_without_exploration_the_draws_are_the_rules_alone():
    """explore=0 draws exactly what the sampler drew before it had the option (no stream is consumed)."""
    def draws(**kw):
        sampler = ValueEliminationSampler(3, selection="ucb", seed=9, **kw)
        out = []
        for t in range(1, 25):
            chosen = sampler.sample(t, range(12))
            sampler.observe(rows(t, {c: float(np.cos(3 * c + t)) for c in chosen}))
            out.append(chosen)
        return out, sampler
    (bare, _), (zero, zero_sampler), (explored, explored_sampler) = draws(), draws(explore=0.0), draws(explore=0.34)
    assert bare == zero and zero_sampler.explored == {} and "explore" not in repr(zero_sampler)
    assert explored != bare and all(len(e) == 1 for e in explored_sampler.explored.values())  # round(0.34 * 3) = 1
    assert "explore=0.34" in repr(explored_sampler)
    with pytest.raises(ValueError, match=r"explore: expected a number in \[0, 1\); got 1.0"):
        ValueEliminationSampler(3, explore=1.0)


def test_every_shipped_sampler_is_a_sampler_that_simulate_and_the_strategy_take():
    """simulate(sampler=) and ValuingStrategy(sampler=) are typed by the Sampler protocol: each shipped sampler
    has what the strategy reads of it (clients_per_round, sample), and a value-driven one also observes."""
    from strategies import (GreedyFedSampler, PartitionSampler, ReplaySampler, Sampler, ValueEliminationSampler,
                            ValueWeightedSampler)
    from strategies.policies.sampling import LearningSampler

    samplers = [PartitionSampler(3, seed=0), ValueWeightedSampler(3, seed=0), GreedyFedSampler(3, seed=0),
                ValueEliminationSampler(3, seed=0), ReplaySampler({1: [0, 1, 2]})]
    assert all(isinstance(s, Sampler) and s.clients_per_round == 3 for s in samplers)
    assert [isinstance(s, LearningSampler) for s in samplers] == [False, True, True, True, False]
    assert all(len(s.sample(1, list(range(6)))) == 3 for s in samplers)
