"""Value-weighted aggregation: an acceptance policy that also sets each accepted reply's weight.

FedAvg weighs reply i by n_i; :class:`ValueWeighting` weighs it by n_i w_i with w_i a function of
the reply's within-round value φ_t(i), computed by the server on its held-out data before it
aggregates ([ADS] Remark 4.1, Eq. 10, or LOO): the counterpart of NVIDIA FLARE's FedCE
aggregation ([FEDCE]), whose contribution scores the clients compute themselves. The rule (``"positive"``:
w_i ∝ max(φ_i, 0), replies that did not help are left out; ``"softmax"``: w_i ∝ exp(r_i / τ) on
the round's scale-free values r_i = φ_i / max_j |φ_j|) is
:func:`fedvalue.rounds.kinds.value_weights.value_weight_outcome`; the wrapper books each factor as a
``value_weight`` row, marks the accepted replies as ``selected`` and saves the rule in the round
record, so ``fedvalue audit`` derives the same factors from the recomputed values.

Use it with a FedAvg-family inner strategy (the factors multiply FedAvg's weights)::

    ValuingStrategy(FedAvg(), utility, sampler=PartitionSampler(10, seed=0),
                    acceptance=ValueWeighting("ads"))
"""

from __future__ import annotations

from fedvalue.rounds.kinds.value_weights import KINDS, value_weight_outcome, weighting_rule
from strategies.acceptance_policy import AcceptInputs, Acceptance

SCORES = ("ads", "loo")


class ValueWeighting(Acceptance):
    """Accept the replies the rule gives a positive factor; the wrapper weighs them by n_i w_i.

    Parameters
    ----------
    score
        ``"ads"`` or ``"loo"``: the within-round value the factors follow (it must be among the
        strategy's valuation methods).
    kind
        ``"positive"`` (default) or ``"softmax"`` (module docstring).
    temperature
        τ > 0 of ``"softmax"`` (none for ``"positive"``).
    """

    books_selection = True

    def __init__(self, score: str = "ads", *, kind: str = "positive", temperature: float | None = None) -> None:
        if score not in SCORES:
            raise ValueError(f"score: expected one of {list(SCORES)}; got {score!r}.")
        if kind not in KINDS:
            raise ValueError(f"kind: expected one of {list(KINDS)}; got {kind!r}.")
        self.weighting = weighting_rule(score, kind, temperature)

    @property
    def score(self) -> str:
        return self.weighting["score"]

    def check(self, *, methods, flows, clients_per_round) -> None:
        if self.score not in methods:
            raise ValueError(f"score: {self.score!r} needs the strategy's methods to include it; they are "
                             f"{list(methods)}.")
        if flows:
            raise ValueError("acceptance: ValueWeighting changes the aggregation weights, which TracIn flows take as "
                             "FedAvg's; use flows=False with it.")

    def accept(self, round: AcceptInputs) -> set:
        accepted, _ = value_weight_outcome(self.weighting, round.values(self.score))
        return accepted

    def __repr__(self) -> str:
        extra = "" if self.weighting["kind"] == "positive" else (
            f", kind='softmax', temperature={self.weighting['temperature']!r}")
        return f"ValueWeighting({self.score!r}{extra})"
