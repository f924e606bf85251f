"""What manipulating clients get from the books: one attacker at a time, through Flower on Ray.

Digits (1,797 8×8 images, 10 classes), 25% held out (stratified) for the utility. The
rest is split IID among ``num_clients`` clients; each client keeps a random half for
training and the other half as its inference split (TracIn flows need one). Every
round every client trains ``local_epochs`` full-batch SGD epochs of a softmax
regression from A_{t−1}; FedAvg aggregates; ValuingStrategy books exact within-round
ADS and LOO (utility: held-out accuracy by default) and TracIn flows.

One run per attack, all from the same A_0 and seed, client ``attacker`` playing:

``none``                 honest (the baseline: what the attacker's seat earns honestly)
``free-rider``           replies A_{t−1} (:class:`clients.behaviours.FreeRider`)
``free-rider-noise``     replies A_{t−1} + N(0, ``noise_std``²) per entry
``inflated-count``       trains honestly, claims ``inflation`` × its example count
``inflated-count-reviewed``  the same, with :class:`strategies.intake.claims.ClaimReview` on
                         (registered sizes, ``median_multiple`` × the median, ``jump_factor``)
``replicator``           trains on a copy of client ``source``'s data: submits its update
``sign-flip``            replies A_{t−1} − (w − A_{t−1})
``boost``                replies A_{t−1} + ``boost`` (w − A_{t−1})

The table has, per attack, the attacker's totals over the rounds (ADS, LOO, TracIn
outflow and inflow) next to the mean total of the honest clients, the final held-out
accuracy and its change against ``none``, and the claim flags booked.

One engine serves every run (as in :mod:`simulations.experiments.noisy_clients.study`; :func:`simulations.runner.api.simulate`
starts one per call), the clients reading the attack from the ``data-key`` of the train config.

The attacks on identities, free-riders that replay and crafted updates (:mod:`.plan`:
``sybil-split-K``, ``sybil-replica-K``, ``colluding-free-riders``, ``delta-weights``,
``dynamic-free-rider``, ``crafted-update``, and ``group-split`` for the KNN-ADS market,
:mod:`.shell_groups`) and every option beyond the ones above (seeds, Dirichlet data,
Fashion-MNIST, robust strategies, the defences' books, the fixed-weight game's second-order books) run the
study of :mod:`.study` instead,
whose gains are :mod:`fedvalue.analysis.gains`; the runs above stay as they were.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pandas as pd
from flwr.app import ConfigRecord
from flwr.serverapp import Grid

from clients import (
    BoostedUpdate,
    ClientBehaviour,
    ClientData,
    FreeRider,
    HonestClient,
    InflatedExampleCount,
    Replicator,
    SignFlip,
    is_behaviour_reference,
    load_behaviour,
    make_client_app,
)
from fedvalue import Status, gains_table, honest_cost
from fedvalue.ledger import load_run
from fedvalue.utilities import TorchModelUtility
from simulations.datasets import load_dataset, make_linear_model, partition_iid, split_holdout
from simulations.experiments.attacks.plan import (
    ADAPTIVE_ATTACKS,
    PLAIN_ATTACKS,
    adaptive_behaviour,
    adaptive_parts,
    is_study_attack,
    plan_of,
)
from simulations.experiments.attacks.shell_groups import shell_groups_table
from simulations.experiments.attacks.study import (
    PARTITIONS,
    STRATEGIES,
    StudyRun,
    attack_settings,
    run_frames,
    run_group,
    study_runs,
    study_totals,
    utility_of,
)
from simulations.experiments.attacks.study import model_factory as study_model_factory
from simulations.runner import (
    EngineSettings,
    Simulation,
    check_engine_keys,
    check_integers,
    check_numbers,
    fedavg_without_evaluation,
    flat_fields,
    flat_settings,
    fixed_second_order_asked,
    initial_model_arrays,
    package_versions,
    prepare_run_dir,
    saved_config,
    seeded_server_generators,
    serve,
    write_run_config,
)
from strategies import (
    CLAIM_METHODS,
    BookSettings,
    ClaimReview,
    IntakeSettings,
    PartitionSampler,
    RunSettings,
    ValuationSettings,
    ValuingStrategy,
    aggregates_by_weighted_mean,
    train_config,
)

ATTACKS = ("none", "free-rider", "free-rider-noise", "inflated-count", "inflated-count-reviewed", "replicator",
           "sign-flip", "boost")
#: The KNN-ADS market's broker splitting into shell groups (no federated run: :mod:`.shell_groups`).
GROUP_SPLIT = "group-split"
UTILITIES = ("accuracy", "neg_loss")
#: The study's switch of the fixed-weight game's second-order books, in run.json only when on.
FIXED_SECOND_ORDER = "fixed_second_order"
#: The study's relative clustering of the defences (κ of ``DefenceSettings.duplicate_median_fraction``), in run.json
#: only when set.
DUPLICATE_MEDIAN_FRACTION = "duplicate_median_fraction"
#: Ledger methods summed per client, and their column names in the table.
BOOKS = {"ads": "ads", "loo": "loo", "tracin_outflow": "outflow", "tracin_inflow": "inflow"}


@dataclass
class AttacksConfig:
    """Every number of the attack measurement."""

    seed: int = 0
    num_clients: int = 8
    rounds: int = 5
    local_epochs: int = 5
    learning_rate: float = 0.5
    holdout_fraction: float = 0.25
    utility: str = "accuracy"
    attacks: tuple[str, ...] = ATTACKS
    attacker: int = 0
    source: int = 7
    noise_std: float = 1e-3
    inflation: float = 50.0
    boost: float = 5.0
    median_multiple: float = 3.0
    jump_factor: float = 2.0
    engine: EngineSettings = EngineSettings()
    round_timeout: float = 600.0
    # The study (:mod:`.study`): any of these away from its default, or an attack of .plan, runs it.
    dataset: str = "digits"
    train_examples: int = 0
    holdout_examples: int = 0
    partitions: tuple[str, ...] = ("iid",)
    dirichlet_alpha: float = 0.5
    seeds: int = 1
    strategies: tuple[str, ...] = ("fedavg",)
    defences: int = 0
    norm_cap: float = 0.0
    valuation_budget: int | None = None
    replica_noise: float = 0.0
    colluders: int = 3
    colluder_spread: float = 0.3
    honest_rounds: int = 1
    craft_budget: float = 0.5
    craft_steps: int = 50
    shells: tuple[int, ...] = (1, 2, 4, 8)
    fixed_second_order: bool = False
    duplicate_median_fraction: float = 0.0

    #: The engine settings this job takes (CPUs only), flat in run.json and on the command line.
    ENGINE_KEYS: ClassVar[tuple[str, ...]] = ("num_cpus_per_client", "max_parallel_clients", "ray_address")
    #: Settings a saved run.json may lack: :data:`FIXED_SECOND_ORDER`, written only when on
    #: (:func:`simulations.runner.saved_config` reads it back as its default).
    OPTIONAL_KEYS: ClassVar[tuple[str, ...]] = (FIXED_SECOND_ORDER, DUPLICATE_MEDIAN_FRACTION)

    def as_dict(self) -> dict:
        """The settings as run.json writes them, ``fixed_second_order`` and ``duplicate_median_fraction`` only when
        on: the run.json of a study without them reads as before, byte for byte."""
        settings = flat_settings(self)
        if not self.fixed_second_order:
            del settings[FIXED_SECOND_ORDER]
        if not self.duplicate_median_fraction:
            del settings[DUPLICATE_MEDIAN_FRACTION]
        return settings

    def classic_dict(self) -> dict:
        """The settings of the single-seed measurement alone, as its run.json has always held them."""
        return {name: value for name, value in self.as_dict().items() if name in CLASSIC_FIELDS}

    @property
    def is_study(self) -> bool:
        """Whether this asks for the study (:mod:`.study`) rather than the single-seed measurement."""
        settings, defaults = self.as_dict(), AttacksConfig().as_dict()
        moved = [name for name in STUDY_FIELDS if settings.get(name) != defaults.get(name)]
        return bool(moved) or any(attack not in ATTACKS for attack in self.attacks)


CLASSIC_FIELDS = ("seed", "num_clients", "rounds", "local_epochs", "learning_rate", "holdout_fraction", "utility",
                  "attacks", "attacker", "source", "noise_std", "inflation", "boost", "median_multiple",
                  "jump_factor", "num_cpus_per_client", "max_parallel_clients", "ray_address", "round_timeout")
STUDY_FIELDS = tuple(f.name for f in flat_fields(AttacksConfig) if f.name not in CLASSIC_FIELDS)


def check(config: AttacksConfig) -> None:
    """Every setting, before Ray starts; errors name the parameter, the expectation and the value."""
    if config.is_study:
        return check_study(config)
    check_integers(config, ("num_clients", "rounds", "local_epochs"))
    check_integers(config, ("seed",), minimum=0)
    check_engine_keys(config)
    check_numbers(config, ("learning_rate", "round_timeout"))
    if config.num_clients < 3:
        raise ValueError(f"num_clients: expected at least 3 (an attacker, a source and an honest client); "
                         f"got {config.num_clients}.")
    for name in ("attacker", "source"):
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < config.num_clients:
            raise ValueError(f"{name}: expected a client id in [0, {config.num_clients}); got {value!r}.")
    if config.source == config.attacker:
        raise ValueError(f"source: expected a client other than the attacker {config.attacker}; got {config.source}.")
    unknown = [a for a in config.attacks if a not in ATTACKS]
    if not config.attacks or unknown or len(set(config.attacks)) != len(config.attacks):
        raise ValueError(f"attacks: expected distinct names from {list(ATTACKS)}; got {list(config.attacks)}.")
    if config.utility not in UTILITIES:
        raise ValueError(f"utility: expected one of {list(UTILITIES)}; got {config.utility!r}.")
    if not 0 < config.holdout_fraction < 1:
        raise ValueError(f"holdout_fraction: expected a number in (0, 1); got {config.holdout_fraction!r}.")
    # The behaviours and the review check their own numbers (noise_std, inflation, boost, ...).
    FreeRider(config.noise_std), InflatedExampleCount(config.inflation), BoostedUpdate(config.boost)
    ClaimReview(median_multiple=config.median_multiple, jump_factor=config.jump_factor)


@functools.lru_cache(maxsize=2)
def _prepared(seed: int, num_clients: int, holdout_fraction: float):
    """(train pool, held-out set, per client (training indices, inference indices)), seeded.

    Cached per process: Ray workers rebuild it once instead of receiving it with every message.
    """
    split_seed, partition_seed, halves_seed = np.random.SeedSequence([seed, 7]).spawn(3)
    train, holdout = split_holdout(load_dataset("digits"), holdout_fraction, seed=np.random.default_rng(split_seed))
    shares = partition_iid(len(train), num_clients, seed=np.random.default_rng(partition_seed))
    halves_rng = np.random.default_rng(halves_seed)
    splits = []
    for share in shares:
        chosen = halves_rng.permutation(share)
        half = len(chosen) // 2
        splits.append((np.sort(chosen[:half]), np.sort(chosen[half:])))
    return train, holdout, tuple(splits)


def attacker_behaviour(attack: str, config: AttacksConfig) -> ClientBehaviour:
    """What client ``config.attacker`` does in the run of ``attack``."""
    if attack == "none":
        return HonestClient()
    if attack == "free-rider":
        return FreeRider()
    if attack == "free-rider-noise":
        return FreeRider(config.noise_std)
    if attack in ("inflated-count", "inflated-count-reviewed"):
        return InflatedExampleCount(config.inflation)
    if attack == "replicator":
        train, _, splits = _prepared(config.seed, config.num_clients, config.holdout_fraction)
        own = splits[config.source][0]
        return Replicator(train.x[own], train.y[own], source_id=config.source)
    if attack == "sign-flip":
        return SignFlip()
    if attack == "boost":
        return BoostedUpdate(config.boost)
    raise ValueError(f"attack: expected one of {list(ATTACKS)}; got {attack!r}.")


def attack_client_data(partition_id: int, data_key: str | None = None, *, config_json: str) -> ClientData:
    """Client ``partition_id``'s data and behaviour in the run named by ``data_key`` (an attack)."""
    config = _config_from_json(config_json)
    train, _, splits = _prepared(config.seed, config.num_clients, config.holdout_fraction)
    own, infer = splits[partition_id]
    behaviour = (attacker_behaviour(data_key or "none", config) if partition_id == config.attacker
                 else HonestClient())
    return ClientData(partition_id, train.x[own], train.y[own], train.x[infer], train.y[infer], behaviour=behaviour)


