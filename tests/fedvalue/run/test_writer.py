"""A run directory's life: commits in their crash-safe order, and a resume that verifies
everything before it cuts anything (every refusal leaves every byte where it was)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from fedvalue.run.ledger_tables import csv_lines
from fedvalue.run.writer import RunBooks
from fedvalue.schema import LEDGER_COLUMNS, LedgerRow, RoundRow
from fedvalue.run.seals import Signer, generate_keypair, read_seals

CONFIG = {"experiment": "books", "seed": 0}
STATE = ({"$dict": [["totals", {"$array": "a0"}]]}, {"a0": np.arange(3.0)})


def rows(t: int) -> tuple[RoundRow, list[LedgerRow]]:
    ledger = [LedgerRow(round=t, client_id=c, method="ads", value=0.1 * c + t, stderr=None, num_examples=5,
                        status="ok", noisy=False) for c in (1, 2)]
    return RoundRow(round=t, clients="1 2", num_clients=2, num_failed=0, utility_before=0.5, utility_after=0.6,
                    utility_realized=0.6, num_evaluations=4), ledger


def commit(books: RunBooks, t: int) -> str:
    round_row, ledger_rows = rows(t)
    return books.commit(t, round_row, ledger_rows, realized={"w": np.full(2, float(t))}, state=STATE)


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    base = tmp_path_factory.mktemp("keys")
    generate_keypair(base / "k.pem", base / "k.pub")
    return Signer.from_file(base / "k.pem")


@pytest.fixture
def killed(tmp_path, keys) -> Path:
    """A signed run killed while writing round 3: rounds 1-2 committed, round 3 half-written."""
    books = RunBooks(tmp_path / "run", config=CONFIG, signer=keys)
    commit(books, 1)
    commit(books, 2)
    with open(tmp_path / "run" / "ledger.csv", "a") as handle:
        handle.write(csv_lines(LEDGER_COLUMNS, rows(3)[1])[0][:20])
    return tmp_path / "run"


def snapshot(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


def test_each_commit_is_sealed_with_its_head_digests_and_sizes(tmp_path, keys):
    books = RunBooks(tmp_path / "run", config=CONFIG, signer=keys)
    head = commit(books, 1)
    seal = read_seals(tmp_path / "run")[0]
    assert seal["head"] == head and keys.verifier().problem(seal) is None
    assert seal["sizes"] == {"ledger.csv": (tmp_path / "run" / "ledger.csv").stat().st_size,
                             "rounds.csv": (tmp_path / "run" / "rounds.csv").stat().st_size}
    for key, name in (("npz", "round-000001.npz"), ("state", "round-000001-state.npz")):
        data = (tmp_path / "run" / "checkpoint" / name).read_bytes()
        assert seal["checkpoint"][key] == hashlib.sha256(data).hexdigest()
    assert json.loads((tmp_path / "run" / "checkpoint.json").read_text())["round"] == 1


def test_a_resume_cuts_back_to_the_verified_checkpoint(killed, keys):
    books = RunBooks(killed, config=CONFIG, resume=True, signer=keys)
    assert books.restored.round == 2 and books.restored.arrays["w"].tolist() == [2.0, 2.0]
    tree, arrays = books.restored.state
    assert tree == STATE[0] and arrays["a0"].tolist() == [0.0, 1.0, 2.0]
    lines = (killed / "ledger.csv").read_text().splitlines()
    assert len(lines) == 5 and lines[-1].startswith("2,")  # the torn round 3 is gone


def _refused(run_dir: Path, match: str, **keywords) -> None:
    before = snapshot(run_dir)
    with pytest.raises(ValueError, match=match):
        RunBooks(run_dir, config=CONFIG, resume=True, **keywords)
    assert snapshot(run_dir) == before  # verify, then act: nothing was cut


def test_sizes_the_seal_did_not_commit_to_are_refused(killed):
    pointer = json.loads((killed / "checkpoint.json").read_text())
    pointer["files"]["ledger.csv"] -= 30
    (killed / "checkpoint.json").write_text(json.dumps(pointer))
    _refused(killed, "sizes in checkpoint.json that round 2's seal did not commit to")


def test_a_checkpoint_of_round_zero_is_refused_once_a_round_committed(killed):
    (killed / "checkpoint.json").write_text(json.dumps({"round": 0, "files": {}}))
    _refused(killed, "2 committed rounds and 2 seals but no checkpoint")
    (killed / "checkpoint.json").unlink()
    _refused(killed, "2 committed rounds")


def test_a_changed_table_checkpoint_or_seal_is_refused(killed, tmp_path, keys):
    original = tmp_path / "original"
    shutil.copytree(killed, original)
    text = (killed / "ledger.csv").read_text()
    (killed / "ledger.csv").write_text(text.replace(",1.1,", ",1.3,", 1))
    _refused(killed, "does not chain up to its checkpoint")
    shutil.rmtree(killed)
    shutil.copytree(original, killed)
    (killed / "checkpoint" / "round-000002-state.npz").write_bytes(b"PK\x03\x04 not the sealed state")
    _refused(killed, "differs from the one round 2's seal committed to")
    shutil.rmtree(killed)
    shutil.copytree(original, killed)
    other = tmp_path / "other.pem"
    generate_keypair(other, tmp_path / "other.pub")
    _refused(killed, "not signed by the given key", signer=Signer.from_file(other))


def test_a_state_the_resumed_run_cannot_take_is_refused_before_anything_is_cut(killed):
    def check_state(state):
        raise ValueError("the checkpoint saved a FedAdam; the resumed run has a FedAvg there")

    _refused(killed, "does not restore .the checkpoint saved a FedAdam", check_state=check_state)


def test_a_finished_run_is_not_resumed(tmp_path):
    books = RunBooks(tmp_path / "run", config=CONFIG)
    commit(books, 1)
    books.close(1)
    _refused(tmp_path / "run", r"already completed 1 round \(it holds")
