"""Attacks on a run directory: every rewrite must fail the audit or be declared not
verifiable, and no content of any file may give a traceback or a hang.

One small real run of ``fedvalue run noisy-clients`` (Ray, signed with a fresh key) is made
once for the session (``signed_run`` in conftest.py); each case rewrites a copy of it as an attacker would, recomputing
the hash chain, the seals and the manifest wherever that helps the forgery (a forger has
no signing key). Each case is audited without the key (what the files alone expose) and
with ``--public-key`` (every rewrite fails).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import shutil
import stat
from pathlib import Path

import pytest

from fedvalue.run.archive import load_npz, read_round_record, round_record_paths, save_npz, write_round_record
from fedvalue.run.seals import SEALS_FILE
from fedvalue.schema import MODEL_SIGNATURE_FILE
from simulations.cli.main import main
from tests.fedvalue.forgery import rechain, reseal

INTACT, NOT_INTACT, NOT_VERIFIABLE = "intact", "NOT intact", "NOT verifiable"


# --------------------------------------------------------------------------- rewrites


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines(keepends=True)


def _edit_cell(run_dir: Path, name: str, row: int, column: str, new: str) -> None:
    """Set one cell of a table (``row`` counts data rows from 0)."""
    lines = _lines(run_dir / name)
    header = lines[0].rstrip("\n").split(",")
    cells = lines[row + 1].rstrip("\n").split(",")
    cells[header.index(column)] = new
    lines[row + 1] = ",".join(cells) + "\n"
    (run_dir / name).write_text("".join(lines))
    (run_dir / "ledger.parquet").unlink(missing_ok=True)


def truncate_last_round(run_dir: Path) -> None:
    """The last round removed from every file, seals and manifest recomputed."""
    last = len(_lines(run_dir / "rounds.csv")) - 1
    for name in ("ledger.csv", "rounds.csv"):
        lines = _lines(run_dir / name)
        (run_dir / name).write_text("".join(line for line in lines if not line.startswith(f"{last},")))
    (run_dir / "records" / f"round-{last:06d}.npz").unlink()
    shutil.rmtree(run_dir / "checkpoint")
    (run_dir / "checkpoint.json").unlink()
    (run_dir / "ledger.parquet").unlink()
    rechain(run_dir)


def rewrite(name: str, row: int, column: str, new) -> callable:
    def attack(run_dir: Path) -> None:
        _edit_cell(run_dir, name, row, column, new(_lines(run_dir / name)[row + 1]) if callable(new) else new)
        rechain(run_dir)
    attack.__name__ = f"{column}_changed"
    return attack


def flip_noisy(run_dir: Path) -> None:
    """Every row of one client claims the other noisy flag."""
    lines = _lines(run_dir / "ledger.csv")
    client = lines[1].split(",")[1]
    out = [lines[0]]
    for line in lines[1:]:
        if line.split(",")[1] == client:
            line = line.replace(",true,", ",FLIP,").replace(",false,", ",true,").replace(",FLIP,", ",false,")
        out.append(line)
    (run_dir / "ledger.csv").write_text("".join(out))
    (run_dir / "ledger.parquet").unlink()
    rechain(run_dir)


def swap_identities(run_dir: Path) -> None:
    """Two clients of different rounds swap ids everywhere: ledger, rounds.csv, records."""
    rounds = _lines(run_dir / "rounds.csv")
    a, b = rounds[1].split(",")[1].split()[0], rounds[2].split(",")[1].split()[0]

    def swap(text: str) -> str:
        return text.replace(f",{a},", ",@A,").replace(f",{b},", f",{a},").replace(",@A,", f",{b},")

    (run_dir / "ledger.csv").write_text("".join(swap(line) for line in _lines(run_dir / "ledger.csv")))
    out = [rounds[0]]
    for line in rounds[1:]:
        cells = line.split(",")
        cells[1] = " ".join({a: b, b: a}.get(c, c) for c in cells[1].split())
        out.append(",".join(cells))
    (run_dir / "rounds.csv").write_text("".join(out))
    for path in round_record_paths(run_dir).values():
        record = read_round_record(path)
        relabel = {int(a): int(b), int(b): int(a)}
        record.replies = {relabel.get(c, c): v for c, v in record.replies.items()}
        record.entries = [dataclasses.replace(e, client_id=relabel.get(e.client_id, e.client_id))
                          for e in record.entries]
        record.accepted = [relabel.get(c, c) for c in record.accepted]
        write_round_record(run_dir, record)
    (run_dir / "ledger.parquet").unlink()
    rechain(run_dir)


def move_value_and_delete_records(run_dir: Path) -> None:
    """ADS moved from one client to its round partner (efficiency kept), records deleted."""
    lines = _lines(run_dir / "ledger.csv")
    first = next(i for i, line in enumerate(lines) if ",ads," in line)
    second = next(i for i, line in enumerate(lines) if ",ads," in line and i > first
                  and line.split(",")[0] == lines[first].split(",")[0])
    for index, delta in ((first, 0.05), (second, -0.05)):
        cells = lines[index].split(",")
        cells[3] = repr(float(cells[3]) + delta)
        lines[index] = ",".join(cells)
    (run_dir / "ledger.csv").write_text("".join(lines))
    (run_dir / "ledger.parquet").unlink()
    shutil.rmtree(run_dir / "records")
    rechain(run_dir)


def records_replaced_by_a_file(run_dir: Path) -> None:
    shutil.rmtree(run_dir / "records")
    (run_dir / "records").write_text("not a directory\n")


def huge_number(run_dir: Path) -> None:
    _edit_cell(run_dir, "ledger.csv", 0, "value", "1" + "0" * 400)
    rechain(run_dir)


def truncated_record(run_dir: Path) -> None:
    path = run_dir / "records" / "round-000001.npz"
    path.write_bytes(path.read_bytes()[:300])


def garbage_record_metadata(run_dir: Path) -> None:
    """Round 1's record keeps its arrays but its metadata lacks the clients (resealed)."""
    path = run_dir / "records" / "round-000001.npz"
    arrays, _ = load_npz(path)
    save_npz(path, arrays, {"round": 1})
    reseal(run_dir)


