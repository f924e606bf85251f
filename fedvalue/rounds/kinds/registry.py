"""The kinds of round book, in the order their rows follow a client's valuation rows
(:mod:`fedvalue.rounds.book_kind`). A new kind is one module and one registration here
(:func:`register_round_book`; the package's own kinds are listed below), with its hook on the
strategy's side where its book needs more than the round record (:mod:`strategies.hooks.registry`)."""

from __future__ import annotations

from collections.abc import Callable

from fedvalue._registry import Registry
from fedvalue.rounds.book_kind import RoundBook, RoundContext
from fedvalue.rounds.kinds.claims import claims_book
from fedvalue.rounds.kinds.defences import defences_book
from fedvalue.rounds.kinds.fairness import fairness_book
from fedvalue.rounds.kinds.fairness_curvature import fairness_curvature_book
from fedvalue.rounds.kinds.fixed_second_order import fixed_second_order_book
from fedvalue.rounds.kinds.flows import flows_book
from fedvalue.rounds.kinds.selection import selection_book
from fedvalue.rounds.kinds.value_weights import value_weight_book

#: A kind: the round's book of that kind from its context, or None when it keeps none.
BookKind = Callable[[RoundContext], RoundBook | None]

#: name -> kind, in the order their rows follow.
ROUND_BOOKS: Registry = Registry("round book kind", "RoundContext -> RoundBook | None", {
    "selection": selection_book,
    "value_weights": value_weight_book,
    "flows": flows_book,
    "fairness": fairness_book,
    "fair_curvature": fairness_curvature_book,
    "defences": defences_book,
    "fixed_second_order": fixed_second_order_book,
    "claims": claims_book,
})


def register_round_book(name: str, kind: BookKind, *, replace: bool = False) -> None:
    """Register the book kind ``name`` (its rows follow those of every kind registered before it);
    ValueError for a name already taken unless ``replace``."""
    ROUND_BOOKS.register(name, kind, replace=replace)


def round_book(name: str) -> BookKind:
    """The kind registered as ``name``; ValueError naming the registered kinds for an unknown one."""
    return ROUND_BOOKS.named(name)


def unregister_round_book(name: str) -> None:
    """Remove the kind ``name`` (ValueError naming the registered kinds for an unknown one)."""
    ROUND_BOOKS.unregister(name)
