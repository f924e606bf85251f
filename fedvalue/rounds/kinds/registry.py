"""The kinds of round book, in the order their rows follow a client's valuation rows
(:mod:`fedvalue.rounds.book_kind`). A new kind is one module and one line here."""

from __future__ import annotations

from collections.abc import Callable

from fedvalue.rounds.kinds.claims import claims_book
from fedvalue.rounds.kinds.defences import defences_book
from fedvalue.rounds.kinds.fairness_curvature import fairness_curvature_book
from fedvalue.rounds.kinds.fairness import fairness_book
from fedvalue.rounds.kinds.flows import flows_book
from fedvalue.rounds.kinds.selection import selection_book
from fedvalue.rounds.kinds.value_weights import value_weight_book
from fedvalue.rounds.book_kind import RoundBook, RoundContext

#: name -> kind(context) -> the round's book of that kind, or None when it keeps none.
ROUND_BOOKS: dict[str, Callable[[RoundContext], RoundBook | None]] = {
    "selection": selection_book,
    "value_weights": value_weight_book,
    "flows": flows_book,
    "fairness": fairness_book,
    "fair_curvature": fairness_curvature_book,
    "defences": defences_book,
    "claims": claims_book,
}
