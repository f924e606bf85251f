"""Signatures of seals and manifests (the cryptography library), with every key algorithm
``fedvalue keygen`` writes (ECDSA on P-256, P-384, P-521; Ed25519), and the manifest's digests."""

from __future__ import annotations

import hashlib
import json

import pytest

from fedvalue.run.seals import (
    KEY_ALGORITHMS,
    Signer,
    Verifier,
    generate_keypair,
    read_manifest,
    seal_fields,
    write_manifest,
)


@pytest.fixture(params=KEY_ALGORITHMS)
def keys(tmp_path, request):
    generate_keypair(tmp_path / "k.pem", tmp_path / "k.pub", algorithm=request.param)
    return Signer.from_file(tmp_path / "k.pem"), Verifier.from_file(tmp_path / "k.pub")


def test_a_signed_seal_verifies_and_any_changed_field_does_not(keys):
    signer, verifier = keys
    seal = signer.sign(seal_fields(3, "ab" * 32, "cd" * 32, {"npz": "00" * 32, "pkl": "11" * 32}))
    assert verifier.problem(seal) is None
    assert verifier.fingerprint == signer.fingerprint == seal["key"]
    for key, value in [("round", 4), ("head", "ef" * 32), ("record", None), ("checkpoint", None)]:
        assert "does not verify" in verifier.problem({**seal, key: value})
    assert "no signature" in verifier.problem({k: v for k, v in seal.items() if k != "signature"})


def test_another_key_is_named(tmp_path, keys):
    signer, _ = keys
    generate_keypair(tmp_path / "o.pem", tmp_path / "o.pub")
    other = Verifier.from_file(tmp_path / "o.pub")
    assert "not by the given public key" in other.problem(signer.sign({"round": 1}))


def test_the_manifest_lists_every_file_with_its_digest(tmp_path, keys):
    signer, verifier = keys
    run = tmp_path / "run"
    (run / "records").mkdir(parents=True)
    (run / "ledger.csv").write_text("a\n")
    (run / "records" / "round-000001.npz").write_bytes(b"npz")
    manifest = write_manifest(run, rounds=1, planned_rounds=1, head="ab" * 32, signer=signer)
    assert manifest["files"] == {"ledger.csv": hashlib.sha256(b"a\n").hexdigest(),
                                 "records/round-000001.npz": hashlib.sha256(b"npz").hexdigest()}
    assert read_manifest(run) == json.loads((run / "manifest.json").read_text())
    assert verifier.problem(read_manifest(run)) is None and manifest["complete"] is True


def test_bad_key_files_are_bad_input(tmp_path, keys):
    (tmp_path / "junk.pem").write_text("not a key")
    (tmp_path / "junk.pem").chmod(0o600)
    with pytest.raises(ValueError, match="sign_key: expected a PEM key file .* holds 0 PEM blocks"):
        Signer.from_file(tmp_path / "junk.pem")
    with pytest.raises(ValueError, match="public_key: expected an Ed25519 public key"):
        Verifier.from_file(tmp_path / "k.pem")
    with pytest.raises(ValueError, match="private key: expected a new file"):
        generate_keypair(tmp_path / "k.pem", tmp_path / "new.pub")


def test_signatures_are_deterministic_so_a_signed_run_is_reproducible(keys):
    signer, verifier = keys
    fields = seal_fields(1, "ab" * 32, None, None, {"ledger.csv": 10})
    assert signer.sign(fields) == signer.sign(fields)  # RFC 6979 ECDSA, like Ed25519: no random nonce
    assert verifier.problem({**signer.sign(fields), "algorithm": "ed448"}) is not None
