"""The procurement simulation: conjoint generator, stand-in model, study outputs and the CLI."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from simulations.cli.main import main
from simulations.experiments.procurement.conjoint import (
    ALL_PROFILES,
    RatingGenerator,
    average_error,
    centered,
    mixed_ratings,
    part_worths_ols,
    random_profiles,
    validation_profiles,
)
from simulations.experiments.procurement.procurement import ProcurementConfig, build, run_one, run_procurement_study
from simulations.experiments.procurement.model import RatingMLP

#: Small enough for the fast suite: 3 stages of 3 offers, a short initial fit.
TINY = dict(seeds=1, stages=3, initial_epochs=30)


def test_ols_on_noise_free_ratings_recovers_the_part_worths_up_to_one_offset_per_attribute():
    generator = RatingGenerator.draw(4, noise_variance=0.0)
    rng = np.random.default_rng(0)
    for profiles in (ALL_PROFILES, random_profiles(200, rng)):
        ratings = generator.rate(profiles, rng)
        assert np.array_equal(ratings, generator.mean_rating(profiles))  # no noise, nothing clipped (max 95)
        estimated = part_worths_ols(profiles, ratings)
        np.testing.assert_allclose(estimated, centered(generator.part_worths), atol=1e-9)
        assert average_error(estimated, generator.part_worths) < 1e-9
    # The identification: shifting one attribute's part-worths by a constant changes no rating.
    shifted = RatingGenerator(generator.part_worths + np.array([[5.0], [0.0], [-2.0]]), 0.0)
    rated = shifted.mean_rating(ALL_PROFILES) - 3.0
    np.testing.assert_allclose(rated, generator.mean_rating(ALL_PROFILES))
    assert average_error(part_worths_ols(ALL_PROFILES, rated), shifted.part_worths) < 1e-9


def test_rating_noise_has_the_configured_variance_and_ratings_are_clipped():
    generator = RatingGenerator(np.full((3, 4), 15.0), noise_variance=5.0)  # mean 45: far from the clip
    profiles = random_profiles(200_000, np.random.default_rng(1))
    noise = generator.rate(profiles, np.random.default_rng(2)) - 45.0
    assert noise.var() == pytest.approx(5.0, rel=0.02)  # σ² = 5, not σ = 5 (variance 25)
    low = RatingGenerator(np.zeros((3, 4)), noise_variance=5.0).rate(profiles[:1000], np.random.default_rng(3))
    assert low.min() == 0.0 and (low == 0.0).mean() > 0.4


def test_an_offer_holds_exactly_its_share_of_noisy_ratings():
    true = RatingGenerator(np.zeros((3, 4)), 0.0)
    noisy = RatingGenerator(np.full((3, 4), 10.0), 0.0)
    _, ratings = mixed_ratings(true, noisy, 50, 0.3, np.random.default_rng(0))
    assert (ratings == 30.0).sum() == 15 and (ratings == 0.0).sum() == 35


def test_fine_tuning_is_pure_deterministic_and_learns_the_data():
    learner = RatingMLP(epochs=200, learning_rate=0.01, batch_size=0)
    generator = RatingGenerator.draw(0)
    rng = np.random.default_rng(0)
    profiles = random_profiles(300, rng)
    data = (profiles, generator.rate(profiles, rng))
    start = learner.initial_state(1)
    snapshot = {k: v.copy() for k, v in start.items()}
    first, second = learner.fine_tune(start, [data], seed=2), learner.fine_tune(start, [data], seed=2)
    assert all(np.array_equal(start[k], snapshot[k]) for k in start)
    assert all(np.array_equal(first[k], second[k]) for k in first)
    design = validation_profiles(1)
    before = average_error(part_worths_ols(design, learner.predict(start, design)), generator.part_worths)
    after = average_error(part_worths_ols(design, learner.predict(first, design)), generator.part_worths)
    assert after < 1.5 < before


def test_with_one_candidate_per_stage_the_three_rules_give_the_same_trajectory(tmp_path):
    tables = run_procurement_study(ProcurementConfig(**TINY, noise_shares=(0.6,)), tmp_path / "run")
    errors = tables["avgerr"].pivot(index="stage", columns="rule", values="avgerr")
    assert (errors["ads"] == errors["loo"]).all() and (errors["ads"] == errors["random"]).all()
    assert errors["ads"].nunique() == TINY["stages"] + 1  # the model moved every stage
    assert (tables["shares"]["share"] == 1.0).all()


def test_v_of_all_offers_is_the_utility_of_the_model_bought_with_all_offers():
    config = ProcurementConfig(**TINY, budget=3)
    setting = build(config, seed=0)
    run = run_one(config, setting, "ads", None)
    state = setting.initial_state
    for outcome, offers in zip(run.stages, setting.stages):
        assert outcome.purchased == outcome.offers
        assert outcome.utility_realized == outcome.valuation.utility_after
        # Recomputed outside the game: fine-tune the stage's start state on every offer, in stage order.
        seed = _stage_fine_tune_seed(setting, outcome.stage)
        bought = setting.learner.fine_tune(state, [o.data for o in offers], seed=seed)
        assert setting.utility(bought) == outcome.valuation.utility_after
        state = outcome.state


def _stage_fine_tune_seed(setting, stage: int) -> int:
    """The fine-tuning seed fedvalue.analysis.staged_procurement.run_procurement draws for ``stage``."""
    tune = np.random.default_rng(np.random.SeedSequence(setting.procurement_seed).spawn(2)[0])
    return [int(tune.integers(2**31 - 1)) for _ in range(stage)][-1]


def test_cli_end_to_end_same_seed_same_bytes_and_the_audit_passes(tmp_path, capsys):
    # Offers of 10 rated profiles, not 50, and fine-tunes of one epoch: a fifteenth of the minibatch steps of every
    # coalition's fine-tune.
    args = ["run", "procurement", "--seeds", "2", "--stages", "3", "--initial-epochs", "30", "--fine-tune-epochs", "1",
            "--offer-size", "10"]
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    assert "seed 1 random stage 3/3: bought" in out and "share of purchases" in out
    assert main([*args, "--out", str(tmp_path / "b"), "--quiet"]) == 0
    assert "stage 1/3" not in capsys.readouterr().out
    a, b = tmp_path / "a", tmp_path / "b"
    for name in ("avgerr.csv", "purchases.csv", "purchase_shares.csv", "seed-1/loo/ledger.csv"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    for name in ("figure5.png", "figure6.png"):
        assert (a / name).stat().st_size > 10_000
    summary = pd.read_csv(a / "avgerr_summary.csv")
    assert set(summary["rule"]) == {"ads", "loo", "random"} and (summary["ci_low"] <= summary["ci_high"]).all()
    paired = pd.read_csv(a / "paired.csv")
    errors = pd.read_csv(a / "avgerr.csv")
    per_seed = errors[errors["stage"] > 0].groupby(["rule", "seed"])["avgerr"].mean()
    ads_minus_loo = paired[(paired["first"] == "ads") & (paired["second"] == "loo")]
    assert ads_minus_loo["mean"].item() == pytest.approx((per_seed["ads"] - per_seed["loo"]).mean())
    shares = pd.read_csv(a / "purchase_shares.csv")
    np.testing.assert_allclose(shares.groupby(["rule", "stage"])["share"].sum(), 1.0)

    assert main(["audit", str(a / "seed-0" / "ads")]) == 0
    audited = capsys.readouterr().out
    assert "ok: group efficiency in 3 rounds" in audited and "ok: replayed seed 0 under rule 'ads'" in audited
    assert main(["report", str(a / "seed-0" / "ads")]) == 0
    assert "total_ads" in capsys.readouterr().out

    # A forged value breaks the hash chain; forged and re-chained, it is caught by the replay.
    forge(a / "seed-0" / "loo", rechain=False)
    assert main(["audit", str(a / "seed-0" / "loo")]) == 1
    assert "FAILED: hash chain" in capsys.readouterr().out
    forge(a / "seed-0" / "random", rechain=True)
    assert main(["audit", str(a / "seed-0" / "random")]) == 1
    audited = capsys.readouterr().out
    assert "ok: hash chain intact" in audited and "FAILED: replay: ledger.csv differs" in audited


def forge(run_dir, *, rechain: bool) -> None:
    """Add 0.5 to the first ADS value; with ``rechain`` rewrite the books so the hash chain holds."""
    from fedvalue.analysis.run_summary import load_run
    from fedvalue.run.ledger_reader import ledger_rows_of
    from fedvalue.run.ledger_tables import LedgerWriter

    run = load_run(run_dir)
    ledger = run.ledger.astype(object).where(run.ledger.notna(), None)
    first = ledger.index[ledger["method"] == "ads"][0]
    ledger.loc[first, "value"] += 0.5
    if not rechain:
        ledger.to_csv(run_dir / "ledger.csv", index=False)
        return
    for name in ("ledger.csv", "rounds.csv", "ledger.parquet"):
        (run_dir / name).unlink()
    writer = LedgerWriter(run_dir)
    rows = ledger_rows_of(ledger)
    for row in run.round_rows():
        writer.write_round(row, [booked for booked in rows if booked.round == row.round])


def test_an_existing_run_is_kept_unless_overwrite(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["run", "procurement", "--out", str(out), "--seeds", "1", "--stages", "1", "--initial-epochs", "5", "--rules", "ads",
            "--quiet"]
    assert main(args) == 0
    before = (out / "avgerr.csv").read_bytes()
    assert main(args) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert (out / "avgerr.csv").read_bytes() == before
    assert main([*args, "--overwrite"]) == 0


@pytest.mark.parametrize(("options", "named"), [
    (["--seeds", "0"], "seeds"),
    (["--stages", "-1"], "stages"),
    (["--offer-size", "0"], "offer_size"),
    (["--seed", "-1"], "seed"),
    (["--noise-shares", "0.3,1.5"], "noise_shares"),
    (["--noise-shares", "0.3,0.3"], "noise_shares"),
    (["--noise-shares", "0.301,0.302"], "noise_shares"),
    (["--rating-noise-variance", "-1"], "rating_noise_variance"),
    (["--part-worth-max", "0"], "part_worth_max"),
    (["--fine-tune-learning-rate", "nan"], "fine_tune_learning_rate"),
    (["--fine-tune-epochs", "0"], "fine_tune_epochs"),
    (["--fine-tune-batch-size", "-4"], "fine_tune_batch_size"),
    (["--rules", "ads,shapley"], "rules"),
    (["--rules", "ads,ads"], "rules"),
    (["--budget", "4"], "budget"),
    (["--hidden", "32,0"], "hidden"),
    (["--confidence", "1"], "confidence"),
    (["--ratings-per-profile", "0"], "ratings_per_profile"),
])
def test_bad_options_exit_2_name_the_parameter_and_leave_nothing_behind(tmp_path, capsys, options, named):
    out = tmp_path / "run"
    assert main(["run", "procurement", "--out", str(out), *options]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"fedvalue: error: --{named.replace('_', '-')}: expected"), err
    assert "Traceback" not in err
    assert not out.exists()


def test_the_config_round_trips_through_run_json(tmp_path):
    from simulations.experiments.procurement.procurement import ledger_config
    from simulations.runner.config_checks import saved_config

    config = ProcurementConfig(**TINY, noise_shares=(0.1, 0.5))
    saved = ledger_config(config, 3, "loo")
    # One seed's run.json is the configuration of that seed alone.
    assert saved_config(ProcurementConfig, saved, strict=False) == dataclasses.replace(config, seed=3, seeds=1)
    assert saved["contributors"] == {"c10": 0.1, "c50": 0.5}


@pytest.mark.parametrize("batch_size", [0, 10, 25])
def test_fine_tuning_steps_grow_with_the_data_bought_unless_full_batch(batch_size, monkeypatch):
    """Counted at the optimizer: epochs × ⌈n / batch⌉ Adam steps (full batch: epochs, whatever n)."""
    import torch

    learner = RatingMLP(epochs=3, learning_rate=0.003, batch_size=batch_size)
    state = learner.initial_state(0)
    rng = np.random.default_rng(0)
    offer = (random_profiles(50, rng), rng.uniform(0, 100, 50))
    counted = []
    step = torch.optim.Adam.step

    def counting(self, *args, **kwargs):
        counted[-1] += 1
        return step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.Adam, "step", counting)
    for offers in ([offer], [offer, offer], [offer, offer, offer]):
        counted.append(0)
        learner.fine_tune(state, offers, seed=1)
        assert counted[-1] == learner.num_steps(50 * len(offers))
    assert counted == ([3, 3, 3] if batch_size == 0 else [3 * -(-50 * k // batch_size) for k in (1, 2, 3)])
