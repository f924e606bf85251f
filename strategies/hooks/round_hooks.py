"""The hooks of one run, as the valuing strategy meets them: the kinds of books its
:class:`strategies.valuing_settings.BookSettings` ask for beyond the replies (TracIn flows,
fairness, defences), each called at fixed points of a round, and the acceptance step they feed.

A round asks the clients for what the books need (:meth:`RoundHooks.train_config`), starts from
A_{t−1} (:meth:`RoundHooks.start_round`), decides which valid replies are aggregated
(:meth:`RoundHooks.accept`: fairness is valued first, inside its plug-in, and the policy reads its
scores, the flows' outflows or the defences' replies), and notes what the record needs
(:meth:`RoundHooks.settings_notes`, :meth:`RoundHooks.note`).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from flwr.app import ConfigRecord
from flwr.serverapp.strategy import Strategy

from fedvalue.run.archive import RoundRecord
from fedvalue.valuation.round_game import RoundValuation, ValuationSettings
from strategies.hooks.defences import DefenceRounds
from strategies.hooks.fairness import FairnessRounds, check_policy
from strategies.hooks.flows import FlowQueries, outflows_if_all_aggregated
from strategies.hooks.value_weights import reweigh_by_values, weighting_rule
from strategies.policies.acceptance import Acceptance
from strategies.protocol import GRADIENT_KEY
from strategies.train_round import TrainRound
from strategies.book_settings import BookSettings


class RoundHooks:
    """The flows, fairness and defences hooks of a run whose books are ``settings`` and whose
    replies are taken by ``acceptance`` (``fair`` and ``defences`` None when not booked), and
    the value weighting a policy may name (``weighting``: its rule, or None).

    ValueError when ``acceptance`` acts on books the run does not keep (fairness influences,
    curvature, the defences' previous global model), or weighs by values where ``strategy`` does
    not aggregate by the weighted mean.
    """

    def __init__(self, settings: BookSettings, acceptance: Acceptance, strategy: Strategy) -> None:
        check_policy(acceptance, settings.fairness, settings.fair_curvature)
        self.acceptance = acceptance
        self.flows = settings.flows
        self.fair = None if settings.fairness is None else FairnessRounds(settings.fairness, settings.fair_curvature,
                                                                          acceptance)
        self.defences = None if settings.defences is None else DefenceRounds(settings.defences)
        if getattr(acceptance, "needs_replies", False) and self.defences is None:
            raise ValueError(f"acceptance: {acceptance!r} reads the defences' previous global model; book them "
                             "too: books=BookSettings(defences=DefenceSettings()).")
        self.flow_queries = FlowQueries()
        self.weighting = weighting_rule(acceptance, strategy, fairness=self.fair is not None)

    def train_config(self, config: ConfigRecord) -> ConfigRecord:
        """The round's train config with what the books ask of the clients (gradients, curvature)."""
        if self.flows:
            config = ConfigRecord({**dict(config), GRADIENT_KEY: True})
        return config if self.fair is None else self.fair.train_config(config)

    def start_round(self, start_arrays: Mapping[str, np.ndarray]) -> None:
        if self.defences is not None:
            self.defences.start_round(start_arrays)

    def resume_from(self, run_dir, committed_rounds: int) -> None:
        if self.defences is not None:
            self.defences.resume_from(run_dir, committed_rounds)

    def accept(self, round_: TrainRound, valuation: RoundValuation, *, settings: ValuationSettings, seed: int,
               weighted_by_key: str) -> tuple[set, object]:
        """(the clients whose valid replies are aggregated, the round's fairness books or None).

        Fairness is valued first (:class:`strategies.hooks.fairness.FairnessRounds`), so that the
        policy can act on its scores; a reweighing policy's factors are booked after it chose.
        """
        ok, start, intake = round_.intake.ok, round_.start.arrays, round_.intake
        fair = None if self.fair is None else self.fair.value(round_.record(), round_.aggregator, settings,
                                                              round_.rng())
        scores = None if fair is None or not ok else self.fair.scores(fair)
        accepted = self.acceptance.accept(
            round_.server_round, [r.client_id for r in ok], valuation, seed=seed,
            outflows=lambda: outflows_if_all_aggregated(start, ok, intake.gradients),
            # Only for a policy that reads the replies (strategies.policies.representatives).
            **({"replies": lambda: self.defences.round_replies(start, ok)}
               if getattr(self.acceptance, "needs_replies", False) else {}),
            # Only with fairness books: a policy written before them takes no such keyword.
            **({} if fair is None else {"fairness": scores})
        ) if ok else set()
        if fair is not None and ok:
            fair = self.fair.reweigh(fair, ok, accepted, weighted_by_key)
        if self.weighting is not None and ok:  # value-weighted aggregation: n_u w_u from the round's values
            reweigh_by_values(self.weighting, ok, accepted, valuation, weighted_by_key)
        return accepted, fair

    def check_first_order(self, gradients: Mapping, ledger) -> None:
        """With flows: last round's predicted loss changes meet the losses reported now, at A_{t−1}."""
        if self.flows:
            self.flow_queries.check_first_order(gradients, ledger)

    def settings_notes(self) -> dict:
        """What the round record notes of the fairness books, the value weighting and the defences."""
        return {"fairness": None if self.fair is None else self.fair.settings_note(),
                "weighting": self.weighting,
                "defences": None if self.defences is None else self.defences.settings_note()}

    def note(self, record: RoundRecord) -> RoundRecord:
        """``record`` with the references the defences' tests need."""
        return record if self.defences is None else self.defences.note(record)
