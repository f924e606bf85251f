"""Commitments a run makes to its reader: per-round seals, the final manifest, signatures.

The hash chain of ``rounds.csv`` (:mod:`fedvalue.run.ledger_tables`) shows a file was changed
after the fact, but anyone can recompute a SHA-256 chain, and a chain says nothing about
how long it should be. Like Certificate Transparency logs, a run therefore also commits
to its size and, optionally, signs its head:

``seals.jsonl``
    One line per committed round k, appended after the round's checkpoint files are on
    disk and before ``checkpoint.json`` points at them: the round, its chain head (its
    ``rounds.csv`` hash), the SHA-256 of its round record and of its checkpoint files,
    the size of every append-only table at the round's commit, and, with a signing key,
    an Ed25519 signature over those fields. ``--resume`` checks all of them (signature,
    the chain over the sealed sizes, the checkpoint's digests) before it cuts anything.
``manifest.json``
    Written once, when the run completes all its planned rounds: ``complete``,
    ``rounds``, ``planned_rounds``, the final ``head`` and the SHA-256 of every file of
    the run (tables, records, checkpoint, seals), signed like the seals. A run without
    one is incomplete (killed, or cut short by hand).

Signatures are Ed25519 (RFC 8032) from the ``cryptography`` library, over the canonical
JSON of the signed fields (sorted keys, no spaces). Without a key, seals and manifest
are only as good as the chain: whoever rewrites the directory can rewrite them too. With
the signer's public key (``fedvalue audit --public-key``) or a head published elsewhere
(``--expect-head``), no rewrite of the directory passes.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping

from fedvalue.run import rundir
from fedvalue.run.key_files import read_key_file
from fedvalue.run.rundir import RunDir, open_run_dir
from fedvalue.schema import FIGURES_DIR, LOCK_FILE, MANIFEST_FILE, PAYOUT_FILE, REPORT_FILE, SEALS_FILE

#: The signature algorithm named in seals and manifests.
ALGORITHM = "ed25519"
#: Largest seal line read.
MAX_SEAL_LINE = 1 << 16


def canonical(fields: Mapping) -> bytes:
    """The bytes a signature covers: the fields as JSON, keys sorted, no spaces."""
    return json.dumps(dict(fields), sort_keys=True, separators=(",", ":")).encode("utf-8")


def sha256_of(run_dir: str | os.PathLike | RunDir, relative: str) -> str:
    """SHA-256 of a regular file of the run directory, hashed as it streams."""
    return open_run_dir(run_dir).sha256(relative)


# --------------------------------------------------------------------------- keys


def _crypto():
    try:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
    except ImportError:  # pragma: no cover - a dependency of the package
        raise ValueError("signing needs the 'cryptography' package: pip install cryptography") from None
    return InvalidSignature, serialization, Ed25519PrivateKey, Ed25519PublicKey


def generate_keypair(private_path: str | os.PathLike, public_path: str | os.PathLike) -> str:
    """Write a new Ed25519 key pair as PEM files (the private one with mode 0600: readable
    by its owner only, as :func:`fedvalue.run.key_files.read_key_file` requires) and return
    the public key's fingerprint. Refuses to overwrite either file."""
    _, serialization, private_cls, _ = _crypto()
    private_path, public_path = rundir.resolve(private_path), rundir.resolve(public_path)
    if private_path == public_path:
        raise ValueError(f"public key: expected another file than the private key; both are {private_path}.")
    for name, path in (("private key", private_path), ("public key", public_path)):
        if os.path.lexists(path):
            raise ValueError(f"{name}: expected a new file; {path} exists (a key is never overwritten).")
        if not path.parent.is_dir():
            raise ValueError(f"{name}: expected a file in an existing directory; {path.parent} is not one.")
    key = private_cls.generate()
    private_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
    descriptor = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    os.fchmod(descriptor, 0o600)  # exactly: owner read and write, whatever the umask
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(private_pem)
    descriptor = os.open(public_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                   serialization.PublicFormat.SubjectPublicKeyInfo))
    return fingerprint(key.public_key())


