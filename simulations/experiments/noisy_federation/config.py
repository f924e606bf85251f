"""The ``noisy-federation`` benchmark's settings: every number an option, checked before anything runs.

The defaults are the **quick configuration**: the 784-64-10 MLP, 30 rounds, both flip
probabilities (p = 1.0 and 0.5), every policy, a validation split of 1,000 images and 100
coalition evaluations a round (MC-ADS). One seed is 23 cells (the clean federation and 11
policies under each p) and takes 6 to 10 minutes on the shared 2-core machine the table in
docs/reproductions.md was measured on, so under 20 minutes a seed; ``--seeds 5`` under an hour.
At 30 rounds every policy, random sampling included, is still rising slowly.

The **full configuration** (``--rounds 100 --final-window 10 --models mlp,cnn
--validation-examples 2000 --valuation-budget 200``) is meant to let random sampling plateau and adds the
LeNet-5-style CNN; about 25 minutes a seed for the MLP alone on that machine, more for the CNN.

The **regimes of bad clients**: ``bad_kind`` says what the ``noisy_fraction`` clients do (label flips
by default; :data:`BAD_KINDS`), ``extra_bad_kind`` mixes a second kind in, ``mavericks`` gives classes
whole to single honest clients, and ``coalition_rule`` is the round game the valuing policies value
with (``python -m bench.regimes`` runs them all).

Tuning: the learning rate 0.1 was picked on a pilot of seed 0's clean, random and oracle runs;
the value-driven policy's options (``elimination_*``, ``weighting_*``), GreedyFed's memory,
``trimmed_beta``, ``krum_malicious`` and ``poc_candidates`` on seed 100; the value-guard policy's
(``guard_*``) on seed 100 in four regimes, do-no-harm first (``python -m bench.regimes.tuning``). Report
other seeds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from fedvalue import COALITION_RULES, EXPANSION_METHODS
from simulations.datasets import MODELS, check_hidden
from simulations.runner import (
    EngineSettings,
    check_devices,
    check_engine_keys,
    check_integers,
    check_number,
    check_numbers,
    flat_settings,
)

#: Every policy the benchmark knows (:mod:`.policies` builds them), in the order tables list them.
POLICY_NAMES = ("random", "power-of-choice", "greedyfed", "value-ucb", "value-guard", "topk-ads", "topk-loo",
                "value-weighted", "trimmed-mean", "median", "krum", "oracle")
#: What the ``noisy_fraction`` clients do (``bad_kind``, :mod:`.data` builds each kind's behaviour):
#: label noise (symmetric flips, class-pair swaps), corrupted inputs, free-riding (the received model,
#: exactly or plus noise), a stale model, scaled updates (sign-flipped, boosted), noisy updates; or no
#: bad client at all (the do-no-harm regime).
BAD_KINDS = ("label-flip", "class-swap", "feature-noise", "free-rider", "noisy-free-rider", "stale-replayer",
             "sign-flip", "boosted-update", "noisy-update", "none")
#: Kinds whose strength is the flip probability p (per label, per example); the others have none.
KINDS_WITH_STRENGTH = ("label-flip", "class-swap", "feature-noise")
#: Kinds of bad client mixed in besides the ``bad_kind`` ones (``extra_bad_kind``), at full strength.
EXTRA_BAD_KINDS = ("none",) + tuple(kind for kind in BAD_KINDS if kind != "none")
UTILITIES = ("accuracy", "neg_loss")
ADS_ESTIMATORS = ("auto", "exact", "mc", "tmc", "antithetic")
#: The value-guard policy's estimators: those, and the round game's expansions (no coalition evaluated).
GUARD_ESTIMATORS = ADS_ESTIMATORS + EXPANSION_METHODS
WEIGHTING_KINDS = ("positive", "softmax")
#: What the value-guard policy aggregates: FedAvg × a value weighting, or plain FedAvg of the clients it samples.
GUARD_WEIGHTINGS = WEIGHTING_KINDS + ("none",)
#: What the value-ucb policy aggregates of the clients it samples.
ELIMINATION_ACCEPTANCE = ("value-weighted", "all")
#: Label skew by Flower Datasets' DirichletPartitioner, or none.
PARTITIONS = ("dirichlet", "iid")


@dataclass
class NoisyFederationConfig:
    """Every number of the benchmark (each is a ``fedvalue run noisy-federation`` option)."""

    seed: int = 0
    seeds: int = 1
    policies: tuple[str, ...] = POLICY_NAMES
    flip_probabilities: tuple[float, ...] = (1.0, 0.5)
    noisy_fraction: float = 0.5
    bad_kind: str = "label-flip"
    extra_bad_kind: str = "none"
    extra_bad_fraction: float = 0.0
    mavericks: int = 0
    num_clients: int = 100
    clients_per_round: int = 10
    rounds: int = 30
    final_window: int = 5
    partition: str = "dirichlet"
    dirichlet_alpha: float = 0.5
    validation_examples: int = 1000
    test_examples: int = 0
    models: tuple[str, ...] = ("mlp",)
    hidden: tuple[int, ...] = (64,)
    local_epochs: int = 1
    learning_rate: float = 0.1
    batch_size: int = 32
    utility: str = "neg_loss"
    ads_method: str = "mc"
    coalition_rule: str = "renormalized"
    valuation_budget: int = 100
    topk: int = 5
    poc_candidates: int = 20
    greedy_memory: float | None = None
    elimination_confidence: float = 0.5
    elimination_min_rounds: int = 1
    elimination_acceptance: str = "value-weighted"
    elimination_warm_start: int = 0
    elimination_selection: str = "ucb"
    weighting_kind: str = "positive"
    weighting_temperature: float | None = None
    guard_explore: float = 0.2
    guard_selection: str = "ucb"
    guard_min_rounds: int = 2
    guard_weighting_kind: str = "softmax"
    guard_weighting_temperature: float | None = 1.0
    guard_ads_method: str = "second-order"
    guard_coalition_rule: str = "fixed-weight"
    trimmed_beta: float = 0.2
    krum_malicious: int = 1
    engine: EngineSettings = EngineSettings()
    device: str = "cpu"
    round_timeout: float = 600.0
    query_timeout: float = 120.0

    #: The engine settings the benchmark takes (a local Ray only), flat in run.json and on the command line.
    ENGINE_KEYS: ClassVar[tuple[str, ...]] = ("num_cpus_per_client", "num_gpus_per_client", "max_parallel_clients")

    def as_dict(self) -> dict:
        return flat_settings(self)


#: Help of the options (``fedvalue run noisy-federation --help``).
HELP = {
    "seed": "first seed: the benchmark runs seeds seed, seed+1, ..., seed+seeds-1",
    "seeds": "number of seeds",
    "policies": f"policies to run, comma-separated, from {','.join(POLICY_NAMES)}",
    "flip_probabilities": "label-flip probabilities p of the noisy clients, one federation each (comma-separated); "
                          f"the strength of the bad kinds {', '.join(KINDS_WITH_STRENGTH)} (per label, per example)",
    "noisy_fraction": "share of the clients of the bad kind (the ones that flip labels by default)",
    "bad_kind": f"what the noisy_fraction clients do: {', '.join(BAD_KINDS)} (docs/reproductions.md, "
                "'Regimes of bad clients'; none: every client honest, the do-no-harm regime)",
    "extra_bad_kind": f"a further kind of bad client mixed in: {', '.join(EXTRA_BAD_KINDS)} (a free-rider replies the "
                      "model it got, untrained, and claims its example count)",
    "extra_bad_fraction": "share of the clients of the extra bad kind (drawn among those not of the bad kind)",
    "mavericks": "classes each held by one honest client alone (a maverick: its partition gets every example of "
                 "the class), drawn among the clients that are not bad; 0: none",
    "final_window": "final accuracy is the mean test accuracy of this many last rounds (the targets' base too)",
    "validation_examples": "the server's validation split, class-balanced, drawn from the training images "
                           "(the utility values on it; no client holds it)",
    "test_examples": "test images accuracy is reported on (0: all 10,000; never used to value or decide)",
    "models": f"models to run, comma-separated, from {','.join(MODELS)}",
    "hidden": "the MLP's hidden layer sizes",
    "utility": f"the valuation's utility on the validation split: {', '.join(UTILITIES)}",
    "ads_method": f"within-round ADS estimator: {', '.join(ADS_ESTIMATORS)}",
    "coalition_rule": f"the round game's coalition rule the valuing policies value with: {', '.join(COALITION_RULES)} "
                      "(docs/design.md)",
    "valuation_budget": "coalition evaluations per round (ADS and LOO together) for the valuing policies",
    "topk": "k of the top-k acceptance policies",
    "poc_candidates": "d, the candidates Power-of-Choice asks for their loss per round",
    "greedy_memory": "GreedyFed's exponential average of values (unset: the plain mean)",
    "elimination_confidence": "c of the value-ucb sampler (rule a client out when mean + c/sqrt(n) < 0)",
    "elimination_min_rounds": "valued rounds before the value-ucb sampler may rule a client out",
    "elimination_warm_start": "1: the value-ucb sampler goes round-robin through every client first; 0: not",
    "elimination_selection": "how the value-ucb sampler draws among the clients not ruled out: uniform, "
                             "or ucb (the largest upper bounds r + c/sqrt(n))",
    "elimination_acceptance": "what the value-ucb policy aggregates: value-weighted (FedAvg x the "
                              "weighting rule) or all (plain FedAvg of the clients it samples)",
    "weighting_kind": f"value weighting's rule: {', '.join(WEIGHTING_KINDS)}",
    "weighting_temperature": "temperature of the softmax value weighting",
    "guard_explore": "share of the value-guard policy's slots drawn uniformly among every client, ruled out or not",
    "guard_selection": "how the value-guard policy fills its other slots among the clients not ruled out: uniform, or "
                       "ucb (the largest upper bounds r + c/sqrt(n))",
    "guard_min_rounds": "valued rounds before the value-guard policy may rule a client out (its probation)",
    "guard_weighting_kind": f"the value-guard policy's value weighting: {', '.join(GUARD_WEIGHTINGS)} (none: plain "
                            "FedAvg of the clients it samples)",
    "guard_weighting_temperature": "temperature of the value-guard policy's softmax weighting",
    "guard_ads_method": f"the value-guard policy's within-round estimator: {', '.join(GUARD_ESTIMATORS)} "
                        "(first- and second-order: the round game's expansion, neg_loss utility only)",
    "guard_coalition_rule": f"the round game the value-guard policy values with: {', '.join(COALITION_RULES)}",
    "trimmed_beta": "fraction cut at each end per coordinate by the trimmed mean",
    "krum_malicious": "f, the Byzantine clients Krum tolerates (it needs clients_per_round > 2f + 2)",
    "device": "torch device of the server's valuation and test evaluation and of the clients' training ('cuda' where "
              "there is one; it needs --num-gpus-per-client > 0, e.g. 0.1: ten clients share a GPU)",
}


def _check_choices(config: NoisyFederationConfig) -> None:
    for name, choices in (("policies", POLICY_NAMES), ("models", MODELS)):
        values = getattr(config, name)
        unknown = [v for v in values if v not in choices]
        if not values or unknown or len(set(values)) != len(values):
            raise ValueError(f"{name}: expected distinct names from {list(choices)}; got {list(values)}.")
    for name, choices in (("bad_kind", BAD_KINDS), ("extra_bad_kind", EXTRA_BAD_KINDS), ("utility", UTILITIES),
                          ("ads_method", ADS_ESTIMATORS), ("coalition_rule", COALITION_RULES),
                          ("weighting_kind", WEIGHTING_KINDS), ("guard_weighting_kind", GUARD_WEIGHTINGS),
                          ("guard_ads_method", GUARD_ESTIMATORS), ("guard_coalition_rule", COALITION_RULES),
                          ("elimination_acceptance", ELIMINATION_ACCEPTANCE),
                          ("elimination_selection", ("uniform", "ucb")), ("guard_selection", ("uniform", "ucb")),
                          ("partition", PARTITIONS)):
        if getattr(config, name) not in choices:
            raise ValueError(f"{name}: expected one of {list(choices)}; got {getattr(config, name)!r}.")


def _check_fractions(config: NoisyFederationConfig) -> None:
    if not config.flip_probabilities:
        raise ValueError("flip_probabilities: expected at least one flip probability; got none.")
    for p in config.flip_probabilities:
        check_number("flip_probabilities", p, low=0.0, high=1.0, low_open=True)
    check_number("noisy_fraction", config.noisy_fraction, low=0.0, high=1.0, high_open=True)
    check_number("extra_bad_fraction", config.extra_bad_fraction, low=0.0, high=1.0)
    if config.noisy_fraction + config.extra_bad_fraction >= 1:
        raise ValueError(f"noisy_fraction, extra_bad_fraction: expected a sum below 1 (the oracle trains the clean "
                         f"clients); got {config.noisy_fraction} + {config.extra_bad_fraction}.")
    if (config.extra_bad_kind == "none") != (config.extra_bad_fraction == 0):
        raise ValueError(f"extra_bad_kind, extra_bad_fraction: give both (a kind and a share > 0) or neither; got "
                         f"{config.extra_bad_kind!r} and {config.extra_bad_fraction}.")
    if config.bad_kind not in KINDS_WITH_STRENGTH and len(config.flip_probabilities) > 1:
        raise ValueError(f"flip_probabilities: the bad kind {config.bad_kind!r} has no strength p, so one federation "
                         f"per seed: give one value (e.g. 1); got {list(config.flip_probabilities)}.")
    check_number("trimmed_beta", config.trimmed_beta, low=0.0, high=0.5, high_open=True)
    check_number("greedy_memory", config.greedy_memory, low=0.0, high=1.0, high_open=True, none_ok=True)


def check_config(config: NoisyFederationConfig) -> None:
    """ValueError naming the first bad field, before anything is written or started."""
    check_integers(config, ("seeds", "num_clients", "clients_per_round", "rounds", "local_epochs", "batch_size",
                            "final_window", "validation_examples", "valuation_budget", "topk", "poc_candidates",
                            "elimination_min_rounds", "guard_min_rounds"))
    check_integers(config, ("seed", "test_examples", "krum_malicious", "mavericks"), minimum=0)
    check_numbers(config, ("learning_rate", "dirichlet_alpha", "elimination_confidence", "round_timeout",
                           "query_timeout"))
    _check_choices(config)
    _check_fractions(config)
    check_hidden(config.hidden)
    per_round = config.clients_per_round
    if per_round > config.num_clients:
        raise ValueError(f"clients_per_round: expected at most num_clients={config.num_clients}; got {per_round}.")
    if config.mavericks > 9:
        raise ValueError(f"mavericks: expected at most 9 of the 10 classes held by a single client; got "
                         f"{config.mavericks}.")
    if config.final_window > config.rounds:
        raise ValueError(f"final_window: expected at most rounds={config.rounds}; got {config.final_window}.")
    if config.topk > per_round:
        raise ValueError(f"topk: expected at most clients_per_round={per_round}; got {config.topk}.")
    if not per_round <= config.poc_candidates <= config.num_clients:
        raise ValueError(f"poc_candidates: expected d in [clients_per_round, num_clients] = [{per_round}, "
                         f"{config.num_clients}]; got {config.poc_candidates}.")
    if "krum" in config.policies and per_round <= 2 * config.krum_malicious + 2:
        raise ValueError(f"krum_malicious: Krum needs clients_per_round > 2f + 2; got f={config.krum_malicious} "
                         f"with {per_round} clients a round.")
    if config.valuation_budget < per_round + 1:
        raise ValueError(f"valuation_budget: expected at least clients_per_round + 1 = {per_round + 1} evaluations "
                         f"(leave-one-out's); got {config.valuation_budget}.")
    if isinstance(config.elimination_warm_start, bool) or config.elimination_warm_start not in (0, 1):
        raise ValueError(f"elimination_warm_start: expected 1 (round-robin through every client first) or 0; got "
                         f"{config.elimination_warm_start!r}.")
    for prefix in ("", "guard_"):
        kind = getattr(config, prefix + "weighting_kind")
        temperature = getattr(config, prefix + "weighting_temperature")
        check_number(prefix + "weighting_temperature", temperature, low=0.0, low_open=True, none_ok=True)
        if (kind == "softmax") != (temperature is not None):
            raise ValueError(f"{prefix}weighting_temperature: the softmax weighting needs one, the others "
                             f"none; got {temperature!r} with {prefix}weighting_kind={kind!r}.")
    check_number("guard_explore", config.guard_explore, low=0.0, high=1.0, high_open=True)
    expands = config.guard_ads_method in EXPANSION_METHODS
    if "value-guard" in config.policies and expands and config.utility != "neg_loss":
        raise ValueError(f"guard_ads_method: {config.guard_ads_method!r} expands the round game and needs the "
                         f"differentiable utility neg_loss; got utility={config.utility!r}.")
    check_engine_keys(config)
    check_devices(config.device, config.engine.num_gpus_per_client)
