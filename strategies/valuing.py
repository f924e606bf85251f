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
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import logging
import os
import random as random_module
import threading
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg, FedProx, Strategy
from flwr.supercore.logger import log

from fedvalue._checks import check_positive
from fedvalue.ads import AdsSettings
from fedvalue.archive import RoundRecord
from fedvalue.books import book_round
from fedvalue.fair_books import FairnessBooks, fairness_round
from fedvalue.fair_curvature import CURVATURE_SCORES
from fedvalue.flows import RoundFlows, fedavg_round_flows
from fedvalue.fairness import GroupFairness
from fedvalue.ledger import LedgerWriter
from fedvalue.run_books import Restored, RunBooks
from fedvalue.seals import Signer
from fedvalue.schema import FIRST_ORDER_COLUMNS, FIRST_ORDER_FILE, WEIGHED_STATUSES, ClientEntry, Status
from fedvalue.rounds import (
    VALUATION_METHODS,
    ArraysUtility,
    RoundValuation,
    round_game_for,
    round_rng,
    value_round,
)
from strategies.acceptance import AcceptAll, Acceptance
from strategies.claims import ClaimReview
from strategies.counterfactual import CounterfactualAggregator, RandomState
from strategies.protocol import CURVATURE_KEY, GRADIENT_KEY, NUM_EXAMPLES_KEY
from strategies.intake import log_problems, reason, take_in
from strategies.nodes import NodeDirectory
from strategies.replay import replay_state
from strategies.records import (
    ClientReply,
    InferenceGradient,
    arrays_to_numpy,
    numpy_to_arrays,
    take_curvature,
    take_inference_gradient,
)
from strategies.sampling import LearningSampler, Sampler
from strategies import server_state

#: Strategies whose aggregate_train is the pure n-weighted mean of the replies.
PURE_WEIGHTED_MEAN = (FedAvg, FedProx)


class RunInterrupted(RuntimeError):
    """The run was asked to stop (SIGINT, SIGTERM) and did, after its last round committed."""


def aggregates_by_weighted_mean(strategy: Strategy) -> bool:
    """Whether ``strategy`` aggregates by FedAvg's own ``aggregate_train``: FedAvg, FedProx
    and their subclasses that do not override it (a user's ``MyFedAvg``)."""
    return isinstance(strategy, PURE_WEIGHTED_MEAN) and type(strategy).aggregate_train in {
        cls.aggregate_train for cls in PURE_WEIGHTED_MEAN}


