"""The strategy's half of the books that need more than the replies: each kind of round book that
asks the clients for more, keeps more in the round record or offers an acceptance policy something
to read has one hook (a :class:`strategies.round_hook.RoundHook`), registered under the kind's name
and called by the round at fixed points, the same for every kind.

Modules: registry (the hooks by kind, ``register_round_hook``), flows (TracIn: idle clients'
gradients, the first-order check), fairness (the fairness game, influences and policies), defences
(the previous global model the free-rider test compares with; the replies a representatives policy
reads), value_weights (the factors a value-weighting policy sets).

May import: strategies.round_hook, strategies.acceptance_policy, strategies.book_settings,
strategies.protocol, strategies.arrays, strategies.replies, strategies.aggregation (and fedvalue, flwr).
No hook imports the round (strategies.train_round), the strategy (strategies.valuing) or a policy
(strategies.policies): a hook reads the round in flight through :class:`strategies.round_hook.RoundView`.
"""
