"""Commitments a run makes to its reader: per-round seals, the final manifest, signatures.

The hash chain of ``rounds.csv`` (:mod:`fedvalue.ledger`) shows a file was changed
after the fact, but anyone can recompute a SHA-256 chain, and a chain says nothing about
how long it should be. Like Certificate Transparency logs, a run therefore also commits
to its size and, optionally, signs its head:

``seals.jsonl``
    One line per committed round k, appended after the round's checkpoint files are on
    disk and before ``checkpoint.json`` points at them: the round, its chain head (its
    ``rounds.csv`` hash), the SHA-256 of its round record and of its checkpoint files,
    and, with a signing key, an Ed25519 signature over those fields. ``--resume``
    checks the checkpoint it is about to unpickle against its seal, and the seal's head
    against the recomputed chain.
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
from pathlib import Path

from fedvalue import rundir

SEALS_FILE = "seals.jsonl"
MANIFEST_FILE = "manifest.json"
#: The signature algorithm named in seals and manifests.
ALGORITHM = "ed25519"


def canonical(fields: Mapping) -> bytes:
    """The bytes a signature covers: the fields as JSON, keys sorted, no spaces."""
    return json.dumps(dict(fields), sort_keys=True, separators=(",", ":")).encode("utf-8")


def sha256_of(run_dir: str | os.PathLike, relative: str) -> str:
    """SHA-256 of a regular file of the run directory."""
    return hashlib.sha256(rundir.read_bytes(run_dir, relative)).hexdigest()


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
    """Write a new Ed25519 key pair as PEM files (the private one readable by its owner
    only) and return the public key's fingerprint. Refuses to overwrite either file."""
    _, serialization, private_cls, _ = _crypto()
    private_path, public_path = Path(private_path), Path(public_path)
    for name, path in (("private key", private_path), ("public key", public_path)):
        if os.path.lexists(path):
            raise ValueError(f"{name}: expected a new file; {path} exists (a key is never overwritten).")
        if not path.parent.is_dir():
            raise ValueError(f"{name}: expected a file in an existing directory; {path.parent} is not one.")
    key = private_cls.generate()
    private_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
    descriptor = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(private_pem)
    public_path.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                          serialization.PublicFormat.SubjectPublicKeyInfo))
    return fingerprint(key.public_key())


def fingerprint(public_key) -> str:
    """SHA-256 of the raw 32-byte public key (names the key in seals and messages)."""
    _, serialization, _, _ = _crypto()
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()


def _read_key_file(path: str | os.PathLike, what: str) -> bytes:
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{what}: expected a PEM key file written by `fedvalue keygen`; {path} is not a file.")
    data = path.read_bytes()[:65536]
    return data


class Signer:
    """Signs with an Ed25519 private key (a PEM file from :func:`generate_keypair`)."""

    def __init__(self, private_key) -> None:
        self._key = private_key
        self.public_key = private_key.public_key()
        self.fingerprint = fingerprint(self.public_key)

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> Signer:
        _, serialization, private_cls, _ = _crypto()
        try:
            key = serialization.load_pem_private_key(_read_key_file(path, "sign_key"), password=None)
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
        try:
            key = serialization.load_pem_public_key(_read_key_file(path, "public_key"))
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


def seal_fields(server_round: int, head: str, record: str | None, checkpoint: Mapping[str, str] | None) -> dict:
    return {"round": int(server_round), "head": head, "record": record,
            "checkpoint": None if checkpoint is None else dict(checkpoint)}


def append_seal(run_dir: str | os.PathLike, fields: Mapping, signer: Signer | None = None) -> None:
    """Append one round's seal (signed with ``signer``) to ``seals.jsonl``, durably."""
    line = json.dumps(signer.sign(fields) if signer is not None else dict(fields), sort_keys=True) + "\n"
    path = rundir.check_file(run_dir, SEALS_FILE)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(line)
        handle.flush()
        os.fsync(handle.fileno())


def read_seals(run_dir: str | os.PathLike) -> list[dict]:
    """The seals of a run, in file order (ValueError when the file is not seals)."""
    if not rundir.exists(run_dir, SEALS_FILE):
        return []
    seals = []
    for number, line in enumerate(rundir.read_text(run_dir, SEALS_FILE).splitlines(), start=1):
        try:
            seal = json.loads(line)
        except ValueError:
            raise ValueError(f"{SEALS_FILE}: line {number} is not JSON.") from None
        if not isinstance(seal, dict) or isinstance(seal.get("round"), bool) or not isinstance(seal.get("round"), int):
            raise ValueError(f"{SEALS_FILE}: line {number} is not a seal (expected an object with an integer round).")
        seals.append(seal)
    return seals


def cut_seals(run_dir: str | os.PathLike, last_round: int) -> None:
    """Drop the seals of rounds after ``last_round`` (a resumed run rewinds to its checkpoint)."""
    seals = read_seals(run_dir)
    kept = [s for s in seals if s["round"] <= last_round]
    if len(kept) == len(seals):
        return
    path = rundir.check_file(run_dir, SEALS_FILE)
    tmp = rundir.check_file(run_dir, SEALS_FILE + ".tmp")
    tmp.write_text("".join(json.dumps(s, sort_keys=True) + "\n" for s in kept), encoding="utf-8")
    os.replace(tmp, path)


def manifest_files(run_dir: str | os.PathLike) -> list[str]:
    """Every file a manifest covers: the run directory's regular files and those of its
    records and checkpoint directories, except the manifest itself (relative, sorted)."""
    run_dir = rundir.resolve(run_dir)
    names = []
    for path in rundir.list_dir(run_dir, "."):
        relative = path.relative_to(run_dir).as_posix()
        if relative == MANIFEST_FILE or relative.endswith(".tmp"):
            continue
        if path.is_dir() and not path.is_symlink():
            names += [p.relative_to(run_dir).as_posix() for p in rundir.list_dir(run_dir, relative)]
        else:
            names.append(relative)
    return sorted(names)


def write_manifest(run_dir: str | os.PathLike, *, rounds: int, planned_rounds: int, head: str | None,
                   sealed: bool = True, signer: Signer | None = None) -> dict:
    """Write ``manifest.json`` for a run that completed ``rounds`` of ``planned_rounds``
    (``sealed``: every round has its seal in ``seals.jsonl``)."""
    files = {name: sha256_of(run_dir, name) for name in manifest_files(run_dir)}
    fields = {"complete": rounds == planned_rounds, "rounds": int(rounds), "planned_rounds": int(planned_rounds),
              "head": head, "sealed": bool(sealed), "files": files}
    manifest = signer.sign(fields) if signer is not None else fields
    path = rundir.check_file(run_dir, MANIFEST_FILE)
    tmp = rundir.check_file(run_dir, MANIFEST_FILE + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    with open(tmp, "rb+") as handle:
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    return manifest


def read_manifest(run_dir: str | os.PathLike) -> dict | None:
    """The run's manifest (None when it has none; ValueError when it is not one)."""
    if not rundir.exists(run_dir, MANIFEST_FILE):
        return None
    try:
        manifest = json.loads(rundir.read_text(run_dir, MANIFEST_FILE, max_bytes=rundir.MAX_JSON_BYTES))
    except ValueError as error:
        if isinstance(error, rundir.UnsafeRunFile):
            raise
        raise ValueError(f"{MANIFEST_FILE}: is not JSON ({error}).") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        raise ValueError(f"{MANIFEST_FILE}: expected an object with 'rounds', 'head' and 'files'; got something else.")
    return manifest
