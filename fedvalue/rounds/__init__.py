"""One round's books from its record: book_round, the book interface and its registered kinds
(top-k marks, TracIn flows, fairness, curvature fairness, claim flags, defences, value weighting,
the fixed-weight game's second-order expansion), the fairness books, the harm of rejected replies,
and the defences of the books against manipulation by identity.

Modules: booking (book_round), book_kind (the interface), record_game (the round game of a record),
fairness_round, harms; kinds/ (registry, selection, flows, fairness, fairness_curvature, claims,
defences, value_weights, fixed_second_order); defences/ (clusters, relative_clusters, free_riders, quotient,
random_order, second_order, settings).

May import: fedvalue.valuation, fedvalue.scoring, fedvalue.flows, fedvalue.run (and
fedvalue._checks, fedvalue.schema). Nothing here imports a subpackage above it or a public face
(fedvalue, fedvalue.ledger, fedvalue.utilities); fedvalue/ never imports flwr or ray.
"""