class ValuingStrategy(Strategy):
    """Wraps ``strategy``; values every round's clients and writes the ledger.

    Parameters
    ----------
    strategy
        Any ``flwr.serverapp.strategy.Strategy``.
    utility
        U(arrays) -> float on held-out data (for example
        :class:`fedvalue.utilities.TorchModelUtility`); may have a ``batch`` method
        taking a list of arrays dicts.
    run_dir
        Where the ledger goes (``None``: keep the books in memory only).
    methods
        Valuations per round, a subset of ``("ads", "loo")``.
    sampler
        Seeded sampling by partition id; ``None`` keeps the inner strategy's own
        sampling (not reproducible in Flower 1.41).
    ads_method, epsilon, delta, r, max_evaluations, truncation_tolerance, stderr_target
        Passed to :func:`fedvalue.ads` for each round (``ads_method="tmc"``: truncated MC).
    valuation_budget
        Most distinct coalition evaluations per round (ADS and LOO together;
        :func:`fedvalue.rounds.value_round`); ``ads_method="auto"`` then picks exact or a
        sampler that fits. None: no budget.
    on_valuation_progress
        Called with (round, coalitions evaluated, coalitions planned) while a round is
        valued (a progress display; it changes nothing that is booked).
    seed
        Seed of MC permutations (round t uses ``[seed, t]``).
    noisy_clients
        Client ids known to be noisy (simulations know it), recorded in the ledger.
    claims
        A :class:`strategies.claims.ClaimReview` that caps and flags the weights clients
        claim before anything reads them (the books and the inner strategy both see the
        capped weight); each flag is booked as a ``claim_capped`` / ``claim_jumped`` row.
    on_round
        Called with each round's ``rounds.csv`` row after it is written.
    query_timeout
        Seconds to wait for clients to report their partition ids (and, with ``flows``, their
        inference gradients); > 0.
    nodes
        Which node holds which partition (:class:`strategies.nodes.NodeDirectory`): pass one
        shared directory to runs served one after another by the same engine so that each
        node is queried once, not once per run; ``None``: a directory of this run's own.
    flows
        Book TracIn flows between clients ([RECIP]): sampled
        clients return their inference gradient at A_{t−1} with their update; every
        other client is asked for it with a query carrying A_{t−1} (one forward and
        backward pass on its inference split, no training), so it receives inflow too.
    reject_non_finite
        Keep replies with NaN or inf arrays out of the aggregate (status ``rejected``,
        booked with the harm they would have done: U(Agg(accepted ∪ {i})) −
        U(Agg(accepted)), for every method); ``False`` passes them to the inner strategy.
    save_records
        With ``run_dir``: save each round's record (A_{t−1}, every reply's arrays and
        weight, inference gradients) to ``records/`` before the round commits, so
        ``fedvalue audit`` can recompute every value (:mod:`fedvalue.archive`). Records
        go to disk, not memory.
    checkpoint
        With ``run_dir``: after each round commits, save A_t and the server's state as data
        (:mod:`strategies.server_state`: the inner strategy's optimizer moments, the sampler,
        the claim review, pending checks, the global random state; never pickled) so the run
        can resume. A strategy holding state that is not data is refused when the books open
        (give its class ``state_dict``/``load_state_dict``, or pass ``checkpoint=False``).
    acceptance
        Which valid replies the inner strategy aggregates (:mod:`strategies.acceptance`):
        every one (default), the top k by a score (:class:`~strategies.acceptance.TopK`) or a
        replayed plan (:class:`~strategies.acceptance.Replay`); the last two book
        ``selected`` rows; the fairness policies (:class:`~strategies.acceptance.FairDropK`,
        :class:`~strategies.acceptance.FairReweight`) act on the fairness influences and need
        ``fairness``.
    fairness
        A :class:`fedvalue.fairness.GroupFairness` objective on held-out data with a sensitive
        attribute: each round then also books ``ads_fairness`` / ``loo_fairness`` (the round
        game with U = −gap, the same methods and settings) and ``fairness_influence``
        (:mod:`fedvalue.fair_books`).
    fair_curvature
        The damping δ > 0 of fairness influence with curvature (None: off). Sampled clients
        are then asked for their training loss gradient and Fisher diagonal at A_{t−1} (kept
        in the round record) and each round books ``fairness_influence_curvature`` and
        ``fairness_weight_derivative`` (:mod:`fedvalue.fair_curvature`); needs ``fairness``.
    resume
        Continue the run in ``run_dir`` from its last checkpoint: tables are cut back to
        the last committed round, the inner strategy and sampler are restored from the
        checkpoint (replacing the ones given), and :meth:`start` runs the remaining
        rounds of ``num_rounds`` from the checkpointed state. The same seed gives the
        same ledger as an uninterrupted run. The checkpoint is verified before anything is
        cut (:mod:`fedvalue.run_books`: the seal, with ``sign_key`` its signature, the chain,
        the sizes and the digests) and holds data only: resuming runs no code from the run
        directory.
    sign_key
        An Ed25519 private key (a PEM file from ``fedvalue keygen``, or a
        :class:`fedvalue.seals.Signer`): each round's seal and the final manifest are
        signed (:mod:`fedvalue.seals`), so ``fedvalue audit --public-key`` fails any rewrite.
    """

    def __init__(
        self,
        strategy: Strategy,
        utility: ArraysUtility,
        *,
        run_dir: str | None = None,
        methods: Sequence[str] = VALUATION_METHODS,
        sampler: Sampler | None = None,
        ads_method: str = "auto",
        epsilon: float = 0.1,
        delta: float = 0.05,
        r: float = 1.0,
        max_evaluations: int | None = None,
        truncation_tolerance: float = 1e-3,
        stderr_target: float | None = None,
        seed: int = 0,
        noisy_clients: Collection[int] | None = None,
        claims: ClaimReview | None = None,
        on_round: Callable[[dict], None] | None = None,
        query_timeout: float = 120.0,
        nodes: NodeDirectory | None = None,
        run_config: Mapping | None = None,
        flows: bool = False,
        reject_non_finite: bool = True,
        save_records: bool = True,
        checkpoint: bool = True,
        resume: bool = False,
        acceptance: Acceptance | None = None,
        fairness: GroupFairness | None = None,
        fair_curvature: float | None = None,
        sign_key: str | os.PathLike | Signer | None = None,
        valuation_budget: int | None = None,
        on_valuation_progress: Callable[[int, int, int], None] | None = None,
    ) -> None:
        if not isinstance(strategy, Strategy):
            raise TypeError(
                f"strategy: expected a flwr.serverapp.strategy.Strategy; got {type(strategy).__name__}."
            )
        unknown = [m for m in methods if m not in VALUATION_METHODS]
        if unknown:
            raise ValueError(f"methods: expected a subset of {list(VALUATION_METHODS)}; got unknown {unknown}.")
        self.strategy = strategy
        self.utility = utility
        self.methods = tuple(methods)
        self.sampler = sampler
        # Checked here, once, and passed whole to every round's valuation and round record.
        self.ads_settings = AdsSettings(method=ads_method, epsilon=epsilon, delta=delta, r=r,
                                        max_evaluations=max_evaluations, truncation_tolerance=truncation_tolerance,
                                        stderr_target=stderr_target, budget=valuation_budget)
        self.on_valuation_progress = on_valuation_progress
        self.seed = int(seed)
        self.noisy_clients = None if noisy_clients is None else frozenset(noisy_clients)
        if claims is not None and not callable(getattr(claims, "review", None)):
            raise TypeError(f"claims: expected a strategies.claims.ClaimReview (or None); got {type(claims).__name__}.")
        self.claims = claims
        self.on_round = on_round
        self.query_timeout = check_positive("query_timeout", query_timeout)
        self.weighted_by_key = getattr(strategy, "weighted_by_key", "num-examples")
        if resume and run_dir is None:
            raise ValueError("resume: expected run_dir, the directory of the run to continue; got None.")
        # The run directory is written (or, resuming, rewound) by open_books(), not here.
        self._run_dir, self._run_config, self._resume = run_dir, run_config, bool(resume)
        self.ledger: LedgerWriter | None = None
        self.books: RunBooks | None = None
        self._books_open = False
        self.save_records = bool(save_records) and run_dir is not None
        self.checkpoint = bool(checkpoint) and run_dir is not None
        self.rounds: list[dict] = []
        self.last_valuation: RoundValuation | None = None
        self._start_arrays: dict[str, np.ndarray] | None = None
        if nodes is not None and not isinstance(nodes, NodeDirectory):
            raise TypeError(f"nodes: expected a strategies.nodes.NodeDirectory (or None); got {type(nodes).__name__}.")
        self.nodes = NodeDirectory() if nodes is None else nodes
        self.flows = bool(flows)
        self.reject_non_finite = bool(reject_non_finite)
        self.acceptance = AcceptAll() if acceptance is None else acceptance
        if not callable(getattr(self.acceptance, "accept", None)):
            raise TypeError(f"acceptance: expected an acceptance policy (strategies.TopK, Replay, AcceptAll); got "
                            f"{type(acceptance).__name__}.")
        self.acceptance.check(methods=self.methods, flows=self.flows,
                              clients_per_round=getattr(sampler, "clients_per_round", None))
        if fairness is not None and not (callable(fairness) and callable(getattr(fairness, "gradient", None))):
            raise TypeError(f"fairness: expected a fedvalue.fairness.GroupFairness (or None); got "
                            f"{type(fairness).__name__}.")
        if getattr(self.acceptance, "needs_fairness", False) and fairness is None:
            raise ValueError(f"fairness: the acceptance policy {self.acceptance!r} acts on fairness influences; "
                             "pass fairness=GroupFairness(...) (held-out data with a sensitive attribute).")
        self.fairness = fairness
        if fair_curvature is not None:
            if fairness is None:
                raise ValueError("fair_curvature: fairness influence with curvature needs fairness=GroupFairness(...).")
            fair_curvature = check_positive("fair_curvature", fair_curvature)
        if fair_curvature is None and dict(getattr(self.acceptance, "rule", {}) or {}).get("score") in CURVATURE_SCORES:
            raise ValueError(f"fair_curvature: the acceptance policy {self.acceptance!r} acts on curvature "
                             "influences; pass fair_curvature=DAMPING (> 0).")
        self.fair_curvature = fair_curvature
        self.signer = sign_key if sign_key is None or isinstance(sign_key, Signer) else Signer.from_file(sign_key)
        #: Set (by a signal handler) to stop after the round in flight commits: RunInterrupted.
        self.stop_requested = threading.Event()
        self._num_rounds: int | None = None
        self._targets: list[int] = []
        self._idle_gradients: dict = {}
        # Round t's predicted loss changes, checked against the losses reported in round t + 1.
        self._pending_first_order: tuple[int, dict] | None = None
        # Rounds already done before start() (resume): Flower's loop counts from 1 again.
        self._round_offset = 0
        self._resumed_from: Restored | None = None
        self._resumed_random: RandomState | None = None

    def open_books(self) -> None:
        """Create the run directory and its run.json, or, resuming, cut the directory back to
        its last checkpoint and take the inner strategy, sampler and claim review from it.

        :meth:`start` calls it; call it first to meet bad input (a changed configuration, a
        directory without a checkpoint) before a simulation engine starts. Runs once.
        """
        if self._books_open:
            return
        if self._run_dir is None:
            self._books_open = True
            return
        if self.checkpoint:
            self._server_state()  # a state that is not data is refused before anything is written
        config = self._run_config
        if self.claims is not None:  # the audit allows claim rows only in a run whose run.json names a review
            config = {**(config or {}), "claim_review": repr(self.claims)}
        self.books = RunBooks(self._run_dir, config=config, resume=self._resume, signer=self.signer,
                              save_records=self.save_records, checkpoint=self.checkpoint,
                              check_state=self._check_state if self._resume else None)
        self.ledger = self.books.ledger
        self._books_open = True
        if self._resume:
            self._resumed_from = self._restore()

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
        self.open_books()
        self._num_rounds = num_rounds
        offset = 0 if self._resumed_from is None else self._resumed_from.round
        if offset >= num_rounds:
            raise ValueError(
                f"num_rounds: the run in {self.ledger.run_dir} already completed {offset} rounds; got "
                f"num_rounds={num_rounds}, so there is nothing to resume."
            )
        if offset:
            initial_arrays = numpy_to_arrays(self._resumed_from.arrays)
            self._resumed_random.restore()  # the global draws Flower's strategies make continue as uninterrupted
        self._round_offset = offset
        shifted_evaluate_fn = None if evaluate_fn is None else (lambda t, arrays: evaluate_fn(t + offset, arrays))
        result = super().start(grid, initial_arrays, num_rounds=num_rounds - offset, timeout=timeout,
                               train_config=train_config, evaluate_config=evaluate_config,
                               evaluate_fn=shifted_evaluate_fn)
        if self.flows and self._pending_first_order is not None:
            final = result.arrays if len(result.arrays) else initial_arrays
            gradients = self._query_gradients(grid, final, busy=set())
            self._check_first_order({c: g.loss for c, g in gradients.items()})
        self._close_books()
        return result

    def _close_books(self) -> None:
        """The final manifest (:mod:`fedvalue.seals`), once every planned round committed."""
        if self.books is None or not self.rounds or self.rounds[-1]["round"] != self._num_rounds:
            return
        self.books.close(self._num_rounds)

    def _server_state(self) -> tuple[object, dict]:
        """What resuming needs besides A_t, as data (:mod:`strategies.server_state`): the inner
        strategy (optimizer moments), the sampler, the claim review (each client's last
        claim), the pending first-order check and the global random state."""
        random = RandomState.capture()
        try:
            return server_state.capture({
                "strategy": self.strategy, "sampler": self.sampler, "claims": self.claims,
                "pending_first_order": self._pending_first_order,
                "random": (random.numpy, random.python, random.torch_cpu),
            })
        except server_state.StateNotCaptured as error:
            raise TypeError(f"checkpoint: saving the server's state for resume failed: {error}") from None

    def _take_state(self, state: tuple[object, dict], *, into_copies: bool) -> tuple:
        """(strategy, sampler, claims, pending first-order check, global random state) with the
        saved state applied; ``into_copies`` applies it to copies (a dry run). ValueError when
        the state does not fit this run's objects."""
        saved = server_state.load(*state)
        targets = (self.strategy, self.sampler, self.claims)
        if into_copies:
            targets = copy.deepcopy(targets)
        try:
            taken = tuple(server_state.apply(target, saved[part], part)
                          for part, target in zip(("strategy", "sampler", "claims"), targets))
            numpy_state, python_state, torch_state = saved["random"]
            np.random.RandomState().set_state(numpy_state)  # each part checked on a generator of its own
            random_module.Random().setstate(python_state)
            torch.Generator().set_state(torch_state)
        except (KeyError, TypeError, ValueError, IndexError, RuntimeError) as error:
            raise ValueError(f"the saved server state does not fit this run ({error})") from None
        return (*taken, saved.get("pending_first_order"), RandomState(numpy_state, python_state, torch_state, None))

    def _check_state(self, state: tuple[object, dict]) -> None:
        """Before a resume cuts anything: the saved state fits this run (applied to copies)."""
        self._take_state(state, into_copies=True)

    def _restore(self) -> Restored:
        """Take the server's state from the verified checkpoint (:class:`fedvalue.run_books.RunBooks`
        verified it, checked it fits and cut the directory back to it) into this run's own objects."""
        restored = self.books.restored
        if restored.state is not None:
            (self.strategy, self.sampler, self.claims, self._pending_first_order,
             self._resumed_random) = self._take_state(restored.state, into_copies=False)
        self.rounds = self.books.committed_rounds()
        return restored

    def _round_record(self, server_round: int, records: list[ClientReply], accepted: set,
                      gradients: Mapping[object, InferenceGradient], claim_flags: list, pure: bool,
                      replay: tuple | str | None, passed: list[int], loss_gradients: Mapping,
                      fisher_diagonals: Mapping) -> RoundRecord:
        """The round's record, built once from the intake: the books are booked from it and
        it is saved before the round's commit mark (:mod:`fedvalue.archive`). ``replay`` is
        what replaying the inner strategy's aggregation needs, or why it could not be saved;
        ``passed`` the entries whose messages the live aggregation was given, in order."""
        replies: dict = {}
        for r in records:  # the first reply under an id (a duplicate is failed)
            if r.status in WEIGHED_STATUSES:
                replies.setdefault(r.client_id, r.arrays)
        return RoundRecord(
            round=server_round,
            start_arrays=self._start_arrays,
            entries=[self._entry(r) for r in records],
            replies=replies,
            accepted=[r.client_id for r in records if r.status == Status.OK and r.client_id in accepted],
            gradients={c: g.gradient for c, g in gradients.items()} if self.flows else {},
            losses={c: g.loss for c, g in gradients.items()} if self.flows else {},
            meta={"methods": list(self.methods), "valuation": self.ads_settings.as_keywords(), "seed": self.seed,
                  "strategy": type(self.strategy).__name__, "aggregation": "weighted-mean" if pure else "strategy",
                  "weighted_by_key": self.weighted_by_key, "flows": self.flows,
                  "reject_non_finite": self.reject_non_finite, "selection": self.acceptance.books_selection,
                  **self._fairness_meta(), **({"replay_missing": replay} if isinstance(replay, str) else {}),
                  **({} if pure else {"passed": passed})},
            claims=[f.entry() for f in claim_flags],
            replay=replay if isinstance(replay, tuple) else None,
            loss_gradients=loss_gradients,
            fisher_diagonals=fisher_diagonals,
        )

    def _replay_state(self, random_state: RandomState, records: list[ClientReply]) -> tuple | str:
        """The inner strategy's state, the round's random state and the replies' metric
        records as data (:func:`strategies.replay.replay_state`), taken before the live
        aggregation moves the strategy; or why they cannot be saved (the audit then says
        its rounds are not verifiable)."""
        try:
            return replay_state(self.strategy, random_state, records)
        except server_state.StateNotCaptured as error:
            return str(error)

    def _fairness_meta(self) -> dict:
        """The record's note of fairness books and rule (absent without them: old records unchanged)."""
        if self.fairness is None:
            return {}
        note = {"gap": self.fairness.gap, "utility_gap": self.fairness.utility_gap,
                "rule": dict(getattr(self.acceptance, "rule", {})) or None}
        if self.fair_curvature is not None:
            note["curvature"] = {"damping": self.fair_curvature}
        return {"fairness": note}

    # -- delegation -------------------------------------------------------------------------

    def summary(self) -> None:
        log(logging.INFO, "\t├──> Valuing %s with %s", type(self.strategy).__name__, list(self.methods))
        self.strategy.summary()

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        return self.strategy.configure_evaluate(server_round + self._round_offset, arrays, config, grid)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        return self.strategy.aggregate_evaluate(server_round + self._round_offset, replies)

    # -- training ---------------------------------------------------------------------------

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        """Record A_{t−1}; let the inner strategy configure; re-target to the sampler's clients."""
        server_round += self._round_offset
        self._start_arrays = arrays_to_numpy(arrays)
        if self.flows:
            config = ConfigRecord({**dict(config), GRADIENT_KEY: True})
        if self.fair_curvature is not None:
            config = ConfigRecord({**dict(config), CURVATURE_KEY: True})
        messages = list(self.strategy.configure_train(server_round, arrays, config, grid))
        if self.sampler is not None and messages:
            client_to_node = self._partition_map(grid)
            chosen = self.sampler.sample(server_round, list(client_to_node))
            template = messages[0]
            messages = [
                Message(
                    content=template.content,
                    dst_node_id=client_to_node[client_id],
                    message_type=template.metadata.message_type,
                    group_id=template.metadata.group_id or None,
                )
                for client_id in chosen
            ]
        self._targets = [int(m.metadata.dst_node_id) for m in messages]
        if self.flows:
            self._idle_gradients = self._query_gradients(grid, arrays, set(self._targets))
        return messages

    def _query_gradients(self, grid: Grid, arrays: ArrayRecord, busy: set[int]) -> dict:
        """Inference gradients at A_{t−1} of every client not training this round."""
        idle = [node for node in self._partition_map(grid).values() if node not in busy]
        queries = [
            Message(RecordDict({"arrays": arrays, "config": ConfigRecord({GRADIENT_KEY: True})}),
                    dst_node_id=node, message_type=MessageType.QUERY)
            for node in idle
        ]
        gradients = {}
        for reply in grid.send_and_receive(queries, timeout=self.query_timeout) if queries else []:
            gradient = take_inference_gradient(reply)
            if gradient is not None:
                gradients[gradient.client_id] = gradient
        return gradients

    def _partition_map(self, grid: Grid) -> dict[int, int]:
        """partition id -> node id (:class:`strategies.nodes.NodeDirectory`: each node asked once)."""
        return self.nodes.partition_map(grid, self.query_timeout)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Value the round, aggregate with the inner strategy (live), write the round's books.

        Counterfactual coalitions aggregate copies of the replies from the random state
        captured here, and the live aggregation starts from it too
        (:mod:`strategies.counterfactual`): the live run is the bare run's, bit for bit.
        """
        random_state = RandomState.capture()
        server_round += self._round_offset
        replies = list(replies)
        # Out before anything reads the reply, like inference gradients; bound to the very reply
        # that carried it, so a client can only ever give curvature for the id its reply is booked under.
        sent = {id(message): take_curvature(message) for message in replies}
        intake = take_in(replies, weighted_by_key=self.weighted_by_key, node_to_client=self.nodes.node_to_client,
                         start_arrays=self._start_arrays, targets=self._targets, claims=self.claims,
                         gradients=self._idle_gradients)
        records, gradients, claim_flags = intake.records, intake.gradients, intake.claim_flags
        curvature = {}  # the first weighed reply per client (intake fails the later ones)
        for r in records:
            if r.status in WEIGHED_STATUSES and sent.get(id(r.message)) is not None:
                curvature.setdefault(r.client_id, sent[id(r.message)])
        loss_gradients = {c: v.gradient for c, v in curvature.items()}
        fisher_diagonals = {c: v.fisher for c, v in curvature.items()}
        ok = [r for r in records if r.status == Status.OK]
        pure = aggregates_by_weighted_mean(self.strategy)
        # Made before the live aggregation, which may consume or rewrite the replies it is given.
        aggregator = None if pure else CounterfactualAggregator(
            self.strategy, server_round,
            {r.client_id: r.message for r in records if r.status in WEIGHED_STATUSES},
            self._start_arrays, random_state)
        # Only a saved record is ever replayed (by the audit): capture nothing for one that is not saved.
        replay = None if pure or not self.save_records else self._replay_state(random_state, records)
        valuation = self._value(server_round, ok, aggregator) if ok else None
        fair = None if self.fairness is None else self._fairness_books(server_round, ok, aggregator,
                                                                        loss_gradients, fisher_diagonals)
        scores = None if fair is None or not ok else fair.rule_scores(getattr(self.acceptance, "rule", None))
        accepted = self.acceptance.accept(
            server_round, [r.client_id for r in ok], valuation, seed=self.seed,
            outflows=lambda: self.outflows_if_all_aggregated(ok, gradients),
            # Only with fairness books: a policy written before them takes no such keyword.
            **({} if fair is None else {"fairness": scores})
        ) if ok else set()
        if fair is not None and ok and getattr(self.acceptance, "factors", None) is not None:
            factors = self.acceptance.factors([r.client_id for r in ok], scores)
            if factors is not None:
                fair = dataclasses.replace(fair, factors=factors)
                self._reweight([r for r in ok if r.client_id in accepted], factors)
        # Malformed replies would make the inner strategy raise: it sees the accepted ones and the errors.
        passed = [k for k, r in enumerate(records)
                  if (r.status == Status.OK and r.client_id in accepted) or (r.message is not None and r.message.has_error())]
        if not self.reject_non_finite:
            passed += [k for k, r in enumerate(records) if r.status == Status.REJECTED]
        random_state.restore()
        live_arrays, live_metrics = self.strategy.aggregate_train(server_round, [records[k].message for k in passed])

        # A round where nothing was aggregated keeps the global state.
        realized = arrays_to_numpy(live_arrays) if live_arrays is not None else None
        if self.flows:  # last round's predicted loss changes meet the losses reported now, at A_{t−1}
            self._check_first_order({c: g.loss for c, g in gradients.items()})
        record = self._round_record(server_round, records, accepted, gradients, claim_flags, pure,
                                    replay, passed, loss_gradients, fisher_diagonals)
        books = book_round(record, valuation, self.utility, realized=realized, aggregate=aggregator,
                           inputs={"fairness": fair}, noisy_clients=self.noisy_clients,
                           unaggregatable=0 if aggregator is None else None)
        if books.flows is not None:
            predicted = books.flows.predicted_loss_change()
            self._pending_first_order = (server_round, {
                c: (g.loss, float(predicted[c])) for c, g in gradients.items()
            })
        realized = self._start_arrays if realized is None else realized
        round_row, ledger_rows = books.round_row, books.ledger_rows
        log_problems(server_round, records)
        if isinstance(self.sampler, LearningSampler):
            self.sampler.observe(ledger_rows)
        if self.books is not None:  # record, rows, commit mark, checkpoint, seal: fedvalue.run_books
            self.books.commit(
                server_round, round_row, ledger_rows,
                record=record if self.save_records else None,
                realized=realized, state=self._server_state() if self.checkpoint else None)
        self.rounds.append(round_row)
        self.last_valuation = valuation
        if self.on_round is not None:
            self.on_round(round_row)
        if self.stop_requested.is_set() and server_round != self._num_rounds:  # the last round closes the books
            where = "" if self.ledger is None else f" in {self.ledger.run_dir}; continue it with --resume"
            raise RunInterrupted(f"stopped on request after round {server_round} committed{where}")
        return live_arrays, live_metrics

    def _value(self, server_round: int, ok: list[ClientReply],
               aggregator: CounterfactualAggregator | None) -> RoundValuation:
        """The round game over the clients that replied, valued by ``self.methods``; FedAvg's
        family (``aggregator`` None) as the weighted mean, any other strategy by its own code."""
        game = round_game_for([r.client_id for r in ok], self._start_arrays, [r.arrays for r in ok],
                              [r.weight for r in ok], self.utility, aggregator)
        progress = None if self.on_valuation_progress is None else functools.partial(self.on_valuation_progress,
                                                                                      server_round)
        return value_round(game, self.methods, self.ads_settings, seed=round_rng(self.seed, server_round),
                           progress=progress)

    def _fairness_books(self, server_round: int, ok: list[ClientReply], aggregator: CounterfactualAggregator | None,
                        loss_gradients: Mapping, fisher_diagonals: Mapping) -> FairnessBooks:
        """The round game valued on fairness (U = −gap) and each valid reply's fairness influence
        (with curvature from the valid replies that sent G_u and d_u)."""
        return fairness_round(self.fairness, [r.client_id for r in ok], self._start_arrays, [r.arrays for r in ok],
                              [r.weight for r in ok], methods=self.methods, settings=self.ads_settings,
                              seed=round_rng(self.seed, server_round), aggregate=aggregator,
                              loss_gradients=loss_gradients, fisher_diagonals=fisher_diagonals,
                              damping=self.fair_curvature)

    def _reweight(self, accepted: list[ClientReply], factors: Mapping) -> None:
        """Multiply the weight each accepted reply's message carries by its factor (the live
        aggregation sees n_u w_u; the books keep n_u)."""
        for record in accepted:
            used = float(record.weight) * float(factors[record.client_id])
            for metrics in record.message.content.metric_records.values():
                if self.weighted_by_key in metrics:
                    metrics[self.weighted_by_key] = used

    def _flows_of(self, aggregated: list[ClientReply],
                  gradients: Mapping[object, InferenceGradient]) -> tuple[RoundFlows, frozenset]:
        """TracIn flows if ``aggregated`` make the round's step, and the clients without a
        gradient (:func:`fedvalue.flows.fedavg_round_flows`; their inflow is booked empty)."""
        return fedavg_round_flows(self._start_arrays, {r.client_id: r.arrays for r in aggregated},
                                  {r.client_id: r.weight for r in aggregated},
                                  {c: g.gradient for c, g in gradients.items()})

    def outflows_if_all_aggregated(self, ok: list[ClientReply],
                                   gradients: Mapping[object, InferenceGradient]) -> dict:
        """outflow_u of every valid reply, as if all of them made the round's step."""
        flows, _ = self._flows_of(ok, gradients)
        outflow = dict(zip(flows.clients, flows.outflow.tolist()))
        return {r.client_id: outflow[r.client_id] for r in ok}

    def _check_first_order(self, losses: Mapping[object, float]) -> None:
        """Book last round's predicted loss changes against the losses now reported at A_t."""
        if self._pending_first_order is None:
            return
        previous_round, previous = self._pending_first_order
        self._pending_first_order = None
        rows = [
            {"round": previous_round, "client_id": c, "loss_before": before, "loss_after": losses[c],
             "actual_change": losses[c] - before, "predicted_change": predicted}
            for c, (before, predicted) in previous.items() if c in losses
        ]
        if self.ledger is not None:
            self.ledger.append_table(FIRST_ORDER_FILE, FIRST_ORDER_COLUMNS, rows)

    def _entry(self, record: ClientReply) -> ClientEntry:
        """A reply as the books take it: its example count is its weight when the strategy
        weighs by examples, else what it reported."""
        ok = record.status == Status.OK
        num_examples = (int(record.weight) if ok and self.weighted_by_key == NUM_EXAMPLES_KEY
                        else record.metrics.get(NUM_EXAMPLES_KEY))
        return ClientEntry(record.client_id, record.status, record.weight, num_examples, reason(record))
