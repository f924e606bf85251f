"""A run directory's life in one place: open it (or resume it: verify, then act), commit
each round in a crash-safe order, close it with its manifest.

The strategy that values rounds (``strategies.ValuingStrategy``) only calls these; the
order of the files on disk is written down here once:

1. **open** a new run: the directory (created) and its ``run.json``;
2. **commit** round t: its record (``records/``), its ledger rows, its ``rounds.csv`` row
   (the commit mark) and the Parquet copy; then its checkpoint files (A_t and the
   server's state as data), its seal (the chain head, the digests of the record and the
   checkpoint files, the tables' sizes; signed with a key) and only then
   ``checkpoint.json``, switched atomically (:mod:`fedvalue.run.archive`, :mod:`fedvalue.run.seals`);
3. **close**: the final manifest once every planned round committed.

**Resume** first verifies and only then acts. It reads ``checkpoint.json`` and round k's
seal, and checks, changing nothing: the seal's signature (with the signer's key), that
the sizes ``checkpoint.json`` names are the sealed ones and no longer than the tables,
that the hash chain over the tables cut to those sizes has k rounds and ends at the
seal's head, that the checkpoint files' digests are the sealed ones, and that they parse
as data (arrays and a JSON state; nothing is unpickled, so nothing runs). A checkpoint of
round 0 (or none) is accepted only when no round was committed. Then it acts: the tables
are cut to the sealed sizes, later records and seals removed, the Parquet copy rewritten.
A refused resume leaves every file as it was.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from fedvalue.run import rundir
from fedvalue.run.archive import (
    APPEND_ONLY_FILES,
    RoundRecord,
    npz_from_bytes,
    prune_checkpoints,
    read_checkpoint_pointer,
    record_bytes,
    round_record_names,
    state_from_bytes,
    write_checkpoint,
)
from fedvalue.run.ledger_tables import LedgerWriter, chain_from_lines, genesis_hash, table_lines
from fedvalue.run.rundir import RunDir
from fedvalue.schema import (
    CHECKPOINT_FILE,
    LEDGER_FILE,
    MANIFEST_FILE,
    ROUNDS_FILE,
    SEALS_FILE,
    checkpoint_names,
    record_name,
)
from fedvalue.run.seals import Signer, append_seal, cut_seals, read_seals, seal_fields

Arrays = dict[str, np.ndarray]


@dataclass
class Restored:
    """What a resumed run continues from: round ``round`` (0: from the start), A_k and the
    server's state as data (:mod:`fedvalue.run.state_codec`: a JSON tree and its arrays)."""

    round: int
    arrays: Arrays | None
    state: tuple[object, Arrays] | None


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _committed(rounds_text: str) -> int:
    """Rounds whose rounds.csv line is whole (a torn last line is not committed)."""
    return sum(1 for line in table_lines(rounds_text) if line.endswith("\n"))


@dataclass(frozen=True)
class RunSettings:
    """How a valued run keeps its directory, checked once when made.

    Parameters
    ----------
    run_config
        The run's configuration, written to ``run.json`` (resuming: compared with it).
    save_records
        Save each round's record (A_{t−1}, every reply's arrays and weight, gradients) before
        the round commits, so ``fedvalue audit`` can recompute every value.
    checkpoint
        After each round commits, save A_t and the server's state as data so the run can
        resume (a strategy holding state that is not data is refused when the books open).
    resume
        Continue the run from its last checkpoint, verified before anything is cut.
    sign_key
        The :class:`fedvalue.run.seals.Signer` of each round's seal and the final manifest
        (``Signer.from_file(pem)`` reads a key from ``fedvalue keygen``); settings read no file.

    What the run tells its caller as it goes is a callback, not a setting
    (:class:`strategies.valuing_settings.RunCallbacks`).
    """

    run_config: Mapping | None = None
    save_records: bool = True
    checkpoint: bool = True
    resume: bool = False
    sign_key: Signer | None = None

    def __post_init__(self) -> None:
        if self.run_config is not None and not isinstance(self.run_config, Mapping):
            raise TypeError(f"run_config: expected a mapping (written to run.json) or None; got "
                            f"{type(self.run_config).__name__}.")
        for name in ("save_records", "checkpoint", "resume"):
            if not isinstance(getattr(self, name), bool | np.bool_):
                raise TypeError(f"{name}: expected True or False; got {getattr(self, name)!r}.")
            object.__setattr__(self, name, bool(getattr(self, name)))
        if self.sign_key is not None and not isinstance(self.sign_key, Signer):
            raise TypeError(f"sign_key: expected a fedvalue.run.seals.Signer or None; got "
                            f"{type(self.sign_key).__name__}. Read a key file with Signer.from_file(path).")

    @property
    def signer(self) -> Signer | None:
        return self.sign_key


