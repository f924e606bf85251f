"""A Flower strategy that keeps books on every client around ANY inner strategy.

Composition, as Flower's ``dp_fixed_clipping`` wraps a strategy: ``self.strategy`` does
all sampling configuration and aggregation; the wrapper records each round's realized
state and values its clients by the round game ([ADS] Remark 4.1, Eq. 10):

    v_t(S) = U(Agg_t(A_{t−1}; {reply_i : i ∈ S})),   v_t(∅) = U(A_{t−1}),

where Agg_t is the inner strategy's own ``aggregate_train``. Counterfactual coalitions
never touch the live run: FedAvg and FedProx (pure aggregation) use the n-weighted mean
directly; every other strategy (server optimizers, robust and q-fair rules, DP wrappers,
user subclasses) aggregates each coalition with its own code on copies of the replies,
on a copy of itself at round start and under the round's random state
(:mod:`strategies.counterfactual`), and the live aggregation gets the original replies
from the same random state.

The wrapper is the Flower adapter. Its ``aggregate_train`` reads intake → value → accept →
delegate → record → books → commit: one round from its replies to its books is a
:class:`strategies.train_round.TrainRound` (the intake, :mod:`strategies.intake`; the round
game; the live aggregation; the record and :func:`fedvalue.rounds.booking.book_round`), the
acceptance step and the books beyond the replies (TracIn flows, fairness, defences) are
:class:`strategies.hooks.round_hooks.RoundHooks`, and the run directory and server state
:mod:`strategies.run_state`.
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

from fedvalue.run.settings import BY_STRATEGY, WEIGHTED_MEAN, RoundSettings, RunSettings
from fedvalue.run.writer import RunBooks
from fedvalue.valuation.round_game import ArraysUtility, RoundValuation, ValuationSettings
from strategies.hooks.round_hooks import RoundHooks
from strategies.intake import log_problems, usable_evaluations
from strategies.policies.acceptance import AcceptAll, Acceptance
from strategies.policies.sampling import LearningSampler, Sampler, retarget
from strategies.run_state import RunState, ServerParts, run_json
from strategies.train_round import RoundStart, TrainRound
from strategies.book_settings import BookSettings
from strategies.valuing_settings import IntakeSettings, RunCallbacks, settings_or_default, utility_of


class RunInterrupted(RuntimeError):
    """The run was asked to stop (SIGINT, SIGTERM) and did, after its last round committed."""


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
        Seeded sampling by partition id; ``None`` keeps the inner strategy's own sampling
        (not reproducible in Flower 1.41).
    acceptance
        Which valid replies the inner strategy aggregates (:mod:`strategies.policies.acceptance`): every
        one (default), the top k by a score, a replayed plan, or a fairness policy (which
        needs ``books.fairness``).
    seed
        Seed of MC permutations (round t uses ``[seed, t]``).
    valuation, books, intake, run
        Settings objects, each checked when made (None: its defaults):
        :class:`fedvalue.valuation.round_game.ValuationSettings` (methods, the ADS estimator's settings,
        a progress callback), :class:`strategies.valuing_settings.BookSettings` (TracIn
        flows, fairness and its curvature, noisy clients),
        :class:`strategies.valuing_settings.IntakeSettings` (claim review, NaN/inf replies,
        node directory, query timeout) and :class:`fedvalue.run.settings.RunSettings`
        (run.json's configuration, records, checkpoints, resume, signing key, per-round
        callback). Resuming continues the run in ``run_dir`` from its verified checkpoint
        (the inner strategy, sampler and claim review take the saved state); the same
        seed gives the same ledger as an uninterrupted run.
    federated_evaluation
        False: no client-side evaluation rounds (the books value every round on the server's
        held-out data; the inner strategy's ``configure_evaluate`` is not called). Unlike
        ``fraction_evaluate=0.0`` on the inner strategy, Flower does not warn about it.
    """

    def __init__(
        self,
        strategy: Strategy,
        utility: ArraysUtility,
        *,
        run_dir: str | None = None,
        sampler: Sampler | None = None,
        acceptance: Acceptance | None = None,
        seed: int = 0,
        valuation: ValuationSettings | None = None,
        books: BookSettings | None = None,
        intake: IntakeSettings | None = None,
        run: RunSettings | None = None,
        callbacks: RunCallbacks | None = None,
        federated_evaluation: bool = True,
    ) -> None:
        if not isinstance(strategy, Strategy):
            raise TypeError(
                f"strategy: expected a flwr.serverapp.strategy.Strategy; got {type(strategy).__name__}."
            )
        self.strategy = strategy
        if not isinstance(federated_evaluation, bool):
            raise TypeError(f"federated_evaluation: expected True or False; got {federated_evaluation!r}.")
        self.federated_evaluation = federated_evaluation
        #: U, and the ``module:callable`` that built it (None: U was given as an object).
        self.utility, self.utility_reference = utility_of(utility)
        self.sampler = sampler
        self.seed = int(seed)
        self.valuation = settings_or_default("valuation", valuation, ValuationSettings)
        self.book_settings = settings_or_default("books", books, BookSettings)
        self.book_settings.check_strategy(strategy)
        self.intake = settings_or_default("intake", intake, IntakeSettings)
        self.run_state = RunState(run_dir, settings_or_default("run", run, RunSettings),
                                  noisy_clients=self.book_settings.noisy_clients)
        self.claims = self.intake.claims  # a resume replaces it with the checkpointed review
        callbacks = settings_or_default("callbacks", callbacks, RunCallbacks)
        self.on_round = callbacks.on_round  # attributes: a caller may set them once built
        self.on_progress = callbacks.on_progress
        self.nodes = self.intake.node_directory()
        self.weighted_by_key = getattr(strategy, "weighted_by_key", "num-examples")
        self.acceptance = AcceptAll() if acceptance is None else acceptance
        if not callable(getattr(self.acceptance, "accept", None)):
            raise TypeError(f"acceptance: expected an acceptance policy (strategies.TopK, Replay, AcceptAll); got "
                            f"{type(acceptance).__name__}.")
        self.acceptance.check(methods=self.methods, flows=self.flows,
                              clients_per_round=getattr(sampler, "clients_per_round", None))
        #: The flows, fairness and defences hooks (:mod:`strategies.hooks.round_hooks`).
        self.hooks = RoundHooks(self.book_settings, self.acceptance, strategy)
        self.rounds: list[dict] = []
        self.last_valuation: RoundValuation | None = None
        #: Set (by a signal handler, or :meth:`request_stop`) to stop after the round in flight commits.
        self.stop_requested = threading.Event()
        #: Why the run was asked to stop (None: on request, a signal).
        self.stop_reason: str | None = None
        self._num_rounds: int | None = None
        self._start: RoundStart | None = None
        self._targets: list[int] = []
        self._sent: list[Message] = []
        #: The partitions the sampler chose from, when some registered nodes are gone (round record meta).
        self._available: list[int] | None = None
        self._warned_anonymous = False
        self._idle_gradients: dict = {}
        # Rounds already done before start() (resume): Flower's loop counts from 1 again.
        self._round_offset = 0

    @property
    def methods(self) -> tuple[str, ...]:
        return self.valuation.methods

    @property
    def flows(self) -> bool:
        return self.book_settings.flows

    @property
    def books(self) -> RunBooks | None:
        """The open run directory (:class:`fedvalue.run.writer.RunBooks`; None before
        :meth:`open_books` or without ``run_dir``)."""
        return self.run_state.books

    @property
    def ledger(self):
        """The open run directory's ledger (:class:`fedvalue.run.ledger_tables.LedgerWriter`; None
        before :meth:`open_books` or without ``run_dir``)."""
        return self.run_state.ledger

    @property
    def flow_queries(self):
        """The TracIn flows' gradient queries (:class:`strategies.hooks.flows.FlowQueries`)."""
        return self.hooks.flow_queries

    def _parts(self) -> ServerParts:
        return ServerParts(self.strategy, self.sampler, self.claims, self.flow_queries.pending)

    def open_books(self) -> None:
        """Create the run directory and its run.json, or, resuming, cut the directory back to
        its last checkpoint and take the inner strategy, sampler and claim review from it.

        :meth:`start` calls it; call it first to meet bad input (a changed configuration, a
        directory without a checkpoint) before a simulation engine starts. Runs once.
        """
        if self.run_state.opened:
            return
        taken = self.run_state.open(self._parts(), run_json(self, self._num_rounds))
        if taken is not None:
            self.strategy, self.sampler, self.claims = taken.strategy, taken.sampler, taken.claims
            self.flow_queries.pending = taken.pending_first_order
        if self.run_state.resumed is not None:
            self.rounds = self.books.committed_rounds()
            self.hooks.resume_from(self.books.run_dir, len(self.rounds))

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
        loop counts from 1; the wrapper shifts the round numbers it passes on). With flows,
        one more gradient query at the final state gives the last round's first-order
        check its actual loss change.
        """
        self._num_rounds = num_rounds
        if self.intake.query_data_key:
            self.flow_queries.carry_data_key(train_config)
        self.open_books()
        if self.books is not None:
            log(logging.INFO, "fedvalue: valuing %s's clients by %s into %s", type(self.strategy).__name__,
                list(self.methods), self.books.run_dir)
        offset, initial_arrays = self.run_state.continue_from(num_rounds, initial_arrays)
        self._round_offset = offset
        shifted_evaluate_fn = None if evaluate_fn is None else (lambda t, arrays: evaluate_fn(t + offset, arrays))
        result = super().start(grid, initial_arrays, num_rounds=num_rounds - offset, timeout=timeout,
                               train_config=train_config, evaluate_config=evaluate_config,
                               evaluate_fn=shifted_evaluate_fn)
        if self.flows and self.flow_queries.pending is not None:
            final = result.arrays if len(result.arrays) else initial_arrays
            self.flow_queries.check_first_order(self._query_gradients(grid, final, busy=set()), self.ledger)
        self.run_state.close(self.rounds, self._num_rounds)
        return result

    # -- delegation -------------------------------------------------------------------------

    def summary(self) -> None:
        log(logging.INFO, "\t├──> Valuing %s with %s", type(self.strategy).__name__, list(self.methods))
        self.strategy.summary()

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        if not self.federated_evaluation:
            return []
        return self.strategy.configure_evaluate(server_round + self._round_offset, arrays, config, grid)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """The inner strategy's, on the evaluate replies it can take (:func:`strategies.intake.usable_evaluations`)."""
        if not self.federated_evaluation:
            return None
        usable = usable_evaluations(replies, self.weighted_by_key)
        return self.strategy.aggregate_evaluate(server_round + self._round_offset, usable)

    # -- training ---------------------------------------------------------------------------

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        """Record A_{t−1}; let the inner strategy configure; re-target to the sampler's clients."""
        server_round += self._round_offset
        self._start = RoundStart.of(arrays, self._start)
        self.hooks.start_round(self._start.arrays)
        config = self.hooks.train_config(config)
        messages = list(self.strategy.configure_train(server_round, arrays, config, grid))
        if self.sampler is not None and messages:
            partitions = self._partition_map(grid)
            # Nodes that are gone are not chosen; the record notes what the sampler chose from.
            self._available = None if len(partitions) == len(self.nodes.client_to_node) else sorted(partitions)
            check_enough_nodes(self.sampler, partitions, self.nodes.client_to_node, server_round)
            messages = retarget(messages, self.sampler, server_round, partitions)
        self._targets = [int(m.metadata.dst_node_id) for m in messages]
        self._sent = messages  # the grid gives them ids when it sends them: each reply answers one node
        if self.flows:
            self._idle_gradients = self._query_gradients(grid, arrays, set(self._targets))
        return messages

    def _query_gradients(self, grid: Grid, arrays: ArrayRecord, busy: set[int]) -> dict:
        """Inference gradients at ``arrays`` of every client not training this round."""
        return self.flow_queries.idle_gradients(grid, arrays, self._partition_map(grid), busy,
                                                self.intake.query_timeout, self.nodes.query_type)

    def _partition_map(self, grid: Grid) -> dict[int, int]:
        """partition id -> node id (:class:`strategies.nodes.NodeDirectory`: each node asked once)."""
        return self.nodes.partition_map(grid, self.intake.query_timeout)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Take the replies in, value the round, accept, aggregate with the inner strategy (live),
        write the round's record and books, commit (:mod:`strategies.train_round`)."""
        server_round += self._round_offset
        round_ = TrainRound.take_in(
            server_round, replies, self._start, self.strategy, seed=self.seed,
            save_records=self.run_state.save_records, weighted_by_key=self.weighted_by_key, flows=self.flows,
            node_to_client=self.nodes.node_to_client, targets=self._targets, claims=self.claims,
            gradients=self._idle_gradients, sent=self._sent)
        progress = None if self.on_progress is None else functools.partial(self.on_progress, server_round)
        valuation = round_.value(self.utility, self.methods, self.valuation.ads, progress)
        accepted, fairness = self.hooks.accept(round_, valuation, settings=self.valuation, seed=self.seed,
                                               weighted_by_key=self.weighted_by_key)
        live_arrays, live_metrics = round_.delegate(self.strategy, accepted, self.intake.reject_non_finite)
        self.hooks.check_first_order(round_.intake.gradients, self.ledger)
        record = self.hooks.note(round_.record(accepted, self._round_settings(round_)))
        books = round_.book(record, valuation, self.utility, fairness=fairness)
        self._commit(round_, record, books, valuation)
        return live_arrays, live_metrics

    def _round_settings(self, round_: TrainRound) -> RoundSettings:
        """What the round record notes of this run: the settings, the aggregation, the fairness
        rule and defences, what the live aggregation was given."""
        return RoundSettings(
            methods=tuple(self.methods), valuation=self.valuation.ads, seed=self.seed,
            strategy=type(self.strategy).__name__, aggregation=WEIGHTED_MEAN if round_.pure else BY_STRATEGY,
            weighted_by_key=self.weighted_by_key, flows=self.flows, reject_non_finite=self.intake.reject_non_finite,
            selection=self.acceptance.books_selection, **self.hooks.settings_notes(),
            acceptance=getattr(self.acceptance, "recorded_acceptance", None),
            replay_missing=round_.replay if isinstance(round_.replay, str) else None,
            available=self._available, passed=None if round_.pure else round_.passed)

    def _commit(self, round_: TrainRound, record, books, valuation: RoundValuation) -> None:
        """Round ``round_``'s record, rows, commit mark and checkpoint (:mod:`fedvalue.run.writer`);
        then its log line, the caller's callback, and a requested stop."""
        server_round, records = round_.server_round, round_.intake.records
        if books.flows is not None:
            self.flow_queries.expect(server_round, books.flows, round_.intake.gradients)
        round_row, ledger_rows = books.round_row, books.ledger_rows
        log_problems(server_round, records)
        self._warn_anonymous(records)
        if isinstance(self.sampler, LearningSampler):
            self.sampler.observe(ledger_rows)
        self.run_state.commit(server_round, round_row, ledger_rows, record, round_.end_arrays(), self._parts())
        self.rounds.append(round_row)
        self.last_valuation = valuation
        log(logging.INFO, "%s", round_line(server_round, ledger_rows, self.methods,
                                           None if self.ledger is None else self.ledger.run_dir))
        if self.on_round is not None:
            self.on_round(round_row)
        if self.stop_requested.is_set() and server_round != self._num_rounds:  # the last round closes the books
            where = "" if self.ledger is None else f" in {self.ledger.run_dir}; continue it with --resume"
            raise RunInterrupted(f"stopped {self.stop_reason or 'on request'} after round {server_round} committed"
                                 f"{where}")

    def _warn_anonymous(self, records: list) -> None:
        """Warn once, loudly, when replies say no partition id: they are booked under node ids
        that change every run, which no one can pay or rank."""
        anonymous = sorted({r.node_id for r in records if isinstance(r.client_id, str) and r.client_id.startswith("node-")
                            and r.message is not None and not r.message.has_error()})
        if anonymous and not self._warned_anonymous:
            self._warned_anonymous = True
            log(logging.WARNING, "fedvalue: replies from nodes %s say no partition id, so they are booked under "
                "node ids ('node-N') that change every run. Add the valuation mod to the ClientApp: "
                "ClientApp(mods=[clients.valuation_mod()]) (it reads the node config's 'partition-id').", anonymous)


