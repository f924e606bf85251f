"""The run directory on disk: the directory guard (RunDir), round records and checkpoints, the
state codec, run.json, the ledger's tables (their writer and hash chain; their typed reader),
seals and manifests and the key files that sign them, the commit order of a round (RunBooks)
with its named kill points, the one-writer lock, and what a resume verifies before it acts.

Modules: archive, key_files, kill_points, ledger_reader, ledger_tables (the writer and the hash
chain), model_signature, resume_check, run_info (run.json), rundir, seals, settings, state_codec,
writer, writer_lock.

May import: fedvalue.valuation (and fedvalue._checks, fedvalue.schema). Nothing here imports a
subpackage above it or a public face (fedvalue, fedvalue.ledger, fedvalue.utilities); fedvalue/
never imports flwr or ray.
"""
