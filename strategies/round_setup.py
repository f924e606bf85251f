"""What a round is made of before its replies arrive: the run's :class:`RoundSetup` (its round settings,
utility, acceptance policy, hooks, node directory and claim review, made once when the books open),
the round's start A_{t−1} (:class:`RoundStart`) and what configuring it decided
(:class:`ConfiguredRound`); :class:`strategies.train_round.TrainRound` is built from them and the replies."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from flwr.app import ArrayRecord, Message

from fedvalue.run.settings import BY_STRATEGY, WEIGHTED_MEAN, RoundSettings
from fedvalue.valuation.round_game import ArraysUtility
from fedvalue.valuation.settings import ValuationSettings
from strategies.acceptance_policy import Acceptance
from strategies.arrays import arrays_to_numpy
from strategies.round_hook import HookContext, RoundHook, merged_fields
from strategies.server_log import ServerLog


@dataclass(frozen=True)
class RoundStart:
    """A_{t−1} as the books read it (``arrays``) and the model's own dtypes (``model_dtypes``,
    from the first state seen): an aggregation may turn an integer buffer (a batch counter) into
    floats, while the clients' models keep it integer."""

    arrays: dict
    model_dtypes: dict

    @classmethod
    def of(cls, arrays: ArrayRecord, previous: RoundStart | None) -> RoundStart:
        start = arrays_to_numpy(arrays)
        dtypes = None if previous is None else previous.model_dtypes
        return cls(start, dtypes or {k: v.dtype for k, v in start.items()})


@dataclass(frozen=True)
class ConfiguredRound:
    """What configuring a round decided, for taking its replies in: A_{t−1} (``start``), the nodes
    sent an instruction (``targets``) and the instructions (``sent``: each reply answers one), and
    the partitions the sampler chose from when some registered nodes were gone (``available``)."""

    start: RoundStart
    targets: list[int]
    sent: list[Message]
    available: list[int] | None = None


@dataclass(frozen=True)
class RoundSetup:
    """What every round of a run is taken in, valued and booked with, fixed when its books open.

    ``settings`` are the run's :class:`fedvalue.run.settings.RoundSettings` (methods, estimator,
    seed, weight key, flows, how it aggregates, what its books note); ``hooks`` the books' hooks by
    kind name; ``node_to_client`` which node holds which partition (the node directory's own mapping,
    which it keeps current); ``claims`` the claim review (or None); ``log`` what the rounds say in the
    server's log;
    ``save_records``: the audit will replay the inner strategy's aggregation from the records.
    """

    settings: RoundSettings
    utility: ArraysUtility
    acceptance: Acceptance
    hooks: Mapping[str, RoundHook]
    node_to_client: Mapping[int, int]
    claims: object | None = None
    save_records: bool = True
    log: ServerLog = field(default_factory=lambda: ServerLog(()))

    @classmethod
    def of_run(cls, context: HookContext, utility: ArraysUtility, hooks: Mapping[str, RoundHook], *,
               valuation: ValuationSettings, seed: int, weighted_by_key: str, reject_non_finite: bool,
               node_to_client: Mapping[int, int], claims: object | None, save_records: bool) -> RoundSetup:
        """The setup of a run whose hooks were made from ``context`` (the inner strategy, how it
        aggregates, the books, the acceptance policy) and whose round records note: its valuation
        settings, seed, the strategy and how it aggregates, the weight key, flows, how non-finite
        replies are taken, the acceptance policy's marks and rule, whether the fixed-weight game's
        second-order expansion is booked, and what every hook notes of the run."""
        acceptance = context.acceptance
        noted = merged_fields(hook.settings() for hook in hooks.values())
        settings = RoundSettings(
            methods=tuple(valuation.methods), valuation=valuation.ads, seed=seed, strategy=context.strategy_name,
            aggregation=WEIGHTED_MEAN if context.weighted_mean else BY_STRATEGY, weighted_by_key=weighted_by_key,
            flows=context.books.flows, reject_non_finite=reject_non_finite, selection=acceptance.books_selection,
            acceptance=acceptance.recorded_acceptance, coalition_rule=context.coalition_rule,
            fixed_second_order=context.books.fixed_second_order, **noted)
        return cls(settings, utility, acceptance, hooks, node_to_client, claims, save_records,
                   ServerLog(settings.methods))