def claim_review(config: AttacksConfig) -> ClaimReview:
    """The server's rule in the reviewed run: sizes registered at enrollment, a median cap, a jump flag."""
    _, _, splits = _prepared(config.seed, config.num_clients, config.holdout_fraction)
    return ClaimReview(registered={c: len(own) for c, (own, _) in enumerate(splits)},
                       median_multiple=config.median_multiple, jump_factor=config.jump_factor)


def _config_from_json(config_json: str) -> AttacksConfig:
    return saved_config(AttacksConfig, json.loads(config_json), strict=False)


def check_study(config: AttacksConfig) -> None:
    """The study's settings (:mod:`.study`); errors name the parameter, the expectation and the value."""
    check_integers(config, ("num_clients", "rounds", "local_epochs", "seeds", "colluders", "craft_steps"))
    check_integers(config, ("seed", "train_examples", "holdout_examples", "honest_rounds"), minimum=0)
    check_engine_keys(config)
    check_numbers(config, ("learning_rate", "round_timeout", "dirichlet_alpha"))
    check_numbers(config, ("replica_noise", "colluder_spread", "craft_budget", "norm_cap"), zero_ok=True)
    choices = {"dataset": ("digits", "fashion-mnist"), "utility": UTILITIES}
    for name, allowed in choices.items():
        if getattr(config, name) not in allowed:
            raise ValueError(f"{name}: expected one of {list(allowed)}; got {getattr(config, name)!r}.")
    for name, allowed in (("partitions", PARTITIONS), ("strategies", tuple(STRATEGIES))):
        values = getattr(config, name)
        if not values or any(v not in allowed for v in values) or len(set(values)) != len(values):
            raise ValueError(f"{name}: expected distinct names from {list(allowed)}; got {list(values)}.")
    check_adaptive(config)
    check_fixed_second_order(config)
    check_duplicate_median_fraction(config)
    unknown = [a for a in config.attacks if not (is_study_attack(a) or a == GROUP_SPLIT)]
    if not config.attacks or unknown or len(set(config.attacks)) != len(config.attacks):
        raise ValueError(f"attacks: expected distinct names from {list(PLAIN_ATTACKS) + [GROUP_SPLIT]}, "
                         f"sybil-split-K / sybil-replica-K (K >= 2), {', '.join(ADAPTIVE_ATTACKS)} (M >= 0) "
                         f"or a ClientBehaviour of your own as "
                         f"module:callable; got {list(config.attacks)} (the study reviews every claim against the "
                         "registered sizes: inflated-count is reviewed there).")
    for attack in config.attacks:  # one's own, built here once: a misspelled one is said before Ray starts
        if is_behaviour_reference(attack):
            try:
                load_behaviour(attack)
            except ValueError as error:
                raise ValueError(f"attacks: {error}") from None
    if not 0 <= config.attacker < config.num_clients:
        raise ValueError(f"attacker: expected a client id in [0, {config.num_clients}); got {config.attacker!r}.")
    if "replicator" in config.attacks and not (0 <= config.source < config.num_clients
                                               and config.source != config.attacker):
        raise ValueError(f"source: expected a client id in [0, {config.num_clients}) other than the attacker for the "
                         f"replicator; got {config.source!r}.")
    if config.colluders > config.num_clients or config.colluders < 2:
        raise ValueError(f"colluders: expected 2 to num_clients={config.num_clients} colluding clients; got "
                         f"{config.colluders}.")
    if config.defences not in (0, 1, 2):
        raise ValueError(f"defences: expected 0 (none), 1 (book them beside the plain books) or 2 (also aggregate "
                         f"only the clusters' representatives, no free-rider); got {config.defences!r}.")
    if not 0 < config.holdout_fraction < 1:
        raise ValueError(f"holdout_fraction: expected a number in (0, 1); got {config.holdout_fraction!r}.")
    if config.valuation_budget is not None:
        check_integers(config, ("valuation_budget",))
    if not config.shells or any(isinstance(m, bool) or not isinstance(m, int) or m < 1 for m in config.shells):
        raise ValueError(f"shells: expected numbers of shell groups >= 1; got {list(config.shells)}.")
    FreeRider(config.noise_std), InflatedExampleCount(config.inflation), BoostedUpdate(config.boost)


