"""Performance scripts: each runs as ``python -m bench.NAME`` from the project root (``--help`` for its options)."""

import contextlib
import io
import sys
from collections.abc import Iterator
from pathlib import Path


def results_header(command: str) -> str:
    """The first line of a results file a script writes: the command that made it and the commit it ran at
    (:func:`simulations.runner.results_files.results_header`, which ``fedvalue run --results`` writes too)."""
    from simulations.runner.results_files import results_header as header  # here: importing bench stays light

    return header(command)


class _Tee(io.TextIOBase):
    """A text stream that writes to the terminal and keeps a copy."""

    def __init__(self, terminal, copy: io.StringIO) -> None:
        self.terminal, self.copy = terminal, copy

    def write(self, text: str) -> int:
        self.copy.write(text)
        return self.terminal.write(text)

    def flush(self) -> None:
        self.terminal.flush()


@contextlib.contextmanager
def kept_output(path: Path | None, command: str) -> Iterator[None]:
    """Print as usual; with a ``path``, also keep what was printed there under :func:`results_header`, so a
    printed block the docs quote is a results file (written only when the block finishes without an error)."""
    if path is None:
        yield
        return
    copy, terminal = io.StringIO(), sys.stdout
    sys.stdout = _Tee(terminal, copy)
    try:
        yield
    finally:
        sys.stdout = terminal
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(results_header(command) + copy.getvalue())