def check_enough_nodes(sampler: Sampler, partitions: dict[int, int], registered: dict[int, int],
                       server_round: int) -> None:
    """RuntimeError when fewer partitions have a connected node than ``sampler`` takes a round."""
    wanted = getattr(sampler, "clients_per_round", None)
    if isinstance(wanted, int) and len(partitions) < wanted:
        gone = sorted(set(registered) - set(partitions))
        raise RuntimeError(f"sampler: round {server_round} needs {wanted} clients, but only {len(partitions)} of the "
                           f"{len(registered)} registered partitions have a connected node (gone: {gone}); the run "
                           "stops here with every earlier round committed: resume it once the nodes are back.")


def round_line(server_round: int, ledger_rows: list, methods: tuple[str, ...], run_dir) -> str:
    """The round's one log line: clients valued, where the books are, the largest and smallest value."""
    method = methods[0] if methods else None
    valued = [r for r in ledger_rows if r.method == method and r.status == "ok" and r.value is not None]
    sampled = {r.client_id for r in ledger_rows if r.method == method and r.status != "idle"}
    where = "in memory" if run_dir is None else f"into {run_dir}"
    if not valued:
        return f"fedvalue: round {server_round}: 0 of {len(sampled)} sampled clients valued, {where}"
    high = max(valued, key=lambda r: r.value)
    low = min(valued, key=lambda r: r.value)
    return (f"fedvalue: round {server_round}: {len(valued)} of {len(sampled)} sampled clients valued, {where}; "
            f"{method} largest {high.value:.4g} (client {high.client_id}), smallest {low.value:.4g} "
            f"(client {low.client_id})")