def check_adaptive(config: AttacksConfig) -> None:
    """Each adaptive attack's name, margin and what it needs (a norm cap to stay within), before Ray starts:
    its behaviour is built once here (ValueError naming the attack and what is wrong)."""
    for attack in config.attacks:
        if adaptive_parts(attack) is None:
            continue
        plan = plan_of(attack, config.num_clients, config.attacker, config.colluders)
        try:
            adaptive_behaviour(plan, 0, attack_settings(config, config.seed), study_model_factory(config))
        except ValueError as error:
            said = str(error)
            raise ValueError(said if said.startswith("norm_cap:") else f"attacks: {attack}: {said}") from None


def check_fixed_second_order(config: AttacksConfig) -> None:
    """The fixed-weight game's second-order books only where every run of the study can book them
    (``strategies.ValuingStrategy`` would refuse them inside the engine), refused here before Ray starts: the
    expansion differentiates U twice (``neg_loss``; the study books accuracy by default, and is not switched to
    −loss behind the user's back: every book of the runs is valued under the utility chosen) and the fixed-weight
    coalition rule is FedAvg's (no robust strategy)."""
    if not fixed_second_order_asked(config.fixed_second_order, config.utility,
                                    "Pass utility=neg_loss (every book of the study is then valued under it), or "
                                    "leave it off."):
        return
    robust = [name for name in config.strategies if not aggregates_by_weighted_mean(STRATEGIES[name]())]
    if robust:
        raise ValueError(f"fixed_second_order: expected strategies that aggregate by FedAvg's weighted mean "
                         f"('fedavg'; the fixed-weight coalition rule is defined for it only); got strategies="
                         f"{list(config.strategies)}, of which {robust} aggregate by their own code. Run those "
                         "without it, or pass strategies=fedavg.")


