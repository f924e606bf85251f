"""Staged data procurement valued on the realized model trajectory ([ADS] Example 1.3, §6.3).

At stage t a buyer holds the realized model state A_{t−1} and receives offers O_t
(contributor datasets). The stage game is the round game of :mod:`fedvalue.valuation.round_game` with
fine-tuning as the aggregation rule:

    v_t(S) = U(FineTune(A_{t−1}; ∪_{i∈S} D_i)),   S ⊆ O_t,   v_t(∅) = U(A_{t−1}),

every coalition fine-tuned from the same state with the same seed (common random
numbers, so marginals differ only by the data). Offers are valued by within-stage ADS
([ADS] Remark 4.1, Eq. 10: the purchased prefix is absorbed into A_{t−1})

    φ_t(i) = (1/n) Σ_{S ⊆ O_t∖{i}} C(n−1, |S|)^{-1} [v_t(S ∪ {i}) − v_t(S)],

and within-stage LOO ψ_t(i) = v_t(O_t) − v_t(O_t ∖ {i}) ([ADS] App. C.2), on one shared
coalition cache. The buyer purchases the ``budget`` top-valued offers under a rule (ADS,
LOO, or uniformly at random) and A_t is the state fine-tuned on the purchased data —
the very state the game scored for that coalition, so U(A_t) = v_t(purchase).

Nothing here knows what the model is: a :class:`Learner` fine-tunes a state
(``dict[str, np.ndarray]``) on datasets and predicts; a conjoint-rating MLP
(``simulations.experiments.procurement.procurement``) and an LLM fine-tuner with a LoRA adapter as its state fit
the same protocol. The books are a federated run's (:class:`fedvalue.run.ledger_tables.LedgerWriter`):
one round per stage, one row per offer and method, plus ``selected`` rows (1 bought, 0 not).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import pandas as pd

from fedvalue._checks import check_integer, check_seed
from fedvalue.valuation.settings import AdsSettings
from fedvalue.run.archive import RoundRecord
from fedvalue.run.settings import RoundSettings
from fedvalue.rounds.booking import ClientEntry, book_round
from fedvalue.run.ledger_tables import LedgerWriter
from fedvalue.valuation.round_game import (
    VALUATION_METHODS,
    Arrays,
    ArraysUtility,
    RoundValuation,
    round_game,
    value_round,
)
from fedvalue.schema import LEDGER_FILE, LedgerRow, Method, RoundRow, Status
from fedvalue.analysis.top_k_selection import top_k

#: How the buyer picks the purchased offers of a stage.
PURCHASE_RULES = (Method.ADS, Method.LOO, "random")


@runtime_checkable
class Learner(Protocol):
    """A model that can be fine-tuned from a given state; the state is its parameters.

    ``fine_tune`` must be a pure function of its arguments (same state, datasets and seed:
    same result), because the stage game fine-tunes a copy per coalition and the buyer
    moves on with the copy of the purchased coalition.
    """

    def fine_tune(self, state: Mapping[str, np.ndarray], datasets: Sequence[Any], *, seed: int) -> Arrays:
        """The state after fine-tuning ``state`` on the union of ``datasets`` (not modified)."""
        ...

    def predict(self, state: Mapping[str, np.ndarray], inputs: Any) -> np.ndarray:
        """Predictions of the model in ``state`` for ``inputs``."""
        ...


@dataclass(frozen=True)
class Offer:
    """One contributor's dataset offered at a stage (``data`` is whatever the learner takes)."""

    contributor_id: str
    data: Any
    num_examples: int


@dataclass
class StageOutcome:
    """What one stage did: its valuation, the purchase and the state it moved to."""

    stage: int
    offers: tuple[str, ...]
    purchased: tuple[str, ...]
    valuation: RoundValuation | None
    utility_before: float
    utility_realized: float
    state: Arrays = field(repr=False)
    num_fine_tunes: int
    seconds: float

    def values(self, method: str) -> dict[str, float]:
        """Value per offer under ``method`` (``ads`` or ``loo``)."""
        if self.valuation is None or method not in self.valuation.results:
            raise ValueError(f"method: expected one of the stage's valuations "
                             f"{[] if self.valuation is None else list(self.valuation.results)}; got {method!r}.")
        return {c: float(v) for c, v in self.valuation.results[method].values.items()}


