"""Round records and checkpoints on disk: exact round trips, atomic pointers, rewind."""

from __future__ import annotations

import io
import pickle

import numpy as np
import pytest

from fedvalue.run.archive import (
    CHECKPOINT_DIR,
    CHECKPOINT_FILE,
    RoundRecord,
    load_npz,
    npz_from_bytes,
    read_checkpoint_pointer,
    read_round_record,
    record_bytes,
    round_record_paths,
    save_npz,
    state_from_bytes,
    write_checkpoint,
    write_round_record,
)
from fedvalue.run.rundir import RunDir
from fedvalue.schema import LEDGER_FILE, ClaimEntry, ClientEntry
from fedvalue.run.settings import RoundSettings
from fedvalue.valuation.settings import AdsSettings


def arrays(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "w": rng.standard_normal((3, 4)).astype(np.float32),
        "b": rng.standard_normal(4),  # float64
        "count": np.array(7, dtype=np.int64),  # a 0-d buffer keeps its shape
    }


def same_arrays(a, b) -> bool:
    return list(a) == list(b) and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and a[k].tobytes() == b[k].tobytes() for k in a
    )


def record(server_round: int = 3) -> RoundRecord:
    return RoundRecord(
        round=server_round,
        start_arrays=arrays(0),
        entries=[ClientEntry(4, "ok", 10.0, 10), ClientEntry(11, "failed", None, None, "crashed"),
                 ClientEntry("edge-a", "rejected", 2.5, None, "non-finite values"),
                 ClientEntry(np.int64(9), "ok", 1.0, 1), ClientEntry(4, "failed", None, None, "duplicate")],
        replies={4: arrays(1), "edge-a": arrays(2), np.int64(9): arrays(3)},
        accepted=[4, np.int64(9)],
        gradients={4: {"g": np.arange(3.0)}, 12: {"g": np.ones(3)}},
        losses={4: 0.5, 12: 1.25},
        settings=RoundSettings(methods=("ads",), valuation=AdsSettings(method="exact"), seed=7, strategy="FedAvg"),
        claims=[ClaimEntry("edge-a", "claim_capped", 40.0, 2.5, "rejected")],
        available=(4, 9), passed=(0, 2), replay_missing="its state holds a lock",
    )


def test_npz_round_trip_keeps_bytes_dtypes_shapes_and_meta(tmp_path):
    path = tmp_path / "a.npz"
    save_npz(path, arrays(5), {"k": [1, "x"]})
    loaded, meta = load_npz(path)
    assert same_arrays(loaded, arrays(5)) and meta == {"k": [1, "x"]}


def test_a_round_record_comes_back_exactly(tmp_path):
    written = record()
    path = write_round_record(tmp_path, written)
    assert path == tmp_path / "records" / "round-000003.npz"
    read = read_round_record(path)
    assert read.round == 3 and read.settings == written.settings
    assert (read.available, read.passed, read.replay_missing) == ((4, 9), (0, 2), "its state holds a lock")
    assert same_arrays(read.start_arrays, written.start_arrays)
    # numpy ids come back as plain ints, in reply order, with their arrays and weights
    assert list(read.replies) == [4, "edge-a", 9]
    assert all(same_arrays(read.replies[int(c) if isinstance(c, np.integer) else c], a)
               for c, a in written.replies.items())
    # every entry in reply order, the failure between replies and the duplicate included
    assert read.entries == [ClientEntry(4, "ok", 10.0, 10), ClientEntry(11, "failed", None, None, "crashed"),
                            ClientEntry("edge-a", "rejected", 2.5, None, "non-finite values"),
                            ClientEntry(9, "ok", 1.0, 1), ClientEntry(4, "failed", None, None, "duplicate")]
    assert read.claims == written.claims and read.lossless
    assert read.weights == {4: 10.0, "edge-a": 2.5, 9: 1.0}
    assert read.statuses == {4: "ok", 11: "failed", "edge-a": "rejected", 9: "ok"}  # a duplicate is the later one
    assert read.accepted == [4, 9]
    assert list(read.gradients) == [4, 12] and read.losses == {4: 0.5, 12: 1.25}


def test_curvature_comes_back_and_a_record_without_it_writes_no_trace_of_it(tmp_path):
    import dataclasses

    plain = record_bytes(record())
    _, meta = npz_from_bytes(plain, "plain")
    assert "loss_gradients" not in meta and "fisher_diagonals" not in meta  # older records' bytes unchanged
    written = dataclasses.replace(record(), loss_gradients={4: arrays(6), "edge-a": arrays(7)},
                                  fisher_diagonals={4: arrays(8), "edge-a": arrays(9)})
    read = read_round_record(write_round_record(tmp_path, written))
    assert list(read.loss_gradients) == [4, "edge-a"] and list(read.fisher_diagonals) == [4, "edge-a"]
    assert same_arrays(read.loss_gradients[4], arrays(6)) and same_arrays(read.fisher_diagonals["edge-a"], arrays(9))
    assert same_arrays(read.replies[4], arrays(1)) and list(read.gradients) == [4, 12]  # prefixes do not mix


def projected(base: RoundRecord, k: int, rng: np.random.Generator, idle: int = 0) -> RoundRecord:
    """``base`` with its flows kept projected: k float32 numbers per gradient (its clients' and ``idle``
    more), k float64 numbers per valid reply's update, and no full gradients."""
    import dataclasses

    clients = [*base.gradients, *(f"idle-{i}" for i in range(idle))]
    note = {"dim": k, "seed": 5, "kind": "count-sketch", "chunk_size": 1 << 20}
    return dataclasses.replace(
        base, gradients={}, settings=dataclasses.replace(base.settings, flows=True, flows_projection=note),
        projected_gradients={c: rng.standard_normal(k).astype(np.float32) for c in clients},
        projected_updates={c: rng.standard_normal(k) for c in base.replies})


