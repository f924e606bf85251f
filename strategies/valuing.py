"""A Flower strategy that keeps books on every client around ANY inner strategy.

Composition, as Flower's ``dp_fixed_clipping`` wraps a strategy: ``self.strategy`` samples,
configures and aggregates; the wrapper records each round's realized state and values its clients
by the round game ([ADS] Remark 4.1, Eq. 10), v_t(S) = U(Agg_t(A_{t−1}; {reply_i : i ∈ S})) with
Agg_t the inner strategy's own ``aggregate_train``, never touching the live run
(:mod:`strategies.aggregation.counterfactual`). One round from its replies to its books is one
:class:`strategies.train_round.TrainRound` (take in → value → accept → delegate → book), built from
the run's :class:`strategies.train_round.RoundSetup` (made once, when the books open) and the
replies; the books beyond the replies are hooks registered beside their book kinds
(:mod:`strategies.hooks.registry`); the run directory and server state are :mod:`strategies.run_state`.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Iterable

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy
from flwr.supercore.logger import log

from fedvalue.run.settings import RunSettings
from fedvalue.valuation.round_game import ArraysUtility, RoundValuation
from fedvalue.valuation.settings import ValuationSettings
from strategies.acceptance_policy import AcceptAll, Acceptance
from strategies.book_settings import BookSettings
from strategies.hooks.registry import check_expansion, check_fixed_second_order, hook_context, run_hooks
from strategies.intake.round_intake import usable_evaluations
from strategies.policies.sampling import LearningSampler, Sampler, check_sampler, retarget
from strategies.round_hook import IdleClients
from strategies.round_setup import ConfiguredRound, RoundSetup, RoundStart
from strategies.run_state import RunInterrupted, RunState, ServerParts, run_json
from strategies.train_round import TrainRound
from strategies.valuing_settings import IntakeSettings, RoundCallback, settings_or_default, utility_of


class ValuingStrategy(Strategy):
    """Wraps ``strategy``; values every round's clients and writes the ledger.

    Parameters
    ----------
    strategy
        Any ``flwr.serverapp.strategy.Strategy``.
    utility
        U(arrays) -> float on held-out data (e.g. :class:`fedvalue.scoring.torch_utilities.TorchModelUtility`);
        may have a ``batch`` method taking a list of arrays dicts. Or the importable
        ``"module:callable"`` (no arguments) that builds U: run.json then names it, with the
        digest of the held-out data U scores, and ``fedvalue audit DIR --utility module:callable``
        recomputes every value from the command line.
    run_dir
        Where the ledger goes (``None``: keep the books in memory only).
    sampler
        Seeded sampling by partition id (:class:`strategies.policies.sampling.Sampler`); ``None``
        keeps the inner strategy's own sampling (not reproducible in Flower 1.41 or 1.42: unseeded
        ``random.sample``).
    acceptance
        Which valid replies the inner strategy aggregates (:class:`strategies.policies.acceptance.Acceptance`):
        every one (default), the top k by a score, a replayed plan, or a fairness policy (which
        needs ``books.fairness``).
    seed
        Seed of MC permutations (round t uses ``[seed, t]``).
    valuation, books, intake, run
        Settings objects, each checked when made (None: its defaults):
        :class:`fedvalue.valuation.settings.ValuationSettings` (methods, the ADS estimator's settings),
        :class:`strategies.book_settings.BookSettings` (TracIn flows, fairness and its curvature,
        defences, the fixed-weight game's second-order expansion, noisy clients), :class:`strategies.valuing_settings.IntakeSettings` (claim review,
        NaN/inf replies, node directory, query timeout, federated evaluation) and
        :class:`fedvalue.run.settings.RunSettings` (run.json's configuration, records,
        checkpoints, resume, signing key). Resuming continues the run in ``run_dir`` from its
        verified checkpoint (the inner strategy, sampler and claim review take the saved state);
        the same seed gives the same ledger as an uninterrupted run.

    What the run tells its caller as it goes are the attributes ``on_round`` (called with each
    round's rounds.csv row, a :class:`fedvalue.schema.RoundRow`, once it commits) and ``on_progress`` (round, coalitions evaluated,
    planned), None by default: set them once the strategy is built.
    """

    def __init__(self, strategy: Strategy, utility: ArraysUtility, *, run_dir: str | None = None,
                 sampler: Sampler | None = None, acceptance: Acceptance | None = None, seed: int = 0,
                 valuation: ValuationSettings | None = None, books: BookSettings | None = None,
                 intake: IntakeSettings | None = None, run: RunSettings | None = None) -> None:
        if not isinstance(strategy, Strategy):
            raise TypeError(f"strategy: expected a flwr.serverapp.strategy.Strategy; got {type(strategy).__name__}.")
        self.strategy = strategy
        #: U, and the ``module:callable`` that built it (None: U was given as an object).
        self.utility, self.utility_reference = utility_of(utility)
        self.sampler = check_sampler(strategy, sampler)
        self.seed = int(seed)
        self.valuation = settings_or_default("valuation", valuation, ValuationSettings)
        self.book_settings = settings_or_default("books", books, BookSettings)
        self.book_settings.check_strategy(strategy)
        self.intake = settings_or_default("intake", intake, IntakeSettings)
        self.run_state = RunState(run_dir, settings_or_default("run", run, RunSettings),
                                  noisy_clients=self.book_settings.noisy_clients)
        self.claims = self.intake.claims  # a resume replaces it with the checkpointed review
        self.on_round: RoundCallback | None = None
        self.on_progress: Callable[[int, int, int], None] | None = None
        self.nodes = self.intake.node_directory()
        self.weighted_by_key = getattr(strategy, "weighted_by_key", "num-examples")
        self.acceptance = AcceptAll() if acceptance is None else settings_or_default("acceptance", acceptance, Acceptance)
        self.acceptance.check(methods=self.methods, flows=self.flows,
                              clients_per_round=None if sampler is None else sampler.clients_per_round)
        #: The books' hooks by kind name (:mod:`strategies.hooks.registry`).
        self._hook_context = hook_context(self.book_settings, self.acceptance, strategy,
                                          query_data_key=self.intake.query_data_key,
                                          coalition_rule=self.valuation.coalition_rule, seed=self.seed)
        check_expansion(self.valuation, self.book_settings, strategy, self.utility)
        check_fixed_second_order(self.book_settings, strategy, self.utility)
        self.hooks = run_hooks(self._hook_context)
        self.last_valuation: RoundValuation | None = None
        #: Set (by a signal handler, or :meth:`request_stop`) to stop after the round in flight commits.
        self.stop_requested = threading.Event()
        #: Why the run was asked to stop (None: on request, a signal).
        self.stop_reason: str | None = None
        self._num_rounds: int | None = None
        self._setup: RoundSetup | None = None
        self._configured: ConfiguredRound | None = None
        # Rounds already done before start() (resume): Flower's loop counts from 1 again.
        self._round_offset = 0

    @property
    def methods(self) -> tuple[str, ...]:
        return self.valuation.methods

    @property
    def flows(self) -> bool:
        return self.book_settings.flows

    @property
    def rounds(self) -> list:
        """The rows of the rounds committed so far (:class:`fedvalue.schema.RoundRow`, a resumed run's first)."""
        return self.run_state.rounds

    @property
    def books(self):
        """The open run directory (:class:`fedvalue.run.writer.RunBooks`; None before :meth:`open_books`
        or without ``run_dir``)."""
        return self.run_state.books

    @property
    def ledger(self):
        """The open run directory's ledger (:class:`fedvalue.run.ledger_tables.LedgerWriter`; None before
        :meth:`open_books` or without ``run_dir``)."""
        return self.run_state.ledger

    @property
    def round_setup(self) -> RoundSetup:
        """What every round of the run is taken in and valued with (made once, when first needed:
        after the books open, so a resumed run's claim review is the checkpointed one)."""
        if self._setup is None:
            self._setup = RoundSetup.of_run(
                self._hook_context, self.utility, self.hooks, valuation=self.valuation, seed=self.seed,
                weighted_by_key=self.weighted_by_key, reject_non_finite=self.intake.reject_non_finite,
                node_to_client=self.nodes.node_to_client, claims=self.claims, save_records=self.run_state.save_records)
        return self._setup

    def _parts(self) -> ServerParts:
        return ServerParts(self.strategy, self.sampler, self.claims,
                           {key: value for hook in self.hooks.values() for key, value in hook.saved().items()})

    def open_books(self) -> None:
        """Create the run directory and its run.json, or, resuming, cut the directory back to
        its last checkpoint and take the inner strategy, sampler, claim review and the hooks'
        state from it.

        :meth:`start` calls it; call it first to meet bad input (a changed configuration, a
        directory without a checkpoint) before a simulation engine starts. Runs once.
        """
        if self.run_state.opened:
            return
        taken = self.run_state.open(self._parts(), run_json(self, self._num_rounds))
        if taken is not None:
            self.strategy, self.sampler, self.claims = taken.strategy, taken.sampler, taken.claims
            for hook in self.hooks.values():
                hook.restore(taken.hook_state)
        if self.run_state.resumed is not None:
            for hook in self.hooks.values():
                hook.resume_from(self.books.run_dir, len(self.rounds))
        self._setup = None  # made again from what the books opened with

    def request_stop(self, reason: str) -> None:
        """Stop after the round in flight commits (:class:`RunInterrupted` names ``reason``, e.g.
        "because a Ray worker died"); the run stays resumable. Safe from any thread."""
        if self.stop_reason is None:
            self.stop_reason = reason
        self.stop_requested.set()

    # -- the loop ---------------------------------------------------------------------------

    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3, timeout: float = 3600,
              train_config: ConfigRecord | None = None, evaluate_config: ConfigRecord | None = None,
              evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None):
        """Flower's loop (``Strategy.start``) over rounds 1..``num_rounds``.

        Resumed, it runs rounds k+1..``num_rounds`` from the checkpointed A_k (Flower's
        loop counts from 1; the wrapper shifts the round numbers it passes on). Once it ends,
        every hook sees the final state (TracIn flows ask one more gradient query there, which
        gives the last round's first-order check its actual loss change).
        """
        self._num_rounds = num_rounds
        self.open_books()
        if self.books is not None:
            self.run_state.log_start(type(self.strategy).__name__, self.methods)
        offset, initial_arrays = self.run_state.continue_from(num_rounds, initial_arrays)
        self._round_offset = offset
        shifted_evaluate_fn = None if evaluate_fn is None else (lambda t, arrays: evaluate_fn(t + offset, arrays))
        try:
            result = super().start(grid, initial_arrays, num_rounds=num_rounds - offset, timeout=timeout,
                                   train_config=train_config, evaluate_config=evaluate_config,
                                   evaluate_fn=shifted_evaluate_fn)
        except BaseException:
            self.run_state.remove_unstarted()
            raise
        final = result.arrays if len(result.arrays) else initial_arrays
        for hook in self.hooks.values():
            hook.finish(final, self._idle_clients(grid, busy=()), self.ledger)
        self.run_state.close(self._num_rounds)
        return result

    # -- delegation -------------------------------------------------------------------------

    def summary(self) -> None:
        log(logging.INFO, "\t├──> Valuing %s with %s", type(self.strategy).__name__, list(self.methods))
        self.strategy.summary()

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        if not self.intake.federated_evaluation:
            return []
        return self.strategy.configure_evaluate(server_round + self._round_offset, arrays, config, grid)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """The inner strategy's, on the evaluate replies it can take (:func:`strategies.intake.usable_evaluations`)."""
        if not self.intake.federated_evaluation:
            return None
        usable = usable_evaluations(replies, self.weighted_by_key)
        return self.strategy.aggregate_evaluate(server_round + self._round_offset, usable)

    # -- training ---------------------------------------------------------------------------

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        """Record A_{t−1}; let the inner strategy configure (with what the books ask of the
        clients); re-target to the sampler's clients; let every hook start the round."""
        server_round += self._round_offset
        start = RoundStart.of(arrays, None if self._configured is None else self._configured.start)
        for hook in self.hooks.values():
            config = hook.train_config(config)
        messages, available = list(self.strategy.configure_train(server_round, arrays, config, grid)), None
        if self.sampler is not None and messages:
            partitions = self.nodes.partition_map(grid, self.intake.query_timeout, self.intake.query_batch)
            messages, available = retarget(messages, self.sampler, server_round, partitions, self.nodes.client_to_node)
        # The grid gives the messages ids when it sends them: each reply answers one node.
        self._configured = ConfiguredRound(start, [int(m.metadata.dst_node_id) for m in messages], messages, available)
        idle = self._idle_clients(grid, busy=self._configured.targets)
        for hook in self.hooks.values():
            hook.start_round(arrays, start.arrays, idle)
        return messages

    def _idle_clients(self, grid: Grid, busy: Iterable[int]) -> IdleClients:
        """The clients whose nodes are not in ``busy``, as a hook may query them (partition -> node
        from the node directory, which asks each node once)."""
        return IdleClients(grid, functools.partial(self.nodes.partition_map, grid, self.intake.query_timeout,
                                                     self.intake.query_batch),
                           frozenset(busy), self.intake.query_timeout, self.nodes.query_type, self.intake.query_batch)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Take the replies in, value the round, accept, aggregate with the inner strategy (live),
        book the round from its record, commit (:mod:`strategies.train_round`)."""
        server_round += self._round_offset
        round_ = TrainRound.take_in(self.round_setup, server_round, replies, self._configured, self.strategy)
        round_.value(None if self.on_progress is None else functools.partial(self.on_progress, server_round))
        accepted = round_.accept()
        live_arrays, live_metrics = round_.delegate(self.strategy, accepted)
        self._commit(round_, round_.book())
        return live_arrays, live_metrics

    def _commit(self, round_: TrainRound, books) -> None:
        """Round ``round_``'s record, rows, commit mark and checkpoint (:mod:`fedvalue.run.writer`);
        then its log line, the caller's callback, and a requested stop."""
        server_round = round_.server_round
        for hook in self.hooks.values():
            hook.before_commit(round_, books, self.ledger)
        round_row, ledger_rows = books.round_row, books.ledger_rows
        if isinstance(self.sampler, LearningSampler):
            self.sampler.observe(ledger_rows)
        self.run_state.commit(server_round, round_row, ledger_rows, round_.record, round_.end_arrays(), self._parts())
        self.last_valuation = round_.valuation
        round_.setup.log.committed(server_round, ledger_rows, None if self.ledger is None else self.ledger.run_dir)
        if self.on_round is not None:
            self.on_round(round_row)
        if self.stop_requested.is_set() and server_round != self._num_rounds:  # the last round closes the books
            where = "" if self.ledger is None else f" in {self.ledger.run_dir}; continue it with --resume"
            raise RunInterrupted(f"stopped {self.stop_reason or 'on request'} after round {server_round} committed"
                                 f"{where}")
