"""The valuation ledger's public face: a run's books read back (:func:`load_run` gives a
:class:`Run`: the tables as DataFrames, their rows typed as :class:`LedgerRow` and :class:`RoundRow`,
and what they add up to), the two tables read alone, a round's saved record (:func:`read_round`:
A_{t−1} and what every client sent), the updates in it (:func:`round_updates`), every saved round valued again
under another utility (:func:`value_recorded_rounds`), the claim factors the defended second-order book pays a
round's replies by, screened again from its record (:func:`recorded_claim_factors`), and the writer of a ledger of
one's own.

The names live in :mod:`fedvalue.analysis.run_summary`, :mod:`fedvalue.run.ledger_reader`,
:mod:`fedvalue.run.ledger_tables` (the writer and the hash chain), :mod:`fedvalue.run.archive`,
:mod:`fedvalue.rounds.record_game`, :mod:`fedvalue.rounds.kinds.fixed_second_order` and :mod:`fedvalue.schema`;
code inside fedvalue imports those modules, not this one.
"""

from fedvalue.analysis.run_summary import Run, client_summary, load_run, run_summary
from fedvalue.run.archive import RoundRecord, read_round, round_updates
from fedvalue.run.ledger_reader import read_ledger_csv, read_rounds_csv
from fedvalue.rounds.kinds.fixed_second_order import recorded_claim_factors
from fedvalue.rounds.record_game import value_recorded_rounds
from fedvalue.run.ledger_tables import LedgerWriter
from fedvalue.schema import LedgerRow, RoundRow

__all__ = [
    "LedgerRow",
    "LedgerWriter",
    "RoundRecord",
    "RoundRow",
    "Run",
    "client_summary",
    "load_run",
    "read_ledger_csv",
    "read_round",
    "read_rounds_csv",
    "recorded_claim_factors",
    "round_updates",
    "run_summary",
    "value_recorded_rounds",
]
