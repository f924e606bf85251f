"""The valuation ledger's public face: everything public in :mod:`fedvalue.run.ledger_tables` (the
tables, their hash chain, ``load_run``). Code inside fedvalue imports that module, not this one.
"""

from fedvalue.run.run_info import config_json, parse_run_config, read_run_config, write_json  # noqa: F401
from fedvalue.analysis.run_summary import (  # noqa: F401
    Run,
    client_summary,
    first_order_error,
    flow_rounds,
    load_run,
    run_summary,
)
from fedvalue.run.ledger_reader import check_tables, ledger_rows_of, read_ledger_csv, read_rounds_csv  # noqa: F401
from fedvalue.run.ledger_tables import (  # noqa: F401
    GENESIS_HASH,
    LedgerWriter,
    chain_from_lines,
    chain_hash,
    chain_heads,
    chain_links,
    csv_lines,
    genesis_hash,
    genesis_of,
    parquet_bytes,
    spreadsheet_safe,
    table_lines,
)

__all__ = [
    "GENESIS_HASH",
    "LedgerWriter",
    "Run",
    "chain_from_lines",
    "chain_hash",
    "chain_heads",
    "chain_links",
    "check_tables",
    "client_summary",
    "config_json",
    "csv_lines",
    "first_order_error",
    "flow_rounds",
    "genesis_hash",
    "genesis_of",
    "ledger_rows_of",
    "load_run",
    "parquet_bytes",
    "parse_run_config",
    "read_ledger_csv",
    "read_rounds_csv",
    "read_run_config",
    "run_summary",
    "spreadsheet_safe",
    "table_lines",
    "write_json",
]
