"""Flows of influence between clients ([RECIP]): TracIn round flows, the flow totals over rounds,
marginal (retraining) flows, matrix-factorization flows and the reciprocity measures.

Modules: flow_totals, marginal, mf_flows, projected_flows, reciprocity_measures, round_flows.

May import: fedvalue.scoring (and fedvalue._checks, fedvalue.schema). Nothing here imports a
subpackage above it or a public face (fedvalue, fedvalue.ledger, fedvalue.utilities); fedvalue/
never imports flwr or ray.
"""
