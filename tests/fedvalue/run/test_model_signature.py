"""model.sig: a signed run verifies with model-signing's own verifier (its Python API and its
command line), and neither it nor ``fedvalue audit --public-key`` accepts a changed file,
another key, a removed signature or an old signature beside new rounds.

The real run is the session's small signed ``noisy-clients`` run (``signed_run``,
tests/fedvalue/conftest.py, signed with ``fedvalue keygen``'s default P-256 key); tests
change copies of it. The resume case writes its books through :class:`RunBooks` directly.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import model_signing
import pytest

from fedvalue.run.model_signature import (
    IGNORED_PATHS,
    sign_closed_run,
    sign_run,
    verify_run,
)
from fedvalue.run.seals import (
    Signer,
    Verifier,
    generate_keypair,
    read_seals,
    write_manifest,
)
from fedvalue.run.writer import RunBooks
from fedvalue.schema import MODEL_SIGNATURE_FILE
from simulations.cli.main import main
from tests.fedvalue.run.test_writer import CONFIG, commit


def model_signing_verify(run_dir: Path, public: Path) -> None:
    """model-signing's Python API alone, as an outside auditor calls it (its hashing
    configuration guessed from the signed statement)."""
    model_signing.verifying.Config().use_elliptic_key_verifier(public_key=public).verify(
        run_dir, run_dir / MODEL_SIGNATURE_FILE)


def model_signing_cli(run_dir: Path, public: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "model_signing", "verify", "key", str(run_dir), "--signature",
                           str(run_dir / MODEL_SIGNATURE_FILE), "--public_key", str(public)],
                          capture_output=True, text=True, timeout=120, check=False)


def audit(run_dir: Path, public: Path, capsys, *extra: str) -> tuple[int, str]:
    code = main(["audit", str(run_dir), "--no-recompute", "--public-key", str(public), *extra])
    return code, capsys.readouterr().out


@pytest.fixture
def copy(signed_run, tmp_path) -> Path:
    shutil.copytree(signed_run[0], tmp_path / "run")
    return tmp_path / "run"


@pytest.fixture(scope="module")
def other_key(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("other")
    generate_keypair(base / "other.pem", base / "other.pub")
    return base / "other.pub"


def test_a_signed_run_verifies_with_model_signings_python_api(signed_run):
    run_dir, _, public = signed_run
    model_signing_verify(run_dir, public)
    bundle = json.loads((run_dir / MODEL_SIGNATURE_FILE).read_bytes())
    statement = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
    signed = {r["name"]: r["digest"] for r in statement["predicate"]["resources"]}
    manifest = json.loads((run_dir / "manifest.json").read_text())
    # Every file the manifest lists, with the same SHA-256, and the manifest itself.
    assert {name: signed[name] for name in manifest["files"]} == manifest["files"]
    assert set(signed) == {*manifest["files"], "manifest.json"}
    assert "seals.jsonl" in signed and MODEL_SIGNATURE_FILE not in signed
    assert set(statement["predicate"]["serialization"]["ignore_paths"]) == {
        *IGNORED_PATHS, ".git", ".gitattributes", ".github", ".gitignore"}  # git's: model-signing's default
    # model.sig names the key by the fingerprint seals and manifest name it by.
    assert bundle["verificationMaterial"]["publicKey"]["hint"] == manifest["key"] == Verifier.from_file(public).fingerprint


def test_a_signed_run_verifies_with_model_signings_command_line(signed_run, copy, other_key):
    _, _, public = signed_run
    done = model_signing_cli(copy, public)
    assert done.returncode == 0 and "Verification succeeded" in done.stdout, done.stdout + done.stderr
    (copy / "report.html").write_text("<html></html>")  # what fedvalue report adds later is left out
    (copy / "figures").mkdir()
    (copy / "figures" / "values.png").write_bytes(b"png")
    (copy / "payout.csv").write_text("client,payment\n0,1.0\n")
    assert model_signing_cli(copy, public).returncode == 0
    assert model_signing_cli(copy, other_key).returncode == 1
    with open(copy / "ledger.csv", "a") as handle:
        handle.write("9,0,ads,1.0,,5,ok,False,\n")
    done = model_signing_cli(copy, public)
    assert done.returncode == 1 and "ledger.csv" in done.stderr


def test_fedvalue_audit_says_intact_and_checks_model_sig(signed_run, capsys):
    run_dir, _, public = signed_run
    code, out = audit(run_dir, public, capsys)
    assert code == 0 and out.rstrip().endswith(": intact")
    assert "ok: model.sig verifies with model-signing's own verifier and the given key" in out
    code = main(["audit", str(run_dir), "--no-recompute"])
    assert code == 0 and "note: model.sig: not checked without the signer's public key" in capsys.readouterr().out


@pytest.mark.parametrize("change", ["ledger", "record", "added", "seals-line-removed"])
def test_a_changed_file_fails_model_signing_and_the_audit(signed_run, copy, capsys, change):
    _, _, public = signed_run
    if change == "ledger":
        data = (copy / "ledger.csv").read_bytes()
        (copy / "ledger.csv").write_bytes(data[:-2] + bytes([data[-2] ^ 1]) + data[-1:])
    elif change == "record":
        record = min((copy / "records").iterdir())
        record.write_bytes(record.read_bytes() + b"\0")
    elif change == "added":
        (copy / "records" / "round-000009.npz").write_bytes(b"planted")
    else:
        lines = (copy / "seals.jsonl").read_text().splitlines(keepends=True)
        (copy / "seals.jsonl").write_text("".join(lines[:-1]))
    with pytest.raises(ValueError):
        model_signing_verify(copy, public)
    assert verify_run(copy, Verifier.from_file(public)) is not None
    code, out = audit(copy, public, capsys)
    assert code == 1 and out.rstrip().endswith("NOT intact") and "Traceback" not in out


def test_only_a_changed_file_fails_model_sig_when_the_rest_is_resigned(signed_run, copy, capsys):
    """A file changed and manifest re-signed with the run's own key leaves only model.sig to
    catch it: the audit names model-signing's finding and the changed file."""
    _, private, public = signed_run

    (copy / "run.json").write_bytes((copy / "run.json").read_bytes() + b" ")  # the same settings, other bytes
    manifest = json.loads((copy / "manifest.json").read_text())
    write_manifest(copy, rounds=manifest["rounds"], planned_rounds=manifest["planned_rounds"], head=manifest["head"],
                   signer=Signer.from_file(private))
    problem = verify_run(copy, Verifier.from_file(public))
    assert problem is not None and "model-signing's verifier refuses it" in problem
    code, out = audit(copy, public, capsys)
    assert code == 1 and "FAILED: model.sig: model-signing's verifier refuses it" in out


