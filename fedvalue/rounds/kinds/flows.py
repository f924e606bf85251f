"""TracIn flows as a round book ([RECIP] §4): each sampled client's ``tracin_inflow``,
``tracin_outflow`` and ``tracin_self`` rows, then those of the clients that did not train
this round (``idle``: they still receive inflow). Booked when the round records inference
gradients (``record.settings.flows``). The flows are those of the aggregated clients' step,
F(u→v) = −(p_u Δ_u)·g_v (:func:`fedvalue.flows.round_flows.fedavg_round_flows`), or, when the record
keeps the vectors projected (``record.settings.flows_projection``), −p_u (R_t Δ_u)·(R_t g_v) from the
projected vectors it keeps (:func:`fedvalue.flows.projected_flows.projected_round_flows`); a client whose
inference gradient is missing has no known inflow (booked empty)."""

from __future__ import annotations

from fedvalue.flows.projected_flows import projected_round_flows
from fedvalue.flows.round_flows import RoundFlows, fedavg_round_flows
from fedvalue.rounds.book_kind import RoundBook, RoundContext
from fedvalue.schema import FLOW_METHODS, ClientEntry, LedgerRow, Status


class FlowsBook(RoundBook):
    """The round's flows (:attr:`flows`, for the first-order check) and their rows."""

    def __init__(self, context: RoundContext, flows: RoundFlows, missing: frozenset) -> None:
        self.context, self.flows, self.missing = context, flows, missing
        self.frame = flows.to_frame()

    def _rows(self, client_id, status: str, num_examples: int | None, reason: str | None) -> list[LedgerRow]:
        known = status in (Status.OK, Status.IDLE) and client_id in self.frame.index
        rows = []
        for method, column in FLOW_METHODS.items():
            value = float(self.frame.at[client_id, column]) if known else None
            if column == "inflow" and client_id in self.missing:
                value = None
            rows.append(self.context.row(client_id, method, value, None if value is None else 0.0, num_examples,
                                         status, reason))
        return rows

    def entry_rows(self, entry: ClientEntry) -> list[LedgerRow]:
        return self._rows(entry.client_id, entry.status, self.context.weight_count(entry),
                          self.context.reason_of(entry))

    def closing_rows(self) -> list[LedgerRow]:
        booked = {e.client_id for e in self.context.record.entries}
        return [row for client_id in self.frame.index if client_id not in booked
                for row in self._rows(client_id, Status.IDLE, None, None)]


def flows_book(context: RoundContext) -> FlowsBook | None:
    record = context.record
    if not context.settings.flows:
        return None
    accepted = set(record.accepted)
    ok = [e for e in record.entries if e.status == Status.OK]
    aggregated = [e.client_id for e in ok if e.client_id in accepted]
    projected = context.settings.flows_projection is not None
    if not ((record.projected_gradients if projected else record.gradients) or aggregated):
        return None
    weights = {e.client_id: e.weight for e in ok}
    if projected:
        unprojected = [c for c in aggregated if c not in record.projected_updates]
        if unprojected:
            raise ValueError(f"projected_updates: expected the projected update of every aggregated client; "
                             f"missing {unprojected[:5]}.")
        flows, missing = projected_round_flows({c: record.projected_updates[c] for c in aggregated},
                                               record.projected_gradients, {c: weights[c] for c in aggregated})
    else:
        flows, missing = fedavg_round_flows(record.start_arrays, {c: record.replies[c] for c in aggregated},
                                            {c: weights[c] for c in aggregated}, record.gradients)
    return FlowsBook(context, flows, missing)
