"""Numerics no reply can poison: a basis state whose products overflow leaves the fast path's
coalitions without it as the plain path scores them, the audit cross-checks a sample of
coalitions on the plain path, and a reply that makes the round's utility non-finite is
rejected, the round valued without it."""

from __future__ import annotations

import numpy as np
import pytest

from fedvalue.audit.round import plain_path_problems
from fedvalue.run.archive import RoundRecord
from fedvalue.schema import ClientEntry
from fedvalue.scoring.torch_utilities import TorchModelUtility
from fedvalue.valuation.game import CoalitionGame
from fedvalue.valuation.round_game import fedavg_round_game, round_game_for, value_round, weighted_mean
from fedvalue.run.settings import RoundSettings
from simulations.datasets.models import make_mlp
from strategies.replies import ClientReply
from strategies.intake.screening import value_screened

CLIENTS, WEIGHTS = [0, 1, 2, 3], [10.0, 20.0, 30.0, 15.0]
POISONED = 2


def setup(metric: str = "accuracy", fill: float = 3e38):
    """A round of four clients, client 2's arrays all ``fill`` (finite in float32, but its products are not)."""
    model = make_mlp(5, 3, hidden=(16, 8), seed=0)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(400, 5)).astype(np.float32)
    utility = TorchModelUtility(model, x, rng.integers(0, 3, size=400), metric=metric, batch_size=128)
    start = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    replies = [{k: (v + rng.normal(scale=0.4, size=v.shape)).astype(np.float32) for k, v in start.items()}
               for _ in CLIENTS]
    replies[POISONED] = {k: np.full_like(v, fill) for k, v in start.items()}
    return utility, start, replies


def plain(utility, replies, coalition) -> float:
    with np.errstate(all="ignore"):
        return utility(weighted_mean([replies[c] for c in coalition], [WEIGHTS[c] for c in coalition]))


def test_an_overflowing_client_spoils_no_coalition_on_the_fast_path():
    utility, start, replies = setup()
    game = fedavg_round_game(CLIENTS, start, replies, WEIGHTS, utility)
    values = game.values(list(range(1, 2 ** len(CLIENTS))))
    coalitions = [[c for c in CLIENTS if mask >> c & 1] for mask in range(1, 2 ** len(CLIENTS))]
    # Every coalition is U of its own weighted mean, with the poisoned client or without it.
    assert list(values) == [plain(utility, replies, c) for c in coalitions]
    without = [v for v, c in zip(values, coalitions) if POISONED not in c]
    assert len(set(without)) > 1  # the coalitions without it differ, as they do in a round without it


def test_losses_of_the_coalitions_without_an_overflowing_client_are_the_plain_paths():
    utility, start, replies = setup("neg_loss")  # its first-layer outputs overflow: 0 x inf in every row
    coalitions = [[c for c in CLIENTS if mask >> c & 1] for mask in range(1, 2 ** len(CLIENTS))]
    rows = np.zeros((len(coalitions), 1 + len(CLIENTS)))
    for row, members in zip(rows, coalitions):
        row[[1 + c for c in members]] = [WEIGHTS[c] for c in members]
    rows /= rows.sum(axis=1, keepdims=True)
    scorer = utility.linear([start, *replies])  # one batch of every coalition, as exact ADS asks for them
    values = scorer.values(rows, materialize=lambda k: weighted_mean([replies[c] for c in coalitions[k]],
                                                                     [WEIGHTS[c] for c in coalitions[k]]))
    for members, value in zip(coalitions, values):
        if POISONED not in members:
            assert np.isfinite(value) and value == pytest.approx(plain(utility, replies, members), rel=1e-5)


def record_of(start, replies) -> RoundRecord:
    return RoundRecord(round=3, start_arrays=start, entries=[ClientEntry(c, "ok", WEIGHTS[c], int(WEIGHTS[c]))
                                                             for c in CLIENTS],
                       replies=dict(zip(CLIENTS, replies)), accepted=list(CLIENTS), settings=RoundSettings(seed=0))


def test_the_audit_finds_a_coalition_the_fast_path_scored_wrongly():
    utility, start, replies = setup(fill=0.1)
    record = record_of(start, replies)
    honest_game = fedavg_round_game(CLIENTS, start, replies, WEIGHTS, utility)
    honest_game.values(list(range(2 ** len(CLIENTS))))
    assert plain_path_problems(record, honest_game, CLIENTS, utility) == []

    def off_by_one_example(coalitions):  # a fast path that miscounts: the fault only a broken path makes
        return [utility(start) if not c else plain(utility, replies, sorted(c)) + (len(c) < len(CLIENTS)) / 400
                for c in coalitions]

    broken = CoalitionGame(None, CLIENTS, batch_utility=off_by_one_example)
    broken.values(list(range(2 ** len(CLIENTS))))
    problems = plain_path_problems(record, broken, CLIENTS, utility)
    assert len(problems) == 4 and all("on the plain path (U of its weighted mean)" in p for p in problems)


def test_a_reply_whose_inclusion_makes_the_utility_non_finite_is_rejected_and_the_round_valued_without_it():
    utility, start, replies = setup("neg_loss", fill=1e15)  # aggregable (its sum of squares holds); its logits overflow
    records = [ClientReply(c, 100 + c, "ok", arrays=replies[c], weight=WEIGHTS[c]) for c in CLIENTS]

    def value(ok):
        game = round_game_for([r.client_id for r in ok], start, [r.arrays for r in ok], [r.weight for r in ok], utility)
        return value_round(game, ("ads", "loo"), seed=0)

    valuation = value_screened(lambda: value([r for r in records if r.status == "ok"]), records, utility, start)
    assert [r.status for r in records] == ["ok", "ok", "rejected", "ok"]
    assert records[POISONED].error.startswith("arrays: its inclusion makes the round's utility non-finite")
    without = value([r for r in records if r.client_id != POISONED])
    for method in ("ads", "loo"):
        assert valuation.results[method].values.to_dict() == without.results[method].values.to_dict()
