"""What a run saves per round on disk: round records (for audits) and checkpoints (for resume).

A run directory (:mod:`fedvalue.run.ledger_tables`) may also hold

``records/round-NNNNNN.npz``
    The round record (:class:`RoundRecord`), the single input of the round's books: the
    state the round started from, A_{t−1}; every ok or rejected reply's arrays; the
    inference gradients and losses of TracIn flows (or, with a projection, each gradient and
    each valid reply's update projected to k numbers); and, as JSON, every sampled client's
    outcome in reply order (status, weight, example count, reason), who was accepted, the
    claim review's flags and the round's settings. The live books are booked from it, and
    from it and the run's utility the audit books the round again (``fedvalue audit``). Written once, before
    the round's commit mark, and never held in memory after: a run with many clients
    keeps one round in RAM.
``checkpoint.json``, ``checkpoint/round-NNNNNN.npz`` and ``checkpoint/round-NNNNNN-state.npz``
    After round k commits: the global state A_k, the server's own state as data (the
    inner strategy's optimizer moments, the sampler, the claim review, pending checks:
    a JSON tree and its arrays, :mod:`fedvalue.run.state_codec`; never a pickle) and the size
    of every append-only table at that moment. Round k's seal (:mod:`fedvalue.run.seals`)
    commits to the files' digests and the sizes before ``checkpoint.json`` switches to
    them in one atomic replace; older files are then removed. Resuming checks all of it
    first, then cuts the tables back to those sizes (a round that was being written when
    the run died leaves no trace) and continues from A_k, so a resumed run writes the
    same ledger as an uninterrupted one (:mod:`fedvalue.run.writer`).

Arrays are stored exactly (``numpy.savez``, no compression, the arrays' own dtypes), and
read with ``allow_pickle=False``: no file of a run directory can make a reader run code.
Every file goes through :mod:`fedvalue.run.rundir` (no links, regular files, capped reads).
"""

from __future__ import annotations

import io
import json
import math
import os
import zipfile
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fedvalue.run import kill_points, rundir
from fedvalue.run.settings import (
    ROUND_FACTS,
    RoundSettings,
    round_facts_as_json,
    round_facts_from_json,
)
from fedvalue.run.rundir import RunDir, open_run_dir
from fedvalue.schema import (
    NUM_EXAMPLES_KEY,
    CHECKPOINT_DIR,
    CHECKPOINT_FILE,
    FIRST_ORDER_FILE,
    LEDGER_FILE,
    RECORDS_DIR,
    ROUNDS_FILE,
    WEIGHED_STATUSES,
    ClaimEntry,
    ClientEntry,
    checkpoint_names,
    record_name,
    record_round,
)

#: Append-only tables of a run; a checkpoint records their sizes.
APPEND_ONLY_FILES = (LEDGER_FILE, ROUNDS_FILE, FIRST_ORDER_FILE)
#: Most members an archive may hold (a record holds a few per reply).
MAX_MEMBERS = 100_000

Arrays = dict[str, np.ndarray]
_META_KEY = "__meta__"


def _split(path: str | os.PathLike) -> tuple[RunDir, str]:
    path = rundir.resolve(path)
    return RunDir(path.parent), path.name


def npz_bytes(arrays: Mapping[str, np.ndarray], meta: Mapping | None = None) -> bytes:
    """``arrays`` (and JSON ``meta``) as the bytes of an npz archive."""
    payload = {key: np.asarray(value) for key, value in arrays.items()}
    if _META_KEY in payload:
        raise ValueError(f"arrays: the key {_META_KEY!r} is reserved for the record's metadata.")
    if meta is not None:
        payload[_META_KEY] = np.frombuffer(json.dumps(meta, sort_keys=True).encode("utf-8"), dtype=np.uint8)
    buffer = io.BytesIO()
    np.savez(buffer, **payload)
    return buffer.getvalue()


def write_npz(run: RunDir, name: str, arrays: Mapping[str, np.ndarray], meta: Mapping | None = None) -> bytes:
    """Write ``arrays`` and ``meta`` to ``name`` of ``run`` atomically; returns the bytes written."""
    data = npz_bytes(arrays, meta)
    run.write_bytes(name, data)
    return data


