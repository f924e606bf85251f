"""A run's directory as one writer holds it: made (:func:`prepare_run_dir`: ``--out``, refusing a
non-empty one), given an experiment's run.json (:func:`write_run_config`), claimed under the writer
lock (:func:`claim_run_dir`), and let go at the end of the run, removed when a new run failed before
it committed a round (:class:`RunHold`)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path

from fedvalue.run import rundir
from fedvalue.run.run_info import write_json
from fedvalue.run.seals import SEALS_FILE
from fedvalue.run.writer_lock import WriterLock, lock_run_dir
from fedvalue.schema import LEDGER_FILE, LOCK_FILE, ROUNDS_FILE, RUN_CONFIG_FILE
from simulations.runner.engine_failures import engine_failure
from strategies import ValuingStrategy


def prepare_run_dir(out: str | os.PathLike, *, overwrite: bool = False, keep: str | None = None) -> Path:
    """Create ``out`` and return its resolved path (:func:`fedvalue.run.rundir.resolve`: ``~``
    expanded, absolute, links resolved); refuse a directory that already holds a run unless
    ``overwrite``, which removes what it holds (but the entry named ``keep``)."""
    out = rundir.resolve(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"out: expected a directory for the run; {out} is a file.")
    held = [] if not out.is_dir() else [entry for entry in out.iterdir() if entry.name != keep]
    if held:
        if not (out / LEDGER_FILE).exists() and not (out / RUN_CONFIG_FILE).exists():
            raise ValueError(f"out: expected an empty or new directory; {out} holds other files.")
        if not overwrite:
            raise ValueError(
                f"out: {out} already holds a run; choose a new directory, continue that run with "
                "resume=True (--resume DIR), or pass overwrite=True (--overwrite) to replace it."
            )
        for entry in held:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".fedvalue-write-check"
        probe.touch()
        probe.unlink()
    except OSError as error:
        raise ValueError(f"out: expected a directory fedvalue can create and write; {out} cannot be "
                         f"({error.strerror or error}).") from None
    return out


def write_run_config(out: str | os.PathLike, config: Mapping) -> None:
    """Write ``config`` as ``out``'s run.json (sorted, indented JSON, written atomically and never
    through a link: :func:`fedvalue.run.run_info.write_json`), as every experiment records
    how it was run."""
    write_json(Path(out) / RUN_CONFIG_FILE, config)


def remove_unstarted_run(run_dir: Path) -> bool:
    """Remove a run directory this call made, after a failure, only while it holds no
    committed round: a run that committed a round keeps every one (it resumes from them).
    Whether it was removed."""
    if not rundir.exists(run_dir, ROUNDS_FILE) and not rundir.exists(run_dir, SEALS_FILE):
        shutil.rmtree(run_dir, ignore_errors=True)
        return True
    return False


def claim_run_dir(out: str | os.PathLike, *, overwrite: bool = False, resume: bool = False) -> tuple[Path, WriterLock]:
    """The run directory ``out`` (resolved) and this writer's lock on it
    (:mod:`fedvalue.run.writer_lock`), taken before the directory is checked, cut or
    replaced: a second writer (a second resume, a run into the same ``out``) is refused
    with the holder's PID. A new run's directory is made as :func:`prepare_run_dir` makes
    it (``overwrite`` removes the old run's files, not the lock file: the lock is never let
    go); a directory that holds other files than a run's is refused before it is locked."""
    run_dir = rundir.resolve(out)
    if resume:
        if not (run_dir / RUN_CONFIG_FILE).exists():
            raise ValueError(f"resume: expected the directory of a run to continue, holding run.json; {run_dir} "
                             "has none.")
        return run_dir, lock_run_dir(rundir.RunDir(run_dir))
    made = not run_dir.exists()
    if not run_dir.is_dir() or not any(True for _ in run_dir.iterdir()):
        prepare_run_dir(run_dir)  # new or empty: made (and checked writable) before it is locked
    elif not any((run_dir / name).exists() for name in (LEDGER_FILE, RUN_CONFIG_FILE, LOCK_FILE)):
        raise ValueError(f"out: expected an empty or new directory; {run_dir} holds other files.")
    lock = lock_run_dir(rundir.RunDir(run_dir))
    try:
        prepare_run_dir(run_dir, overwrite=overwrite, keep=LOCK_FILE)
    except BaseException:
        lock.release()
        if made:
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    return run_dir, lock


class RunHold:
    """This call's hold on its run directory, for the run's lifetime: at the end the books and
    the writer lock are let go; a new run refused before it committed a round leaves no
    half-made directory (committed rounds stay: the run resumes from them); an engine that did
    not start or crashed is one :class:`~simulations.runner.engine_failures.EngineFailed` line."""

    def __init__(self, run_dir: Path, lock: WriterLock, *, resume: bool) -> None:
        self.run_dir, self.lock, self.resume = run_dir, lock, resume
        self.books: ValuingStrategy | None = None

    def __enter__(self) -> RunHold:
        return self

    def __exit__(self, kind, error, traceback) -> bool:
        if kind is None:
            give_up(self.run_dir, self.lock, remove=False, books=self.books)  # the run is over
            return False
        removed = give_up(self.run_dir, self.lock, remove=not self.resume, books=self.books)
        if issubclass(kind, Exception) and not issubclass(kind, (TypeError, ValueError)):
            committed = 0 if self.books is None else len(self.books.rounds)
            failure = engine_failure(error, run_dir=str(self.run_dir), committed=committed, removed=removed)
            if failure is not None:
                raise failure from None
        return False


def give_up(run_dir: Path, lock: WriterLock, *, remove: bool, books: ValuingStrategy | None = None) -> bool:
    """End this run's hold on ``run_dir``: its books' and ``lock``'s; with ``remove``, a
    directory holding no committed round is removed first. Whether it was removed."""
    removed = remove and remove_unstarted_run(run_dir)
    if books is not None:
        books.run_state.release()
    lock.release()
    return removed