def test_another_key_fails(signed_run, other_key, capsys):
    run_dir, _, _ = signed_run
    with pytest.raises(ValueError, match="Key mismatch"):
        model_signing_verify(run_dir, other_key)
    problem = verify_run(run_dir, Verifier.from_file(other_key))
    assert "Key mismatch" in problem
    code, out = audit(run_dir, other_key, capsys)
    assert code == 1 and "not by the given public key" in out


def test_a_removed_or_garbled_model_sig_fails_with_a_finding(signed_run, copy, capsys):
    _, _, public = signed_run
    (copy / MODEL_SIGNATURE_FILE).unlink()
    code, out = audit(copy, public, capsys)
    assert code == 1 and "FAILED: model.sig: missing; a run signed with an EC key writes it at its close" in out
    for garbage in (b"not json\x1b[2J", b"{}", json.dumps({"mediaType": 1}).encode()):
        (copy / MODEL_SIGNATURE_FILE).write_bytes(garbage)
        code, out = audit(copy, public, capsys)
        assert code == 1 and "FAILED: model.sig: model-signing's verifier refuses it" in out
        assert "\x1b" not in out and "Traceback" not in out


def test_a_linked_model_sig_is_not_handed_to_model_signing(signed_run, copy, capsys):
    _, _, public = signed_run
    target = copy.parent / "elsewhere.sig"
    (copy / MODEL_SIGNATURE_FILE).rename(target)
    (copy / MODEL_SIGNATURE_FILE).symlink_to(target)
    code, out = audit(copy, public, capsys)
    assert code == 1 and "model.sig: a symbolic link" in out
    assert "model.sig: not checked; it is a symbolic link, not a regular file" in out


@pytest.mark.timeout(60)
def test_a_fifo_in_the_run_is_never_handed_to_model_signing(signed_run, copy, capsys):
    """model-signing opens every file it finds and would block on a FIFO: the audit stops first."""
    _, _, public = signed_run
    record = min((copy / "records").iterdir())
    record.unlink()
    os.mkfifo(record)
    code, out = audit(copy, public, capsys)
    assert code == 1 and "model.sig: not checked; model-signing reads the directory itself" in out
    assert f"records/{record.name}" in out