def save_npz(path: str | os.PathLike, arrays: Mapping[str, np.ndarray], meta: Mapping | None = None) -> None:
    """Write ``arrays`` (and JSON ``meta``) to ``path`` atomically: a crash leaves the old file or the new."""
    run, name = _split(path)
    write_npz(run, name, arrays, meta)


def _check_members(archive: zipfile.ZipFile, where: str, max_bytes: int) -> None:
    """Refuse an archive with too many members, members that would unpack to more than
    ``max_bytes``, or array headers promising more elements than their member holds (numpy
    allocates the promised size before reading)."""
    members = archive.infolist()
    if len(members) > MAX_MEMBERS:
        raise ValueError(f"{where}: holds {len(members)} members, more than the {MAX_MEMBERS} allowed.")
    total = sum(member.file_size for member in members)
    if total > max_bytes:
        raise ValueError(f"{where}: unpacks to {total} bytes, more than the {max_bytes} allowed.")
    for member in members:
        with archive.open(member) as stream:
            version = np.lib.format.read_magic(stream)
            read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                           else np.lib.format.read_array_header_2_0)
            shape, _, dtype = read_header(stream)
            if dtype.hasobject:
                raise ValueError(f"{where}: member {rundir.printable(member.filename, 80)} holds Python objects, "
                                 "not arrays.")
            promised = math.prod(shape) * dtype.itemsize
            if promised > member.file_size:
                raise ValueError(f"{where}: member {rundir.printable(member.filename, 80)} promises {promised} "
                                 f"bytes of array in {member.file_size}.")


