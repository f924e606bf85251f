"""The strategy's half of the books that need more than the replies: what a round asks of the
clients and records for them, each kind one object the valuing strategy calls at fixed points of
a round. TracIn flows (:mod:`.flows`: idle clients' gradients, the first-order check), fairness
(:mod:`.fairness`: the fairness game, influences and policies) and defences (:mod:`.defences`: the
previous global model the free-rider test compares with); :mod:`.round_hooks` holds the three as
the strategy meets them, with the acceptance step they feed and the value weighting a policy may
name (:mod:`.value_weights`)."""