def test_projected_vectors_come_back_and_a_record_without_them_writes_no_trace_of_them(tmp_path):
    _, meta = npz_from_bytes(record_bytes(record()), "plain")
    assert "projected_gradients" not in meta and "projected_updates" not in meta  # other records' bytes unchanged
    written = projected(record(), 5, np.random.default_rng(0), idle=2)
    read = read_round_record(write_round_record(tmp_path, written))
    assert read.settings == written.settings and read.gradients == {}
    assert list(read.projected_gradients) == [4, 12, "idle-0", "idle-1"] and list(read.projected_updates) == [4, "edge-a", 9]
    for kept, back in ((written.projected_gradients, read.projected_gradients),
                       (written.projected_updates, read.projected_updates)):
        for client, vector in kept.items():
            again = back[int(client) if isinstance(client, np.integer) else client]
            assert again.dtype == vector.dtype and again.tobytes() == vector.tobytes()


def test_a_projected_record_is_the_size_of_its_k_numbers_a_client():
    """p = 20,000 parameters, 300 clients with a gradient, 3 replies: the full gradients take 300·p·4 bytes
    (24 MB); projected to k = 256 they take 300·k·4 + 3·k·8 bytes (313 KB) and a few hundred bytes of metadata."""
    rng = np.random.default_rng(1)
    p, n, k = 20_000, 300, 256
    base = {**record().__dict__, "losses": {}}
    full = RoundRecord(**{**base, "gradients": {f"c{i}": {"w": rng.standard_normal(p).astype(np.float32)}
                                                for i in range(n)}})
    bare = len(record_bytes(RoundRecord(**{**base, "gradients": {}})))
    assert len(record_bytes(full)) - bare >= n * p * 4
    grown = len(record_bytes(projected(full, k, rng))) - bare
    assert n * k * 4 + 3 * k * 8 <= grown <= n * k * 4 + 3 * k * 8 + 8 * n + 2048


@pytest.mark.parametrize("bad_id", [True, 1.5, ("a", 1)])
def test_a_record_refuses_client_ids_it_cannot_save(tmp_path, bad_id):
    bad = record()
    bad.entries.append(ClientEntry(bad_id, "failed"))
    with pytest.raises(TypeError) as error:
        write_round_record(tmp_path, bad)
    assert str(error.value) == f"client ids: expected ints or strings to save a round record; got {bad_id!r}."
    assert round_record_paths(tmp_path) == {}


def test_record_paths_list_only_round_files_in_order(tmp_path):
    for t in (10, 2, 7):
        write_round_record(tmp_path, record(t))
    (tmp_path / "records" / "notes.txt").write_text("not a record")
    assert list(round_record_paths(tmp_path)) == [2, 7, 10]


def test_checkpoint_switches_atomically_and_keeps_only_its_own_files(tmp_path):
    run = RunDir(tmp_path)
    assert read_checkpoint_pointer(run) is None  # nothing yet: start afresh
    sealed = []
    state = ({"$dict": [["k", {"$array": "a0"}]]}, {"a0": np.arange(3.0)})
    write_checkpoint(run, 1, arrays(1), state, {LEDGER_FILE: 11})
    write_checkpoint(run, 2, arrays(2), state, {LEDGER_FILE: 16}, before_switch=sealed.append)
    assert read_checkpoint_pointer(run) == (2, {LEDGER_FILE: 16})
    assert sorted(p.name for p in (tmp_path / CHECKPOINT_DIR).iterdir()) == ["round-000002-state.npz",
                                                                             "round-000002.npz"]
    # the seal saw exactly the bytes on disk, before the pointer switched
    assert sealed[0]["npz"] == (tmp_path / CHECKPOINT_DIR / "round-000002.npz").read_bytes()
    assert same_arrays(npz_from_bytes(sealed[0]["npz"], "a")[0], arrays(2))
    tree, saved = state_from_bytes(sealed[0]["state"], "s")
    assert tree == state[0] and same_arrays(saved, state[1])


@pytest.mark.parametrize("pointer", ["not json", '{"round": 1}', '{"round": "x", "files": {}}', "[" * 10_000,
                                     '{"round": 1, "files": {"../x": 1}}', '{"round": 1, "files": {"ledger.csv": -1}}'])
def test_a_damaged_checkpoint_pointer_is_named(tmp_path, pointer):
    (tmp_path / CHECKPOINT_FILE).write_text(pointer)
    with pytest.raises(ValueError, match="checkpoint.json"):
        read_checkpoint_pointer(RunDir(tmp_path))


def test_an_archive_holding_python_objects_is_refused_and_never_unpickled(tmp_path):
    marker = tmp_path / "ran"
    payload = np.array([Payload(str(marker))], dtype=object)
    buffer = io.BytesIO()
    np.savez(buffer, x=payload)
    with pytest.raises(ValueError, match="holds Python objects"):
        npz_from_bytes(buffer.getvalue(), "evil.npz")
    assert not marker.exists()
    with pytest.raises(ValueError, match="not an archive written by fedvalue"):
        npz_from_bytes(pickle.dumps(Payload(str(marker))), "evil.npz")
    assert not marker.exists()


class Payload:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        from pathlib import Path

        return (Path.touch, (Path(self.marker),))