def test_a_resumed_run_drops_the_old_signature_and_signs_at_its_own_close(tmp_path):
    generate_keypair(tmp_path / "k.pem", tmp_path / "k.pub")
    signer, public = Signer.from_file(tmp_path / "k.pem"), tmp_path / "k.pub"
    run_dir = tmp_path / "run"
    books = RunBooks(run_dir, config=CONFIG, signer=signer)
    commit(books, 1)
    commit(books, 2)
    books.release()  # killed before round 3
    sign_run(run_dir, signer)  # a signature of the two-round directory, planted beside it
    old = (run_dir / MODEL_SIGNATURE_FILE).read_bytes()
    model_signing_verify(run_dir, public)
    books = RunBooks(run_dir, config=CONFIG, resume=True, signer=signer)
    assert not (run_dir / MODEL_SIGNATURE_FILE).exists()
    commit(books, 3)
    books.close(3)
    model_signing_verify(run_dir, public)  # the new close's signature covers the three rounds
    assert len(read_seals(run_dir)) == 3
    (run_dir / MODEL_SIGNATURE_FILE).write_bytes(old)
    with pytest.raises(ValueError, match="Signature mismatch"):
        model_signing_verify(run_dir, public)


def test_a_run_stopped_between_manifest_and_model_sig_is_signed_only_unchanged(signed_run, copy, capsys):
    _, private, public = signed_run
    signer = Signer.from_file(private)
    (copy / MODEL_SIGNATURE_FILE).unlink()  # as a writer stopped at its close leaves it
    assert main(["run", "noisy-clients", "--resume", str(copy), "--quiet", "--sign-key", str(private)]) == 2
    assert "model.sig is missing (stopped at its close): fedvalue.run.model_signature.sign_closed_run" in \
        capsys.readouterr().err
    data = (copy / "ledger.csv").read_bytes()
    (copy / "ledger.csv").write_bytes(data + b"\n")
    with pytest.raises(ValueError, match=r"run_dir: ledger.csv is not as the signed manifest lists it"):
        sign_closed_run(copy, signer)
    (copy / "ledger.csv").write_bytes(data)
    with pytest.raises(ValueError, match="sign_key: the run's manifest.json does not carry this key's signature"):
        other = copy.parent / "o.pem"
        generate_keypair(other, copy.parent / "o.pub")
        sign_closed_run(copy, Signer.from_file(other))
    assert not (copy / MODEL_SIGNATURE_FILE).exists()
    sign_closed_run(copy, signer)
    model_signing_verify(copy, public)
    code, out = audit(copy, public, capsys)
    assert code == 0 and out.rstrip().endswith(": intact")
    with pytest.raises(ValueError, match="run_dir: expected a closed run without model.sig"):
        sign_closed_run(copy, signer)


def test_an_ed25519_key_signs_seals_and_manifest_but_writes_no_model_sig(tmp_path, capsys):
    generate_keypair(tmp_path / "k.pem", tmp_path / "k.pub", algorithm="ed25519")
    signer = Signer.from_file(tmp_path / "k.pem")
    books = RunBooks(tmp_path / "run", config=CONFIG, signer=signer)
    commit(books, 1)
    books.close(1)
    assert not (tmp_path / "run" / MODEL_SIGNATURE_FILE).exists()
    assert signer.algorithm == "ed25519" and not signer.signs_model
    assert "EC keys only" in verify_run(tmp_path / "run", Verifier.from_file(tmp_path / "k.pub"))
    with pytest.raises(ValueError, match="sign_key: expected an EC key"):
        sign_run(tmp_path / "run", signer)


def test_the_same_key_and_books_give_the_same_seals_and_manifest(tmp_path):
    generate_keypair(tmp_path / "k.pem", tmp_path / "k.pub")
    signer = Signer.from_file(tmp_path / "k.pem")
    for name in ("a", "b"):
        books = RunBooks(tmp_path / name, config=CONFIG, signer=signer)
        commit(books, 1)
        books.close(1)
    for name in ("seals.jsonl", "manifest.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_keygen_and_audit_refuse_bad_values_naming_the_parameter(tmp_path, capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["keygen", str(tmp_path / "k.pem"), str(tmp_path / "k.pub"), "--algorithm", "rsa"])
    assert stopped.value.code == 2
    assert "algorithm: expected one of p256, p384, p521, ed25519; got 'rsa'" in capsys.readouterr().err
    assert not (tmp_path / "k.pem").exists()
    assert main(["keygen", str(tmp_path / "k.pem"), str(tmp_path / "k.pub"), "--algorithm", "p384"]) == 0
    assert "a p384 key" in capsys.readouterr().out
    assert Signer.from_file(tmp_path / "k.pem").algorithm == "ecdsa-p384-sha384"
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    k1 = ec.generate_private_key(ec.SECP256K1()).public_key()  # a curve model-signing does not take
    (tmp_path / "k1.pub").write_bytes(k1.public_bytes(serialization.Encoding.PEM,
                                                      serialization.PublicFormat.SubjectPublicKeyInfo))
    (tmp_path / "run").mkdir()
    assert main(["audit", str(tmp_path / "run"), "--public-key", str(tmp_path / "k1.pub")]) == 2
    err = capsys.readouterr().err
    assert "--public-key: expected an Ed25519 public key or an EC one (P-256, P-384, P-521)" in err
    assert "on curve secp256k1" in err
