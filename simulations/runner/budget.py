"""``--valuation-budget``: coalition evaluations, or seconds, a round's valuation may spend.

``"2000"`` is 2,000 distinct coalition evaluations per round (ADS and LOO together;
:func:`fedvalue.valuation.round_game.value_round`), and ``ads_method="auto"`` picks exact ADS when its
2^n coalitions fit, else the sampler that fits (:func:`fedvalue.valuation.ads.budget_method`). The
same seed gives the same ledger, and the audit recomputes it.

``"30s"`` is turned into evaluations once, before the run starts, by timing the utility
on a synthetic round of the run's size (:func:`seconds_per_evaluation`): the round's fixed
cost (first-layer outputs of every client, the plain-path anchors) and the cost of one
more coalition. The evaluation count it gives is what every round then spends (the
round records keep it, so the audit recomputes the books); a timing differs between
machines and moments, so two runs with the same seconds budget may spend different
counts, and a resumed run times again. Give evaluations for a reproducible run.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass

import numpy as np

_PATTERN = re.compile(r"^\s*(?:(?P<evaluations>\d+)|(?P<seconds>\d+(?:\.\d*)?|\.\d+)\s*s)\s*$")


@dataclass(frozen=True)
class ValuationBudget:
    """A budget per round in ``evaluations`` or in ``seconds`` (exactly one is set)."""

    evaluations: int | None = None
    seconds: float | None = None

    def evaluations_for(self, utility, clients_per_round: int) -> int:
        """The budget in coalition evaluations per round (seconds: timed on ``utility``)."""
        if self.evaluations is not None:
            return self.evaluations
        if utility is None:
            raise ValueError("valuation_budget: a budget in seconds is timed on the run's utility; none was given "
                             "(give the budget in coalition evaluations instead).")
        fixed, per_coalition = seconds_per_evaluation(utility, clients_per_round)
        return max(1, math.floor((self.seconds - fixed) / per_coalition))


def check_budget(evaluations: int, ads_method: str, clients_per_round: int, methods) -> None:
    """ValueError naming ``valuation_budget`` when a round of ``clients_per_round`` clients
    cannot be valued by ``ads_method`` within ``evaluations`` (LOO's n + 1 reserved as
    :func:`fedvalue.valuation.round_game.value_round` reserves them), before the run starts."""
    from fedvalue.valuation.plan import MAX_EXACT_GROUP_SIZE, budget_method, exact_num_coalitions
    from fedvalue.valuation.round_game import ads_share_of_budget

    exact = exact_num_coalitions([range(clients_per_round)]) if clients_per_round <= MAX_EXACT_GROUP_SIZE else None
    ads_budget = ads_share_of_budget(evaluations, clients_per_round, methods)
    if "ads" not in methods:
        return
    try:
        if ads_budget < 1:
            raise ValueError(f"LOO alone needs {clients_per_round + 1} evaluations")
        budget_method(ads_method, [clients_per_round], ads_budget, exact)
    except ValueError as error:
        message = str(error).removeprefix("budget: ")
        raise ValueError(f"valuation_budget: {evaluations} evaluations per round do not fit: {message}") from None


def parse_budget(text: str) -> ValuationBudget | None:
    """``""`` -> None; ``"2000"`` -> 2,000 evaluations; ``"30s"`` -> 30 seconds."""
    if text is None or str(text).strip() == "":
        return None
    match = _PATTERN.match(str(text))
    if match is None or (match["evaluations"] is not None and int(match["evaluations"]) < 1) or \
            (match["seconds"] is not None and not float(match["seconds"]) > 0):
        raise ValueError(f"valuation_budget: expected coalition evaluations per round (a positive integer, e.g. "
                         f"2000) or seconds per round (e.g. 30s); got {text!r}.")
    if match["evaluations"] is not None:
        return ValuationBudget(evaluations=int(match["evaluations"]))
    return ValuationBudget(seconds=float(match["seconds"]))


def seconds_per_evaluation(utility, num_clients: int, *, seed: int = 0) -> tuple[float, float]:
    """(fixed seconds per round, seconds per coalition) of ``utility`` on a synthetic FedAvg
    round of ``num_clients`` clients around its model's state: two batches of random
    coalitions (16 and 80) scored on fresh round games, the difference giving the cost of
    one coalition and the rest the round's fixed cost. ``utility``: a
    :class:`~fedvalue.scoring.torch_utilities.TorchModelUtility` (or a wrapper holding one as ``.utility``)."""
    from fedvalue.valuation.round_game import fedavg_round_game

    local = getattr(utility, "utility", utility)
    rng = np.random.default_rng(seed)
    start = {k: v.detach().cpu().numpy().copy() for k, v in local.model.state_dict().items()}
    clients = [{k: (v + 0.01 * rng.standard_normal(v.shape)).astype(v.dtype) if v.dtype.kind == "f" else v
                for k, v in start.items()} for _ in range(num_clients)]
    full = (1 << num_clients) - 1
    candidates = max(full - 1, 1)  # every coalition but ∅ and the full one (scored on the plain path)
    counts = [min(16, candidates), min(80, candidates)]
    timings = []
    for count in counts:
        masks = [1 + int(m) for m in rng.choice(candidates, size=count, replace=False)] if num_clients < 62 else \
            [int(sum(1 << int(k) for k in np.flatnonzero(rng.random(num_clients) < 0.5))) or 1 for _ in range(count)]
        game = fedavg_round_game(list(range(num_clients)), start, clients, [1.0] * num_clients, local)
        started = time.perf_counter()
        game.values([0, full, *masks])
        timings.append(time.perf_counter() - started)
    if counts[1] == counts[0]:
        return 0.0, timings[1] / (counts[1] + 2)
    per_coalition = max((timings[1] - timings[0]) / (counts[1] - counts[0]), 1e-9)
    return max(timings[0] - counts[0] * per_coalition, 0.0), per_coalition