def npz_from_bytes(data: bytes, where: str, *, max_bytes: int = rundir.MAX_FILE_BYTES) -> tuple[Arrays, dict]:
    """Arrays (in their saved order) and metadata of an archive :func:`npz_bytes` wrote;
    ValueError naming ``where`` for anything else (pickles, bombs, torn files, garbage)."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            _check_members(archive, where, max_bytes)
        with np.load(io.BytesIO(data), allow_pickle=False) as archive:
            arrays = {key: archive[key] for key in archive.files if key != _META_KEY}
            meta = (rundir.loads_json(archive[_META_KEY].tobytes().decode("utf-8"), where)
                    if _META_KEY in archive.files else {})
    except (ValueError, OSError, EOFError, KeyError, TypeError, zipfile.BadZipFile, UnicodeDecodeError,
            RuntimeError, MemoryError, OverflowError) as error:
        raise ValueError(f"{where}: not an archive written by fedvalue ({type(error).__name__}: "
                         f"{rundir.printable(error, 160)}).") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{where}: its metadata is not a JSON object.")
    return arrays, meta


def load_npz(path: str | os.PathLike, *, max_bytes: int = rundir.MAX_FILE_BYTES) -> tuple[Arrays, dict]:
    """Arrays and metadata written by :func:`save_npz`: the file must be a regular file
    (no link, FIFO or device) and unpack to at most ``max_bytes``; anything that is not
    such an archive raises ValueError naming the file."""
    run, name = _split(path)
    return npz_from_bytes(run.read_bytes(name, max_bytes=max_bytes), run.show(name), max_bytes=max_bytes)


def _split_prefix(arrays: Arrays, prefix: str) -> Arrays:
    cut = len(prefix)
    return {key[cut:]: value for key, value in arrays.items() if key.startswith(prefix)}


@dataclass
class RoundRecord:
    """Everything a round's books are decided from: the single input of
    :func:`fedvalue.rounds.booking.book_round`, live and in the audit alike.

    Attributes
    ----------
    round
        The round t.
    start_arrays
        A_{t−1}, the state every client received.
    entries
        Every sampled client's outcome (status, weight, example count, reason), in reply
        order, duplicates and clients that never replied included (the order the books
        list them and their sums were taken in).
    replies
        Client id -> the arrays it returned, for every ``ok`` or ``rejected`` reply (the
        first under its id), in reply order.
    accepted
        The clients whose updates the inner strategy aggregated (top-k selection may
        accept fewer than the valid replies).
    gradients, losses
        TracIn flows: client id -> inference gradient at A_{t−1} and the summed inference
        loss there (sampled and idle clients).
    projected_gradients, projected_updates
        TracIn flows through a random projection R_t (``settings.flows_projection``;
        :mod:`fedvalue.flows.projected_flows`), kept instead of ``gradients``: client id -> R_t g_v
        (float32; sampled and idle clients) and, for every valid reply, R_t Δ_u (float64), each a
        vector of k numbers.
    loss_gradients, fisher_diagonals
        Fairness influence with curvature (:mod:`fedvalue.scoring.fairness.curvature`): client id ->
        its training loss gradient G_u and empirical Fisher diagonal d_u at A_{t−1}.
    settings
        The round's settings (methods, estimator, seed, strategy, aggregation, what it books:
        :class:`fedvalue.run.settings.RoundSettings`).
    claims
        The claim review's flags of the round, in the order booked.
    replay
        For a round aggregated by the inner strategy's own code (not the weighted mean):
        what replaying its aggregation needs, as data (:mod:`fedvalue.run.state_codec`'s JSON
        tree and arrays): the inner strategy's state and the global random state when the
        replies arrived, and each reply's metric records. None for the FedAvg family, or
        when the strategy's state cannot be saved as data (``replay_missing`` says why).
    replay_missing
        Why the inner strategy's state was not saved for replay (None: saved, or not needed).
    available
        The partitions the sampler chose from, when some registered nodes were gone (None: all).
    passed
        For a round aggregated by the inner strategy: the positions (among ``entries``) of the
        replies its live aggregation was given.
    """

    round: int
    start_arrays: Arrays
    entries: list[ClientEntry]
    replies: dict[Hashable, Arrays]
    accepted: list[Hashable]
    gradients: dict[Hashable, Arrays] = field(default_factory=dict)
    losses: dict[Hashable, float] = field(default_factory=dict)
    settings: RoundSettings = field(default_factory=RoundSettings)
    claims: list[ClaimEntry] = field(default_factory=list)
    replay: tuple[object, Arrays] | None = None
    loss_gradients: dict[Hashable, Arrays] = field(default_factory=dict)
    fisher_diagonals: dict[Hashable, Arrays] = field(default_factory=dict)
    #: False for a record of an older version (statuses and weights only: no order across
    #: replies and failures, no example counts or reasons of its own).
    lossless: bool = True
    #: Name -> arrays the round's books compare replies with (the defences' free-rider test:
    #: ``"previous-global"``, A_{t−2}); the audit checks each against the earlier record it names.
    references: dict[str, Arrays] = field(default_factory=dict)
    projected_gradients: dict[Hashable, np.ndarray] = field(default_factory=dict)
    projected_updates: dict[Hashable, np.ndarray] = field(default_factory=dict)
    replay_missing: str | None = None
    available: tuple | None = None
    passed: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("available", "passed"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, tuple(getattr(self, name)))

    @property
    def statuses(self) -> dict[Hashable, str]:
        """Client id -> status of its first entry (a duplicate reply is the later one)."""
        found: dict[Hashable, str] = {}
        for entry in self.entries:
            found.setdefault(entry.client_id, entry.status)
        return found

    @property
    def weights(self) -> dict[Hashable, float]:
        """Client id -> the aggregation weight n_i of its first weighed entry (after any cap on claims)."""
        found: dict[Hashable, float] = {}
        for entry in self.entries:
            if entry.weight is not None:
                found.setdefault(entry.client_id, entry.weight)
        return found


def record_path(run_dir: str | os.PathLike, server_round: int) -> Path:
    return rundir.resolve(run_dir) / record_name(server_round)


def _json_id(client):
    return int(client) if isinstance(client, np.integer) else client


def record_bytes(record: RoundRecord) -> bytes:
    """The bytes of ``record``'s archive. Client ids must be ints or strings."""
    clients = list(dict.fromkeys([*(e.client_id for e in record.entries), *record.replies, *record.gradients,
                                  *(c.client_id for c in record.claims), *record.loss_gradients,
                                  *record.fisher_diagonals, *record.projected_gradients,
                                  *record.projected_updates]))
    for client in clients:
        if isinstance(client, bool) or not isinstance(client, (int, np.integer, str)):
            raise TypeError(f"client ids: expected ints or strings to save a round record; got {client!r}.")
    index = {c: k for k, c in enumerate(clients)}
    arrays: Arrays = {f"start/{key}": value for key, value in record.start_arrays.items()}
    for client, reply in record.replies.items():
        arrays.update({f"reply/{index[client]}/{key}": value for key, value in reply.items()})
    for client, gradient in record.gradients.items():
        arrays.update({f"gradient/{index[client]}/{key}": value for key, value in gradient.items()})
    for client, gradient in record.loss_gradients.items():
        arrays.update({f"loss-gradient/{index[client]}/{key}": value for key, value in gradient.items()})
    for client, diagonal in record.fisher_diagonals.items():
        arrays.update({f"fisher/{index[client]}/{key}": value for key, value in diagonal.items()})
    if record.replay is not None:
        arrays.update({f"replay/{key}": value for key, value in record.replay[1].items()})
    for name, reference in record.references.items():
        arrays.update({f"reference/{name}/{key}": value for key, value in reference.items()})
    meta = {
        "round": int(record.round),
        "clients": [_json_id(c) for c in clients],
        "entries": [[index[e.client_id], str(e.status), None if e.weight is None else float(e.weight),
                     None if e.num_examples is None else int(e.num_examples),
                     "" if e.reason is None else str(e.reason)]  # the format's text: empty for none
                    for e in record.entries],
        "replies": [index[c] for c in record.replies],
        "accepted": [index[c] for c in record.accepted],
        "gradients": [index[c] for c in record.gradients],
        "losses": {str(index[c]): float(v) for c, v in record.losses.items()},
        "claims": [[index[c.client_id], str(c.method), float(c.claimed), float(c.used), str(c.status)]
                   for c in record.claims],
        # The round's own facts sit beside the run's settings (the archive's format since they were one object).
        "meta": {**record.settings.as_json(), **round_facts_as_json(record.replay_missing, record.available,
                                                                     record.passed)},
    }
    if record.replay is not None:
        meta["replay"] = record.replay[0]
    if record.loss_gradients or record.fisher_diagonals:  # absent otherwise: other records' bytes unchanged
        meta["loss_gradients"] = [index[c] for c in record.loss_gradients]
        meta["fisher_diagonals"] = [index[c] for c in record.fisher_diagonals]
    if record.references:  # absent otherwise: other records' bytes unchanged
        meta["references"] = list(record.references)
    for name, member, vectors in _projected(record):  # absent otherwise: other records' bytes unchanged
        meta[name] = [index[c] for c in vectors]
        arrays[member] = np.stack(list(vectors.values())) if vectors else np.zeros((0, 0))
    return npz_bytes(arrays, meta)


