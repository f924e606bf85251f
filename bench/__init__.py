"""Performance scripts: each runs as ``python -m bench.NAME`` from the project root (``--help`` for its options)."""

import subprocess


def results_header(command: str) -> str:
    """The first line of a results file a script writes: the command that made it and the commit it ran at."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            check=False).stdout.strip()
    return f"# {command} (commit {commit})\n"
