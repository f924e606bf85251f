"""Key files read as ssh reads them: a private key others can read, a PEM holding two keys,
or data after the PEM block are refused with the file named; `fedvalue keygen` writes the
private key with mode 0600 whatever the umask. Real key files, real commands."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from fedvalue.run.seals import Signer, Verifier, generate_keypair
from simulations.cli.main import main


@pytest.fixture
def pair(tmp_path) -> tuple[Path, Path]:
    generate_keypair(tmp_path / "k.pem", tmp_path / "k.pub")
    return tmp_path / "k.pem", tmp_path / "k.pub"


def _refused(capsys, argv: list[str], *expected: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedvalue: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    for text in expected:
        assert text in err, err


@pytest.mark.parametrize("umask", [0o000, 0o022, 0o077])
def test_keygen_writes_the_private_key_with_mode_0600(tmp_path, capsys, umask):
    previous = os.umask(umask)
    try:
        assert main(["keygen", str(tmp_path / "k.pem"), str(tmp_path / "k.pub")]) == 0
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "k.pem").stat().st_mode) == 0o600
    signer, verifier = Signer.from_file(tmp_path / "k.pem"), Verifier.from_file(tmp_path / "k.pub")
    assert signer.verifier().fingerprint == verifier.fingerprint


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620, 0o660])
def test_a_private_key_others_can_read_or_write_is_refused_before_anything_is_written(pair, tmp_path, capsys, mode):
    private, _ = pair
    private.chmod(mode)
    out = tmp_path / "run"
    _refused(capsys, ["run", "noisy-clients", "--out", str(out), "--sign-key", str(private), "--quiet"],
             f"--sign-key: {private} is a private key readable or writable by others (mode {mode:04o})",
             f"chmod 600 {private}")
    assert not out.exists()
    with pytest.raises(ValueError, match=f"mode {mode:04o}"):
        Signer.from_file(private)
    private.chmod(0o400)  # owner-only, read-only: accepted
    assert Signer.from_file(private).fingerprint


def test_a_pem_holding_two_keys_is_refused(pair, tmp_path, capsys):
    private, public = pair
    generate_keypair(tmp_path / "other.pem", tmp_path / "other.pub")
    both = tmp_path / "both.pem"
    both.write_bytes(private.read_bytes() + (tmp_path / "other.pem").read_bytes())
    both.chmod(0o600)
    _refused(capsys, ["run", "noisy-clients", "--out", str(tmp_path / "run"), "--sign-key", str(both)],
             f"{both} holds 2 PEM blocks (one key expected)")
    both_public = tmp_path / "both.pub"
    both_public.write_bytes(public.read_bytes() + (tmp_path / "other.pub").read_bytes())
    with pytest.raises(ValueError, match="public_key: .* holds 2 PEM blocks"):
        Verifier.from_file(both_public)


@pytest.mark.parametrize("extra", [b"garbage\n", b"\x00\x01", b"-----END PRIVATE KEY-----\n", b"#\n"])
def test_trailing_data_after_the_pem_block_is_refused(pair, tmp_path, capsys, extra):
    private, public = pair
    tainted = tmp_path / "tainted.pem"
    tainted.write_bytes(private.read_bytes() + extra)
    tainted.chmod(0o600)
    with pytest.raises(ValueError, match="sign_key: expected a PEM key file .* trailing data after its PEM block"):
        Signer.from_file(tainted)
    tainted_public = tmp_path / "tainted.pub"
    tainted_public.write_bytes(public.read_bytes() + extra)
    _refused(capsys, ["audit", str(tmp_path), "--public-key", str(tainted_public)],
             "--public-key: expected a PEM key file", "trailing data after its PEM block")


def test_whitespace_around_the_block_is_not_data_but_text_before_it_is(pair, tmp_path):
    private, _ = pair
    spaced = tmp_path / "spaced.pem"
    spaced.write_bytes(b"\n" + private.read_bytes() + b"\n\n")
    spaced.chmod(0o600)
    assert Signer.from_file(spaced).fingerprint == Signer.from_file(private).fingerprint
    prefixed = tmp_path / "prefixed.pem"
    prefixed.write_bytes(b"my key\n" + private.read_bytes())
    prefixed.chmod(0o600)
    with pytest.raises(ValueError, match="bytes before its PEM block"):
        Signer.from_file(prefixed)