#: (metadata key, archive member, RoundRecord field) of the projected vectors: one k-column matrix
#: each, its rows the clients the metadata lists.
PROJECTED = (("projected_gradients", "projected-gradients", "projected_gradients"),
             ("projected_updates", "projected-updates", "projected_updates"))


def _projected(record: RoundRecord) -> list[tuple[str, str, dict]]:
    """The record's projected vectors to save, by :data:`PROJECTED` (none for a record without a projection)."""
    if record.settings.flows_projection is None and not (record.projected_gradients or record.projected_updates):
        return []
    return [(name, member, getattr(record, attribute)) for name, member, attribute in PROJECTED]


def _projected_vectors(arrays: Arrays, meta: dict, clients: list) -> dict[str, dict]:
    """The record's projected vectors by field (client -> row of its member's matrix)."""
    found = {}
    for name, member, attribute in PROJECTED:
        if name not in meta:
            continue
        rows, matrix = meta[name], arrays[member]
        if not isinstance(rows, list) or len(set(rows)) != len(rows) or matrix.ndim != 2 or len(matrix) != len(rows):
            raise ValueError(f"'{name}' does not list one client per row of its {member} matrix")
        found[attribute] = {clients[k]: matrix[i] for i, k in enumerate(rows)}
    return found


def write_round_record(run_dir: str | os.PathLike | RunDir, record: RoundRecord) -> Path:
    """Save ``record`` as ``records/round-NNNNNN.npz`` (atomic). Client ids must be ints or strings."""
    run = open_run_dir(run_dir)
    name = record_name(record.round)
    run.write_bytes(name, record_bytes(record))
    return run.path / name


