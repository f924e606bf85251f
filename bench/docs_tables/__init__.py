"""The docs' results tables, rendered from docs/results/ by one command (``python -m bench.docs_tables``, ``--check``
to compare without writing), and the registries that say which table and printed block comes from which files.

Modules: renderings (a table's renderer and files; a table awaiting its run), regions (finding a doc's tables and
the lines each rendering replaces), blocks (printed blocks held to their kept files), reproductions,
faults_audit and benchmarks (each doc's registries), run_dir_battery (the run-directory battery's tables), rebuild
(one doc rebuilt), __main__ (the command).
"""