def check_duplicate_median_fraction(config: AttacksConfig) -> None:
    """κ of the relative clusters (:mod:`fedvalue.rounds.defences.relative_clusters`): 0 (off, the fixed τ) or in
    (0, 1), and only with the defences on (it is theirs), refused here before Ray starts."""
    kappa = config.duplicate_median_fraction
    if isinstance(kappa, bool) or not isinstance(kappa, (int, float)) or not 0 <= kappa < 1:
        raise ValueError(f"duplicate_median_fraction: expected 0 (off: the fixed threshold) or a number in (0, 1), "
                         f"e.g. 0.25; got {kappa!r}.")
    if kappa and not config.defences:
        raise ValueError(f"duplicate_median_fraction: expected defences=1 or 2 (it sets how the defences cluster "
                         f"identities); got defences={config.defences!r} with duplicate_median_fraction={kappa!r}.")


def summarize(ledger: pd.DataFrame, rounds: pd.DataFrame, attack: str, attacker: int,
              source: int | None = None) -> dict:
    """One row of the table: the attacker's totals, the honest clients' mean totals, accuracy, flags
    (and, for the replicator, the totals of the client it copies in ``notes``)."""
    booked = ledger[ledger["status"] == Status.OK]
    totals = booked[booked["method"].isin(list(BOOKS))].pivot_table(
        index="client_id", columns="method", values="value", aggfunc="sum").reindex(columns=list(BOOKS))
    me = str(attacker)
    honest = totals.drop(index=me)
    row: dict = {"attack": attack}
    for method, name in BOOKS.items():
        row[name] = float(totals.at[me, method])
        row[f"{name}_honest"] = float(honest[method].mean())
    row["accuracy"] = float(rounds["utility_realized"].iloc[-1])
    flags = ledger[ledger["method"].isin(list(CLAIM_METHODS))]
    row["claim_flags"] = " ".join(f"{m}×{n}" for m, n in flags["method"].value_counts().sort_index().items())
    row["notes"] = ""
    if attack == "replicator" and source is not None:
        twin = totals.loc[str(source)]
        row["notes"] = "source {}: ".format(source) + ", ".join(f"{BOOKS[m]} {twin[m]:.4g}" for m in BOOKS)
    return row


