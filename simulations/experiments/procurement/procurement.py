"""The ``procurement`` simulation: staged data procurement of [ADS] §6.3 / App. C.3 (Figures 5, 6).

A buyer fine-tunes a rating model over ``stages`` = 30 stages. At each stage three
contributors offer ``offer_size`` = 50 rated profiles each, of which 30%, 60% and 90% come
from a noisy generator (independently drawn part-worths); the buyer purchases one offer
per stage (``budget``), chosen by exact within-stage ADS, within-stage LOO or at random,
and fine-tunes its model on it from the current state. Every candidate coalition S of a
stage's offers is scored by fine-tuning a copy of the current model on the union of S and
measuring −AvgErr on the evaluation design (64 profiles × 5 ratings; part-worths by OLS).
The model is a small MLP standing in for the paper's LLMs
(:mod:`simulations.experiments.procurement.model`), first fit to a biased rating behaviour on 500
samples, then fine-tuned for ``fine_tune_epochs`` epochs in minibatches of
``fine_tune_batch_size`` (10): as in LLM fine-tuning, a coalition of three offers (150
examples) gets three times the optimizer steps of one offer (``fine_tune_batch_size=0``,
full batch, gives every coalition the same ``fine_tune_epochs`` steps). The accounting is
:mod:`fedvalue.analysis.staged_procurement`.

Per seed, the true, noisy and biased generators, the biased data and every stage's offers
(in a shuffled order) are drawn once and shared by the three rules, which also share the
fine-tuning seeds: their trajectories differ only by what was bought. Outputs in ``--out``:

``avgerr.csv``            seed, rule, stage, avgerr (stage 0: the biased initial model)
``avgerr_summary.csv``    rule, stage, mean, ci_low, ci_high (Student-t band at ``confidence``)
``purchases.csv``         seed, rule, stage, contributor, noise_share, ads, loo (its values)
``purchase_shares.csv``   rule, stage, noise_share, share (of the seeds' purchases)
``paired.csv``            per pair of rules: per-seed difference of the mean AvgErr over stages
                          (mean, band, seeds where the first rule was lower)
``figure5.png``           AvgErr per stage and rule with the confidence band
``figure6.png``           share of purchases by noise level per stage, one panel per rule
``seed-S/RULE/``          each run's books (ledger.csv, rounds.csv, run.json), auditable

``--results FOLDER`` keeps the docs' results files besides (:mod:`simulations.experiments.procurement.markdown`).
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from fedvalue import (
    LEDGER_FILE,
    PURCHASE_RULES,
    ROUNDS_FILE,
    RUN_CONFIG_FILE,
    Arrays,
    Offer,
    ProcurementRun,
    StageOutcome,
    run_procurement,
)
from fedvalue.ledger import read_ledger_csv, read_rounds_csv
from simulations.datasets import check_hidden
from simulations.experiments.procurement.conjoint import (
    RatingGenerator,
    mixed_ratings,
    random_profiles,
    validation_profiles,
)
from simulations.experiments.procurement.markdown import PROCUREMENT_RESULTS, offer_values, results_frames
from simulations.experiments.procurement.model import NegativeAverageError, RatingMLP
from simulations.runner import (
    Simulation,
    check_integers,
    check_numbers,
    check_open_unit,
    saved_config,
    write_results,
)


@dataclass
class ProcurementConfig:
    """Every number of the simulation (each is a ``fedvalue run procurement`` option)."""

    seeds: int = 15
    seed: int = 0
    stages: int = 30
    offer_size: int = 50
    noise_shares: tuple[float, ...] = (0.3, 0.6, 0.9)
    rating_noise_variance: float = 5.0
    part_worth_max: float = 95.0 / 3.0
    biased_samples: int = 500
    ratings_per_profile: int = 5
    hidden: tuple[int, ...] = (32,)
    initial_epochs: int = 200
    initial_learning_rate: float = 0.01
    fine_tune_epochs: int = 10
    fine_tune_learning_rate: float = 0.003
    fine_tune_batch_size: int = 10
    rules: tuple[str, ...] = PURCHASE_RULES
    budget: int = 1
    confidence: float = 0.9

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


#: Help of the options that are the procurement simulation's own (``fedvalue run procurement --help``).
PROCUREMENT_HELP = {
    "stages": "procurement stages (one purchase decision each)",
    "offer_size": "rated profiles in each contributor's offer",
    "noise_shares": "per contributor, the share of its offer rated by the noisy generator, comma-separated",
    "rating_noise_variance": "variance σ² of the rating noise ε ~ N(0, σ²) (the paper's N(0, 5))",
    "part_worth_max": "part-worths are drawn from U(0, this)",
    "biased_samples": "samples of the biased dataset the model is first fit to",
    "ratings_per_profile": "ratings per profile in the evaluation design (64 profiles × this)",
    "initial_epochs": "full-batch Adam steps of the initial fit to the biased data",
    "initial_learning_rate": "Adam learning rate of the initial fit",
    "seeds": "seeds run (seed, seed+1, ...; the paper's 15 runs)",
    "fine_tune_epochs": "epochs of each fine-tune (of every candidate coalition and of the purchase)",
    "fine_tune_learning_rate": "Adam learning rate of each fine-tune",
    "fine_tune_batch_size": "fine-tuning minibatch size: a fine-tune takes epochs x ceil(examples / size) steps, so "
                            "more data bought means more steps (0 = full batch: epochs steps whatever the data)",
    "rules": "purchase rules compared, comma-separated: ads, loo, random",
    "budget": "offers bought per stage",
    "confidence": "level of the confidence band over seeds (the paper's Figure 5: 0.9)",
}


def _check(config: ProcurementConfig) -> None:
    """ValueError naming the first bad field, before anything is written."""
    check_integers(config, ("seeds", "stages", "offer_size", "biased_samples", "ratings_per_profile",
                            "initial_epochs", "fine_tune_epochs", "budget"))
    check_integers(config, ("seed", "fine_tune_batch_size"), minimum=0)
    check_numbers(config, ("part_worth_max", "initial_learning_rate", "fine_tune_learning_rate"))
    check_numbers(config, ("rating_noise_variance",), zero_ok=True)
    shares = config.noise_shares
    if not shares or any(isinstance(s, bool) or not isinstance(s, (int, float)) or not 0 <= s <= 1 for s in shares) \
            or len(set(shares)) != len(shares):
        raise ValueError(f"noise_shares: expected distinct numbers in [0, 1], one per contributor; got {list(shares)}.")
    if len({contributor_id(s) for s in shares}) != len(shares):
        raise ValueError(f"noise_shares: expected shares at least 0.01 apart (contributors are named by percent, "
                         f"c30 for 0.3); got {list(shares)}.")
    if config.budget > len(shares):
        raise ValueError(f"budget: expected at most the {len(shares)} offers of a stage (one per noise share); "
                         f"got {config.budget}.")
    if not config.rules or any(r not in PURCHASE_RULES for r in config.rules) or len(set(config.rules)) != len(config.rules):
        raise ValueError(f"rules: expected distinct names from {list(PURCHASE_RULES)}; got {list(config.rules)}.")
    check_hidden(config.hidden)
    check_open_unit("confidence", config.confidence)


def contributor_id(noise_share: float) -> str:
    """The id of the contributor whose offers are ``noise_share`` noisy: ``c30`` for 0.3."""
    return f"c{round(100 * noise_share):02d}"


@dataclass
class ProcurementSetting:
    """One seed's world: generators, the initial (biased) model, the stages' offers, the utility."""

    seed: int
    true: RatingGenerator
    noisy: RatingGenerator
    biased: RatingGenerator
    learner: RatingMLP
    initial_state: Arrays
    stages: list[list[Offer]]
    utility: NegativeAverageError
    procurement_seed: int


def build(config: ProcurementConfig, seed: int) -> ProcurementSetting:
    """Seed ``seed``'s world (module docstring); children of one SeedSequence, nothing global."""
    _check(config)
    true_seq, noisy_seq, biased_seq, data_seq, model_seq, procure_seq = np.random.SeedSequence(seed).spawn(6)
    draw = dict(upper=config.part_worth_max, noise_variance=config.rating_noise_variance)
    true = RatingGenerator.draw(np.random.default_rng(true_seq), **draw)
    noisy = RatingGenerator.draw(np.random.default_rng(noisy_seq), **draw)
    biased = RatingGenerator.draw(np.random.default_rng(biased_seq), **draw)
    data_rng = np.random.default_rng(data_seq)
    biased_profiles = random_profiles(config.biased_samples, data_rng)
    biased_data = (biased_profiles, biased.rate(biased_profiles, data_rng))
    stages = []
    for _ in range(config.stages):
        offers = [Offer(contributor_id(share), mixed_ratings(true, noisy, config.offer_size, share, data_rng),
                        config.offer_size) for share in config.noise_shares]
        stages.append([offers[k] for k in data_rng.permutation(len(offers))])  # no position favoured on ties
    learner = RatingMLP(hidden=tuple(config.hidden), epochs=config.fine_tune_epochs,
                        learning_rate=config.fine_tune_learning_rate, batch_size=config.fine_tune_batch_size)
    model_rng = np.random.default_rng(model_seq)
    initial_fit = dataclasses.replace(learner, epochs=config.initial_epochs,
                                      learning_rate=config.initial_learning_rate, batch_size=0)
    initial_state = initial_fit.fine_tune(learner.initial_state(int(model_rng.integers(2**31 - 1))), [biased_data],
                                          seed=int(model_rng.integers(2**31 - 1)))
    utility = NegativeAverageError(learner, validation_profiles(config.ratings_per_profile), true.part_worths)
    return ProcurementSetting(seed=seed, true=true, noisy=noisy, biased=biased, learner=learner,
                              initial_state=initial_state, stages=stages, utility=utility,
                              procurement_seed=int(np.random.default_rng(procure_seq).integers(2**63)))


