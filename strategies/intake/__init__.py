"""A round's replies taken in, before anything reads them: every reply checked and booked under the
client its sender's node registered (round_intake), which node holds which partition (nodes), the
claim review of the weights clients claim (claims), and the rejection of a reply whose inclusion
makes the round game non-finite (screening).

Modules: round_intake, nodes, claims, screening.

May import: strategies.protocol, strategies.replies, strategies.reply_checks, strategies.arrays (and
fedvalue, flwr). Nothing here imports the round, the hooks, the policies or the strategy.
"""
