"""Progress of long valuations: coalitions evaluated out of those planned, with an ETA.

A round's valuation can take minutes (exact ADS at 14 clients: 16,384 coalitions; a
sampler at 50–100 clients: its budget). :class:`ValuationProgress` is a callback for
``strategies.RunCallbacks(on_progress=...)``, called with (round, evaluated, planned)
(:meth:`fedvalue.valuation.game.CoalitionGame.watch`): on a terminal it shows a ``rich`` bar,
elsewhere (a log file, CI) one line every ``interval`` seconds; valuations shorter than
``delay`` seconds show nothing. ``planned`` is the estimator's upper bound: a sampler that
reaches its standard-error target stops sooner, and the bar then ends early.

The callback runs in the ServerApp's thread; it only displays (the books are the same
with and without it, and with ``--quiet``, which turns it off).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable


def rich_progress(*, unit: str = "", console=None, transient: bool = False):
    """A ``rich`` progress display: description, bar, done/total (``unit``), elapsed, ETA."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn()]
    if unit:
        columns.append(TextColumn(unit))
    columns += [TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn()]
    return Progress(*columns, console=console, transient=transient)


class ValuationProgress:
    """(round, evaluated, planned) -> a bar or periodic line (module docstring).

    Parameters
    ----------
    delay
        Seconds a valuation runs before anything is shown.
    interval
        Seconds between lines when the output is not a terminal.
    write
        Where lines go (not a terminal); default ``print`` to stdout.
    terminal
        Force the bar (True) or lines (False); default: whether stdout is a terminal.
    clock
        Seconds since some start (``time.perf_counter``; replaced in tests).
    """

    def __init__(self, *, delay: float = 1.0, interval: float = 10.0, write: Callable[[str], None] | None = None,
                 terminal: bool | None = None, clock: Callable[[], float] = time.perf_counter) -> None:
        self.delay, self.interval, self.clock = float(delay), float(interval), clock
        self.write = write or (lambda line: print(line, flush=True))
        self.terminal = sys.stdout.isatty() if terminal is None else bool(terminal)
        self._lock = threading.Lock()
        self._round: int | None = None
        self._started = 0.0
        self._last_line = 0.0
        self._bar = None
        self._task = None

    def __call__(self, server_round: int, evaluated: int, planned: int) -> None:
        with self._lock:
            now = self.clock()
            if server_round != self._round:
                if evaluated >= planned:  # a finished (or empty) valuation: nothing to show
                    return
                self._close()
                self._round, self._started, self._last_line = server_round, now, now
            elapsed = now - self._started
            if evaluated >= planned:  # value_round's last call: the valuation is over
                if self._bar is None and not self.terminal and elapsed >= self.interval:
                    self.write(self.line(server_round, evaluated, planned, elapsed))
                self._close()
                self._round = None
                return
            if elapsed < self.delay:
                return
            if self.terminal:
                self._show_bar(server_round, evaluated, planned)
            elif now - self._last_line >= self.interval:
                self._last_line = now
                self.write(self.line(server_round, evaluated, planned, elapsed))

    @staticmethod
    def line(server_round: int, evaluated: int, planned: int, elapsed: float) -> str:
        """``round 3 valuation: 4,096/16,384 coalitions (25%), 12.0 s, ETA 36 s``."""
        share = evaluated / planned if planned else 1.0
        eta = "" if evaluated == 0 or evaluated >= planned else \
            f", ETA {elapsed * (planned - evaluated) / evaluated:.0f} s"
        return (f"round {server_round} valuation: {evaluated:,}/{planned:,} coalitions ({share:.0%}), "
                f"{elapsed:.1f} s{eta}")

    def _show_bar(self, server_round: int, evaluated: int, planned: int) -> None:
        if self._bar is None:
            self._bar = rich_progress(unit="coalitions", transient=True)
            self._bar.start()
            self._task = self._bar.add_task(f"round {server_round} valuation", total=planned)
        self._bar.update(self._task, completed=evaluated, total=planned)

    def _close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = self._task = None

    def close(self) -> None:
        """Take down a bar still shown (a run that stopped mid-valuation)."""
        with self._lock:
            self._close()
            self._round = None