def run_json_a_list(run_dir: Path) -> None:
    (run_dir / "run.json").write_text("[1, 2, 3]\n")
    rechain(run_dir)


def fifo_parquet(run_dir: Path) -> None:
    (run_dir / "ledger.parquet").unlink()
    os.mkfifo(run_dir / "ledger.parquet")


def dev_zero_record(run_dir: Path) -> None:
    path = run_dir / "records" / "round-000002.npz"
    path.unlink()
    path.symlink_to("/dev/zero")


def ledger_symlinked_outside(run_dir: Path) -> None:
    outside = run_dir.parent / "secret.txt"
    outside.write_text("SECRET-FIRST-LINE\n")
    (run_dir / "ledger.csv").unlink()
    (run_dir / "ledger.csv").symlink_to(outside)


def manifest_deleted(run_dir: Path) -> None:
    (run_dir / "manifest.json").unlink()


def manifest_and_model_signature_deleted(run_dir: Path) -> None:
    """Every trace of the close removed: the run reads as one killed before its end."""
    (run_dir / "manifest.json").unlink()
    (run_dir / MODEL_SIGNATURE_FILE).unlink()


def seals_and_manifest_deleted(run_dir: Path) -> None:
    (run_dir / "manifest.json").unlink()
    (run_dir / SEALS_FILE).unlink()


def resealed_record(run_dir: Path) -> None:
    """A saved reply changed, seals and manifest recomputed."""
    path = round_record_paths(run_dir)[2]
    record = read_round_record(path)
    client = next(iter(record.replies))
    record.replies[client] = {k: v * 1.01 for k, v in record.replies[client].items()}
    write_round_record(run_dir, record)
    reseal(run_dir)


