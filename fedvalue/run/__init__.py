"""The run directory on disk: the directory guard (RunDir), round records and checkpoints, the
state codec, the ledger tables and their hash chain (fedvalue.ledger re-exports them), seals and
manifests, and the commit order of a round (RunBooks).

Modules: archive, ledger_tables, rundir, seals, state_codec, writer.

May import: fedvalue.flows (and fedvalue._checks, fedvalue.schema). Nothing here imports a
subpackage above it or a public face (fedvalue, fedvalue.ledger, fedvalue.utilities); fedvalue/
never imports flwr or ray.
"""