def round_record_from_bytes(data: bytes, where: str) -> RoundRecord:
    """A record from its archive's bytes; ValueError naming ``where`` for anything else."""
    arrays, meta = npz_from_bytes(data, where)
    try:
        return _round_record(arrays, meta)
    except (KeyError, IndexError, TypeError, ValueError, AttributeError, OverflowError) as error:
        raise ValueError(f"{where}: not a round record written by fedvalue (its metadata lacks or garbles "
                         f"{type(error).__name__}: {rundir.printable(error, 120)}).") from None


def read_round_record(path: str | os.PathLike) -> RoundRecord:
    """A record written by :func:`write_round_record`; ValueError naming the file for
    anything else (a torn archive, garbage metadata)."""
    run, name = _split(path)
    return round_record_from_bytes(run.read_bytes(name), run.show(name))


def read_round(run_dir: str | os.PathLike | RunDir, server_round: int) -> RoundRecord:
    """Round ``server_round``'s record in ``run_dir`` (what its books were decided from: A_{t−1},
    every reply's arrays and weight, the gradients). FileNotFoundError naming the rounds that
    have one when the run saved none for it (a run with ``save_records=False``); ValueError for
    a file that is not a record."""
    run = open_run_dir(run_dir)
    names = round_record_names(run)
    if server_round not in names:
        raise FileNotFoundError(f"server_round: expected a round with a saved record in {run.show()} "
                                f"({sorted(names) or 'none'}); got {server_round!r}.")
    return round_record_from_bytes(run.read_bytes(names[server_round]), run.show(names[server_round]))


def round_updates(run_dir: str | os.PathLike | RunDir, server_round: int) -> dict[Hashable, Arrays]:
    """The update each client sent in round ``server_round``, Δ_i = w_i − A_{t−1} per array,
    by client id in reply order (every ``ok`` or ``rejected`` reply: :attr:`RoundRecord.replies`),
    read from the round's saved record (:func:`read_round`)."""
    record = read_round(run_dir, server_round)
    start = record.start_arrays
    for client, reply in record.replies.items():
        if set(reply) != set(start):
            raise ValueError(f"round {server_round}: client {client}'s reply holds the arrays {sorted(reply)[:5]}, "
                             f"not A_(t-1)'s {sorted(start)[:5]}; it has no update to take.")
    return {client: {key: np.asarray(value) - np.asarray(start[key]) for key, value in reply.items()}
            for client, reply in record.replies.items()}


def _optional(value, kind):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{value!r} is not a number")
    return kind(value)


def _entries(meta: dict, clients: list) -> tuple[list[ClientEntry], bool]:
    """The record's entries, and whether it holds them itself (an older record holds only
    statuses and weights by client: its entries are rebuilt in that order)."""
    if "entries" in meta:
        entries = []
        for item in meta["entries"]:
            k, status, weight, num_examples, reason = item
            if not isinstance(status, str) or not isinstance(reason, str):
                raise TypeError("an entry's status or reason is not text")
            entries.append(ClientEntry(clients[k], status, _optional(weight, float), _optional(num_examples, int),
                                       reason))
        return entries, True
    weights = {clients[int(k)]: float(w) for k, w in meta["weights"].items()}
    by_examples = meta["meta"].get("weighted_by_key", NUM_EXAMPLES_KEY) == NUM_EXAMPLES_KEY
    entries = []
    for k, status in meta["statuses"].items():
        client = clients[int(k)]
        weight = weights.get(client)
        weighed = status in WEIGHED_STATUSES and weight is not None
        entries.append(ClientEntry(client, status, weight, int(weight) if by_examples and weighed else None))
    return entries, False


