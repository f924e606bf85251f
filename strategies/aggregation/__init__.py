"""The inner strategy's own aggregation, away from the live run: counterfactual coalitions aggregated
by its code on copies of the replies and of itself (counterfactual), the same aggregation replayed
from a round record by the audit (reaggregate), and what both need as data: the global random state
(random_state) and the server's state (server_state).

Modules: counterfactual, reaggregate, random_state, server_state.

May import: strategies.arrays, strategies.replies (and fedvalue, flwr). Nothing here imports the round,
the hooks, the policies or the strategy.
"""
