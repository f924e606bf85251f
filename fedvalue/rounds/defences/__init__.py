"""Defences of a round's books against manipulation by identity: near-duplicate updates valued as
one player and split within their cluster (:mod:`.clusters`, :mod:`.quotient`; linked by a fixed
tolerance, or by the round's own spread of distances: :mod:`.relative_clusters`), a free-rider test on
updates that reproduce past global models (:mod:`.free_riders`), arrival in proportion to the
examples claimed, so that splitting one's data across identities buys no extra arrivals
(:mod:`.random_order`), and a cap on the size of an update (:mod:`.quotient`). Their settings, as a
round record keeps them, are :mod:`.settings`; the round book that books them is
:mod:`fedvalue.rounds.kinds.defences`. The same screen applied to the fixed-weight game's second-order
values (free-riders 0, a cluster paid as one claim) is :mod:`.second_order`, booked by
:mod:`fedvalue.rounds.kinds.fixed_second_order`. Pure numpy; the audit recomputes every number from the record.
"""