def run_json_seed_changed(run_dir: Path) -> None:
    config = json.loads((run_dir / "run.json").read_text())
    config["seed"] += 1
    (run_dir / "run.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    rechain(run_dir)


def unchanged(run_dir: Path) -> None:
    pass


#: (rewrite, verdict without a key, verdict with the signer's public key).
ATTACKS = [
    (unchanged, INTACT, INTACT),
    (truncate_last_round, NOT_INTACT, NOT_INTACT),
    (rewrite("ledger.csv", 0, "num_examples", "999"), NOT_INTACT, NOT_INTACT),
    (flip_noisy, NOT_INTACT, NOT_INTACT),
    (rewrite("ledger.csv", 0, "stderr", "0.01"), NOT_INTACT, NOT_INTACT),
    (rewrite("rounds.csv", 0, "ads_method", "ads-mc"), NOT_INTACT, NOT_INTACT),
    # What only a signature (or a published head) protects: a timing cannot be recomputed.
    (rewrite("rounds.csv", 0, "valuation_seconds", "123.0"), INTACT, NOT_INTACT),
    (swap_identities, NOT_INTACT, NOT_INTACT),
    (move_value_and_delete_records, NOT_VERIFIABLE, NOT_INTACT),
    (records_replaced_by_a_file, NOT_INTACT, NOT_INTACT),
    (huge_number, NOT_INTACT, NOT_INTACT),
    (truncated_record, NOT_INTACT, NOT_INTACT),
    (garbage_record_metadata, NOT_VERIFIABLE, NOT_INTACT),
    (run_json_a_list, NOT_INTACT, NOT_INTACT),
    (fifo_parquet, NOT_INTACT, NOT_INTACT),
    (dev_zero_record, NOT_INTACT, NOT_INTACT),
    (ledger_symlinked_outside, NOT_INTACT, NOT_INTACT),
    # With the key, the run's model.sig (signed at the close, over manifest.json too) shows
    # the manifest was removed; without model.sig the run is only incomplete.
    (manifest_deleted, NOT_VERIFIABLE, NOT_INTACT),
    (manifest_and_model_signature_deleted, NOT_VERIFIABLE, NOT_VERIFIABLE),
    (seals_and_manifest_deleted, NOT_VERIFIABLE, NOT_INTACT),
    (resealed_record, NOT_INTACT, NOT_INTACT),
    (run_json_seed_changed, NOT_INTACT, NOT_INTACT),
]


@pytest.fixture
def attacked(signed_run, tmp_path, request):
    run_dir, private, public = signed_run
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy, symlinks=True)
    request.param(copy)
    return copy, public


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("attacked", "without_key", "with_key"), ATTACKS, indirect=["attacked"],
                         ids=[attack.__name__ for attack, _, _ in ATTACKS])
def test_every_rewrite_fails_or_is_not_verifiable(attacked, without_key, with_key, capsys):
    run_dir, public = attacked
    for argv, expected in (([], without_key), (["--public-key", str(public)], with_key)):
        code = main(["audit", str(run_dir), *argv])
        out = capsys.readouterr().out
        verdict = out.strip().splitlines()[-1].rsplit(": ", 1)[-1]
        assert verdict == expected, out
        assert code == (0 if expected == INTACT else 1)
        assert "SECRET-FIRST-LINE" not in out  # a linked file is refused, never read
    assert main(["report", str(run_dir)]) in (0, 2)  # read or refused with a message, never a traceback
    capsys.readouterr()


def test_a_published_head_fails_every_rewrite_of_the_tables(signed_run, tmp_path, capsys):
    run_dir, _, _ = signed_run
    head = json.loads((run_dir / "manifest.json").read_text())["head"]
    assert main(["audit", str(run_dir), "--expect-head", head]) == 0
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    rewrite("rounds.csv", 0, "valuation_seconds", "123.0")(copy)
    capsys.readouterr()
    assert main(["audit", str(copy)]) == 0  # the files alone cannot tell a timing was changed
    assert main(["audit", str(copy), "--expect-head", head]) == 1
    assert "published head" in capsys.readouterr().out
    assert main(["audit", str(copy), "--expect-head", "xyz"]) == 2
    assert "--expect-head: expected a chain head of 64" in capsys.readouterr().err


def _resumable(signed_run, tmp_path) -> Path:
    """A copy of the run made resumable again (its manifest removed: as if killed after its last round)."""
    copy = tmp_path / "run"
    shutil.copytree(signed_run[0], copy)
    (copy / "manifest.json").unlink()
    return copy