def fine_tune_aggregator(learner: Learner, start_state: Mapping[str, np.ndarray], offers: Sequence[Offer],
                         seed: int) -> tuple[Callable[[Sequence[Hashable]], Arrays], dict]:
    """The stage's aggregation rule: fine-tune A_{t−1} on the union of a coalition's offers.

    Returns the aggregator (for :func:`fedvalue.valuation.round_game.round_game`) and its memo
    ``{coalition ids in stage order: state}``, from which the buyer takes the purchased
    coalition's state instead of fine-tuning it again.
    """
    by_id = {offer.contributor_id: offer for offer in offers}
    memo: dict[tuple[Hashable, ...], Arrays] = {}

    def aggregate(coalition: Sequence[Hashable]) -> Arrays:
        key = tuple(coalition)
        if key not in memo:
            memo[key] = learner.fine_tune(start_state, [by_id[c].data for c in key], seed=seed)
        return memo[key]

    return aggregate, memo


def _check_offers(offers: Sequence[Offer], stage: int) -> tuple[str, ...]:
    if len(offers) == 0:
        raise ValueError(f"offers: expected at least one offer at stage {stage}; got none.")
    ids = tuple(offer.contributor_id for offer in offers)
    if len(set(ids)) != len(ids):
        raise ValueError(f"offers: expected distinct contributor ids at stage {stage}; got {list(ids)}.")
    return ids


def _check_purchase(rule: str, budget: int, methods: Sequence[str]) -> None:
    if rule not in PURCHASE_RULES:
        raise ValueError(f"rule: expected one of {list(PURCHASE_RULES)}; got {rule!r}.")
    unknown = [m for m in methods if m not in VALUATION_METHODS]
    if unknown or len(set(methods)) != len(methods):
        raise ValueError(f"methods: expected distinct names from {list(VALUATION_METHODS)}; got {list(methods)}.")
    if rule != "random" and rule not in methods:
        raise ValueError(f"methods: expected {rule!r} among them (rule {rule!r} buys by that value); got "
                         f"{list(methods)}.")
    check_integer("budget", budget, why="offers bought per stage")


def procure_stage(
    learner: Learner,
    state: Mapping[str, np.ndarray],
    offers: Sequence[Offer],
    utility: ArraysUtility,
    *,
    rule: str = Method.ADS,
    budget: int = 1,
    methods: Sequence[str] = VALUATION_METHODS,
    fine_tune_seed: int = 0,
    pick_rng: np.random.Generator | None = None,
    stage: int = 1,
) -> StageOutcome:
    """Value one stage's offers at ``state`` and buy ``budget`` of them (module docstring).

    Parameters
    ----------
    rule
        ``"ads"`` or ``"loo"``: buy the top-``budget`` offers by that value, ties to the
        earlier offer; ``"random"``: ``budget`` offers uniformly at random (``pick_rng``).
    methods
        Valuations booked for every offer (exact within-stage ADS and/or LOO); the rule's
        own method must be among them. Empty with ``rule="random"``: no valuation, one
        fine-tune.
    fine_tune_seed
        Seed every coalition is fine-tuned with.
    """
    ids = _check_offers(offers, stage)
    _check_purchase(rule, budget, methods)
    started = time.perf_counter()
    aggregate, memo = fine_tune_aggregator(learner, state, offers, fine_tune_seed)
    game = round_game(ids, state, aggregate, utility)
    valuation = None
    if methods:
        # Exact ADS: a stage holds a handful of offers, and 2^n fine-tunes are the paper's protocol.
        valuation = value_round(game, methods, AdsSettings(method="exact"))
    if rule == "random":
        if pick_rng is None:
            raise ValueError("pick_rng: expected a numpy Generator for rule 'random'; got None.")
        chosen = set(pick_rng.choice(len(ids), size=min(int(budget), len(ids)), replace=False).tolist())
        purchased = tuple(c for k, c in enumerate(ids) if k in chosen)
    else:
        scores = {c: float(v) for c, v in valuation.results[rule].values.items()}
        best = set(top_k(scores, int(budget), ids))
        purchased = tuple(c for c in ids if c in best)
    mask = game.mask_of(purchased)
    utility_before = float(game.value(0))
    utility_realized = float(game.value(mask))  # cached when valued: the scored coalition's value
    return StageOutcome(
        stage=stage, offers=ids, purchased=purchased, valuation=valuation, utility_before=utility_before,
        utility_realized=utility_realized, state=memo[purchased], num_fine_tunes=len(memo),
        seconds=time.perf_counter() - started,
    )