def run_attacks(
    config: AttacksConfig,
    out: str | None = None,
    *,
    on_run: Callable[[str], None] | None = None,
    overwrite: bool = False,
) -> pd.DataFrame:
    """Run every attack of ``config`` on one Flower engine; returns the table (module docstring).

    Parameters
    ----------
    config
        The setting; checked before Ray starts.
    out
        Directory for ``attacks.csv``, ``run.json`` and one run directory (ledger) per
        attack. ``None``: a temporary directory, removed afterwards.
    on_run
        Called with a line after each attack's run.
    overwrite
        Replace a measurement already in ``out``.
    """
    check(config)
    if out is None:
        with tempfile.TemporaryDirectory(prefix="fedvalue-attacks-") as scratch:
            return run_attacks(config, scratch, on_run=on_run, overwrite=True)
    if config.is_study:
        return run_study(config, out, on_run=on_run, overwrite=overwrite)
    run_config = {"simulation": "attacks", **config.classic_dict(), "versions": package_versions()}
    out_dir = prepare_run_dir(out, overwrite=overwrite)
    write_run_config(out_dir, run_config)
    config_json = json.dumps(config.classic_dict(), sort_keys=True)
    train, holdout, _ = _prepared(config.seed, config.num_clients, config.holdout_fraction)
    model_factory = functools.partial(make_linear_model, train.x.shape[1], train.num_classes, seed=config.seed)
    utility = TorchModelUtility(model_factory(), holdout.x, holdout.y, metric=config.utility)
    initial = initial_model_arrays(model_factory, config.seed)
    rows: list[dict] = []
    def main(grid: Grid) -> None:
        for attack in config.attacks:
            started = time.perf_counter()
            strategy = ValuingStrategy(
                fedavg_without_evaluation(), utility, run_dir=str(out_dir / attack),
                sampler=PartitionSampler(config.num_clients, seed=config.seed), seed=config.seed,
                valuation=ValuationSettings(methods=("ads", "loo")),
                # The ledger's "noisy" column marks the client known to misbehave.
                books=BookSettings(flows=True, noisy_clients=set() if attack == "none" else {config.attacker}),
                intake=IntakeSettings(claims=claim_review(config) if attack == "inflated-count-reviewed" else None),
                run=RunSettings(run_config={"attack": attack, "behaviour": repr(attacker_behaviour(attack, config)),
                                            **config.classic_dict()}),
            )
            with seeded_server_generators(config.seed):  # the checkpoint's saved global state is the seed's too
                strategy.start(grid, initial, num_rounds=config.rounds, timeout=config.round_timeout,
                               train_config=ConfigRecord(train_config(
                                   learning_rate=config.learning_rate, local_epochs=config.local_epochs,
                                   seed=config.seed, data_key=attack)))
            run = load_run(out_dir / attack)
            rows.append(summarize(run.ledger, run.rounds, attack, config.attacker, config.source))
            if on_run is not None:
                on_run(f"{attack}: {config.rounds} rounds in {time.perf_counter() - started:.1f}s")

    loader = functools.partial(attack_client_data, config_json=config_json)
    serve(make_client_app(loader, model_factory), main, num_supernodes=config.num_clients,
          engine=config.engine)
    table = pd.DataFrame(rows)
    baseline = table.loc[table["attack"] == "none", "accuracy"]
    table.insert(table.columns.get_loc("accuracy") + 1, "accuracy_change",
                 table["accuracy"] - float(baseline.iloc[0]) if len(baseline) else np.nan)
    table.to_csv(out_dir / "attacks.csv", index=False)
    return table