class _Payload:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


@pytest.mark.parametrize("sign", [False, True], ids=["no-key", "signed"])
def test_resume_never_runs_a_pickle_planted_in_the_checkpoint(signed_run, tmp_path, capsys, sign):
    """The server's state is data (no pickle is ever loaded): a payload in its place is refused
    by its seal, and, resealed, as not an archive fedvalue wrote (or, with a key, unsigned)."""
    copy = _resumable(signed_run, tmp_path)
    marker = tmp_path / "payload-ran"
    state_path = next((copy / "checkpoint").glob("*-state.npz"))
    state_path.write_bytes(pickle.dumps(_Payload(str(marker))))
    argv = ["--sign-key", str(signed_run[1])] if sign else []
    assert main(["run", "noisy-clients", "--resume", str(copy), "--quiet", *argv]) == 2
    assert "differs from the one round 3's seal committed to" in capsys.readouterr().err
    reseal_checkpoint(copy)
    assert main(["run", "noisy-clients", "--resume", str(copy), "--quiet", *argv]) == 2
    err = capsys.readouterr().err
    assert ("not signed by the given key" if sign else "not an archive written by fedvalue") in err
    assert "nothing was changed" in err and not marker.exists()


def reseal_checkpoint(run_dir: Path) -> None:
    """The forger's reseal of the last round's checkpoint digests (no key: signature dropped)."""
    import hashlib

    lines = (run_dir / SEALS_FILE).read_text().splitlines()
    seal = json.loads(lines[-1])
    seal["checkpoint"]["state"] = hashlib.sha256(
        next((run_dir / "checkpoint").glob("*-state.npz")).read_bytes()).hexdigest()
    for key in ("signature", "key", "algorithm"):
        seal.pop(key, None)
    lines[-1] = json.dumps(seal, sort_keys=True)
    (run_dir / SEALS_FILE).write_text("\n".join(lines) + "\n")


def test_resume_writes_nothing_through_links(signed_run, tmp_path, capsys):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("precious\n")
    copy = _resumable(signed_run, tmp_path)
    shutil.rmtree(copy / "checkpoint")
    (copy / "checkpoint").symlink_to(outside)
    assert main(["run", "noisy-clients", "--resume", str(copy), "--quiet"]) == 2
    assert "symbolic link" in capsys.readouterr().err
    assert (outside / "keep.txt").read_text() == "precious\n" and len(list(outside.iterdir())) == 1

    copy2 = tmp_path / "run2"
    shutil.copytree(signed_run[0], copy2)
    (copy2 / "manifest.json").unlink()
    target = tmp_path / "outside-ledger.csv"
    target.write_text("someone else's file\n" * 100)
    (copy2 / "ledger.csv").unlink()
    (copy2 / "ledger.csv").symlink_to(target)
    assert main(["run", "noisy-clients", "--resume", str(copy2), "--quiet"]) == 2
    assert "symbolic link" in capsys.readouterr().err
    assert target.read_text() == "someone else's file\n" * 100


def test_a_complete_run_is_not_resumed_and_a_bad_key_is_bad_input(signed_run, tmp_path, capsys):
    run_dir, private, public = signed_run
    assert main(["run", "noisy-clients", "--resume", str(run_dir), "--quiet"]) == 2
    assert "already completed 3 rounds" in capsys.readouterr().err
    assert main(["audit", str(run_dir), "--public-key", str(private)]) == 2  # a private key is not a public one
    assert "--public-key: expected an Ed25519 public key" in capsys.readouterr().err
    other_private, other_public = tmp_path / "o.pem", tmp_path / "o.pub"
    assert main(["keygen", str(other_private), str(other_public)]) == 0
    assert stat.S_IMODE(os.stat(other_private).st_mode) == 0o600
    assert main(["keygen", str(other_private), str(tmp_path / "x.pub")]) == 2  # never overwrites a key
    capsys.readouterr()
    assert main(["audit", str(run_dir), "--public-key", str(other_public)]) == 1  # signed by another key
    assert "not by the given public key" in capsys.readouterr().out