def ledger_config(config: ProcurementConfig, seed: int, rule: str) -> dict:
    """The run.json of one seed's run under one rule (enough to replay it): the configuration of
    that seed alone (``seed``, ``seeds`` = 1) and the rule."""
    return {"simulation": "procurement", **config.as_dict(), "seed": seed, "seeds": 1, "rule": rule,
            "contributors": {contributor_id(s): s for s in config.noise_shares}}


def run_one(config: ProcurementConfig, setting: ProcurementSetting, rule: str, run_dir: str | Path | None,
            on_stage: Callable[[StageOutcome], None] | None = None) -> ProcurementRun:
    """One seed's procurement under ``rule``, its books in ``run_dir`` (when given)."""
    return run_procurement(
        setting.learner, setting.initial_state, setting.stages, setting.utility, rule=rule, budget=config.budget,
        methods=("ads", "loo"), seed=setting.procurement_seed,
        run_dir=None if run_dir is None else str(run_dir),
        config=ledger_config(config, setting.seed, rule), on_stage=on_stage,
    )


def run_procurement_study(config: ProcurementConfig, out: str | Path, *, overwrite: bool = False,
                          on_stage: Callable[[str], None] | None = None) -> dict:
    """Every seed under every rule, then the tables and figures (module docstring)."""
    from simulations.runner import package_versions, prepare_run_dir, write_run_config

    _check(config)
    out_dir = prepare_run_dir(out, overwrite=overwrite)
    write_run_config(out_dir, {"simulation": "procurement-study", **config.as_dict(),
                               "versions": package_versions()})
    started = time.perf_counter()
    error_rows, purchase_rows = [], []
    shares = {contributor_id(s): s for s in config.noise_shares}
    for seed in range(config.seed, config.seed + config.seeds):
        setting = build(config, seed)
        for rule in config.rules:
            progress = None if on_stage is None else _stage_printer(on_stage, seed, rule, config.stages, started)
            run = run_one(config, setting, rule, out_dir / f"seed-{seed}" / rule, progress)
            frame = run.to_frame()
            error_rows += [{"seed": seed, "rule": rule, "stage": int(s), "avgerr": -float(u)}
                           for s, u in zip(frame["stage"], frame["utility_realized"])]
            for outcome in run.stages:
                ads, loo = outcome.values("ads"), outcome.values("loo")
                purchase_rows += [{"seed": seed, "rule": rule, "stage": outcome.stage, "contributor": c,
                                   "noise_share": shares[c], "ads": ads[c], "loo": loo[c]}
                                  for c in outcome.purchased]
    tables = write_outputs(out_dir, config, pd.DataFrame(error_rows), pd.DataFrame(purchase_rows))
    tables["seconds"] = time.perf_counter() - started
    return tables