def _round_record(arrays: Arrays, meta: dict) -> RoundRecord:
    clients = meta["clients"]
    if not isinstance(clients, list) or any(isinstance(c, bool) or not isinstance(c, (int, str)) for c in clients):
        raise TypeError("'clients' is not a list of ids")
    if len(set(clients)) != len(clients):
        raise ValueError("'clients' names a client twice")
    if not isinstance(meta["meta"], dict):
        raise TypeError("'meta' is not an object")
    for key in ("replies", "accepted", "gradients", "loss_gradients", "fisher_diagonals"):
        if key not in meta and key in ("loss_gradients", "fisher_diagonals"):
            continue
        if not isinstance(meta[key], list) or len(set(meta[key])) != len(meta[key]):
            raise ValueError(f"'{key}' is not a list of distinct clients")
    entries, lossless = _entries(meta, clients)
    claims = [ClaimEntry(clients[k], str(method), float(claimed), float(used), str(status))
              for k, method, claimed, used, status in meta.get("claims", [])]
    return RoundRecord(
        round=int(meta["round"]),
        start_arrays=_split_prefix(arrays, "start/"),
        entries=entries,
        replies={clients[k]: _split_prefix(arrays, f"reply/{k}/") for k in meta["replies"]},
        accepted=[clients[k] for k in meta["accepted"]],
        gradients={clients[k]: _split_prefix(arrays, f"gradient/{k}/") for k in meta["gradients"]},
        losses={clients[int(k)]: float(v) for k, v in meta["losses"].items()},
        settings=RoundSettings.from_json({k: v for k, v in meta["meta"].items() if k not in ROUND_FACTS}),
        claims=claims,
        replay=(meta["replay"], _split_prefix(arrays, "replay/")) if "replay" in meta else None,
        loss_gradients={clients[k]: _split_prefix(arrays, f"loss-gradient/{k}/") for k in meta.get("loss_gradients", [])},
        fisher_diagonals={clients[k]: _split_prefix(arrays, f"fisher/{k}/") for k in meta.get("fisher_diagonals", [])},
        lossless=lossless,
        references=_references(arrays, meta.get("references", [])),
        **_projected_vectors(arrays, meta, clients),
        **round_facts_from_json(meta["meta"]),
    )


def _references(arrays: Arrays, names: object) -> dict[str, Arrays]:
    """The record's reference arrays by name (names: a list of distinct strings without '/')."""
    if not isinstance(names, list) or len(set(map(str, names))) != len(names) or any(
            not isinstance(n, str) or "/" in n or not n for n in names):
        raise ValueError("'references' is not a list of distinct names")
    return {name: _split_prefix(arrays, f"reference/{name}/") for name in names}


def round_record_names(run_dir: str | os.PathLike | RunDir) -> dict[int, str]:
    """Round -> record name (relative), for every file of records/ named exactly as a
    record (``round-NNNNNN.npz``); other names are not records (the audit lists them)."""
    run = open_run_dir(run_dir)
    found = {}
    for entry in run.listdir(RECORDS_DIR):
        server_round = record_round(entry)
        if server_round is not None:
            found[server_round] = f"{RECORDS_DIR}/{entry}"
    return dict(sorted(found.items()))


def round_record_paths(run_dir: str | os.PathLike) -> dict[int, Path]:
    """Round -> record file, for every record the run saved."""
    run = open_run_dir(run_dir)
    return {t: run.path / name for t, name in round_record_names(run).items()}


# --------------------------------------------------------------------------- checkpoints


def state_bytes(tree: object, arrays: Mapping[str, np.ndarray]) -> bytes:
    """The server's state (:mod:`fedvalue.run.state_codec`) as the bytes of its checkpoint file."""
    return npz_bytes({f"state/{key}": value for key, value in arrays.items()}, {"state": tree})


