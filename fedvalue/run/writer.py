"""A run directory's life in one place: open it (or resume it: verify, then act), commit
each round in a crash-safe order, close it with its manifest.

The strategy that values rounds (``strategies.ValuingStrategy``) only calls these; the
order of the files on disk is written down here once (each step is named in
:mod:`fedvalue.run.kill_points`, and a writer killed after any of them resumes to the ledger
of an uninterrupted run):

0. **lock**: the writer holds the run directory's lock for its lifetime
   (:mod:`fedvalue.run.writer_lock`): a second writer is refused with the holder's PID;
1. **open** a new run: the directory (created), its ``run.json`` and, with checkpoints,
   the start's ``checkpoint.json`` (round 0: the run checkpoints; nothing committed yet);
2. **commit** round t: its record (``records/``), its ledger rows (the run's noisy clients
   joined into their ``noisy`` column) and its ``rounds.csv`` row (the commit mark); then
   its checkpoint files (A_t and the
   server's state as data), its seal (the chain head, the digests of the record and the
   checkpoint files, the tables' sizes; signed with a key) and only then
   ``checkpoint.json``, switched atomically (:mod:`fedvalue.run.archive`, :mod:`fedvalue.run.seals`);
3. **close**: the Parquet copy of the ledger (written at the close and at a resume only),
   then the final manifest once every planned round committed; then, with an EC
   key, ``model.sig`` over every file of the closed run, manifest included, in the format
   the ``model-signing`` tool verifies (:mod:`fedvalue.run.model_signature`).

**Resume** first verifies and only then acts (:mod:`fedvalue.run.resume_check`): the seal of
the checkpoint's round and its signature, the table sizes, the hash chain from run.json's
genesis to the sealed head, the checkpoint files' digests, all before any setting of
run.json is read (then the configuration is compared with it). A checkpoint of round 0 is
accepted while no round, or only round 1, was committed: a writer killed after round 1's
commit mark and before its checkpoint starts again from round 0. Then it acts: the tables
are cut to the sealed sizes, later records and seals and half-written files removed, the
Parquet copy rewritten, and any ``model.sig`` removed (the resumed run signs at its own
close). A refused resume leaves every file of the books as it was.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence

import numpy as np

from fedvalue.run import kill_points, rundir
from fedvalue.run.archive import (
    APPEND_ONLY_FILES,
    RoundRecord,
    prune_checkpoints,
    record_bytes,
    round_record_names,
    write_checkpoint,
    write_start_pointer,
)
from fedvalue.run.ledger_tables import LedgerWriter
from fedvalue.run.resume_check import ResumePlan, Restored, check_restorable, verify_resume
from fedvalue.run.rundir import RunDir
from fedvalue.run.model_signature import model_signing_available, sign_run
from fedvalue.run.seals import Signer, append_seal, cut_seals, seal_fields
from fedvalue.run.writer_lock import lock_run_dir
from fedvalue.schema import (
    CHECKPOINT_DIR,
    CHECKPOINT_FILE,
    MODEL_SIGNATURE_FILE,
    RECORDS_DIR,
    SEALS_FILE,
    LedgerRow,
    RoundRow,
    checkpoint_names,
    record_name,
)

Arrays = dict[str, np.ndarray]
__all__ = ["Restored", "RunBooks"]


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class RunBooks:
    """A run directory opened for writing (module docstring).

    Parameters
    ----------
    run_dir
        The run directory (resolved once, :func:`fedvalue.run.rundir.resolve`).
    config
        The run's configuration: written to run.json, or, resuming, compared with it (once
        the directory is verified).
    resume
        Verify the run's last checkpoint, then cut the directory back to it
        (:attr:`restored` is where the run continues from).
    signer
        Signs each seal and the manifest, and with an EC key writes ``model.sig`` at the
        close; resuming, round k's seal must carry its signature.
    save_records, checkpoint
        Write each round's record; checkpoint each round (A_t, the server's state).
    noisy_clients
        The run's ground truth, the clients known to be noisy: joined into the ``noisy``
        column as each round's rows are written (:class:`fedvalue.run.ledger_tables.LedgerWriter`).
    check_state
        Called with the verified state before anything is cut; raises ValueError when the
        resumed run cannot take it (another strategy than the one saved).

    Raises
    ------
    fedvalue.run.writer_lock.RunLocked
        Another process is writing the run directory (a ValueError naming its PID).
    """

    def __init__(self, run_dir: str | os.PathLike | RunDir, *, config: Mapping | None = None, resume: bool = False,
                 signer: Signer | None = None, save_records: bool = True, checkpoint: bool = True,
                 noisy_clients: Collection[Hashable] | None = None,
                 check_state: Callable[[tuple[object, Arrays]], None] | None = None) -> None:
        self.signer = signer
        self.noisy_clients = noisy_clients
        self.save_records = bool(save_records)
        self.checkpoint = bool(checkpoint)
        self.restored: Restored | None = None
        self.ledger: LedgerWriter | None = None
        if signer is not None and signer.signs_model:
            model_signing_available()  # a missing package is said now, not after the last round
        try:
            run = rundir.open_run_dir(run_dir, create=not resume)
        except FileNotFoundError:
            raise ValueError(f"resume: expected a run directory holding run.json; {rundir.resolve(run_dir)} "
                             "does not exist.") from None
        self.run, self.run_dir = run, run.path
        self.lock = lock_run_dir(run)  # before anything is read: one writer at a time
        try:
            self._open(config, resume, check_state)
        except BaseException:
            self.release()  # a refused writer does not keep the directory locked
            raise

    def _open(self, config: Mapping | None, resume: bool, check_state) -> None:
        if resume:  # verify (reading no setting of run.json), then compare the configuration, then act
            plan = verify_resume(self.run, self.signer)
            self.ledger = LedgerWriter(self.run, config=config, resume=True, noisy_clients=self.noisy_clients)
            check_restorable(self.run, plan, check_state)
            self._rewind(plan)
            self.restored = plan.restored
            return
        self.ledger = LedgerWriter(self.run, config=config, noisy_clients=self.noisy_clients)
        kill_points.reached("run_json", 0)
        if self.checkpoint:
            write_start_pointer(self.run)
            kill_points.reached("start_pointer", 0)

    def release(self) -> None:
        """End this writer's holds on the directory's lock (:meth:`close` does it too)."""
        if getattr(self, "ledger", None) is not None:
            self.ledger.lock.release()
        self.lock.release()

    # -- resume: verify (fedvalue.run.resume_check), then act -------------------------------

    def _rewind(self, plan: ResumePlan) -> None:
        """Cut the directory back to the verified checkpoint: what a later, unfinished round
        wrote goes (tables cut to their sealed sizes, later records, seals and checkpoint
        files removed, files a killed write left half-made) and the Parquet copy is
        rewritten. Each step leaves a directory the same resume accepts again."""
        run, k, sizes = self.run, plan.round, plan.sizes
        for name in APPEND_ONLY_FILES:
            if not run.exists(name):
                continue
            if sizes.get(name, 0) == 0:
                run.unlink(name)
            else:
                run.truncate(name, sizes[name])
        for server_round, name in round_record_names(run).items():
            if server_round > k:
                run.unlink(name)
        for directory in (".", RECORDS_DIR, CHECKPOINT_DIR):
            for entry in run.listdir(directory):
                if entry.endswith(".tmp"):
                    run.unlink(entry if directory == "." else f"{directory}/{entry}")
        prune_checkpoints(run, set(checkpoint_names(k)) if k else set())
        run.unlink(MODEL_SIGNATURE_FILE)  # only a close signs; never an old signature beside new rounds
        if k == 0:
            run.unlink(SEALS_FILE)
            if self.checkpoint:
                write_start_pointer(run)
            else:
                run.unlink(CHECKPOINT_FILE)
        else:
            cut_seals(run, k)
        self.ledger.write_parquet()

    # -- rounds -----------------------------------------------------------------------------

    def commit(self, server_round: int, round_row: RoundRow, ledger_rows: Sequence[LedgerRow], *,
               record: RoundRecord | None = None, realized: Mapping[str, np.ndarray] | None = None,
               state: tuple[object, Mapping[str, np.ndarray]] | None = None) -> str:
        """Commit round t (module docstring's order) and return its chain head.

        ``round_row`` and ``ledger_rows`` are the round's typed rows
        (:meth:`fedvalue.run.ledger_tables.LedgerWriter.write_round`). ``record`` (when the run saves
        records) is written before the commit mark; with checkpoints, ``realized`` (A_t) and
        ``state`` (the server's state as data) after it.
        """
        record_digest = None
        if record is not None and self.save_records:
            data = record_bytes(record)
            self.run.write_bytes(record_name(server_round), data)
            record_digest = _digest(data)
            kill_points.reached("record", server_round)
        head = self.ledger.write_round(round_row, list(ledger_rows))
        sizes = self.ledger.table_sizes()

        def seal(written: Mapping[str, bytes] | None) -> None:
            digests = None if written is None else {key: _digest(data) for key, data in written.items()}
            append_seal(self.run, seal_fields(server_round, head, record_digest, digests, sizes), self.signer)
            kill_points.reached("seal", server_round)

        if self.checkpoint:
            write_checkpoint(self.run, server_round, realized, state, sizes, before_switch=seal)
        else:
            seal(None)
        return head

    def append_table(self, name: str, columns: Sequence[str], rows: list[Mapping]) -> None:
        """Rows of a side table (first_order.csv), written before the round's commit mark."""
        self.ledger.append_table(name, columns, rows)

    def committed_rounds(self) -> list[RoundRow]:
        """The rounds committed so far, typed (:meth:`fedvalue.run.ledger_tables.LedgerWriter.committed_rounds`)."""
        return self.ledger.committed_rounds()

    def close(self, planned_rounds: int) -> dict:
        """The final manifest (:mod:`fedvalue.run.seals`), once every planned round committed,
        then, with an EC key, ``model.sig`` (:mod:`fedvalue.run.model_signature`); the
        writer's hold on the directory's lock ends with it."""
        try:
            manifest = self.ledger.close(planned_rounds, sealed=True, signer=self.signer)
            if self.signer is not None and self.signer.signs_model:
                sign_run(self.run, self.signer)
        finally:
            self.release()
        return manifest

