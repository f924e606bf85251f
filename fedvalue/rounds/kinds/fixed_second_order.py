"""The fixed-weight round game's second-order expansion as a round book: after each sampled client's rows,
``ads_fixed_second_order``, the Shapley value of the expanded game ([ADS] Remark 4.1, Eq. 9 with one group,
on the expansion of :mod:`fedvalue.valuation.taylor`) over the round's valid replies, whatever the run's own
coalition rule and ADS estimator:

    φ_k = u_k·(g + ½ H U),   u_k = p_k Δ_k,   p_k = n_k / Σ_{j∈I_t} n_j,   U = Σ_{j∈I_t} u_j,

g = ∇U(A_{t−1}), H = ∇²U(A_{t−1}), with its standard error 0.0 (no sampling). A client that failed or was
rejected gets the row empty.

φ is linear in each reply's claim-weighted update u_k and depends on the others through U alone, so one
participant's identities whose claims add up to its claim and whose claim-weighted updates add up to its own
are paid, together, what that one client would be, and every other client as before: a split gains nothing.
Replicas and overlapping shards are not such a split (each u_k carries its own claim): they are paid as one
claim inflated to their summed claims.

Booked when the round record's settings hold ``fixed_second_order``; the round game is built from the record
alone (:func:`fedvalue.rounds.record_game.valid_clients`, their reply order and weights, the coalition rule
``fixed-weight``) with the run's utility, so the audit books these rows again from the record. Its two anchor
evaluations, v(∅) and v(I_t) for the efficiency gap of the expansion, are added to the round's in rounds.csv.

When the settings also hold ``defences``, each client's ``ads_fixed_second_order_defended`` row follows: c_k φ_k,
0 for a reply the round's free-rider test flags and n_max(C) / n_C for a member of a near-duplicate cluster C
(:mod:`fedvalue.rounds.defences.second_order`), from the same record (its previous global model included), with
no evaluation of its own. Without ``defences`` the row is not booked.
"""

from __future__ import annotations

from fedvalue.rounds.book_kind import RoundBook, RoundContext
from fedvalue.rounds.defences.quotient import screen_replies
from fedvalue.rounds.defences.second_order import one_claim_factors
from fedvalue.rounds.defences.settings import DefenceSettings
from fedvalue.rounds.kinds.defences import PREVIOUS_GLOBAL
from fedvalue.rounds.record_game import record_game, valid_clients
from fedvalue.run.archive import RoundRecord
from fedvalue.schema import ClientEntry, LedgerRow, Method, Status
from fedvalue.valuation.result import ValuationResult
from fedvalue.valuation.round_game import round_rng, value_round
from fedvalue.valuation.settings import FIXED_WEIGHT, AdsSettings

#: The expansion the book values the fixed-weight round game by (:mod:`fedvalue.valuation.taylor`).
SECOND_ORDER = AdsSettings(method="second-order")


class FixedSecondOrderBook(RoundBook):
    """One round's ``ads_fixed_second_order`` rows from the expansion's valuation (None: no valid reply), each
    followed, when ``factors`` is not None (the round's defences are on), by its ``ads_fixed_second_order_defended``
    row: the value and standard error times the client's factor c_k."""

    def __init__(self, context: RoundContext, result: ValuationResult | None, num_evaluations: int,
                 factors: dict | None = None) -> None:
        self.context, self.result = context, result
        self.num_evaluations = num_evaluations
        self.factors = factors

    def entry_rows(self, entry: ClientEntry) -> list[LedgerRow]:
        valued = self.result is not None and entry.status == Status.OK and entry.client_id in self.result.values.index
        value = float(self.result.values[entry.client_id]) if valued else None
        stderr = float(self.result.stderr[entry.client_id]) if valued else None
        rows = [self.context.entry_row(entry, Method.ADS_FIXED_SECOND_ORDER, value, stderr, entry.num_examples)]
        if self.factors is not None:
            factor = self.factors.get(entry.client_id) if valued else None
            rows.append(self.context.entry_row(
                entry, Method.ADS_FIXED_SECOND_ORDER_DEFENDED, None if factor is None else factor * value,
                None if factor is None else factor * stderr, entry.num_examples))
        return rows


def recorded_claim_factors(record: RoundRecord, clients: list | None = None) -> dict:
    """Client -> c_k for the round's valid replies ``clients`` (None: :func:`valid_clients` of the record): the
    round's free-rider tests and near-duplicate clusters, screened as the defended ADS book screens them under the
    record's own defence settings and previous global model, made claim factors. A record of a round without the
    defences has no screen to repeat: ValueError naming ``defences``."""
    if record.settings.defences is None:
        raise ValueError(f"defences: expected round {record.round}'s record to hold the defence settings its replies "
                         "were screened under; got none (a run without the defences). Book the defended rows of a "
                         "run made with the defences on.")
    clients = valid_clients(record) if clients is None else clients
    settings = DefenceSettings.from_meta(record.settings.defences)
    weights = {c: record.weights[c] for c in clients}
    flags, clusters = screen_replies(record.start_arrays, {c: record.replies[c] for c in clients}, weights,
                                     record.references.get(PREVIOUS_GLOBAL), settings)
    return one_claim_factors(weights, flags, clusters)


def fixed_second_order_book(context: RoundContext) -> FixedSecondOrderBook | None:
    if not context.settings.fixed_second_order:
        return None
    record = context.record
    defended = context.settings.defences is not None
    ok = valid_clients(record)
    if not ok:
        return FixedSecondOrderBook(context, None, 0, {} if defended else None)
    if context.utility is None:
        raise ValueError("fixed_second_order: expected the run's utility to expand the round game with; got None.")
    game = record_game(record, context.utility, rule=FIXED_WEIGHT)
    valuation = value_round(game, (Method.ADS,), SECOND_ORDER, seed=round_rng(context.settings.seed, record.round))
    return FixedSecondOrderBook(context, valuation.results[Method.ADS], valuation.num_evaluations,
                                recorded_claim_factors(record, ok) if defended else None)
