"""The closed run's signature in the OpenSSF Model Signing format (``model.sig``).

Seals and the manifest (:mod:`fedvalue.run.seals`) are fedvalue's own format: only fedvalue
checks them. When the run's key is an EC key (P-256, P-384 or P-521: what ``model-signing``
1.1.1 takes), the run's close also writes ``model.sig`` with the same key, through
model-signing's own signer: a Sigstore bundle whose DSSE envelope holds an in-toto Statement
v1 listing the SHA-256 of every file. Anyone can then check the run without fedvalue::

    model_signing verify key RUN_DIR --signature RUN_DIR/model.sig --public_key KEY.pub

**What it covers**: every regular file of the run directory at its close, at every level:
run.json, the tables, the Parquet copy, seals.jsonl, manifest.json, the round records and
the checkpoint. It is written after the manifest, so the manifest is inside it. It leaves
out what is no part of the books, and says so inside the signed statement (model-signing's
``ignore_paths``, which its verifier applies): ``model.sig`` itself, the writer's lock
file, and what ``fedvalue report`` writes later (``report.html``, ``figures/``,
``payout.csv``); and, as
model-signing always does unless told, git's files (``.git/``, ``.gitignore``, ...), which
``fedvalue audit`` refuses in a run directory anyway. Any other file added, removed or
changed after the close fails its verification.

**Resume**: a run is resumed only before its close (a run holding its manifest is refused),
and the resume removes any ``model.sig`` it finds; the resumed run signs at its own close.
An old signature never covers a changed run: the statement lists every file's digest. A
writer stopped between the manifest and ``model.sig`` leaves a complete run without one:
:func:`sign_closed_run` writes it once the manifest's signature and every digest verify.

``model.sig`` is the one file of a signed run that is not the same byte for byte from the
same seed: model-signing's ECDSA draws a random nonce. Seals and manifest are signed with
deterministic ECDSA (RFC 6979) and are.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from fedvalue.run.rundir import RunDir, open_run_dir, printable
from fedvalue.schema import FIGURES_DIR, LOCK_FILE, MODEL_SIGNATURE_FILE, PAYOUT_FILE, REPORT_FILE

#: What the signature leaves out (recorded in the signed statement); see the module docstring.
IGNORED_PATHS = (MODEL_SIGNATURE_FILE, LOCK_FILE, REPORT_FILE, PAYOUT_FILE, FIGURES_DIR)
#: Largest ``model.sig`` the audit hands to model-signing (about 200 bytes per file listed).
MAX_SIGNATURE_BYTES = 64 * 1024**2
#: The model-signing release whose format and verifier this module was written against.
MODEL_SIGNING_VERSION = "1.1.1"


def _model_signing(what: str = MODEL_SIGNATURE_FILE):
    try:
        import model_signing
        import model_signing.hashing
        import model_signing.signing
        import model_signing.verifying
    except ImportError as error:
        raise ValueError(f"{what}: signing and checking {MODEL_SIGNATURE_FILE} needs the 'model-signing' package "
                         f"({type(error).__name__}: {error}); install it with: pip install "
                         f"'model-signing=={MODEL_SIGNING_VERSION}' pyopenssl") from None
    return model_signing


def model_signing_available() -> None:
    """Raise ValueError (naming ``sign_key``, an EC key that writes model.sig at the close)
    with the install command when model-signing cannot be imported."""
    _model_signing("sign_key")


def hashing_config():
    """model-signing's hashing for a run directory: a SHA-256 per file (as the manifest's),
    no symbolic link followed, :data:`IGNORED_PATHS` left out."""
    model_signing = _model_signing()
    return (model_signing.hashing.Config()
            .use_file_serialization(hashing_algorithm="sha256", allow_symlinks=False)
            .set_ignored_paths(paths=list(IGNORED_PATHS), ignore_git_paths=True))


def _loaded_key_signer(private_key):
    """model-signing's EC-key signer over a key already loaded (and checked) by fedvalue: the
    key file is read once, when the run starts, never again at its close. Its constructor
    only reads a PEM file into ``_private_key`` and checks the curve; this does the same
    with the loaded key (model-signing is pinned to the release this was written against)."""
    from model_signing._signing import sign_ec_key

    sign_ec_key._check_supported_ec_key(private_key.public_key())
    signer = sign_ec_key.Signer.__new__(sign_ec_key.Signer)
    signer._private_key = private_key
    return signer


def sign_run(run_dir: str | os.PathLike | RunDir, signer) -> bytes:
    """Write ``model.sig`` over the closed run (module docstring) with ``signer``'s EC key
    (a :class:`fedvalue.run.seals.Signer` whose :attr:`signs_model` is True) and return its
    bytes. The signature is made outside the directory and written into it atomically."""
    if not getattr(signer, "signs_model", False):
        raise ValueError(f"sign_key: expected an EC key (P-256, P-384, P-521) to write {MODEL_SIGNATURE_FILE}; "
                         f"got a {getattr(signer, 'algorithm', type(signer).__name__)} key (model-signing "
                         f"{MODEL_SIGNING_VERSION} takes no Ed25519 key).")
    model_signing = _model_signing()
    run = open_run_dir(run_dir)
    config = model_signing.signing.Config().set_hashing_config(hashing_config())
    config._signer = _loaded_key_signer(signer._key)  # the public API takes a key file's path only
    with tempfile.TemporaryDirectory(prefix="fedvalue-model-sig-") as scratch:
        target = Path(scratch) / MODEL_SIGNATURE_FILE
        config.sign(run.path, target)
        data = target.read_bytes()
    run.write_bytes(MODEL_SIGNATURE_FILE, data)
    return data


def sign_closed_run(run_dir: str | os.PathLike | RunDir, signer) -> bytes:
    """Write ``model.sig`` for a run that holds its manifest but none (its writer was stopped
    between the two at its close), once nothing has changed since: the manifest must carry
    ``signer``'s own valid signature and list exactly the directory's files with their
    digests. ValueError naming what differs otherwise; nothing is written then."""
    from fedvalue.run.seals import manifest_files, read_manifest, sha256_of

    run = open_run_dir(run_dir)
    if run.exists(MODEL_SIGNATURE_FILE):
        raise ValueError(f"run_dir: expected a closed run without {MODEL_SIGNATURE_FILE}; {run.show()} has one.")
    manifest = read_manifest(run)
    if manifest is None:
        raise ValueError(f"run_dir: expected a closed run (holding manifest.json); {run.show()} has no manifest: "
                         "resume it instead, and its close signs it.")
    problem = signer.verifier().problem(manifest)
    if problem is not None:
        raise ValueError(f"sign_key: the run's manifest.json does not carry this key's signature ({problem}); only the "
                         "key that signed the run signs its model.sig.")
    listed, found = manifest["files"], manifest_files(run)
    changed = sorted(set(listed) ^ set(found)) or [name for name in found if sha256_of(run, name) != listed[name]]
    if changed:
        raise ValueError(f"run_dir: {printable(changed[0], 80)} is not as the signed manifest lists it (and "
                         f"{len(changed) - 1} more); a changed run is not signed.")
    return sign_run(run, signer)


def verify_run(run_dir: str | os.PathLike, verifier) -> str | None:
    """None when ``model.sig`` verifies for the run directory with ``verifier``'s EC public key
    through model-signing's own verifier, else what is wrong (one line, printable; never an
    exception for what the directory holds)."""
    if not getattr(verifier, "checks_model", False):
        return (f"{MODEL_SIGNATURE_FILE}: not checked, the given key is {getattr(verifier, 'algorithm', '?')} "
                f"and model-signing {MODEL_SIGNING_VERSION} verifies EC keys only")
    try:
        model_signing = _model_signing()
    except ValueError as error:
        return str(error)
    path = Path(run_dir)
    with tempfile.TemporaryDirectory(prefix="fedvalue-model-sig-") as scratch:
        key = Path(scratch) / "public.pem"  # model-signing reads the key from a file; a public key is no secret
        key.write_bytes(verifier.pem)
        try:
            (model_signing.verifying.Config().use_elliptic_key_verifier(public_key=key)
             .set_hashing_config(hashing_config()).verify(path, path / MODEL_SIGNATURE_FILE))
        except Exception as error:  # noqa: BLE001 - whatever model-signing says about the files is a finding
            return f"{MODEL_SIGNATURE_FILE}: model-signing's verifier refuses it ({_reason(error)})"
    return None


def _reason(error: Exception) -> str:
    """model-signing's message, shortened: its digests print as Python bytes reprs."""
    text = str(error)
    if text.startswith("Signature mismatch:"):
        names = [part.split("'")[1] for part in text.split("Hash mismatch for ")[1:] if "'" in part]
        if names:
            shown = ", ".join(printable(n, 80) for n in names[:5])
            return f"files changed since it was signed: {shown}" + (" ..." if len(names) > 5 else "")
    return printable(f"{type(error).__name__}: {text}", 300)