def _stage_printer(show: Callable[[str], None], seed: int, rule: str, stages: int, started: float):
    def printer(outcome: StageOutcome) -> None:
        show(f"seed {seed} {rule} stage {outcome.stage}/{stages}: bought {' '.join(outcome.purchased)}, "
             f"AvgErr {-outcome.utility_before:.3f} -> {-outcome.utility_realized:.3f}, "
             f"{outcome.num_fine_tunes} fine-tunes in {outcome.seconds:.2f}s, "
             f"elapsed {time.perf_counter() - started:.1f}s")
    return printer


def _band(values: pd.Series, confidence: float) -> pd.Series:
    """Mean and Student-t confidence interval of the mean over seeds."""
    from scipy.special import stdtrit  # the t quantile, without importing all of scipy.stats

    values = values.to_numpy(dtype=np.float64)
    mean = float(values.mean())
    half = 0.0
    if len(values) > 1:
        half = float(stdtrit(len(values) - 1, 0.5 + confidence / 2) * values.std(ddof=1) / math.sqrt(len(values)))
    return pd.Series({"mean": mean, "ci_low": mean - half, "ci_high": mean + half, "seeds": len(values)})


def write_outputs(out_dir: Path, config: ProcurementConfig, errors: pd.DataFrame, purchases: pd.DataFrame) -> dict:
    """The CSV tables and Figures 5 and 6 (module docstring)."""
    summary = (errors.groupby(["rule", "stage"], sort=False)["avgerr"]
               .apply(lambda v: _band(v, config.confidence)).unstack().reset_index())
    summary["seeds"] = summary["seeds"].astype(int)
    counts = purchases.groupby(["rule", "stage", "noise_share"]).size()
    totals = purchases.groupby(["rule", "stage"]).size()
    index = pd.MultiIndex.from_product([list(config.rules), range(1, config.stages + 1), list(config.noise_shares)],
                                       names=["rule", "stage", "noise_share"])
    shares = (counts.reindex(index, fill_value=0) / totals.reindex(index.droplevel("noise_share")).to_numpy())
    shares = shares.rename("share").reset_index()
    paired = paired_differences(errors, config.confidence)
    errors.to_csv(out_dir / "avgerr.csv", index=False)
    paired.to_csv(out_dir / "paired.csv", index=False)
    summary.to_csv(out_dir / "avgerr_summary.csv", index=False)
    purchases.to_csv(out_dir / "purchases.csv", index=False)
    shares.to_csv(out_dir / "purchase_shares.csv", index=False)
    from simulations.experiments.procurement.figures import figure5, figure6

    figure5(out_dir / "figure5.png", summary, config.confidence, config.seeds)
    figure6(out_dir / "figure6.png", shares, config.seeds)
    return {"avgerr": errors, "summary": summary, "purchases": purchases, "shares": shares, "paired": paired}


