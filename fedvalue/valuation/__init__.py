"""Coalition games and their estimators: the game and its cache, exact and Monte Carlo ADS, LOO,
the samplers past exact, the K-NN utility and KNN-ADS, the round game v_t(S) =
U(Agg_t(A_{t-1}; S)) with value_round, the round's first- and second-order expansions (taylor), and
adaptive MC-ADS, which spends its evaluations on the players a decision is unsure of (adaptive).
numpy/pandas only.

Modules: adaptive, ads, game, loo, plan, prefix_mc, result, round_game, settings, shapley_sampling, taylor; knn/ (exact,
monte_carlo, utility).

May import: no other subpackage (and fedvalue._checks, fedvalue.schema). Nothing here imports a
subpackage above it or a public face (fedvalue, fedvalue.ledger, fedvalue.utilities); fedvalue/
never imports flwr or ray.
"""