def fingerprint(public_key) -> str:
    """SHA-256 of the raw 32-byte public key (names the key in seals and messages)."""
    _, serialization, _, _ = _crypto()
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()


class Signer:
    """Signs with an Ed25519 private key (a PEM file from :func:`generate_keypair`)."""

    def __init__(self, private_key) -> None:
        self._key = private_key
        self.public_key = private_key.public_key()
        self.fingerprint = fingerprint(self.public_key)

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> Signer:
        _, serialization, private_cls, _ = _crypto()
        data = read_key_file(path, "sign_key", private=True)  # its own message: mode, blocks, trailing data
        try:
            key = serialization.load_pem_private_key(data, password=None)
        except (ValueError, TypeError) as error:
            raise ValueError(f"sign_key: expected an unencrypted Ed25519 private key in PEM; {path} is not one "
                             f"({error}).") from None
        if not isinstance(key, private_cls):
            raise ValueError(f"sign_key: expected an Ed25519 private key; {path} holds a {type(key).__name__}.")
        return cls(key)

    def sign(self, fields: Mapping) -> dict:
        """``fields`` with the key's fingerprint, the algorithm and the signature added."""
        body = {**fields, "key": self.fingerprint, "algorithm": ALGORITHM}
        return {**body, "signature": self._key.sign(canonical(body)).hex()}

    def verifier(self) -> Verifier:
        return Verifier(self.public_key)


class Verifier:
    """Checks signatures of one Ed25519 public key."""

    def __init__(self, public_key) -> None:
        self.public_key = public_key
        self.fingerprint = fingerprint(public_key)

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> Verifier:
        _, serialization, _, public_cls = _crypto()
        data = read_key_file(path, "public_key", private=False)
        try:
            key = serialization.load_pem_public_key(data)
        except (ValueError, TypeError) as error:
            raise ValueError(f"public_key: expected an Ed25519 public key in PEM; {path} is not one ({error}).") \
                from None
        if not isinstance(key, public_cls):
            raise ValueError(f"public_key: expected an Ed25519 public key; {path} holds a {type(key).__name__}.")
        return cls(key)

    def problem(self, signed: Mapping) -> str | None:
        """None when ``signed`` carries a valid signature of this key over its other fields,
        else what is wrong."""
        invalid, _, _, _ = _crypto()
        signature = signed.get("signature")
        if not isinstance(signature, str) or not signature:
            return "it carries no signature"
        if signed.get("key") != self.fingerprint:
            return f"it is signed by key {str(signed.get('key'))[:16]}..., not by the given public key"
        try:
            self.public_key.verify(bytes.fromhex(signature),
                                   canonical({k: v for k, v in signed.items() if k != "signature"}))
        except (ValueError, invalid):
            return "its signature does not verify (its content was changed after signing)"
        return None


# --------------------------------------------------------------------------- seals and manifest


def seal_fields(server_round: int, head: str, record: str | None, checkpoint: Mapping[str, str] | None,
                sizes: Mapping[str, int] | None = None) -> dict:
    """A round's seal: its head, its record's digest, its checkpoint files' digests and the
    tables' sizes at its commit (what resuming cuts back to)."""
    fields = {"round": int(server_round), "head": head, "record": record,
              "checkpoint": None if checkpoint is None else dict(checkpoint)}
    if sizes is not None:
        fields["sizes"] = dict(sizes)
    return fields


def append_seal(run_dir: str | os.PathLike | RunDir, fields: Mapping, signer: Signer | None = None) -> None:
    """Append one round's seal (signed with ``signer``) to ``seals.jsonl``, durably."""
    line = json.dumps(signer.sign(fields) if signer is not None else dict(fields), sort_keys=True) + "\n"
    open_run_dir(run_dir).append(SEALS_FILE, line.encode("utf-8"))


