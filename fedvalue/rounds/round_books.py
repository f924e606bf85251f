"""The kinds of round book, in the order their rows follow a client's valuation rows
(:mod:`fedvalue.rounds.round_book`). A new kind is one module and one line here."""

from __future__ import annotations

from collections.abc import Callable

from fedvalue.rounds.books_claims import claims_book
from fedvalue.rounds.books_fair_curvature import fair_curvature_book
from fedvalue.rounds.books_fairness import fairness_book
from fedvalue.rounds.books_flows import flows_book
from fedvalue.rounds.books_selection import selection_book
from fedvalue.rounds.round_book import RoundBook, RoundContext

#: name -> kind(context) -> the round's book of that kind, or None when it keeps none.
ROUND_BOOKS: dict[str, Callable[[RoundContext], RoundBook | None]] = {
    "selection": selection_book,
    "flows": flows_book,
    "fairness": fairness_book,
    "fair_curvature": fair_curvature_book,
    "claims": claims_book,
}
