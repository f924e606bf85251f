"""The third-party audit of a run directory, failing closed: its files and signatures, the chain
and schema checks, and the recomputation of every round from its record. This package is the
face fedvalue.audit: it re-exports the audit's public names.

Modules: audit_files, checks (audit_run: the checks, in their order), noisy_column (the ``noisy``
column against the run's ground truth), payout_file (a report's payout.csv recomputed from the
ledger), projected_vectors (a record's projected flows vectors), references, report, round (one round
recomputed from its record and compared with its books), rounding_envelope (a loss's float32 rounding
measured on the auditor's machine), rounds (check 7's loop over the rounds), tables (checks 1 to 4, on the
ledger's tables), torn_tail, training_replay.

May import: fedvalue.valuation, fedvalue.scoring, fedvalue.flows, fedvalue.run, fedvalue.rounds,
fedvalue.analysis (and fedvalue._checks, fedvalue.schema); analysis for payout_file, which recomputes a
payout by the code that wrote it. Nothing here imports a subpackage above it or a public face
(fedvalue, fedvalue.ledger, fedvalue.utilities); fedvalue/ never imports flwr or ray.
"""

from fedvalue.audit.checks import DEFAULT_BUDGET_SECONDS, audit_run
from fedvalue.audit.report import AuditReport
from fedvalue.audit.rounds import MAX_PLAYERS, MAX_ROUND_EVALUATIONS, recompute_run

__all__ = [
    "AuditReport",
    "DEFAULT_BUDGET_SECONDS",
    "MAX_PLAYERS",
    "MAX_ROUND_EVALUATIONS",
    "audit_run",
    "recompute_run",
]