def parse_seals(text: str, where: str = SEALS_FILE) -> list[dict]:
    """The seals of ``seals.jsonl``'s text, in file order (ValueError when a line is not a seal)."""
    seals = []
    for number, line in enumerate(text.splitlines(), start=1):
        if len(line) > MAX_SEAL_LINE:
            raise ValueError(f"{where}: line {number} is longer than a seal ({len(line)} characters).")
        seal = rundir.loads_json(line, f"{where}: line {number}")
        if not isinstance(seal, dict) or isinstance(seal.get("round"), bool) or not isinstance(seal.get("round"), int):
            raise ValueError(f"{where}: line {number} is not a seal (expected an object with an integer round).")
        seals.append(seal)
    return seals


def read_seals(run_dir: str | os.PathLike | RunDir) -> list[dict]:
    """The seals of a run, in file order (ValueError when the file is not seals)."""
    run = open_run_dir(run_dir)
    if not run.exists(SEALS_FILE):
        return []
    return parse_seals(run.read_text(SEALS_FILE), run.show(SEALS_FILE))


def cut_seals(run_dir: str | os.PathLike | RunDir, last_round: int) -> None:
    """Drop the seals of rounds after ``last_round`` (a resumed run rewinds to its checkpoint)."""
    run = open_run_dir(run_dir)
    seals = read_seals(run)
    kept = [s for s in seals if s["round"] <= last_round]
    if len(kept) != len(seals):
        run.write_text(SEALS_FILE, "".join(json.dumps(s, sort_keys=True) + "\n" for s in kept))


def is_report_output(name: str, kind: str) -> bool:
    """Whether ``name`` is what ``fedvalue report`` writes into a run directory after the run
    (report.html, payout.csv, figures/ and its PNGs): regular files and a real directory only."""
    if kind == "a directory":
        return name == FIGURES_DIR
    parts = name.split("/")
    figure = len(parts) == 2 and parts[0] == FIGURES_DIR and parts[1].endswith(".png")
    return kind == "a regular file" and (name in (REPORT_FILE, PAYOUT_FILE) or figure)


def is_outside_books(name: str, kind: str) -> bool:
    """Whether ``name`` is no part of the books: the report's outputs (:func:`is_report_output`)
    or the writer's lock file (:mod:`fedvalue.run.writer_lock`), a regular file."""
    return is_report_output(name, kind) or (name == LOCK_FILE and kind == "a regular file")


def manifest_files(run_dir: str | os.PathLike | RunDir) -> list[str]:
    """Every file a manifest covers: every regular file of the run directory at every level,
    except the manifest itself, temporary files, the report's outputs and the writer's lock
    file (relative, sorted)."""
    run = open_run_dir(run_dir)
    return sorted(name for name, kind in run.walk().items()
                  if kind == "a regular file" and name != MANIFEST_FILE and not name.endswith(".tmp")
                  and not is_outside_books(name, kind))


def write_manifest(run_dir: str | os.PathLike | RunDir, *, rounds: int, planned_rounds: int, head: str | None,
                   sealed: bool = True, signer: Signer | None = None) -> dict:
    """Write ``manifest.json`` for a run that completed ``rounds`` of ``planned_rounds``
    (``sealed``: every round has its seal in ``seals.jsonl``)."""
    run = open_run_dir(run_dir)
    files = {name: sha256_of(run, name) for name in manifest_files(run)}
    fields = {"complete": rounds == planned_rounds, "rounds": int(rounds), "planned_rounds": int(planned_rounds),
              "head": head, "sealed": bool(sealed), "files": files}
    manifest = signer.sign(fields) if signer is not None else fields
    run.write_text(MANIFEST_FILE, json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


def parse_manifest(text: str, where: str = MANIFEST_FILE) -> dict:
    """The manifest in ``text`` (ValueError when it is not one)."""
    manifest = rundir.loads_json(text, where)
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        raise ValueError(f"{where}: expected an object with 'rounds', 'head' and 'files'; got something else.")
    return manifest


def read_manifest(run_dir: str | os.PathLike | RunDir) -> dict | None:
    """The run's manifest (None when it has none; ValueError when it is not one)."""
    run = open_run_dir(run_dir)
    if not run.exists(MANIFEST_FILE):
        return None
    return parse_manifest(run.read_text(MANIFEST_FILE, max_bytes=rundir.MAX_JSON_BYTES), run.show(MANIFEST_FILE))