def format_table(table: pd.DataFrame) -> str:
    """The table as printed: attacker vs honest mean per book, accuracy and its change."""
    return table.to_string(index=False, float_format=lambda v: f"{v:.4g}")


def run_study(config: AttacksConfig, out, *, on_run=None, overwrite: bool = False) -> pd.DataFrame:
    """The study (:mod:`.study`): every run, then totals.csv, runs.csv, gains.csv, honest_cost.csv
    and (with ``group-split``) shells.csv in ``out``; returns the gains table."""
    out_dir = prepare_run_dir(out, overwrite=overwrite)
    write_run_config(out_dir, {"simulation": "attacks", **config.as_dict(), "versions": package_versions()})
    attacks = [a for a in config.attacks if a != GROUP_SPLIT]
    if attacks and "none" not in attacks:  # every gain is against the honest run
        config = dataclasses.replace(config, attacks=("none", *config.attacks))
    by_size: dict[int, list] = {}
    for run in study_runs(config):
        by_size.setdefault(len(run.plan.participants), []).append(run)
    done = [finished for runs in by_size.values() for finished in run_group(config, runs, out_dir, on_run)]
    table = pd.DataFrame()
    if done:
        totals, runs = run_frames(done, study_totals(config))
        table = gains_table(totals, runs)
        totals.to_csv(out_dir / "totals.csv", index=False)
        runs.to_csv(out_dir / "runs.csv", index=False)
        table.to_csv(out_dir / "gains.csv", index=False)
        honest_cost(totals).to_csv(out_dir / "honest_cost.csv", index=False)
    if GROUP_SPLIT in config.attacks:
        shells = pd.concat([shell_groups_table(config.dataset, seed, config.shells)
                            for seed in range(config.seed, config.seed + config.seeds)], ignore_index=True)
        shells.to_csv(out_dir / "shells.csv", index=False)
        if on_run is not None:
            on_run(f"group-split: {len(config.shells)} splits of the broker over {config.seeds} seeds")
    return table