class RunBooks:
    """A run directory opened for writing (module docstring).

    Parameters
    ----------
    run_dir
        The run directory (resolved once, :func:`fedvalue.run.rundir.resolve`).
    config
        The run's configuration: written to run.json, or, resuming, compared with it.
    resume
        Verify the run's last checkpoint, then cut the directory back to it
        (:attr:`restored` is where the run continues from).
    signer
        Signs each seal and the manifest; resuming, round k's seal must carry its signature.
    save_records, checkpoint
        Write each round's record; checkpoint each round (A_t, the server's state).
    check_state
        Called with the verified state before anything is cut; raises ValueError when the
        resumed run cannot take it (another strategy than the one saved).
    """

    def __init__(self, run_dir: str | os.PathLike | RunDir, *, config: Mapping | None = None, resume: bool = False,
                 signer: Signer | None = None, save_records: bool = True, checkpoint: bool = True,
                 check_state: Callable[[tuple[object, Arrays]], None] | None = None) -> None:
        self.signer = signer
        self.save_records = bool(save_records)
        self.checkpoint = bool(checkpoint)
        self.ledger = LedgerWriter(run_dir, config=config, resume=resume)
        self.run: RunDir = self.ledger.run
        self.run_dir = self.run.path
        self.restored: Restored | None = None
        if resume:
            plan = self._verify(check_state)
            self._rewind(plan)
            self.restored = plan["restored"]

    # -- resume: verify, then act -----------------------------------------------------------

    def _refuse(self, why: str) -> ValueError:
        return ValueError(f"resume: the run in {self.run.show()} {why}; not resumed (nothing was changed).")

    def _verify(self, check_state) -> dict:
        """Everything resume checks, reading only (module docstring); the cut it implies."""
        run = self.run
        tables = {name: run.read_bytes(name) for name in APPEND_ONLY_FILES if run.exists(name)}
        rounds_text = tables.get(ROUNDS_FILE, b"").decode("utf-8", "replace")
        committed = _committed(rounds_text)
        if run.exists(MANIFEST_FILE):
            raise ValueError(f"resume: the run in {run.show()} already completed {committed} rounds (it holds its "
                             "final manifest); there is nothing to resume.")
        try:
            pointer = read_checkpoint_pointer(run)
            seals = read_seals(run)
        except ValueError as error:
            raise self._refuse(f"holds a checkpoint or seals that are not fedvalue's ({error})") from None
        if pointer is None or pointer[0] == 0:
            if committed or seals:
                raise self._refuse(f"holds {committed} committed rounds and {len(seals)} seals but no checkpoint "
                                   "of a committed round")
            return {"restored": Restored(0, None, None), "sizes": {}, "round": 0}
        k, sizes = pointer
        mine = [s for s in seals if s["round"] == k]
        if len(mine) != 1:
            raise self._refuse(f"holds {len(mine)} seals of its checkpoint's round {k} in {SEALS_FILE}, not one")
        seal = mine[0]
        if self.signer is not None and (problem := self.signer.verifier().problem(seal)) is not None:
            raise self._refuse(f"has a round {k} seal not signed by the given key ({problem})")
        if seal.get("sizes") != sizes:
            raise self._refuse(f"names table sizes in {CHECKPOINT_FILE} that round {k}'s seal did not commit to"
                               + ("" if "sizes" in seal else " (its seals were written by an older version)"))
        for name, size in sizes.items():
            if len(tables.get(name, b"")) < size:
                raise self._refuse(f"has a {name} shorter than at the checkpoint of round {k}")
        prefix = {name: tables.get(name, b"")[:sizes.get(name, 0)].decode("utf-8", "replace")
                  for name in (LEDGER_FILE, ROUNDS_FILE)}
        try:
            heads = chain_from_lines(genesis_hash(run), table_lines(prefix[LEDGER_FILE]),
                                     table_lines(prefix[ROUNDS_FILE]))
        except ValueError as error:
            raise self._refuse(f"does not chain up to its checkpoint ({error})") from None
        if len(heads) != k or heads[-1] != seal.get("head"):
            raise self._refuse(f"ends its chain at round {len(heads)} elsewhere than round {k}'s seal")
        digests = seal.get("checkpoint") or {}
        arrays_name, state_name = checkpoint_names(k)
        data = {}
        for key, name in (("npz", arrays_name), ("state", state_name)):
            try:
                data[key] = run.read_bytes(name)
            except (FileNotFoundError, rundir.UnsafeRunFile) as error:
                raise self._refuse(f"lacks its checkpoint file {name} ({error})") from None
            if digests.get(key) != _digest(data[key]):
                raise self._refuse(f"has a checkpoint file {name} that differs from the one round {k}'s seal "
                                   "committed to")
        try:
            arrays, _ = npz_from_bytes(data["npz"], run.show(arrays_name))
            state = state_from_bytes(data["state"], run.show(state_name))
            if check_state is not None:
                check_state(state)
        except ValueError as error:
            raise self._refuse(f"has a checkpoint of round {k} that does not restore ({error})") from None
        return {"restored": Restored(k, arrays, state), "sizes": sizes, "round": k}

    def _rewind(self, plan: Mapping) -> None:
        """Cut the directory back to the verified checkpoint: what a later, unfinished round
        wrote goes (tables cut to their sealed sizes, later records, seals and checkpoint
        files removed) and the Parquet copy is rewritten."""
        run, k, sizes = self.run, plan["round"], plan["sizes"]
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
        prune_checkpoints(run, set(checkpoint_names(k)) if k else set())
        if k == 0:
            run.unlink(CHECKPOINT_FILE)
            run.unlink(SEALS_FILE)
        else:
            cut_seals(run, k)
        self.ledger.write_parquet()

    # -- rounds -----------------------------------------------------------------------------

    def commit(self, server_round: int, round_row: dict, ledger_rows: Sequence[Mapping], *,
               record: RoundRecord | None = None, realized: Mapping[str, np.ndarray] | None = None,
               state: tuple[object, Mapping[str, np.ndarray]] | None = None) -> str:
        """Commit round t (module docstring's order) and return its chain head.

        ``record`` (when the run saves records) is written before the commit mark; with
        checkpoints, ``realized`` (A_t) and ``state`` (the server's state as data) after it.
        """
        record_digest = None
        if record is not None and self.save_records:
            data = record_bytes(record)
            self.run.write_bytes(record_name(server_round), data)
            record_digest = _digest(data)
        head = self.ledger.write_round(round_row, list(ledger_rows))
        sizes = self.ledger.table_sizes()

        def seal(written: Mapping[str, bytes] | None) -> None:
            digests = None if written is None else {key: _digest(data) for key, data in written.items()}
            append_seal(self.run, seal_fields(server_round, head, record_digest, digests, sizes), self.signer)

        if self.checkpoint:
            write_checkpoint(self.run, server_round, realized, state, sizes, before_switch=seal)
        else:
            seal(None)
        return head

    def append_table(self, name: str, columns: Sequence[str], rows: list[Mapping]) -> None:
        """Rows of a side table (first_order.csv), written before the round's commit mark."""
        self.ledger.append_table(name, columns, rows)

    def committed_rounds(self) -> list[dict]:
        return self.ledger.committed_rounds()

    def close(self, planned_rounds: int) -> dict:
        """The final manifest (:mod:`fedvalue.run.seals`), once every planned round committed."""
        return self.ledger.close(planned_rounds, sealed=True, signer=self.signer)

