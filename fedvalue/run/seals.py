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

``model.sig``
    Written last, with an EC key only (:mod:`fedvalue.run.model_signature`): the same
    key's signature over every file of the closed run, manifest and seals included, in the
    OpenSSF Model Signing format that ``model_signing verify key`` checks.

One key signs all three. Seals and manifest are signed over the canonical JSON of the
signed fields (sorted keys, no spaces) with the key ``fedvalue keygen`` writes: ECDSA on
P-256 by default (P-384 or P-521 on request), deterministic (RFC 6979, so the same key gives
the same seal bytes, as the same seed gives the same ledger), or Ed25519 (RFC 8032), which
signs seals and manifest but no ``model.sig``, since model-signing 1.1.1 takes EC keys only.
The two messages one key signs cannot be taken for each other: a seal or manifest is JSON
that starts with ``{``, a model-signing signature covers DSSE's pre-authentication encoding,
which starts with ``DSSEv1``. Without a key, seals and manifest are only as good as the
chain: whoever rewrites the directory can rewrite them too. With the signer's public key
(``fedvalue audit --public-key``) or a head published elsewhere (``--expect-head``), no
rewrite of the directory passes.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping

from fedvalue.run import rundir
from fedvalue.run.key_files import read_key_file
from fedvalue.run.rundir import RunDir, open_run_dir
from fedvalue.schema import (
    FIGURES_DIR,
    LOCK_FILE,
    MANIFEST_FILE,
    MODEL_SIGNATURE_FILE,
    PAYOUT_FILE,
    REPORT_FILE,
    SEALS_FILE,
)

#: How seals and manifests name Ed25519 (an EC key's name is :func:`algorithm_of`'s).
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

#: ``fedvalue keygen --algorithm`` choices: the curve (ECDSA with the curve's own hash, the
#: keys model-signing 1.1.1 takes) or Ed25519.
KEY_ALGORITHMS = ("p256", "p384", "p521", "ed25519")
#: The key algorithm ``fedvalue keygen`` writes unless told: a run signed with it is also
#: verifiable by the ``model-signing`` tool (:mod:`fedvalue.run.model_signature`).
DEFAULT_KEY_ALGORITHM = "p256"
_CURVES = {"p256": ("secp256r1", "SHA256"), "p384": ("secp384r1", "SHA384"), "p521": ("secp521r1", "SHA512")}
_KEY_WORDS = "an Ed25519 or EC (P-256, P-384, P-521)"


def _crypto():
    try:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
    except ImportError:  # pragma: no cover - a dependency of the package
        raise ValueError("signing needs the 'cryptography' package: pip install cryptography") from None
    return InvalidSignature, serialization, Ed25519PrivateKey, Ed25519PublicKey


def _curve_name(public_key) -> str | None:
    """"p256", "p384" or "p521" for an EC public key on one of those curves, else None."""
    from cryptography.hazmat.primitives.asymmetric import ec

    if not isinstance(public_key, ec.EllipticCurvePublicKey):
        return None
    return next((name for name, (curve, _) in _CURVES.items() if public_key.curve.name == curve), None)


def algorithm_of(public_key) -> str | None:
    """The algorithm seals and manifests name for ``public_key``: ``"ed25519"``,
    ``"ecdsa-p256-sha256"``, ``"ecdsa-p384-sha384"`` or ``"ecdsa-p521-sha512"``; None for any
    other key (another curve, RSA, ...)."""
    _, _, _, ed25519_cls = _crypto()
    if isinstance(public_key, ed25519_cls):
        return ALGORITHM
    curve = _curve_name(public_key)
    return None if curve is None else f"ecdsa-{curve}-{_CURVES[curve][1].lower()}"


def _ecdsa(public_key):
    """Deterministic ECDSA (RFC 6979) with the curve's hash: the same key and fields give the
    same signature, so a signed run's seals are as reproducible as its ledger."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.ECDSA(getattr(hashes, _CURVES[_curve_name(public_key)][1])(), deterministic_signing=True)


def generate_keypair(private_path: str | os.PathLike, public_path: str | os.PathLike, *,
                     algorithm: str = DEFAULT_KEY_ALGORITHM) -> str:
    """Write a new key pair as PEM files (the private one with mode 0600: readable by its
    owner only, as :func:`fedvalue.run.key_files.read_key_file` requires) and return the public
    key's fingerprint. Refuses to overwrite either file.

    ``algorithm`` is one of :data:`KEY_ALGORITHMS`: an EC key (``"p256"``, the default) signs
    the seals, the manifest and the run's ``model.sig`` that the ``model-signing`` tool
    verifies; an Ed25519 key signs the seals and the manifest only (model-signing 1.1.1 takes
    no Ed25519 key)."""
    if algorithm not in KEY_ALGORITHMS:
        raise ValueError(f"algorithm: expected one of {', '.join(KEY_ALGORITHMS)}; got {algorithm!r}.")
    _, serialization, private_cls, _ = _crypto()
    private_path, public_path = rundir.resolve(private_path), rundir.resolve(public_path)
    if private_path == public_path:
        raise ValueError(f"public key: expected another file than the private key; both are {private_path}.")
    for name, path in (("private key", private_path), ("public key", public_path)):
        if os.path.lexists(path):
            raise ValueError(f"{name}: expected a new file; {path} exists (a key is never overwritten).")
        if not path.parent.is_dir():
            raise ValueError(f"{name}: expected a file in an existing directory; {path.parent} is not one.")
    if algorithm == ALGORITHM:
        key = private_cls.generate()
    else:
        from cryptography.hazmat.primitives.asymmetric import ec

        key = ec.generate_private_key({"p256": ec.SECP256R1, "p384": ec.SECP384R1, "p521": ec.SECP521R1}[algorithm]())
    private_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
    descriptor = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    os.fchmod(descriptor, 0o600)  # exactly: owner read and write, whatever the umask
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(private_pem)
    descriptor = os.open(public_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(public_pem(key.public_key()))
    return fingerprint(key.public_key())


def public_pem(public_key) -> bytes:
    """The public key as PEM SubjectPublicKeyInfo (what ``fedvalue keygen`` writes)."""
    _, serialization, _, _ = _crypto()
    return public_key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def fingerprint(public_key) -> str:
    """The SHA-256 that names the key in seals and messages: of the raw 32-byte key for
    Ed25519; for an EC key, of its PEM SubjectPublicKeyInfo, which is the key ``hint`` that
    model-signing writes into ``model.sig`` (one name for the key in both)."""
    _, serialization, _, ed25519_cls = _crypto()
    if isinstance(public_key, ed25519_cls):
        raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        return hashlib.sha256(raw).hexdigest()
    return hashlib.sha256(public_pem(public_key)).hexdigest()


class Signer:
    """Signs with a private key from :func:`generate_keypair`: Ed25519, or ECDSA on P-256,
    P-384 or P-521 (which also signs the run's ``model.sig``, :attr:`signs_model`)."""

    def __init__(self, private_key) -> None:
        self._key = private_key
        self.public_key = private_key.public_key()
        self.algorithm = algorithm_of(self.public_key)
        if self.algorithm is None:
            raise ValueError(f"sign_key: expected {_KEY_WORDS} private key; got a {type(private_key).__name__}"
                             + (f" on curve {self.public_key.curve.name}" if hasattr(self.public_key, "curve") else "")
                             + ". Write one with: fedvalue keygen PRIVATE PUBLIC")
        self.fingerprint = fingerprint(self.public_key)

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> Signer:
        _, serialization, _, _ = _crypto()
        data = read_key_file(path, "sign_key", private=True)  # its own message: mode, blocks, trailing data
        try:
            key = serialization.load_pem_private_key(data, password=None)
        except (ValueError, TypeError) as error:
            raise ValueError(f"sign_key: expected an unencrypted Ed25519 or EC (P-256, P-384, P-521) private key in "
                             f"PEM; {path} is not one ({error}).") from None
        if algorithm_of(key.public_key()) is None:
            raise ValueError(f"sign_key: expected {_KEY_WORDS} private key; {path} holds a {type(key).__name__}.")
        return cls(key)

    @property
    def signs_model(self) -> bool:
        """Whether this key also signs the run's ``model.sig`` (an EC key: model-signing 1.1.1
        takes P-256, P-384 and P-521 keys, not Ed25519)."""
        return self.algorithm != ALGORITHM

    def sign_bytes(self, data: bytes) -> bytes:
        if self.signs_model:
            return self._key.sign(data, _ecdsa(self.public_key))
        return self._key.sign(data)

    def sign(self, fields: Mapping) -> dict:
        """``fields`` with the key's fingerprint, the algorithm and the signature added."""
        body = {**fields, "key": self.fingerprint, "algorithm": self.algorithm}
        return {**body, "signature": self.sign_bytes(canonical(body)).hex()}

    def verifier(self) -> Verifier:
        return Verifier(self.public_key)


class Verifier:
    """Checks signatures of one public key (Ed25519, or EC on P-256, P-384 or P-521)."""

    def __init__(self, public_key) -> None:
        self.public_key = public_key
        self.algorithm = algorithm_of(public_key)
        if self.algorithm is None:
            raise ValueError(f"public_key: expected {_KEY_WORDS} public key; got a {type(public_key).__name__}.")
        self.fingerprint = fingerprint(public_key)

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> Verifier:
        _, serialization, _, _ = _crypto()
        data = read_key_file(path, "public_key", private=False)
        try:
            key = serialization.load_pem_public_key(data)
        except (ValueError, TypeError) as error:
            raise ValueError(f"public_key: expected an Ed25519 public key or an EC one (P-256, P-384, P-521) in PEM; "
                             f"{path} is not one ({error}).") from None
        if algorithm_of(key) is None:
            raise ValueError(f"public_key: expected an Ed25519 public key or an EC one (P-256, P-384, P-521); {path} "
                             f"holds a {type(key).__name__}"
                             + (f" on curve {key.curve.name}" if hasattr(key, "curve") else "") + ".")
        return cls(key)

    @property
    def checks_model(self) -> bool:
        """Whether this key also checks the run's ``model.sig`` (an EC key)."""
        return self.algorithm != ALGORITHM

    @property
    def pem(self) -> bytes:
        """The public key as PEM (what model-signing's verifier reads)."""
        return public_pem(self.public_key)

    def problem(self, signed: Mapping) -> str | None:
        """None when ``signed`` carries a valid signature of this key over its other fields,
        else what is wrong."""
        invalid, _, _, _ = _crypto()
        signature = signed.get("signature")
        if not isinstance(signature, str) or not signature:
            return "it carries no signature"
        if signed.get("key") != self.fingerprint:
            return f"it is signed by key {str(signed.get('key'))[:16]}..., not by the given public key"
        if signed.get("algorithm") != self.algorithm:
            return (f"it names the algorithm {str(signed.get('algorithm'))[:40]!r}, not the given key's "
                    f"{self.algorithm!r}")
        message = canonical({k: v for k, v in signed.items() if k != "signature"})
        try:
            if self.checks_model:
                self.public_key.verify(bytes.fromhex(signature), message, _ecdsa(self.public_key))
            else:
                self.public_key.verify(bytes.fromhex(signature), message)
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
    except the manifest itself, the model signature written after it (which covers the
    manifest), temporary files, the report's outputs and the writer's lock file (relative,
    sorted)."""
    run = open_run_dir(run_dir)
    return sorted(name for name, kind in run.walk().items()
                  if kind == "a regular file" and name not in (MANIFEST_FILE, MODEL_SIGNATURE_FILE)
                  and not name.endswith(".tmp")
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
