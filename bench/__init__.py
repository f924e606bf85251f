"""Performance scripts: each runs as ``python -m bench.NAME`` from the project root (``--help`` for its options)."""
