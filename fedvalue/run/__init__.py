"""The run directory on disk: the directory guard (RunDir), round records and checkpoints, the
state codec, the ledger tables and their hash chain (fedvalue.ledger re-exports them), seals and
manifests and the key files that sign them, the closed run's OpenSSF model signature, what run.json
records of the run's environment and utility, the commit order of a round (RunBooks) with its
named kill points, the one-writer lock, and what a resume verifies before it acts.

Modules: archive, key_files, kill_points, ledger_tables, model_signature, resume_check, run_info,
rundir, seals, settings, state_codec, writer, writer_lock.

May import: fedvalue.valuation, fedvalue.flows (and fedvalue._checks, fedvalue.schema). Nothing here imports a
subpackage above it or a public face (fedvalue, fedvalue.ledger, fedvalue.utilities); fedvalue/
never imports flwr or ray.
"""