def paired_differences(errors: pd.DataFrame, confidence: float) -> pd.DataFrame:
    """Per pair of rules, the per-seed difference of the mean AvgErr over stages 1..T
    (first rule minus second; negative: the first rule's models were better), with its band.

    The rules of one seed share offers and fine-tuning seeds, so the paired difference is
    the sharper comparison than two overlapping bands.
    """
    per_seed = errors[errors["stage"] > 0].groupby(["rule", "seed"])["avgerr"].mean().unstack("rule")
    rules = list(dict.fromkeys(errors["rule"]))
    rows = []
    for k, first in enumerate(rules):
        for second in rules[k + 1:]:
            band = _band(per_seed[first] - per_seed[second], confidence)
            rows.append({"first": first, "second": second, **band.to_dict(),
                         "first_better_seeds": int((per_seed[first] < per_seed[second]).sum())})
    frame = pd.DataFrame(rows, columns=["first", "second", "mean", "ci_low", "ci_high", "seeds", "first_better_seeds"])
    frame["seeds"] = frame["seeds"].astype(int)
    return frame


def headline(tables: dict) -> str:
    """Final-stage AvgErr per rule, paired differences and the share of purchases by noise level."""
    summary, purchases = tables["summary"], tables["purchases"]
    last = summary[summary["stage"] == summary["stage"].max()]
    lines = [f"AvgErr after stage {int(last['stage'].iloc[0])} (mean [band] over {int(last['seeds'].iloc[0])} seeds):"]
    lines += [f"  {r.rule:<7}{r.mean:8.3f}  [{r.ci_low:.3f}, {r.ci_high:.3f}]" for r in last.itertuples()]
    area = summary[summary["stage"] > 0].groupby("rule", sort=False)["mean"].mean()
    lines.append("mean AvgErr over stages 1..T: " + ", ".join(f"{r} {v:.3f}" for r, v in area.items()))
    for r in tables["paired"].itertuples():
        lines.append(f"paired {r.first} − {r.second} (per-seed mean over stages): {r.mean:+.3f} "
                     f"[{r.ci_low:+.3f}, {r.ci_high:+.3f}], {r.first} lower in {r.first_better_seeds}/{int(r.seeds)} seeds")
    share = (purchases.groupby("rule", sort=False)["noise_share"].value_counts(normalize=True)
             .unstack(fill_value=0.0).reindex(columns=sorted(tables["shares"]["noise_share"].unique()), fill_value=0.0))
    lines.append("share of purchases by noise share (all stages and seeds):")
    lines += [f"  {rule:<7}" + "  ".join(f"{c:g}: {share.loc[rule, c]:.3f}" for c in share.columns)
              for rule in share.index]
    return "\n".join(lines)


