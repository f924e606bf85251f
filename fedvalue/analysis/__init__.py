"""What the books are used for: what a run's books add up to, noisy-client detection and flagging
rules, top-k selection and the retrain plan, a run's findings and HTML report, payments from the
books, what manipulating them gains, and staged data procurement.

Modules: _ledger_frames, detection, findings, flagging, gains (manipulation gain: the attack study's
tables, and one's own runs'), payout, report, run_summary (a run's totals and figures, and Run, the
books load_run reads), staged_procurement, top_k_selection.

May import: fedvalue.valuation, fedvalue.scoring, fedvalue.flows, fedvalue.run, fedvalue.rounds
(and fedvalue._checks, fedvalue.schema). Nothing here imports a subpackage above it or a public
face (fedvalue, fedvalue.ledger, fedvalue.utilities); fedvalue/ never imports flwr or ray.
"""
