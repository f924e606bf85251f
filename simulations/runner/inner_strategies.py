"""The inner Flower strategies a simulation can run (``--strategy``), with their parameters.

Each choice names the Flower strategy it builds and the configuration fields it reads;
a field set away from its default for a strategy that does not read it is refused
rather than silently ignored. Every choice is valued by the same round game: FedAvg and
FedProx as the weighted mean, every other strategy by its own ``aggregate_train`` on
copies of the replies and under the noise the round really drew
(:mod:`strategies.aggregation.counterfactual`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from flwr.clientapp.mod import adaptiveclipping_mod, fixedclipping_mod
from flwr.clientapp.typing import Mod
from flwr.serverapp.strategy import (
    Bulyan,
    DifferentialPrivacyClientSideAdaptiveClipping,
    DifferentialPrivacyClientSideFixedClipping,
    DifferentialPrivacyServerSideAdaptiveClipping,
    DifferentialPrivacyServerSideFixedClipping,
    FedAdagrad,
    FedAdam,
    FedAvg,
    FedAvgM,
    FedMedian,
    FedProx,
    FedTrimmedAvg,
    FedYogi,
    Krum,
    MultiKrum,
    QFedAvg,
    Strategy,
)

from simulations.runner.config_checks import check_integers, check_numbers

#: The configuration fields strategies read, with their defaults and help.
STRATEGY_PARAMETERS = {
    "proximal_mu": (0.01, "fedprox: weight μ of the proximal term (μ/2)‖w − w_global‖² in local training"),
    "trimmed_beta": (0.2, "fedtrimmedavg: fraction of the largest and of the smallest values cut per coordinate"),
    "num_malicious": (0, "krum, multikrum, bulyan: number f of malicious clients tolerated (bulyan needs "
                         "clients_per_round >= 4f + 3)"),
    "num_selected": (3, "multikrum: updates averaged after Krum scoring"),
    "q": (0.1, "qfedavg: fairness exponent q"),
    "noise": (1.0, "dp-*: noise multiplier of the Gaussian mechanism"),
    "clipping_norm": (1.0, "dp-*-fixed: clipping norm; dp-*-adaptive: initial clipping norm"),
    "target_clipped_quantile": (0.5, "dp-*-adaptive: quantile of update norms the clipping norm tracks"),
    "clip_norm_lr": (0.2, "dp-*-adaptive: learning rate of the clipping norm"),
    "clipped_count_stddev": (0.0, "dp-*-adaptive: std of the noised clipped count (0 = Flower's default)"),
}


@dataclass(frozen=True)
class StrategyChoice:
    """One ``--strategy`` value: how to build it from a config, which fields it reads, and the
    client mods its clients need."""

    build: Callable[..., Strategy]
    reads: tuple[str, ...] = ()
    client_mods: tuple[Mod, ...] = ()


class _DropSkippedEvaluationNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "Federated evaluation will be skipped" not in str(record.msg)


@contextmanager
def skipped_evaluation_unannounced() -> Iterator[None]:
    """Build strategies with ``fraction_evaluate=0.0`` without Flower's warning that federated
    evaluation is skipped: the simulations skip it on purpose (the server's utility is the
    evaluation), so the warning is noise the user did not cause."""
    logger, drop = logging.getLogger("flwr"), _DropSkippedEvaluationNotice()
    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)


def fedavg_without_evaluation() -> FedAvg:
    """FedAvg with federated evaluation off (the server values rounds on held-out data)."""
    with skipped_evaluation_unannounced():
        return FedAvg(fraction_evaluate=0.0)


def _adaptive(cls):
    def build(config, sampled: int) -> Strategy:
        return cls(fedavg_without_evaluation(), noise_multiplier=config.noise, num_sampled_clients=sampled,
                   initial_clipping_norm=config.clipping_norm, target_clipped_quantile=config.target_clipped_quantile,
                   clip_norm_lr=config.clip_norm_lr, clipped_count_stddev=config.clipped_count_stddev or None)
    return build


def _fixed(cls):
    def build(config, sampled: int) -> Strategy:
        return cls(fedavg_without_evaluation(), noise_multiplier=config.noise, clipping_norm=config.clipping_norm,
                   num_sampled_clients=sampled)
    return build


_ADAPTIVE = ("noise", "clipping_norm", "target_clipped_quantile", "clip_norm_lr", "clipped_count_stddev")
STRATEGIES: dict[str, StrategyChoice] = {
    "fedavg": StrategyChoice(lambda config, sampled: fedavg_without_evaluation()),
    "fedprox": StrategyChoice(lambda config, sampled: FedProx(fraction_evaluate=0.0, proximal_mu=config.proximal_mu),
                              ("proximal_mu",)),
    "fedavgm": StrategyChoice(lambda config, sampled: FedAvgM(fraction_evaluate=0.0, server_momentum=0.9)),
    "fedadam": StrategyChoice(lambda config, sampled: FedAdam(fraction_evaluate=0.0, eta=0.01)),
    "fedyogi": StrategyChoice(lambda config, sampled: FedYogi(fraction_evaluate=0.0, eta=0.01)),
    "fedadagrad": StrategyChoice(lambda config, sampled: FedAdagrad(fraction_evaluate=0.0, eta=0.01)),
    "fedmedian": StrategyChoice(lambda config, sampled: FedMedian(fraction_evaluate=0.0)),
    "fedtrimmedavg": StrategyChoice(
        lambda config, sampled: FedTrimmedAvg(fraction_evaluate=0.0, beta=config.trimmed_beta), ("trimmed_beta",)),
    "krum": StrategyChoice(
        lambda config, sampled: Krum(fraction_evaluate=0.0, num_malicious_nodes=config.num_malicious),
        ("num_malicious",)),
    "multikrum": StrategyChoice(
        lambda config, sampled: MultiKrum(fraction_evaluate=0.0, num_malicious_nodes=config.num_malicious,
                                          num_nodes_to_select=config.num_selected),
        ("num_malicious", "num_selected")),
    "bulyan": StrategyChoice(
        lambda config, sampled: Bulyan(fraction_evaluate=0.0, num_malicious_nodes=config.num_malicious),
        ("num_malicious",)),
    "qfedavg": StrategyChoice(
        lambda config, sampled: QFedAvg(client_learning_rate=config.learning_rate, q=config.q,
                                        train_loss_key="train-loss", fraction_evaluate=0.0),
        ("q",)),
    "dp-server-fixed": StrategyChoice(_fixed(DifferentialPrivacyServerSideFixedClipping), ("noise", "clipping_norm")),
    "dp-server-adaptive": StrategyChoice(_adaptive(DifferentialPrivacyServerSideAdaptiveClipping), _ADAPTIVE),
    "dp-client-fixed": StrategyChoice(_fixed(DifferentialPrivacyClientSideFixedClipping), ("noise", "clipping_norm"),
                                      (fixedclipping_mod,)),
    "dp-client-adaptive": StrategyChoice(_adaptive(DifferentialPrivacyClientSideAdaptiveClipping), _ADAPTIVE,
                                         (adaptiveclipping_mod,)),
}


def check_strategy(config, clients_per_round: int) -> None:
    """ValueError naming the first strategy setting that is out of range or set for a strategy
    that does not read it. ``config`` has a ``strategy`` field and the fields above."""
    if config.strategy not in STRATEGIES:
        raise ValueError(f"strategy: expected one of {list(STRATEGIES)}; got {config.strategy!r}.")
    reads = STRATEGIES[config.strategy].reads
    for name, (default, _) in STRATEGY_PARAMETERS.items():
        value = getattr(config, name)
        if value != default and name not in reads:
            users = sorted(s for s, choice in STRATEGIES.items() if name in choice.reads)
            raise ValueError(f"{name}: only strategies {users} read it; got {value!r} with strategy "
                             f"{config.strategy!r}. Drop the option or choose one of those strategies.")
    check_numbers(config, ("proximal_mu", "noise", "clipped_count_stddev"), zero_ok=True)
    check_numbers(config, ("clipping_norm", "clip_norm_lr", "q"))
    if not 0 <= config.trimmed_beta < 0.5:
        raise ValueError(f"trimmed_beta: expected a number in [0, 0.5); got {config.trimmed_beta!r}.")
    if not 0 < config.target_clipped_quantile < 1:
        raise ValueError(f"target_clipped_quantile: expected a number in (0, 1); got "
                         f"{config.target_clipped_quantile!r}.")
    check_integers(config, ("num_malicious",), minimum=0)
    check_integers(config, ("num_selected",))
    if config.strategy == "bulyan" and clients_per_round < 4 * config.num_malicious + 3:
        raise ValueError(f"num_malicious: bulyan needs clients_per_round >= 4 * num_malicious + 3 = "
                         f"{4 * config.num_malicious + 3}; got clients_per_round={clients_per_round}.")
    if config.strategy == "multikrum" and config.num_selected > clients_per_round:
        raise ValueError(f"num_selected: expected at most clients_per_round={clients_per_round}; got "
                         f"{config.num_selected}.")


def build_strategy(config, clients_per_round: int) -> Strategy:
    """The inner strategy ``config.strategy`` with ``config``'s parameters (checked first)."""
    check_strategy(config, clients_per_round)
    with skipped_evaluation_unannounced():
        return STRATEGIES[config.strategy].build(config, clients_per_round)


def client_mods(strategy: str) -> Sequence[Mod]:
    """Flower client mods the strategy's clients need (client-side DP)."""
    return STRATEGIES[strategy].client_mods