def state_from_bytes(data: bytes, where: str) -> tuple[object, Arrays]:
    """(JSON tree, arrays) of a state file :func:`state_bytes` wrote; ValueError otherwise."""
    arrays, meta = npz_from_bytes(data, where)
    if "state" not in meta:
        raise ValueError(f"{where}: not a server state written by fedvalue (no 'state').")
    return meta["state"], _split_prefix(arrays, "state/")


def write_checkpoint(run: RunDir, server_round: int, arrays: Mapping[str, np.ndarray], state: tuple[object, Mapping],
                     sizes: Mapping[str, int], before_switch=None) -> dict[str, str]:
    """Checkpoint round ``server_round``, which must already be committed to the tables.

    A_k and the server's state go to their own files first; ``before_switch`` (the round's
    seal) is called with {"npz": bytes, "state": bytes} of what was written; then
    ``checkpoint.json`` switches to them (with the tables' ``sizes``) in one atomic
    replace; other checkpoint files are removed last. Returns the files' names.
    """
    arrays_name, state_name = checkpoint_names(server_round)
    written = {"npz": write_npz(run, arrays_name, arrays)}
    kill_points.reached("checkpoint_arrays", server_round)
    written["state"] = state_bytes(*state)
    run.write_bytes(state_name, written["state"])
    kill_points.reached("checkpoint_state", server_round)
    if before_switch is not None:
        before_switch(written)
    write_checkpoint_pointer(run, server_round, sizes)
    kill_points.reached("checkpoint_switch", server_round)
    prune_checkpoints(run, {arrays_name, state_name})
    kill_points.reached("prune", server_round)
    return {"npz": arrays_name, "state": state_name}


def write_checkpoint_pointer(run: RunDir, server_round: int, sizes: Mapping[str, int]) -> None:
    """``checkpoint.json``: round k and the tables' sizes at its commit, replaced atomically."""
    run.write_text(CHECKPOINT_FILE, json.dumps({"round": int(server_round), "files": dict(sizes)},
                                               sort_keys=True) + "\n")


def write_start_pointer(run: RunDir) -> None:
    """The start's ``checkpoint.json`` (round 0, empty tables): the run checkpoints, and
    nothing is committed yet. A resume of a writer killed in round 1 starts from it."""
    write_checkpoint_pointer(run, 0, {})


def prune_checkpoints(run: RunDir, keep: set[str]) -> None:
    """Remove every file of ``checkpoint/`` but those named in ``keep`` (relative names)."""
    for entry in run.listdir(CHECKPOINT_DIR):
        if f"{CHECKPOINT_DIR}/{entry}" not in keep:
            run.unlink(f"{CHECKPOINT_DIR}/{entry}")


def read_checkpoint_pointer(run: RunDir) -> tuple[int, dict[str, int]] | None:
    """(round k, table sizes) that ``checkpoint.json`` names; None without one. Reads
    nothing else: resuming verifies the files against round k's seal before using them."""
    if not run.exists(CHECKPOINT_FILE):
        return None
    return parse_checkpoint_pointer(run.read_text(CHECKPOINT_FILE, max_bytes=1 << 20), run.show(CHECKPOINT_FILE))


def parse_checkpoint_pointer(text: str, where: str) -> tuple[int, dict[str, int]]:
    """(round k, table sizes) of ``checkpoint.json``'s ``text``; ValueError naming ``where``."""
    saved = rundir.loads_json(text, where)
    try:
        server_round = saved["round"]
        sizes = saved["files"]
        if isinstance(server_round, bool) or not isinstance(server_round, int) or server_round < 0:
            raise ValueError("its round is not a non-negative integer")
        if not isinstance(sizes, dict) or any(
                k not in APPEND_ONLY_FILES or isinstance(v, bool) or not isinstance(v, int) or v < 0
                for k, v in sizes.items()):
            raise ValueError("its sizes are not the tables' byte counts")
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"resume: {where} is not a checkpoint written by fedvalue "
                         f"({rundir.printable(error, 120)}).") from None
    return server_round, dict(sizes)
