"""The kinds of round book, in the order their rows follow a client's valuation rows
(:mod:`fedvalue.rounds.book_kind`). A new kind is one module and one registration here
(:func:`register_round_book`; the package's own kinds are listed below), with its hook on the
strategy's side where its book needs more than the round record (:mod:`strategies.hooks.registry`)."""

from __future__ import annotations

from collections.abc import Callable

from fedvalue.rounds.book_kind import RoundBook, RoundContext
from fedvalue.rounds.kinds.claims import claims_book
from fedvalue.rounds.kinds.defences import defences_book
from fedvalue.rounds.kinds.fairness import fairness_book
from fedvalue.rounds.kinds.fairness_curvature import fairness_curvature_book
from fedvalue.rounds.kinds.flows import flows_book
from fedvalue.rounds.kinds.selection import selection_book
from fedvalue.rounds.kinds.value_weights import value_weight_book

#: A kind: the round's book of that kind from its context, or None when it keeps none.
BookKind = Callable[[RoundContext], RoundBook | None]

#: name -> kind, in the order their rows follow.
ROUND_BOOKS: dict[str, BookKind] = {
    "selection": selection_book,
    "value_weights": value_weight_book,
    "flows": flows_book,
    "fairness": fairness_book,
    "fair_curvature": fairness_curvature_book,
    "defences": defences_book,
    "claims": claims_book,
}


def register_round_book(name: str, kind: BookKind, *, replace: bool = False) -> None:
    """Register the book kind ``name`` (its rows follow those of every kind registered before it);
    ValueError for a name already taken unless ``replace``."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"name: expected a kind's name (an identifier); got {name!r}.")
    if not callable(kind):
        raise TypeError(f"kind: expected a callable RoundContext -> RoundBook | None; got {type(kind).__name__}.")
    if name in ROUND_BOOKS and not replace:
        raise ValueError(f"name: a round book kind {name!r} is registered already; pass replace=True to replace it.")
    ROUND_BOOKS[name] = kind


def round_book(name: str) -> BookKind:
    """The kind registered as ``name``; ValueError naming the registered kinds for an unknown one."""
    if name not in ROUND_BOOKS:
        raise ValueError(f"name: expected a registered round book kind, one of {list(ROUND_BOOKS)}; got {name!r}.")
    return ROUND_BOOKS[name]


def unregister_round_book(name: str) -> None:
    """Remove the kind ``name`` (ValueError naming the registered kinds for an unknown one)."""
    round_book(name)
    del ROUND_BOOKS[name]
