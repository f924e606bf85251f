"""Server-side review of the weights clients claim (FedAvg's ``num-examples``).

FedAvg weighs client i's update by the count it claims: p_i = n_i / Σ_j n_j. The server
never sees the data, so a client that claims 100 times its size takes nearly the whole
step (:class:`clients.behaviours.InflatedExampleCount`), and every book built on p_i
follows: the round game's coalitions, ADS and LOO, and TracIn outflow −(p_u Δ_u)·g_v.
:class:`ClaimReview` checks each claim against what the server can know:

``registered``
    The size client i registered at enrollment, N_i (when the server knows it):
    n_i is capped at N_i.
``median_multiple`` (m)
    The round's other claims: n_i is capped at m × median_j n_j over the round's claims
    (after the registered cap), when the round has at least ``min_claims`` of them. It
    bounds any single client's share by m / (m + k − 1) against k − 1 clients at the
    median; a majority of colluding inflaters moves the median itself and defeats it.
``jump_factor`` (r)
    The client's own history: a claim above r × its previous claim (the last round it
    replied in) is flagged, not capped (a client may really have gathered data).

A capped claim changes BOTH the weight the books use (``ClientReply.weight``) and the
weight the inner Flower strategy aggregates (the reply's MetricRecord entry under the
strategy's ``weighted_by_key``, each reply's ``weight_key``), so the round game's v_t(I_t) is still U(A_t), the
realized state. Every capped or jumped claim is booked as an extra ledger row
(:func:`fedvalue.rounds.booking.claim_rows`, from the round record's
:class:`~fedvalue.schema.ClaimEntry`): method ``claim_capped`` or ``claim_jumped``, ``value`` = the
count claimed, ``num_examples`` = the weight used.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping
from dataclasses import dataclass

import numpy as np

from fedvalue._checks import check_integer, check_number
from fedvalue.schema import WEIGHED_STATUSES, ClaimEntry, Method, Status, client_key
from strategies.replies import ClientReply

#: Ledger methods of claim flags: a claim lowered by a cap, a claim that jumped against the client's last.
CLAIM_METHODS = (Method.CLAIM_CAPPED, Method.CLAIM_JUMPED)



@dataclass(frozen=True)
class ClaimFlag:
    """One reviewed claim the books record.

    Attributes
    ----------
    client_id
        The client.
    method
        ``"claim_capped"`` or ``"claim_jumped"``.
    claimed
        The count the client claimed.
    used
        The weight aggregated and booked (equal to ``claimed`` unless capped).
    limit
        The cap applied (``claim_capped``) or the threshold crossed, r × previous claim
        (``claim_jumped``).
    reason
        Which rule, in words.
    status
        The reply's status (``ok`` or ``rejected``).
    """

    client_id: Hashable
    method: str
    claimed: float
    used: float
    limit: float
    reason: str
    status: str = Status.OK

    def entry(self) -> ClaimEntry:
        """The flag as the round record holds it (and its row books it)."""
        return ClaimEntry(self.client_id, self.method, self.claimed, self.used, self.status)


class ClaimReview:
    """Validates, caps and flags the weights clients claim (see module docstring).

    Parameters
    ----------
    registered
        ``{client id: registered size}`` (positive ints) for the clients whose size the
        server knows; clients missing from it are not capped by this rule.
    median_multiple
        m ≥ 1: cap every claim at m × the round's median claim. ``None``: no such cap.
    jump_factor
        r > 1: flag a claim above r × the client's previous claim. ``None``: no flag.
    min_claims
        The median cap applies only in rounds with at least this many claims (≥ 3: with
        two, the median is their mean and one inflater moves it as much as it likes).

    Examples
    --------
    Cap at the registered sizes and at 3 x the median claim, flag claims that triple::

        review = ClaimReview(registered={0: 30, 1: 34}, median_multiple=3.0, jump_factor=3.0)
        ValuingStrategy(FedAvg(), utility, intake=IntakeSettings(claims=review))
    """

    def __init__(
        self,
        *,
        registered: Mapping[Hashable, int] | None = None,
        median_multiple: float | None = None,
        jump_factor: float | None = None,
        min_claims: int = 3,
    ) -> None:
        if registered is None and median_multiple is None and jump_factor is None:
            raise ValueError(
                "registered, median_multiple, jump_factor: expected at least one rule (registered sizes, a "
                "cap at a multiple of the median claim, or a jump factor); got none."
            )
        if registered is not None:
            if not isinstance(registered, Mapping):
                raise TypeError(
                    f"registered: expected a mapping {{client id: registered size}}; got {type(registered).__name__}."
                )
            for client_id, size in registered.items():
                check_integer(f"registered[{client_id!r}]", size, unit="size")
            registered = {client_key(c): int(n) for c, n in registered.items()}
        if median_multiple is not None:
            median_multiple = check_number("median_multiple", median_multiple, low=1.0)
        if jump_factor is not None:
            jump_factor = check_number("jump_factor", jump_factor, low=1.0, low_open=True)
        check_integer("min_claims", min_claims, 3, why="a median that one claim cannot move")
        self.registered = registered
        self.median_multiple = median_multiple
        self.jump_factor = jump_factor
        self.min_claims = int(min_claims)
        #: The last claim seen from each client (raw, before any cap), for the jump rule.
        self.previous_claims: dict[Hashable, float] = {}

    def __repr__(self) -> str:
        settings = {"registered": self.registered, "median_multiple": self.median_multiple,
                    "jump_factor": self.jump_factor}
        rules = [f"{name}={value!r}" for name, value in settings.items() if value is not None]
        return f"ClaimReview({', '.join(rules)})"

    def review(self, records: list[ClientReply]) -> list[ClaimFlag]:
        """Cap the round's claims in place and return the flags to book.

        Parameters
        ----------
        records
            The round's replies (:func:`strategies.replies.read_reply`); those with
            status ``ok`` or ``rejected`` carry a claim (under its ``weight_key``, the metric
            the inner strategy weighs by). A capped record gets its new ``weight``, ``metrics``
            entry and reply-message MetricRecord entry.

        Returns
        -------
        list of ClaimFlag
            In record order: a client's ``claim_capped`` flag before its ``claim_jumped``.
        """
        weighed = [r for r in records if r.status in WEIGHED_STATUSES and r.weight is not None]
        claimed = {id(r): float(r.weight) for r in weighed}
        limits: dict[int, tuple[float, str]] = {}
        if self.registered is not None:
            for record in weighed:
                size = self.registered.get(client_key(record.client_id))
                if size is not None and claimed[id(record)] > size:
                    limits[id(record)] = (float(size), f"above the registered size {size}")
        if self.median_multiple is not None and len(weighed) >= self.min_claims:
            after_registry = [min(claimed[id(r)], limits.get(id(r), (math.inf, ""))[0]) for r in weighed]
            cap = self.median_multiple * float(np.median(after_registry))
            for record, claim in zip(weighed, after_registry):
                if claim > cap:
                    limits[id(record)] = (cap, f"above {self.median_multiple:g} x the round's median claim")
        flags = []
        for record in weighed:
            claim = claimed[id(record)]
            if id(record) in limits:
                limit, reason = limits[id(record)]
                used = _set_weight(record, limit)
                flags.append(ClaimFlag(record.client_id, Method.CLAIM_CAPPED, claim, used, limit, reason,
                                       record.status))
            previous = self.previous_claims.get(client_key(record.client_id))
            if self.jump_factor is not None and previous is not None and claim > self.jump_factor * previous:
                flags.append(ClaimFlag(record.client_id, Method.CLAIM_JUMPED, claim, float(record.weight),
                                       self.jump_factor * previous,
                                       f"above {self.jump_factor:g} x its previous claim {previous:g}",
                                       record.status))
            self.previous_claims[client_key(record.client_id)] = claim
        return flags


def _set_weight(record: ClientReply, limit: float) -> float:
    """Lower a record's claim to ``limit`` everywhere it is read; returns the weight used.

    An int claim stays an int (rounded down, at least 1), as Flower's metric records hold it.
    """
    original = record.metrics.get(record.weight_key, record.weight)
    used: int | float = max(1, math.floor(limit)) if isinstance(original, (int, np.integer)) else float(limit)
    record.weight = float(used)
    record.metrics[record.weight_key] = used
    record.weigh(used)
    return float(used)