def format_study(table: pd.DataFrame) -> str:
    """The gains table as printed: per attack and book, the gain without and with the defences."""
    if table.empty:
        return "(no federated attack run; see shells.csv)"
    shown = table[["partition", "strategy", "attack", "book", "gain", "defended_gain", "paid", "defended_paid",
                   "accuracy_change"]]
    return shown.to_string(index=False, float_format=lambda v: f"{v:.3g}")


def cli_main(config: AttacksConfig, options) -> int:
    """``fedvalue run attacks``: one run per attack and the table of what each got."""
    table = run_attacks(config, options.out, overwrite=options.overwrite, on_run=options.say())
    print(format_study(table) if config.is_study else format_table(table))
    print(f"done in {options.elapsed():.1f}s" + (f"; ledgers in {options.out}" if options.out else ""))
    return 0


def audit_from_run(saved: dict) -> dict:
    """What the audit rebuilds of one study run from its run.json: the utility (the seed's
    held-out sample), the inner strategy's aggregation for a robust rule (replayed from the
    record) and each round's participants (every identity, every round)."""
    from strategies import replay_aggregator

    study = saved.get("study")
    if not isinstance(study, dict):
        raise ValueError("run.json: not a run of the attack study (no 'study' settings); the single-seed "
                         "measurement's runs are audited without their utility")
    config = saved_config(AttacksConfig, saved, strict=False)
    config = dataclasses.replace(config, engine=dataclasses.replace(config.engine, ray_address=None))
    check_study(config)
    run = StudyRun(str(study["partition"]), str(study["strategy"]), int(study["seed"]),
                   plan_of(str(study["attack"]), config.num_clients, config.attacker, config.colluders))
    if run.strategy not in STRATEGIES or run.scheme not in PARTITIONS:
        raise ValueError(f"run.json: unknown strategy or partition {run.strategy!r}, {run.scheme!r}")
    rebuilt = {"utility": utility_of(config, run), "sampled": lambda t: list(run.plan.participants)}
    if run.strategy != "fedavg":
        rebuilt["replay"] = replay_aggregator(STRATEGIES[run.strategy])
    return rebuilt