def stage_books(outcome: StageOutcome, offers: Sequence[Offer]) -> tuple[RoundRow, list[LedgerRow]]:
    """The stage's rounds.csv row and ledger.csv rows, booked by :func:`fedvalue.rounds.booking.book_round`
    as a federated round: every offer valued (``ok``), the purchase as ``selected`` rows."""
    entries = [ClientEntry(o.contributor_id, Status.OK, float(o.num_examples), int(o.num_examples)) for o in offers]
    valuation = outcome.valuation
    record = RoundRecord(round=outcome.stage, start_arrays={}, entries=entries, replies={},
                         accepted=list(outcome.purchased),
                         settings=RoundSettings(methods=() if valuation is None else tuple(valuation.results),
                                                selection=True))
    books = book_round(record, valuation, None, realized=outcome.state,
                       utility_before=outcome.utility_before, utility_realized=outcome.utility_realized)
    return books.round_row, books.ledger_rows


@dataclass
class ProcurementRun:
    """A whole staged procurement: the stage outcomes and the final state."""

    rule: str
    stages: list[StageOutcome]
    initial_utility: float
    final_state: Arrays = field(repr=False)

    def to_frame(self) -> pd.DataFrame:
        """One row per stage: ``stage``, ``utility_before``, ``utility_realized``, ``purchased``
        (space-separated ids), ``num_fine_tunes``, ``seconds``; stage 0 is the initial state."""
        rows = [{"stage": 0, "utility_before": self.initial_utility, "utility_realized": self.initial_utility,
                 "purchased": "", "num_fine_tunes": 0, "seconds": 0.0}]
        rows += [{"stage": s.stage, "utility_before": s.utility_before, "utility_realized": s.utility_realized,
                  "purchased": " ".join(s.purchased), "num_fine_tunes": s.num_fine_tunes, "seconds": s.seconds}
                 for s in self.stages]
        return pd.DataFrame(rows)


def _root_sequence(seed: int | np.random.Generator | None) -> np.random.SeedSequence:
    if isinstance(seed, np.random.Generator):
        return np.random.SeedSequence(int(seed.integers(2**63)))
    check_seed(seed)  # names the parameter on a bad seed
    return np.random.SeedSequence(seed)


def run_procurement(
    learner: Learner,
    initial_state: Mapping[str, np.ndarray],
    stages: Iterable[Sequence[Offer]],
    utility: ArraysUtility,
    *,
    rule: str = Method.ADS,
    budget: int = 1,
    methods: Sequence[str] = VALUATION_METHODS,
    seed: int | np.random.Generator | None = None,
    run_dir: str | None = None,
    config: Mapping | None = None,
    noisy: Mapping[str, bool] | None = None,
    on_stage: Callable[[StageOutcome], None] | None = None,
) -> ProcurementRun:
    """Procure stage after stage from ``initial_state`` (module docstring).

    The fine-tuning seed of stage t and the random rule's picks come from two separate
    children of ``seed`` (``SeedSequence.spawn``), so every rule given the same seed
    fine-tunes with the same seeds and sees the same offers: the trajectories differ only
    by what was bought. With ``run_dir`` the books are written stage by stage (``config``
    goes to run.json; the writer joins ``noisy``, contributor -> whether it is noisy, into the
    ledger's ``noisy`` column).
    """
    _check_purchase(rule, budget, methods)  # before anything is written
    if run_dir is not None and (Path(run_dir) / LEDGER_FILE).exists():
        raise ValueError(f"run_dir: expected a new or empty directory for the books; {run_dir} already holds a "
                         "ledger (appending would mix two runs). Choose another directory or remove it.")
    tune_sequence, pick_sequence = _root_sequence(seed).spawn(2)
    tune_rng, pick_rng = np.random.default_rng(tune_sequence), np.random.default_rng(pick_sequence)
    noisy_clients = None if noisy is None else {c for c, is_noisy in noisy.items() if is_noisy}
    writer = None if run_dir is None else LedgerWriter(run_dir, config=config, noisy_clients=noisy_clients)
    state: Arrays = dict(initial_state)
    initial_utility = float(utility(state))
    outcomes: list[StageOutcome] = []
    for stage, offers in enumerate(stages, start=1):
        offers = list(offers)
        outcome = procure_stage(learner, state, offers, utility, rule=rule, budget=budget, methods=methods,
                                fine_tune_seed=int(tune_rng.integers(2**31 - 1)), pick_rng=pick_rng, stage=stage)
        if writer is not None:
            writer.write_round(*stage_books(outcome, offers))
        outcomes.append(outcome)
        state = outcome.state
        if on_stage is not None:
            on_stage(outcome)
    if writer is not None:  # every stage booked: the run commits to its length and files
        writer.close(len(outcomes))
    return ProcurementRun(rule=rule, stages=outcomes, initial_utility=initial_utility, final_state=state)
