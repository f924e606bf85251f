"""What a run saves per round on disk: round records (for audits) and checkpoints (for resume).

A run directory (:mod:`fedvalue.ledger`) may also hold

``records/round-NNNNNN.npz``
    The round record: the state the round started from, A_{t−1}; every reply that
    carried arrays (accepted, not accepted or rejected) with its weight; the inference
    gradients and losses of TracIn flows; and, as JSON, who was accepted, the failed
    clients and the valuation settings. From these and the run's utility every number
    of the round's books can be recomputed (``fedvalue audit``). Written once, before
    the round's commit mark, and never held in memory after: a run with many clients
    keeps one round in RAM.
``checkpoint.json`` and ``checkpoint/round-NNNNNN.{npz,pkl}``
    After round k commits: the global state A_k, the server's own state (the inner
    strategy with its optimizer moments, pending checks; pickled by the caller) and the
    size of every append-only file at that moment. ``checkpoint.json`` is replaced
    atomically and points at round k's files; older files are then removed. Resuming
    truncates the tables to those sizes (a round that was being written when the run
    died leaves no trace) and continues from A_k, so a resumed run writes the same
    ledger as an uninterrupted one.

Arrays are stored exactly (``numpy.savez``, no compression, the arrays' own dtypes).
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import zipfile
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fedvalue import rundir
from fedvalue.schema import FIRST_ORDER_FILE, LEDGER_FILE, ROUNDS_FILE

RECORDS_DIR = "records"
CHECKPOINT_FILE = "checkpoint.json"
CHECKPOINT_DIR = "checkpoint"
#: Append-only tables of a run; a checkpoint records their sizes.
APPEND_ONLY_FILES = (LEDGER_FILE, ROUNDS_FILE, FIRST_ORDER_FILE)

Arrays = dict[str, np.ndarray]
_META_KEY = "__meta__"
_ROUND_FILE = re.compile(r"round-(\d{6})\.npz$")


def replace_durably(tmp: Path, path: Path) -> None:
    """Move the finished file ``tmp`` onto ``path`` after forcing it to disk: a crash leaves
    the old ``path`` or the new one, never a torn file. Neither may be a link or a special
    file (a received run directory must not redirect a write)."""
    for target in (tmp, path):
        rundir.check_file(target.parent, target.name)
    with open(tmp, "rb+") as handle:
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def save_npz(path: str | os.PathLike, arrays: Mapping[str, np.ndarray], meta: Mapping | None = None) -> None:
    """Write ``arrays`` (and JSON ``meta``) to ``path`` atomically: a crash leaves the old file or the new."""
    path = Path(path)
    tmp = rundir.check_file(path.parent, path.name + ".tmp")
    rundir.check_file(path.parent, path.name)
    payload = {key: np.asarray(value) for key, value in arrays.items()}
    if _META_KEY in payload:
        raise ValueError(f"arrays: the key {_META_KEY!r} is reserved for the record's metadata.")
    if meta is not None:
        payload[_META_KEY] = np.frombuffer(json.dumps(meta, sort_keys=True).encode("utf-8"), dtype=np.uint8)
    with open(tmp, "wb") as handle:
        np.savez(handle, **payload)
    replace_durably(tmp, path)


def _check_members(data: bytes, path: Path, max_bytes: int) -> None:
    """Refuse an archive whose members would unpack to more than ``max_bytes``, or whose
    array headers promise more elements than their member holds (numpy allocates the
    promised size before reading)."""
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        members = archive.infolist()
        total = sum(member.file_size for member in members)
        if total > max_bytes:
            raise ValueError(f"{path}: unpacks to {total} bytes, more than the {max_bytes} allowed.")
        for member in members:
            with archive.open(member) as stream:
                version = np.lib.format.read_magic(stream)
                read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                               else np.lib.format.read_array_header_2_0)
                shape, _, dtype = read_header(stream)
                if dtype.hasobject:
                    raise ValueError(f"{path}: member {member.filename} holds Python objects, not arrays.")
                promised = math.prod(shape) * dtype.itemsize
                if promised > member.file_size:
                    raise ValueError(f"{path}: member {member.filename} promises {promised} bytes of array "
                                     f"in {member.file_size}.")


def load_npz(path: str | os.PathLike, *, max_bytes: int = rundir.MAX_FILE_BYTES) -> tuple[Arrays, dict]:
    """Arrays and metadata written by :func:`save_npz` (arrays in their saved order).

    The file must be a regular file (no link, FIFO or device) and unpack to at most
    ``max_bytes``; anything that is not such an archive raises ValueError naming the file.
    """
    path = Path(path)
    data = rundir.read_bytes(path.parent, path.name, max_bytes=max_bytes)
    try:
        _check_members(data, path, max_bytes)
        with np.load(io.BytesIO(data), allow_pickle=False) as archive:
            arrays = {key: archive[key] for key in archive.files if key != _META_KEY}
            meta = json.loads(archive[_META_KEY].tobytes().decode("utf-8")) if _META_KEY in archive.files else {}
    except rundir.UnsafeRunFile:
        raise
    except (ValueError, OSError, EOFError, KeyError, TypeError, zipfile.BadZipFile, UnicodeDecodeError,
            RuntimeError, MemoryError) as error:
        raise ValueError(f"{path}: not an archive written by fedvalue ({type(error).__name__}: {error}).") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{path}: its metadata is not a JSON object.")
    return arrays, meta


def _split_prefix(arrays: Arrays, prefix: str) -> Arrays:
    cut = len(prefix)
    return {key[cut:]: value for key, value in arrays.items() if key.startswith(prefix)}


@dataclass
class RoundRecord:
    """Everything needed to recompute one round's books.

    Attributes
    ----------
    round
        The round t.
    start_arrays
        A_{t−1}, the state every client received.
    replies
        Client id -> the arrays it returned, for every reply with arrays (status ``ok``
        or ``rejected``), in reply order.
    weights
        Client id -> the aggregation weight n_i used (after any cap on claims).
    statuses
        Client id -> ``ok``, ``rejected`` or ``failed``, for every client sampled.
    accepted
        The clients whose updates the inner strategy aggregated (top-k selection may
        accept fewer than the valid replies).
    gradients, losses
        TracIn flows: client id -> inference gradient at A_{t−1} and the summed inference
        loss there (sampled and idle clients).
    meta
        Valuation settings and anything else the writer adds (JSON-serializable).
    """

    round: int
    start_arrays: Arrays
    replies: dict[Hashable, Arrays]
    weights: dict[Hashable, float]
    statuses: dict[Hashable, str]
    accepted: list[Hashable]
    gradients: dict[Hashable, Arrays] = field(default_factory=dict)
    losses: dict[Hashable, float] = field(default_factory=dict)
    meta: dict = field(default_factory=dict)


def records_dir(run_dir: str | os.PathLike) -> Path:
    return rundir.resolve(run_dir) / RECORDS_DIR


def record_path(run_dir: str | os.PathLike, server_round: int) -> Path:
    return records_dir(run_dir) / f"round-{int(server_round):06d}.npz"


def write_round_record(run_dir: str | os.PathLike, record: RoundRecord) -> Path:
    """Save ``record`` as ``records/round-NNNNNN.npz`` (atomic). Client ids must be ints or strings."""
    run_dir = rundir.resolve(run_dir)
    clients = list(dict.fromkeys([*record.statuses, *record.replies, *record.gradients]))
    for client in clients:
        if isinstance(client, bool) or not isinstance(client, (int, np.integer, str)):
            raise TypeError(f"client ids: expected ints or strings to save a round record; got {client!r}.")
    index = {c: k for k, c in enumerate(clients)}
    arrays: Arrays = {f"start/{key}": value for key, value in record.start_arrays.items()}
    for client, reply in record.replies.items():
        arrays.update({f"reply/{index[client]}/{key}": value for key, value in reply.items()})
    for client, gradient in record.gradients.items():
        arrays.update({f"gradient/{index[client]}/{key}": value for key, value in gradient.items()})
    meta = {
        "round": int(record.round),
        "clients": [int(c) if isinstance(c, np.integer) else c for c in clients],
        "replies": [index[c] for c in record.replies],
        "weights": {str(index[c]): float(w) for c, w in record.weights.items()},
        "statuses": {str(index[c]): s for c, s in record.statuses.items()},
        "accepted": [index[c] for c in record.accepted],
        "gradients": [index[c] for c in record.gradients],
        "losses": {str(index[c]): float(v) for c, v in record.losses.items()},
        "meta": record.meta,
    }
    directory = rundir.check_dir(run_dir, RECORDS_DIR)
    directory.mkdir(parents=True, exist_ok=True)
    path = record_path(run_dir, record.round)
    save_npz(path, arrays, meta)
    return path


def read_round_record(path: str | os.PathLike) -> RoundRecord:
    """A record written by :func:`write_round_record`; ValueError naming the file for
    anything else (a torn archive, garbage metadata)."""
    arrays, meta = load_npz(path)
    try:
        return _round_record(arrays, meta)
    except (KeyError, IndexError, TypeError, ValueError, AttributeError, OverflowError) as error:
        raise ValueError(f"{path}: not a round record written by fedvalue (its metadata lacks or garbles "
                         f"{type(error).__name__}: {error}).") from None


def _round_record(arrays: Arrays, meta: dict) -> RoundRecord:
    clients = meta["clients"]
    if not isinstance(clients, list) or any(isinstance(c, bool) or not isinstance(c, (int, str)) for c in clients):
        raise TypeError("'clients' is not a list of ids")
    if not isinstance(meta["meta"], dict):
        raise TypeError("'meta' is not an object")
    return RoundRecord(
        round=int(meta["round"]),
        start_arrays=_split_prefix(arrays, "start/"),
        replies={clients[k]: _split_prefix(arrays, f"reply/{k}/") for k in meta["replies"]},
        weights={clients[int(k)]: float(w) for k, w in meta["weights"].items()},
        statuses={clients[int(k)]: s for k, s in meta["statuses"].items()},
        accepted=[clients[k] for k in meta["accepted"]],
        gradients={clients[k]: _split_prefix(arrays, f"gradient/{k}/") for k in meta["gradients"]},
        losses={clients[int(k)]: float(v) for k, v in meta["losses"].items()},
        meta=meta["meta"],
    )


def round_record_paths(run_dir: str | os.PathLike) -> dict[int, Path]:
    """Round -> record file, for every record the run saved."""
    run_dir = rundir.resolve(run_dir)
    found = {}
    for path in rundir.list_dir(run_dir, RECORDS_DIR):
        match = _ROUND_FILE.match(path.name)
        if match:
            found[int(match.group(1))] = path
    return dict(sorted(found.items()))


# --------------------------------------------------------------------------- checkpoints


@dataclass
class Checkpoint:
    """Where a run can continue from: after round ``round`` committed.

    Attributes
    ----------
    round
        Last committed round k (0: nothing committed yet).
    arrays
        A_k, the global state after round k (None when k = 0: the run's initial state).
    state
        The server's pickled state (opaque bytes; None when k = 0).
    file_sizes
        Size in bytes of each append-only table at the commit of round k.
    """

    round: int
    arrays: Arrays | None
    state: bytes | None
    file_sizes: dict[str, int]


def _checkpoint_files(run_dir: Path, server_round: int) -> tuple[Path, Path]:
    stem = run_dir / CHECKPOINT_DIR / f"round-{int(server_round):06d}"
    return stem.with_suffix(".npz"), stem.with_suffix(".pkl")


def checkpoint_files(server_round: int) -> tuple[str, str]:
    """Round k's checkpoint files, relative to the run directory."""
    stem = f"{CHECKPOINT_DIR}/round-{int(server_round):06d}"
    return stem + ".npz", stem + ".pkl"


def write_checkpoint(run_dir: str | os.PathLike, server_round: int, arrays: Mapping[str, np.ndarray],
                     state: bytes, files: Iterable[str] = APPEND_ONLY_FILES,
                     before_switch: Callable[[tuple[str, str]], None] | None = None) -> None:
    """Checkpoint round ``server_round``, which must already be committed to the tables.

    The round's arrays and state go to their own files first; ``before_switch`` (the
    round's seal, :mod:`fedvalue.seals`) is called with their relative paths; then
    ``checkpoint.json`` switches to them in one atomic replace; the previous round's
    files are removed last.
    """
    run_dir = rundir.resolve(run_dir)
    rundir.check_dir(run_dir, CHECKPOINT_DIR).mkdir(parents=True, exist_ok=True)
    arrays_path, state_path = _checkpoint_files(run_dir, server_round)
    save_npz(arrays_path, arrays)
    tmp = rundir.check_file(run_dir, f"{CHECKPOINT_DIR}/{state_path.name}.tmp")
    tmp.write_bytes(state)
    replace_durably(tmp, state_path)
    if before_switch is not None:
        before_switch(checkpoint_files(server_round))
    sizes = {name: rundir.check_file(run_dir, name).stat().st_size for name in files
             if os.path.lexists(run_dir / name)}
    pointer = rundir.check_file(run_dir, CHECKPOINT_FILE)
    tmp = rundir.check_file(run_dir, CHECKPOINT_FILE + ".tmp")
    tmp.write_text(json.dumps({"round": int(server_round), "files": sizes}, sort_keys=True) + "\n", encoding="utf-8")
    replace_durably(tmp, pointer)
    for path in rundir.list_dir(run_dir, CHECKPOINT_DIR):
        if path not in (arrays_path, state_path):
            rundir.check_file(run_dir, path.relative_to(run_dir)).unlink()


def read_checkpoint(run_dir: str | os.PathLike) -> Checkpoint:
    """The run's last checkpoint; round 0 (start afresh) when it has none."""
    run_dir = rundir.resolve(run_dir)
    pointer = run_dir / CHECKPOINT_FILE
    rundir.check_dir(run_dir, CHECKPOINT_DIR)
    if not rundir.exists(run_dir, CHECKPOINT_FILE):
        return Checkpoint(0, None, None, {})
    try:
        saved = json.loads(rundir.read_text(run_dir, CHECKPOINT_FILE, max_bytes=rundir.MAX_JSON_BYTES))
        server_round, sizes = int(saved["round"]), {str(k): int(v) for k, v in saved["files"].items()}
        if server_round < 0 or any(size < 0 for size in sizes.values()):
            raise ValueError("negative round or size")
    except rundir.UnsafeRunFile:
        raise
    except (ValueError, KeyError, TypeError, AttributeError, OverflowError) as error:
        raise ValueError(f"resume: {pointer} is not a checkpoint written by fedvalue ({error}).") from None
    arrays_path, state_path = _checkpoint_files(run_dir, server_round)
    for path in (arrays_path, state_path):
        if not os.path.lexists(path):
            raise ValueError(f"resume: the checkpoint of round {server_round} lacks {path}; the run directory was "
                             "changed by hand.")
    arrays, _ = load_npz(arrays_path)
    state = rundir.read_bytes(run_dir, state_path.relative_to(run_dir))
    return Checkpoint(server_round, arrays, state, sizes)


def rewind(run_dir: str | os.PathLike, checkpoint: Checkpoint, files: Sequence[str] = APPEND_ONLY_FILES) -> None:
    """Cut the run's tables and records back to ``checkpoint``: what a later, unfinished round
    wrote is removed (tables truncated to their checkpointed sizes, later records deleted)."""
    run_dir = rundir.resolve(run_dir)
    for name in files:
        path = rundir.check_file(run_dir, name)
        if not path.exists():
            continue
        size = checkpoint.file_sizes.get(name, 0)
        if path.stat().st_size < size:
            raise ValueError(f"resume: {path} is shorter than at the checkpoint of round {checkpoint.round} "
                             f"({path.stat().st_size} < {size} bytes); the run directory was changed by hand.")
        if size == 0:
            path.unlink()
            continue
        with open(path, "rb+") as handle:
            handle.truncate(size)
            os.fsync(handle.fileno())
    for server_round, path in round_record_paths(run_dir).items():
        if server_round > checkpoint.round:
            rundir.check_file(run_dir, path.relative_to(run_dir)).unlink()
