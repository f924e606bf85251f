"""The strategy's half of one kind of round book, as one interface: a :class:`RoundHook`.

A kind of book (:mod:`fedvalue.rounds.kinds`) books rows from the round record alone, so that the
audit books them again from the saved record. What it needs beyond the replies comes from its hook,
at fixed points of a round, which the round (:class:`strategies.train_round.TrainRound`) calls for
every hook alike, in the registry's order (:mod:`strategies.hooks.registry`):

1. when the run's books open: :meth:`RoundHook.settings` (what the round settings note of it) and,
   resuming, :meth:`RoundHook.resume_from` and :meth:`RoundHook.restore` (its checkpointed state);
2. configuring the round: :meth:`RoundHook.train_config` (what the clients are asked for) and
   :meth:`RoundHook.start_round` (A_{t−1}; the clients not training, for a hook that queries them);
3. the round's record, made once after intake: :meth:`RoundHook.note` (record fields it fills);
4. after valuation, before acceptance: :meth:`RoundHook.inputs` (what its book reads, computed from
   the record by the code the audit runs too) and :meth:`RoundHook.offer` (what the acceptance
   policy may read of it, lazily);
5. after acceptance: :meth:`RoundHook.factors` (weight factors for the accepted replies, if any);
6. before the round commits: :meth:`RoundHook.before_commit`; once the run ends: :meth:`RoundHook.finish`.

Every method has a default that does nothing, so a hook overrides only its own points. A hook
never imports the round: it reads the round in flight through :class:`RoundView`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord
from flwr.serverapp import Grid

from fedvalue.rounds.booking import BookedRound
from fedvalue.run.archive import RoundRecord
from fedvalue.run.ledger_tables import LedgerWriter
from fedvalue.valuation.round_game import Aggregator, RoundValuation
from fedvalue.valuation.settings import RENORMALIZED
from strategies.book_settings import BookSettings
from strategies.acceptance_policy import Acceptance


@dataclass(frozen=True)
class HookContext:
    """What a hook's factory is given when the strategy is built: the run's books, its acceptance
    policy, the inner strategy's class name and whether it aggregates by FedAvg's weighted mean,
    whether the queries to idle clients carry the train config's data-key (so that a client of an
    engine serving several runs answers from this run's data), and the run's seed."""

    books: BookSettings
    acceptance: Acceptance
    strategy_name: str
    weighted_mean: bool
    query_data_key: bool = False
    #: How the round game aggregates a coalition (:data:`fedvalue.valuation.settings.COALITION_RULES`).
    coalition_rule: str = RENORMALIZED
    #: The run's seed (what a hook draws is derived from it: the flows' projection).
    seed: int = 0


@dataclass(frozen=True)
class IdleClients:
    """The clients a hook may query while a round trains (TracIn's gradient queries): through
    ``grid``, every connected partition (``partitions()``: partition -> node, asked of the node
    directory when first needed) whose node is not in ``busy``, each with a message of
    ``query_type(node)``, waiting at most ``timeout`` seconds in all, at most ``batch`` messages in flight
    at a time (None: all at once)."""

    grid: Grid
    partitions: Callable[[], Mapping[int, int]]
    busy: frozenset[int]
    timeout: float
    query_type: Callable[[int], str]
    batch: int | None = None


class RoundView(Protocol):
    """What a hook reads of the round in flight."""

    server_round: int
    #: A_{t−1} as arrays.
    start_arrays: Mapping[str, np.ndarray]
    #: The valid replies (:class:`strategies.replies.ClientReply`), in reply order.
    ok: Sequence
    #: Client -> the inference gradient its reply carried (:class:`strategies.replies.InferenceGradient`).
    gradients: Mapping[Hashable, object]
    #: The round record (as made after intake; accepted clients added after acceptance).
    record: RoundRecord
    valuation: RoundValuation | None
    #: Agg_t by the inner strategy's own code (None: the weighted mean).
    aggregator: Aggregator | None

    def rng(self) -> np.random.Generator:
        """A fresh generator of the round's own stream (``[seed, round]``)."""


class RoundHook:
    """The strategy's half of one kind of round book (module docstring). ``offers`` names what its
    :meth:`offer` gives an acceptance policy (:class:`strategies.policies.acceptance.AcceptInputs`)."""

    offers: Collection[str] = frozenset()

    def settings(self) -> Mapping[str, object]:
        """Fields of the run's :class:`fedvalue.run.settings.RoundSettings` this kind notes (its
        ``notes`` by kind name for a kind registered outside the package)."""
        return {}

    def resume_from(self, run_dir, committed_rounds: int) -> None:
        """A resumed run continues after ``committed_rounds`` committed rounds of ``run_dir``."""

    def saved(self) -> Mapping[str, object]:
        """The hook's state a checkpoint keeps, as data, by key (keys unique across hooks)."""
        return {}

    def restore(self, saved: Mapping[str, object]) -> None:
        """Take back the state a checkpoint kept (every hook's keys: read your own)."""

    def train_config(self, config: ConfigRecord) -> ConfigRecord:
        """The round's train config with what this kind asks of the clients."""
        return config

    def start_round(self, arrays: ArrayRecord, start_arrays: Mapping[str, np.ndarray],
                    idle: IdleClients | None) -> None:
        """The round starts from A_{t−1} (``arrays`` as sent, ``start_arrays`` as read); ``idle``
        reaches the clients not training (None: a round not configured through a grid)."""

    def note(self, round: RoundView) -> Mapping[str, object]:
        """Fields of the round record this kind fills (e.g. ``references``), after intake."""
        return {}

    def inputs(self, round: RoundView) -> object | None:
        """What this kind's book reads beside the record (``book_round(inputs={name: ...})``), from
        the round's record and valuation; None: nothing."""
        return None

    def offer(self, round: RoundView, inputs: object | None) -> Mapping[str, Callable[[], object]]:
        """What an acceptance policy may read of this kind, by name, each computed only if read."""
        return {}

    def factors(self, round: RoundView, accepted: set, inputs: object | None) -> tuple[object | None,
                                                                                         Mapping | None]:
        """(``inputs`` as the book reads them once the policy chose, factors w_u the accepted
        replies' weights are multiplied by or None)."""
        return inputs, None

    def before_commit(self, round: RoundView, books: BookedRound, ledger: LedgerWriter | None) -> None:
        """The round is booked and about to commit (its tables may take rows of this kind now)."""

    def finish(self, final_arrays: ArrayRecord, idle: IdleClients, ledger: LedgerWriter | None) -> None:
        """The run ended at ``final_arrays``."""


def merged_fields(fields: Iterable[Mapping[str, object]]) -> dict:
    """The fields several hooks set (of the round settings or the round record), in order: a field two
    hooks set as mappings merges by key (``notes``, ``references``); any other is the last one's."""
    merged: dict = {}
    for hook_fields in fields:
        for name, value in hook_fields.items():
            both = isinstance(value, Mapping) and isinstance(merged.get(name), Mapping)
            merged[name] = {**merged[name], **value} if both else value
    return merged