HELP = {
    "attacks": "attacks to run, comma-separated (--attack names one). The single-seed measurement's: "
               + ", ".join(ATTACKS) + " (none = the honest baseline). The study's (any of these, or any study "
               "option, runs the study): " + ", ".join(a for a in PLAIN_ATTACKS if a not in ATTACKS)
               + ", sybil-split-K, sybil-replica-K (K >= 2 identities), " + GROUP_SPLIT + " (the KNN-ADS market's "
               "broker), the adaptive attacks, each a margin M >= 0 outside one defence's threshold in its own units "
               "(a sweep is several names): adaptive-cluster-K@M (K replicas (1+M) x the clustering threshold apart), "
               "adaptive-replay@M (the last step turned (1+M) x the replay threshold off its line), adaptive-split-K@M "
               "(overlapping shards, each claim true, claims adding up to (1+M) x the whole), adaptive-crafted@M "
               "(a crafted update at 1/(1+M) of --norm-cap, which it needs), and a ClientBehaviour of your own as module:callable (imported from the working "
               "directory; client --attacker plays it; its gain is in gains.csv)",
    "dataset": "study: digits (embedded) or fashion-mnist (Debian's dataset-fashion-mnist)",
    "train_examples": "study, fashion-mnist: class-balanced training images shared by the clients (0 = all 60,000)",
    "holdout_examples": "study, fashion-mnist: class-balanced test images of the server's utility (0 = all 10,000)",
    "partitions": "study: client data, comma-separated: iid, dirichlet",
    "dirichlet_alpha": "study: concentration of the Dirichlet label skew",
    "seeds": "study: seeds run (seed, seed+1, ...)",
    "strategies": "study: inner strategies, comma-separated: fedavg, fedmedian, fedtrimmedavg",
    "defences": "study: 1 books the defences (ads_defended, loo_defended, tracin_outflow_defended, flags) beside "
                "the plain books; 2 also aggregates only the near-duplicate clusters' representatives and no "
                "flagged free-rider; 0: none",
    "norm_cap": "study, defences: clip updates to this multiple of the round's median norm in the defended game "
                "(0 = off); adaptive-crafted@M stays within it",
    "valuation_budget": "study: coalition evaluations per round for ADS and LOO together (unset = no budget)",
    "replica_noise": "sybil-replica-K: noise each identity adds to every entry (0 = exact copies)",
    "colluders": "colluding-free-riders: clients in the ring (the attacker and the next ones)",
    "colluder_spread": "colluding-free-riders: size of each member's perturbation relative to the replayed step",
    "honest_rounds": "dynamic-free-rider: rounds it trains honestly before free-riding",
    "craft_budget": "crafted-update: the crafted update stays within this multiple of its honest update's norm",
    "craft_steps": "crafted-update: Adam steps of the crafting",
    "shells": "group-split: numbers of shell groups the broker splits into, comma-separated",
    "fixed_second_order": "study: every run also books ads_fixed_second_order, the Shapley value of the fixed-weight "
                          "round game's second-order expansion, u_k·(g + ½ H U), which pays identities whose claims "
                          "and weighted updates add up what one client is paid, and with --defences 1 or 2 "
                          "ads_fixed_second_order_defended (flagged free-riders 0, a near-duplicate cluster one "
                          "claim); both are books of gains.csv. Needs --utility neg_loss (refused otherwise; it is "
                          "not set for you: every book of the study is then valued under -loss) and --strategies "
                          "fedavg",
    "duplicate_median_fraction": "study, defences: cluster identities at kappa x the round's median pairwise update "
                                 "distance (relative to norms) instead of the fixed 0.05 alone (0 = off; e.g. 0.25, "
                                 "the value fixed from attack-free rounds)",
}

#: This experiment's entry in ``fedvalue run`` (:mod:`simulations.cli.registry`).
SIMULATION = Simulation("attacks", AttacksConfig, cli_main, out_optional=True, audit_from_run=audit_from_run,
                        help=HELP)
