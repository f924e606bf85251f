"""What ``fedvalue run`` prints while and after a simulation runs (shared by the simulations)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from fedvalue._checks import counted
from fedvalue.schema import RoundRow


@dataclass(frozen=True)
class RunOptions:
    """What the command line passes a simulation besides its config."""

    out: str | None
    overwrite: bool = False
    quiet: bool = False
    resume: bool = False
    started: float = 0.0
    sign_key: object = None  # a fedvalue.run.seals.Signer, loaded before anything is written
    results: str | None = None  # --results FOLDER: where the run writes its results files
    command: str = ""  # the command line as typed, which heads each results file

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def say(self) -> Callable[[str], None] | None:
        """A progress printer, or None when quiet."""
        return None if self.quiet else (lambda line: print(line, flush=True))


@contextmanager
def progress_bar(total: int, description: str, *, enabled: bool = True, console=None) -> Iterator[Callable[[str], None]]:
    """A progress bar of ``total`` steps with elapsed time and ETA (rich); the yielded callable
    advances it one step and shows its text. Disabled (``--quiet``): a callable that does nothing."""
    if not enabled:
        yield lambda text="": None
        return
    from simulations.runner.progress import rich_progress

    with rich_progress(console=console) as progress:
        task = progress.add_task(description, total=total)
        yield lambda text="": progress.update(task, advance=1, description=text or description)


def _utility(value: float | None) -> str:
    """A utility of a round's row as the progress line shows it (None: no number)."""
    return "   -  " if value is None else f"{value:.4f}"


def round_progress(total_rounds: int) -> Callable[[RoundRow], None]:
    """One line per committed round of a federated run (an ``on_round`` callback)."""
    started = time.perf_counter()

    def show(row: RoundRow) -> None:
        print(
            f"round {row.round}/{total_rounds}: {row.num_clients} clients ({row.num_failed} failed), "
            f"utility {_utility(row.utility_before)} -> {_utility(row.utility_after)} "
            f"(realized {_utility(row.utility_realized)}), "
            f"{row.num_evaluations} evaluations, valuation {row.valuation_seconds:.2f}s, "
            f"elapsed {time.perf_counter() - started:.1f}s",
            flush=True,
        )

    return show


def print_run_summary(summary: dict) -> None:
    """The run-level figures (utility, efficiency, reciprocity, first-order check)."""
    for key, value in summary.items():
        text = f"{value:.4g}" if isinstance(value, float) else str(value)
        print(f"  {key:<36}{text}")


def print_federated_run(run, options: RunOptions) -> int:
    """The closing lines of a federated run: utility, detection of the noisy clients and what a
    top-k selection keeps (:mod:`fedvalue.analysis.findings`), its flows summary when flows were booked."""
    from fedvalue.analysis.findings import findings_lines, run_findings

    print(f"wrote {options.out} ({counted(len(run.rounds), 'round')}, {counted(len(run.ledger), 'ledger row')}) in "
          f"{options.elapsed():.1f}s")
    if len(run.rounds):
        print(f"held-out utility {run.rounds['utility_before'].iloc[0]:.4f} -> "
              f"{run.rounds['utility_realized'].iloc[-1]:.4f} over {counted(len(run.rounds), 'round')}")
    for line in findings_lines(run_findings(run)):
        print(line)
    if run.first_order is not None:
        print_run_summary(run.run_summary())
    print(f"per-client books: fedvalue report {options.out}  (figures and a page: --plots --html)")
    return 0
