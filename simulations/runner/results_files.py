"""Results files: the CSVs a docs table is rendered from, or the text of a table a run printed, each headed by the
command that made it and the commit.

One definition for ``fedvalue run SIMULATION --results FOLDER`` and the benchmarks (``bench.results_header``
calls :func:`results_header`): the installed ``fedvalue`` command cannot import ``bench/``, which is no package of
the wheel, and ``bench`` already imports ``simulations``, so the shared function lives here.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from pathlib import Path

import pandas as pd


def results_header(command: str) -> str:
    """The first line of a results file: the command that made it and the commit it ran at."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            check=False).stdout.strip()
    return f"# {command} (commit {commit})\n"


def write_results(folder: str | Path, frames: Mapping[str, pd.DataFrame | str], command: str) -> list[Path]:
    """Each frame as ``folder/NAME`` (a CSV under :func:`results_header`), each text (a table as the run printed
    it, which the docs quote as a block) as its lines under the same header; the paths written, in order."""
    folder = Path(folder).expanduser()
    folder.mkdir(parents=True, exist_ok=True)
    header = results_header(command)
    written = []
    for name, frame in frames.items():
        path = folder / name
        path.write_text(header + (frame.rstrip("\n") + "\n" if isinstance(frame, str) else frame.to_csv(index=False)))
        written.append(path)
    return written


def read_results(path: str | Path) -> pd.DataFrame:
    """A results file's rows (its header line skipped)."""
    return pd.read_csv(path, comment="#")


def results_command(path: str | Path) -> str:
    """The command a results file names in its header line (without the commit)."""
    first = Path(path).read_text().split("\n", 1)[0]
    if not first.startswith("# ") or " (commit " not in first:
        raise ValueError(f"{path}: expected a results file headed '# COMMAND (commit C)'; got {first[:80]!r}")
    return first[2:first.rindex(" (commit ")]
