"""Which valid replies of a round the inner strategy aggregates: acceptance policies.

Every sampled client trains and the round is valued; the policy then decides which of the
valid replies the inner strategy aggregates, so the realized state moves with the accepted
clients ([ADS] §6.2, App. C.2: top-k selection by within-round scores and the retrain
protocol). A policy is passed to :class:`~strategies.ValuingStrategy` as ``acceptance``:

* :class:`AcceptAll` (the default): every valid reply.
* :class:`TopK`: the k best by ``"ads"`` or ``"loo"`` (they must be among the strategy's
  methods), ``"tracin_outflow"`` (outflow as if every reply were aggregated; needs
  ``flows=True``) or ``"random"`` (seeded by the run's seed and the round).
* :class:`Replay`: a given acceptance per round (the retrain protocol, with
  :class:`~strategies.policies.sampling.ReplaySampler` replaying the scored run's clients).
* :class:`FairDropK`: all but the K replies with the largest positive fairness score
  ([FAIRIJ] Prop. 3.1, drop-K / Fair-IJ at client level): by default the first-order
  influence I^F_t(u); ``score`` picks its FedAvg-renormalized derivative, the curvature
  influence's (the strategy must ask for curvature: ``fair_curvature``) or the exact drop
  effect −loo_fairness (:mod:`fedvalue.scoring.fairness.curvature`).
* :class:`FairReweight`: every reply, its FedAvg weight n_u multiplied by the I-JACK factor
  w_u = max(0, 1 − λ I^F_t(u)) normalized to mean 1 ([FAIRIJ] Prop. 3.2); a reply whose factor
  is 0 is not aggregated. λ = 0 leaves the run FedAvg's, bit for bit.

The fairness policies need the strategy's ``fairness`` objective (the influences are those
booked as ``fairness_influence``: every valid reply as if all were aggregated); they read the
scores the run's :class:`fedvalue.rounds.fairness_round.FairnessPlugin` computed for their
``rule``, and I-JACK's factors are that plug-in's (:meth:`~fedvalue.rounds.fairness_round.FairnessPlugin.decide`),
which the audit calls again on the round record. Policies
other than AcceptAll and FairReweight book a ``selected`` row (1/0) per client and round;
FairReweight books ``fair_weight`` (w_u) instead.

A policy of one's own subclasses :class:`Acceptance`: it declares everything the strategy reads
of it (each with a default) and decides from one :class:`AcceptInputs`, which carries the round's
values and, read lazily and only when the policy ``needs`` them, what the run's books offer: the
outflows of TracIn flows (``"outflows"``), the fairness scores (``"fairness"``) and the defences'
view of the replies (``"replies"``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import numpy as np

from fedvalue._checks import check_choice, check_integer, check_number
from fedvalue.analysis.top_k_selection import top_k
from fedvalue.rounds.fairness_round import policy_outcome
from strategies.acceptance_policy import FAIRNESS, OUTFLOWS, AcceptInputs, Acceptance

SCORES = ("ads", "loo", "tracin_outflow", "random")


class TopK(Acceptance):
    """The ``k`` best valid replies of each round by ``score`` (module docstring)."""

    books_selection = True

    def __init__(self, k: int, score: str = "ads") -> None:
        check_integer("k", k)
        check_choice("score", score, SCORES)
        self.k = int(k)
        self.score = score

    @property
    def needs(self) -> frozenset[str]:
        return frozenset({OUTFLOWS}) if self.score == "tracin_outflow" else frozenset()

    def check(self, *, methods, flows, clients_per_round) -> None:
        if self.score in ("ads", "loo") and self.score not in methods:
            raise ValueError(f"score: {self.score!r} needs methods to include it; methods are {list(methods)}.")
        if self.score == "tracin_outflow" and not flows:
            raise ValueError("score: 'tracin_outflow' needs flows=True.")
        if clients_per_round is not None and clients_per_round < self.k:
            raise ValueError(f"k: expected at most the {clients_per_round} clients sampled per round; got {self.k}.")

    def accept(self, round: AcceptInputs) -> set:
        order = list(round.clients)
        if self.score == "random":
            rng = np.random.default_rng([round.seed, round.server_round, 1])
            picked = rng.choice(len(order), size=min(self.k, len(order)), replace=False)
            return {order[i] for i in picked}
        scores = round.outflows() if self.score == "tracin_outflow" else round.values(self.score)
        return set(top_k(scores, self.k, order))

    def __repr__(self) -> str:
        return f"TopK(k={self.k}, score={self.score!r})"


class Replay(Acceptance):
    """Accept in round t exactly the clients ``plan[t]`` names (ids compared as text)."""

    books_selection = True

    def __init__(self, plan: Mapping[int, Collection]) -> None:
        self.plan = {int(t): {str(c) for c in ids} for t, ids in plan.items()}

    def accept(self, round: AcceptInputs) -> set:
        chosen = self.plan.get(round.server_round, set())
        return {c for c in round.clients if str(c) in chosen}


class _FairPolicy(Acceptance):
    """What the fairness policies share: they act on the fairness scores of their rule."""

    books_selection = True
    needs = frozenset({FAIRNESS})

    def accept(self, round: AcceptInputs) -> set:
        scores = round.fairness()
        accepted, _ = policy_outcome(self.fairness_rule, {c: scores[c] for c in round.clients})
        return accepted


class FairDropK(_FairPolicy):
    """All valid replies but the ``k`` with the largest positive fairness ``score`` (module docstring)."""

    def __init__(self, k: int, score: str = "first-order") -> None:
        self.k = check_integer("k", k, 0)
        from fedvalue.scoring.fairness.curvature import SCORES as FAIR_SCORES  # torch: only for fairness policies

        self.score = str(check_choice("score", score, FAIR_SCORES))
        # The first-order rule is recorded as before (no "score" key): older records read the same.
        self.fairness_rule = {"rule": "drop-k", "k": self.k,
                              **({} if self.score == "first-order" else {"score": self.score})}

    def check(self, *, methods, flows, clients_per_round) -> None:
        if self.score == "exact" and "loo" not in methods:
            raise ValueError(f"score: 'exact' acts on LOO of the fairness game; methods must include 'loo'; they "
                             f"are {list(methods)}.")

    def __repr__(self) -> str:
        return f"FairDropK(k={self.k}" + ("" if self.score == "first-order" else f", score={self.score!r}") + ")"


class FairReweight(_FairPolicy):
    """I-JACK reweighting of the valid replies with strength ``lam`` (module docstring)."""

    books_selection = False

    def __init__(self, lam: float) -> None:
        self.lam = check_number("lam", lam, low=0.0)
        self.fairness_rule = {"rule": "ijack", "lam": self.lam}

    def check(self, *, methods, flows, clients_per_round) -> None:
        if flows:
            raise ValueError("acceptance: FairReweight changes the aggregation weights, which TracIn flows take as "
                             "FedAvg's; use flows=False with it.")

    def __repr__(self) -> str:
        return f"FairReweight(lam={self.lam})"
