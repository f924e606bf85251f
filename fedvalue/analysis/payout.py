"""Payments from the books: a budget shared among the clients by a fixed rule, so that "what a
client is paid" is a number a data market would use.

A client's total Φ_i is the sum of its booked values of one method over the rounds (``ok`` rows).
With floor f ≥ 0, the clients with Φ_i > f are eligible, and budget B is shared among them:

``share-of-positive``  p_i = B · Φ_i / Σ_{j eligible} Φ_j   (in proportion to value; f = 0 pays
                       every client of positive value, in proportion to it)
``equal``              p_i = B / |eligible|                 (a flat payment for clearing the floor)

Everyone else is paid 0. When no client clears the floor the budget is not spent (every p_i = 0).

No book is paid without an explicit opt-in (``allow_undefended=True``, the command line's
``--allow-undefended``) where the attack study of docs/faults-and-audit.md measured that identities buy it with
every defence on (:data:`UNDEFENDED`), and it measured that for every book: an attacker that knows the defences'
thresholds stays outside them (the adaptive sweep), so K identities holding one participant's data are paid as K
participants by ADS and TracIn outflow, and overlapping shards whose claims are each true are paid more by LOO.
The opt-in states what the books cannot check: that each identity is a distinct participant (a verified
registration). A table paid under it says so on every row (``undefended``).

Without a method named, the book paid is :func:`default_payout_method`'s: the defended ADS when the run booked it
(``--defences``), else ADS.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from fedvalue._checks import check_choice, check_number
from fedvalue.schema import Status, client_sort_key

RULES = ("share-of-positive", "equal")
#: The columns of a payout table (rule, floor, budget and method stated on every row; ``undefended``: paid
#: from a book of :data:`UNDEFENDED`, by the opt-in).
PAYOUT_COLUMNS = ("client_id", "method", "total_value", "eligible", "payment", "rule", "floor", "budget",
                  "undefended")
#: Books the defences do not vouch for, with what the attack study measured (docs/faults-and-audit.md): its
#: table of TracIn outflow gains, and the adaptive sweep (docs/results/attack_gains_adaptive.csv).
_IDENTITIES_ADS = ("4 identities holding one participant's data, their updates (1 + M) times the clustering "
                   "threshold apart, gain up to 1.97 times its honest ADS")
_SHARDS_LOO = ("4 identities on overlapping shards of one participant's data, each claim true, are paid 0.496 of a "
               "budget by LOO against 0.184 honestly")
UNDEFENDED = {
    "ads": f"{_IDENTITIES_ADS} (docs/faults-and-audit.md, the adaptive sweep)",
    "ads_defended": f"{_IDENTITIES_ADS} with every defence on (docs/faults-and-audit.md, the adaptive sweep)",
    "loo": f"{_SHARDS_LOO} (docs/faults-and-audit.md, the adaptive sweep)",
    "loo_defended": f"{_SHARDS_LOO} with every defence on (docs/faults-and-audit.md, the adaptive sweep)",
    "tracin_outflow": "a participant that splits into identities gains up to 3.43 times its honest TracIn outflow, "
                      "one that replicates its update up to 36.7 times (docs/faults-and-audit.md, the attack study)",
    "tracin_outflow_defended": "a participant that splits into identities keeps a TracIn outflow gain of up to 3.43 "
                               "with every defence on (docs/faults-and-audit.md, the attack study)",
    "ads_fixed_second_order": "one participant's identities are paid what one client replying their summed weighted "
                              "update is paid: a split whose claims add up gains nothing, but replicas and overlapping "
                              "shards are paid as one claim inflated to their summed claims (docs/faults-and-audit.md, "
                              "the identity attacks booked again)",
    "ads_fixed_second_order_defended": "replicas of one participant's update, each moved just past the clustering "
                                       "threshold by perturbations that cancel, escape its clusters at no cost to "
                                       "their summed weighted update, so identities are still paid as one claim "
                                       "inflated to their summed claims, whatever the threshold (with the relative "
                                       "clusters, the adaptive replicas at margin 5 are paid 1.70 and 2.62 times a "
                                       "seat's value for 2 and 4 identities on IID data: docs/faults-and-audit.md, "
                                       "the defended second-order book)",
}


#: The books paid when no method is named, in order of preference (:func:`default_payout_method`).
DEFAULT_METHODS = ("ads_defended", "ads")


def default_payout_method(ledger: pd.DataFrame) -> str:
    """The book to pay from when none is named: the first of :data:`DEFAULT_METHODS` the ledger has ``ok`` rows of,
    so ``ads_defended`` in a run with the defences on (plain ADS is not identity-robust: docs/faults-and-audit.md,
    the attack study), else ``ads`` (also when the ledger books neither: paying it then says what the ledger books)."""
    booked = set(ledger.loc[ledger["status"] == Status.OK, "method"].astype(str))
    return next((method for method in DEFAULT_METHODS if method in booked), DEFAULT_METHODS[-1])


def check_default_payable(allow_undefended: bool = False) -> None:
    """ValueError naming ``payout`` when no book :func:`default_payout_method` can pick is paid without the opt-in
    (so a payout without a method is refused before any ledger is read)."""
    if not allow_undefended and all(method in UNDEFENDED for method in DEFAULT_METHODS):
        raise ValueError(f"payout: no book is paid by default: the books paid without --method ("
                         f"{' or '.join(DEFAULT_METHODS)}) can be bought by identities: {UNDEFENDED['ads_defended']}; "
                         f"pass allow_undefended=True (--allow-undefended) where each identity is a distinct, verified "
                         f"participant.")


def check_payable(method: str, allow_undefended: bool = False) -> None:
    """ValueError naming ``method`` and why, when it is a book of :data:`UNDEFENDED` and the opt-in is not given."""
    if method in UNDEFENDED and not allow_undefended:
        raise ValueError(f"method: {method} is not paid by default: {UNDEFENDED[method]}; pass allow_undefended=True "
                         f"(--allow-undefended) to pay from it anyway.")


def payments(totals: pd.Series, budget: float, *, rule: str = "share-of-positive", floor: float = 0.0) -> pd.Series:
    """Client -> payment from client -> Φ (module docstring); NaN totals are not eligible."""
    budget = check_number("budget", budget, low=0.0)
    floor = check_number("floor", floor, low=0.0)
    check_choice("rule", rule, RULES)
    values = pd.to_numeric(totals, errors="coerce").astype(float)
    eligible = values > floor
    paid = pd.Series(0.0, index=values.index)
    if eligible.any():
        share = values[eligible] / float(values[eligible].sum()) if rule == "share-of-positive" \
            else pd.Series(1.0 / int(eligible.sum()), index=values[eligible].index)
        paid[eligible] = budget * share
    return paid


def client_totals(ledger: pd.DataFrame, method: str) -> pd.Series:
    """Client -> Σ of its ``ok`` rows of ``method`` (clients sorted as ids); KeyError-free: an
    unknown method gives an empty series."""
    booked = ledger[(ledger["status"] == Status.OK) & (ledger["method"] == method)]
    totals = pd.to_numeric(booked["value"], errors="coerce").groupby(booked["client_id"].astype(str)).sum()
    return totals.reindex(sorted(totals.index, key=client_sort_key))


def payout_table(ledger: pd.DataFrame, budget: float, *, method: str | None = None, rule: str = "share-of-positive",
                 floor: float = 0.0, allow_undefended: bool = False) -> pd.DataFrame:
    """One row per client with a booked ``method`` row: its total, eligibility and payment, with the
    rule, floor, budget and method stated on every row (:data:`PAYOUT_COLUMNS`). ``method`` None: the
    ledger's :func:`default_payout_method`. A book of :data:`UNDEFENDED` is refused (ValueError saying
    why) unless ``allow_undefended``; its rows then say ``undefended``."""
    if not isinstance(allow_undefended, bool):
        raise TypeError(f"allow_undefended: expected True or False; got {allow_undefended!r}.")
    if method is None:
        check_default_payable(allow_undefended)
        method = default_payout_method(ledger)
    check_payable(method, allow_undefended)
    totals = client_totals(ledger, method)
    if totals.empty:
        methods = sorted(set(ledger["method"].astype(str)))
        raise ValueError(f"method: expected a method the ledger books for its clients; got {method!r}, the ledger "
                         f"books {methods[:12]}.")
    paid = payments(totals, budget, rule=rule, floor=floor)
    table = pd.DataFrame({"client_id": totals.index, "method": method, "total_value": totals.to_numpy(),
                          "eligible": (totals > floor).to_numpy(), "payment": paid.to_numpy(), "rule": rule,
                          "floor": float(floor), "budget": float(budget), "undefended": method in UNDEFENDED})
    return table[list(PAYOUT_COLUMNS)]


def paid_share(totals: pd.Series, members, *, rule: str = "share-of-positive", floor: float = 0.0) -> float:
    """The share of a budget of 1 paid to ``members`` (ids compared as text)."""
    paid = payments(totals, 1.0, rule=rule, floor=floor)
    chosen = {str(m) for m in members}
    return float(np.sum([v for c, v in paid.items() if str(c) in chosen]))