#: Seconds a replay may take before the audit calls the run not verifiable.
REPLAY_TIMEOUT = 600.0


def replay_into(saved: dict, out: str) -> None:
    """Replay the run whose run.json is ``saved`` into the new directory ``out`` (the child
    process of :func:`replay_check`)."""
    config = saved_config(ProcurementConfig, saved)
    run_one(config, build(config, saved["seed"]), saved["rule"], out)


def replay_check(run_dir: str | Path, *, timeout: float = REPLAY_TIMEOUT) -> tuple[list[str], list[str]]:
    """Recompute one seed's run from its run.json alone and compare the books.

    Returns ``(checks, problems)``. Procurement saves no per-stage model states, so a
    value cannot be recomputed from saved arrays as the FedAvg audit does; instead the
    run is replayed (the generators, offers and fine-tunes are pure functions of the
    configuration and seed) and every ledger row and every rounds.csv column except the
    wall-clock ``valuation_seconds`` and the ``hash`` that covers it must come out equal.
    The run directory is read through :mod:`fedvalue.run.rundir` (no link, no FIFO, capped);
    the replay runs in a child process killed after ``timeout`` seconds
    (:class:`TimeoutError`: the audit then says not verifiable), and only when the tables
    hold as many stages as run.json names.
    """
    from fedvalue import RunDir
    from simulations.runner import read_run_config

    with RunDir(run_dir) as run:
        saved = read_run_config(run)
        where = run.show(RUN_CONFIG_FILE)
        try:
            config = saved_config(ProcurementConfig, saved, source=where)
            _check(config)
        except (TypeError, ValueError) as error:
            return [], [f"replay: {where} does not hold a procurement configuration ({error})"]
        seed, rule = saved.get("seed"), saved.get("rule")
        if isinstance(seed, bool) or not isinstance(seed, int) or rule not in PURCHASE_RULES:
            return [], [f"replay: {where} names no seed and rule of a procurement run"]
        booked = read_ledger_csv(io.StringIO(run.read_text(LEDGER_FILE), newline=""))
        rounds = read_rounds_csv(io.StringIO(run.read_text(ROUNDS_FILE), newline=""))
    if len(rounds) != config.stages:
        return [], [f"replay: rounds.csv holds {len(rounds)} stages; run.json names {config.stages}"]
    with tempfile.TemporaryDirectory() as scratch:
        replay = Path(scratch) / "replay"
        code = ("import json, sys; from simulations.experiments.procurement.procurement import replay_into; "
                "replay_into(json.loads(sys.argv[1]), sys.argv[2])")
        try:
            subprocess.run([sys.executable, "-c", code, json.dumps(saved), str(replay)], check=True,
                           capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"the replay took longer than {timeout:g} s") from None
        except subprocess.CalledProcessError as error:
            reason = error.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or ["no message"]
            return [], [f"replay: run.json's settings do not replay ({reason[0][:200]})"]
        replayed = read_ledger_csv(replay / LEDGER_FILE)
        replayed_rounds = read_rounds_csv(replay / ROUNDS_FILE)
    problems = []
    for name, mine, theirs in ((LEDGER_FILE, booked, replayed),
                               (ROUNDS_FILE, *(r.drop(columns=["valuation_seconds", "hash"])
                                               for r in (rounds, replayed_rounds)))):
        try:
            pd.testing.assert_frame_equal(mine, theirs, check_exact=True)
        except AssertionError as error:
            first = str(error).strip().splitlines()
            problems.append(f"replay: {name} differs from a replay of seed {seed} under rule {rule!r} "
                            f"({' '.join(first[:3])})")
    checks = [] if problems else [f"replayed seed {seed} under rule {rule!r}: every ledger row and stage "
                                  f"figure equal ({len(booked)} rows, {len(rounds)} stages)"]
    return checks, problems


def cli_main(config: ProcurementConfig, options) -> int:
    """``fedvalue run procurement``: staged procurement over seeds, Figures 5 and 6."""
    tables = run_procurement_study(config, options.out, overwrite=options.overwrite, on_stage=options.say())
    print(headline(tables))
    print(f"wrote {options.out} ({config.seeds} seeds × {len(config.rules)} rules × {config.stages} stages) in "
          f"{options.elapsed():.1f}s; see figure5.png, figure6.png and "
          f"`fedvalue audit {options.out}/seed-{config.seed}/{config.rules[0]}`")
    if options.results:
        offers = offer_values(options.out, range(config.seed, config.seed + config.seeds), config.rules)
        written = write_results(options.results, results_frames(tables, offers), options.command)
        print(f"results files: {', '.join(map(str, written))}")
    return 0


#: This experiment's entry in ``fedvalue run`` (:mod:`simulations.cli.registry`).
SIMULATION = Simulation("procurement", ProcurementConfig, cli_main, replay_check=replay_check,
                        help=PROCUREMENT_HELP, results=PROCUREMENT_RESULTS)
