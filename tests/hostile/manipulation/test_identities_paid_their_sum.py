"""The proposition of :mod:`simulations.experiments.attacks.rebook`: the fixed-weight round game's second-order
value pays any set of identities what one client replying their summed weighted update is paid, and every other
client what it was paid, whatever the identities' replies are; the round game's own values do not.

On a smooth non-quadratic utility (its gradient and Hessian written out), to float precision against the estimate
of the round in which the identities are one client; on a real softmax regression and Fashion-MNIST images, with
shards that each train one full-batch gradient step (so that their weighted updates add up to the whole's)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedvalue.scoring.torch_utilities import TorchModelUtility
from fedvalue.valuation.round_game import fedavg_round_game, value_round
from fedvalue.valuation.settings import FIXED_WEIGHT, RENORMALIZED, AdsSettings
from simulations.datasets.models import make_linear_model
from simulations.experiments.attacks.study import cached_dataset

SIZE = 8


class LogDistanceUtility:
    """U(x) = −log(1 + ‖x − t‖²) over a flat array ``x``: smooth, not quadratic (its expansion has a remainder).
    ∇U = −2d / (1 + r²), ∇²U = −2I / (1 + r²) + 4 d dᵀ / (1 + r²)², d = x − t, r = ‖d‖."""

    differentiable = True

    def __init__(self, target: np.ndarray) -> None:
        self.target = target

    def __call__(self, arrays) -> float:
        d = arrays["x"] - self.target
        return float(-np.log1p(d @ d))

    def gradient(self, arrays) -> dict:
        d = arrays["x"] - self.target
        return {"x": -2 * d / (1 + d @ d)}

    def hessian_vector_product(self, arrays, vector) -> dict:
        d, v = arrays["x"] - self.target, vector["x"]
        s = 1 + d @ d
        return {"x": -2 * v / s + 4 * d * (d @ v) / s**2}


def values(rule: str, method: str, start, replies, claims, utility) -> np.ndarray:
    game = fedavg_round_game(list(range(len(replies))), start, replies, claims, utility, rule)
    return value_round(game, ("ads",), AdsSettings(method=method), seed=0).results["ads"].values.to_numpy()


def split_round(seed: int, pieces: int):
    """A round of 5 clients; client 0 presented again as ``pieces`` identities (appended) whose claims add up to its
    claim and whose claim-weighted updates add up to its own: arbitrary pieces, the last one solving the sum."""
    rng = np.random.default_rng(seed)
    start = {"x": rng.normal(size=SIZE)}
    steps = [rng.normal(scale=0.6, size=SIZE) for _ in range(5)]
    claims = [float(c) for c in rng.integers(10, 60, size=5)]
    shares = rng.dirichlet(np.ones(pieces)) * claims[0]
    parts = [rng.normal(scale=1.5, size=SIZE) for _ in range(pieces - 1)]
    parts.append((claims[0] * steps[0] - sum(n * d for n, d in zip(shares[:-1], parts))) / shares[-1])
    whole = [{"x": start["x"] + d} for d in steps]
    split = whole[1:] + [{"x": start["x"] + d} for d in parts]
    return rng, start, (whole, claims), (split, claims[1:] + [float(n) for n in shares])


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(2, 5))
def test_any_split_with_the_same_sum_is_paid_what_the_whole_is_and_leaves_the_others_alone(seed, pieces):
    rng, start, (whole, claims), (split, split_claims) = split_round(seed, pieces)
    utility = LogDistanceUtility(rng.normal(size=SIZE))
    alone = values(FIXED_WEIGHT, "second-order", start, whole, claims, utility)
    parts = values(FIXED_WEIGHT, "second-order", start, split, split_claims, utility)
    scale = np.abs(alone).max()
    assert parts[4:].sum() == pytest.approx(alone[0], abs=1e-12 * scale)
    np.testing.assert_allclose(parts[:4], alone[1:], rtol=0, atol=1e-12 * scale)
    first_alone = values(FIXED_WEIGHT, "first-order", start, whole, claims, utility)
    first_parts = values(FIXED_WEIGHT, "first-order", start, split, split_claims, utility)
    assert first_parts[4:].sum() == pytest.approx(first_alone[0], abs=1e-12 * np.abs(first_alone).max())


def test_the_round_games_own_values_pay_a_split_otherwise():
    """Not a property of every value: exact ADS of the fixed-weight game (the expansion's remainder) and of the
    renormalized game (arrivals in pieces) pay the same split something else."""
    for rule, floor in ((FIXED_WEIGHT, 1e-4), (RENORMALIZED, 1e-2)):
        moved = []
        for seed in range(5):
            rng, start, (whole, claims), (split, split_claims) = split_round(seed, 3)
            utility = LogDistanceUtility(rng.normal(size=SIZE))
            alone = values(rule, "exact", start, whole, claims, utility)
            parts = values(rule, "exact", start, split, split_claims, utility)
            moved.append(abs(parts[4:].sum() - alone[0]) / np.abs(alone).max())
        assert max(moved) > floor, (rule, moved)


def test_perturbations_that_cancel_across_identities_are_paid_nothing():
    """K identities replying one update moved apart by perturbations that sum to 0 (the adaptive replicas' simplex):
    together they are paid what one client replying the update with their summed claims is."""
    rng = np.random.default_rng(7)
    start = {"x": rng.normal(size=SIZE)}
    steps = [rng.normal(scale=0.6, size=SIZE) for _ in range(4)]
    claims = [30.0, 20.0, 25.0, 40.0]
    moves = rng.normal(scale=2.0, size=(3, SIZE))
    moves -= moves.mean(axis=0)
    utility = LogDistanceUtility(rng.normal(size=SIZE))
    replicas = [{"x": start["x"] + steps[0] + m} for m in moves]
    others = [{"x": start["x"] + d} for d in steps[1:]]
    together = values(FIXED_WEIGHT, "second-order", start, [*others, *replicas], [*claims[1:], 30.0, 30.0, 30.0],
                      utility)
    inflated = values(FIXED_WEIGHT, "second-order", start, [*others, {"x": start["x"] + steps[0]}],
                      [*claims[1:], 90.0], utility)
    assert together[3:].sum() == pytest.approx(inflated[3], abs=1e-12 * np.abs(inflated).max())
    np.testing.assert_allclose(together[:3], inflated[:3], rtol=0, atol=1e-12 * np.abs(inflated).max())


def one_step(model: torch.nn.Module, x: np.ndarray, y: np.ndarray, rate: float) -> dict:
    """Arrays after one full-batch gradient step of the mean cross-entropy on (x, y) from ``model``'s parameters."""
    trained = make_linear_model(784, 10, seed=0)
    trained.load_state_dict(model.state_dict())
    loss = torch.nn.functional.cross_entropy(trained(torch.as_tensor(x)), torch.as_tensor(y))
    loss.backward()
    with torch.no_grad():
        for parameter in trained.parameters():
            parameter -= rate * parameter.grad
    return {k: v.detach().numpy().copy() for k, v in trained.state_dict().items()}


def test_real_shards_of_one_gradient_step_are_paid_what_the_whole_is():
    data = cached_dataset("fashion-mnist", "test")
    x, y = data.x[:1200].astype(np.float32), data.y[:1200].astype(np.int64)
    model = make_linear_model(784, 10, seed=0)
    start = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    utility = TorchModelUtility(make_linear_model(784, 10, seed=0), x[1000:], y[1000:], metric="neg_loss")
    clients = [slice(0, 240), slice(240, 400), slice(400, 700), slice(700, 1000)]
    whole = [one_step(model, x[rows], y[rows], 0.1) for rows in clients]
    claims = [float(rows.stop - rows.start) for rows in clients]
    shards = [slice(0, 50), slice(50, 170), slice(170, 240)]
    split = whole[1:] + [one_step(model, x[rows], y[rows], 0.1) for rows in shards]
    split_claims = claims[1:] + [float(rows.stop - rows.start) for rows in shards]
    alone = values(FIXED_WEIGHT, "second-order", start, whole, claims, utility)
    parts = values(FIXED_WEIGHT, "second-order", start, split, split_claims, utility)
    # float32 updates: their weighted sums agree to float32 rounding, not to the last bit
    assert parts[3:].sum() == pytest.approx(alone[0], rel=1e-4)
    np.testing.assert_allclose(parts[:3], alone[1:], rtol=1e-4)
    plain_alone = values(RENORMALIZED, "exact", start, whole, claims, utility)
    plain_parts = values(RENORMALIZED, "exact", start, split, split_claims, utility)
    assert abs(plain_parts[3:].sum() - plain_alone[0]) > 0.05 * abs(plain_alone[0])  # the default game's do not


@pytest.fixture(scope="module")
def split_study(tmp_path_factory):
    """A real study on Ray: 3 clients, one split into 2 identities, 2 rounds of one full-batch local epoch, 2 seeds."""
    from simulations.cli.main import main

    out = tmp_path_factory.mktemp("rebook") / "iid-fedavg"
    assert main(["run", "attacks", "--attacks", "none,sybil-split-2", "--dataset", "fashion-mnist", "--num-clients",
                 "3", "--train-examples", "300", "--holdout-examples", "200", "--rounds", "2", "--local-epochs", "1",
                 "--seeds", "2", "--quiet", "--out", str(out)]) == 0
    return out


@pytest.mark.slow
def test_the_study_booked_again_pays_a_split_of_one_step_what_the_whole_earns(split_study, tmp_path, capsys):
    import json

    import pandas as pd

    from bench import attack_study
    from fedvalue.analysis.run_summary import load_run
    from simulations.experiments.attacks.attacks import AttacksConfig
    from simulations.experiments.attacks.plan import plan_of
    from simulations.experiments.attacks.rebook import rebooked_totals
    from simulations.experiments.attacks.study import StudyRun, utility_of
    from simulations.runner import saved_config

    config = saved_config(AttacksConfig, json.loads((split_study / "run.json").read_text()), strict=False)
    for attack in ("none", "sybil-split-2"):
        run = StudyRun("iid", "fedavg", 0, plan_of(attack, 3, config.attacker, config.colluders))
        ledger = load_run(split_study / run.directory).ledger
        booked = ledger[(ledger["method"] == "ads") & (ledger["status"] == "ok")].groupby("client_id")["value"].sum()
        again = rebooked_totals(split_study / run.directory, utility_of(config, run), ("ads",))["ads"]
        assert again == pytest.approx({int(c): v for c, v in booked.items()}, abs=1e-12)
    attack_study.main(["--out", str(split_study.parent), "--rebook", "--results", str(tmp_path)])
    assert "| iid-fedavg | sybil-split-2 | 2 |" in capsys.readouterr().out
    gains = pd.read_csv(tmp_path / "attack_gains_second_order.csv", comment="#").set_index("book")
    assert gains.loc["ads_second_order", "gain"] == pytest.approx(1.0, abs=1e-4)
    assert gains.loc["ads_first_order", "gain"] == pytest.approx(1.0, abs=1e-4)
    assert abs(gains.loc["ads", "gain"] - 1.0) > 1e-3  # the run's own game pays the split otherwise
    cost = pd.read_csv(tmp_path / "attack_honest_cost_second_order.csv", comment="#")
    assert set(cost["book"]) == {"ads_fixed_weight", "ads_first_order", "ads_second_order"}
    tables = attack_study.docs_tables(attack_study.read_results(tmp_path))
    assert tables[0].startswith("| part | attack | seeds | ADS, the run's game |")
