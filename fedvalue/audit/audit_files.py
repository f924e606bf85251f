"""The audit's view of a run directory's files: what is there, what was committed to, and
the signatures, checked before anything is parsed or recomputed.

:class:`RunFiles` reads every file through one :class:`fedvalue.run.rundir.RunDir` (no link
is followed, special files are refused, reads are capped) and reads each file once for
hashing; a file parsed later is hashed again and must give the same digest, so what is
verified is what is used. :class:`Budget` bounds the whole audit's time: running out
ends in *not verifiable*, never in a hang.

The checks here (the audit's checks 5 and 6, :mod:`fedvalue.audit.checks`):

- **layout**: every entry at every level is a name a run writes (run.json, the tables,
  seals, manifest, checkpoint, ``records/round-NNNNNN.npz``, ``checkpoint/...``) or one
  ``fedvalue report`` writes after the run (report.html, figures/*.png), and is a regular
  file or a real directory; links, FIFOs, devices and any other name are findings;
- **signatures first** (with the signer's public key): the manifest's and every seal's
  signature, before anything else is read; with an EC key, then ``model.sig`` through
  model-signing's own verifier (:mod:`fedvalue.run.model_signature`), once every entry is
  known to be a regular file or a directory; the audit stops at the first failure;
- **the manifest**: it lists exactly the run's files, by their exact names (no other
  spelling, no file twice), each hashed once and equal to its digest; it names as many
  rounds as rounds.csv holds and run.json planned, and the chain's head;
- **the seals**: one per committed round, each naming its round's chain head and its
  record's digest.
"""

from __future__ import annotations

import hashlib
import time

from fedvalue._checks import counted
from fedvalue.run import rundir
from fedvalue.run.rundir import RunDir, printable
from fedvalue.run.run_info import parse_run_config
from fedvalue.schema import (
    CHECKPOINT_DIR,
    CHECKPOINT_FILE,
    FIRST_ORDER_FILE,
    LEDGER_FILE,
    LEDGER_PARQUET_FILE,
    MANIFEST_FILE,
    MODEL_SIGNATURE_FILE,
    RECORDS_DIR,
    ROUNDS_FILE,
    RUN_CONFIG_FILE,
    SEALS_FILE,
    record_name,
    record_round,
)
from fedvalue.run.model_signature import MAX_SIGNATURE_BYTES, verify_run
from fedvalue.run.seals import Verifier, is_outside_books, parse_manifest, parse_seals

#: Files of a run directory's top level.
TOP_FILES = (RUN_CONFIG_FILE, LEDGER_FILE, LEDGER_PARQUET_FILE, ROUNDS_FILE, FIRST_ORDER_FILE, SEALS_FILE,
             MANIFEST_FILE, MODEL_SIGNATURE_FILE, CHECKPOINT_FILE)
#: Files read whole and kept while the audit runs (larger ones are read again when parsed).
KEEP_BYTES = 8 * 1024**2
_REGULAR, _DIRECTORY = "a regular file", "a directory"


class BudgetExceeded(Exception):
    """The audit's time budget ran out (the run is then not verifiable)."""


class Budget:
    """A deadline ``seconds`` from now; :meth:`check` raises :class:`BudgetExceeded` past it."""

    def __init__(self, seconds: float) -> None:
        self.seconds = float(seconds)
        self.deadline = time.monotonic() + self.seconds

    def check(self, where: str) -> None:
        if time.monotonic() > self.deadline:
            raise BudgetExceeded(f"the audit's budget of {self.seconds:g} s ran out while {where}")


def _is_checkpoint_name(entry: str) -> bool:
    stem, _, suffix = entry.partition(".")
    if suffix != "npz" or not stem.startswith("round-"):
        return False
    digits = stem[len("round-"):].removesuffix("-state")
    return len(digits) == 6 and digits.isascii() and digits.isdigit()


def _known(name: str, kind: str) -> bool:
    parts = name.split("/")
    if len(parts) == 1:
        return (kind == _REGULAR and name in TOP_FILES) or (kind == _DIRECTORY and name in (RECORDS_DIR,
                                                                                           CHECKPOINT_DIR))
    return len(parts) == 2 and kind == _REGULAR and (
        (parts[0] == RECORDS_DIR and record_round(parts[1]) is not None)
        or (parts[0] == CHECKPOINT_DIR and _is_checkpoint_name(parts[1])))


def layout_problem(name: str, kind: str, *, tmp_allowed: bool) -> str | None:
    """Why ``name`` (of ``kind``) is not an entry a run or its report writes; None if it is.
    ``tmp_allowed``: a run killed mid-write may leave a known file's ``.tmp`` beside it."""
    if kind == "a symbolic link":
        return f"{printable(name)}: a symbolic link (a run directory holds regular files only)"
    if is_outside_books(name, kind) or _known(name, kind):
        return None
    if tmp_allowed and name.endswith(".tmp") and _known(name[: -len(".tmp")], kind):
        return None
    return f"{printable(name)}: {kind}, not a file a run writes"


class RunFiles:
    """A run directory's entries and file bytes as the audit reads them (module docstring)."""

    def __init__(self, run: RunDir, budget: Budget) -> None:
        self.run = run
        self.budget = budget
        self.inventory = run.walk()
        self._kept: dict[str, bytes] = {}
        self._digests: dict[str, str] = {}

    def kind(self, name: str) -> str | None:
        return self.inventory.get(name)

    def exists(self, name: str) -> bool:
        return name in self.inventory

    def bytes(self, name: str, *, max_bytes: int = rundir.MAX_FILE_BYTES) -> bytes:
        """The bytes of the regular file ``name``; the same digest every time it is read."""
        if name in self._kept:
            return self._kept[name]
        self.budget.check(f"reading {printable(name, 80)}")
        data = self.run.read_bytes(name, max_bytes=max_bytes)
        digest = hashlib.sha256(data).hexdigest()
        if self._digests.setdefault(name, digest) != digest:
            raise ValueError(f"{printable(name)}: changed while it was being audited")
        if len(data) <= KEEP_BYTES:
            self._kept[name] = data
        return data

    def release(self, name: str) -> None:
        """Forget ``name``'s bytes (its digest is kept: a later read must match it)."""
        self._kept.pop(name, None)

    def text(self, name: str, *, max_bytes: int = rundir.MAX_FILE_BYTES) -> str:
        try:
            return self.bytes(name, max_bytes=max_bytes).decode("utf-8")
        except UnicodeDecodeError as error:
            raise rundir.UnsafeRunFile(f"{printable(name)}: expected UTF-8 text ({error.reason})") from None

    def digest(self, name: str) -> str:
        """SHA-256 of ``name``; a file larger than :data:`KEEP_BYTES` is hashed as it streams
        (never whole in memory), and a later read of it must give the same digest."""
        if name not in self._digests:
            if self.run.size(name) <= KEEP_BYTES:
                self.bytes(name)
            else:
                self.budget.check(f"hashing {printable(name, 80)}")
                self._digests[name] = self.run.sha256(name)
        return self._digests[name]


def check_layout(files: RunFiles, report, *, has_manifest: bool) -> None:
    """Every entry at every level is one a run (or its report) writes (module docstring)."""
    found = [problem for name, kind in files.inventory.items()
             if (problem := layout_problem(name, kind, tmp_allowed=not has_manifest)) is not None]
    report.problems += found[:20]
    if len(found) > 20:
        report.problems.append(f"... and {len(found) - 20} more entries a run does not write")
    if not found:
        report.checks.append(f"every one of the {len(files.inventory)} entries is a file or directory a run writes "
                             "(no link, no special file)")


def read_config(files: RunFiles, report) -> dict:
    """run.json's settings as the file holds them ({} without one); a file that is not a JSON
    object of settings is a finding (and {})."""
    if not files.exists(RUN_CONFIG_FILE):
        return {}
    try:
        return parse_run_config(files.text(RUN_CONFIG_FILE, max_bytes=rundir.MAX_JSON_BYTES))
    except ValueError as error:
        report.problems.append(printable(error))
        return {}


def read_commitments(files: RunFiles, report) -> tuple[list[dict], dict | None]:
    """(seals, manifest) as the files hold them; a file that is not one is a finding."""
    seals, manifest = [], None
    try:
        if files.exists(SEALS_FILE):
            seals = parse_seals(files.text(SEALS_FILE), SEALS_FILE)
    except ValueError as error:
        report.problems.append(str(error))
    try:
        if files.exists(MANIFEST_FILE):
            manifest = parse_manifest(files.text(MANIFEST_FILE, max_bytes=rundir.MAX_JSON_BYTES), MANIFEST_FILE)
    except ValueError as error:
        report.problems.append(str(error))
    return seals, manifest


def check_signatures(verifier: Verifier, seals: list[dict], manifest: dict | None, report) -> bool:
    """With the signer's key, before anything else: the manifest's and every seal's signature.
    False at the first failure (the audit stops there)."""
    if manifest is not None and (problem := verifier.problem(manifest)) is not None:
        report.problems.append(f"{MANIFEST_FILE}: {problem}")
        return False
    for seal in seals:
        if (problem := verifier.problem(seal)) is not None:
            report.problems.append(f"{SEALS_FILE}: round {seal['round']}'s seal: {problem}")
            return False
    report.checks.append(f"signatures of key {verifier.fingerprint[:16]}... verify on {len(seals)} round seals"
                         + (" and the manifest" if manifest is not None else ""))
    return True


def check_model_signature(files: RunFiles, verifier: Verifier, manifest: dict | None, report) -> bool:
    """With an EC key, after the seals' and manifest's signatures: ``model.sig`` verifies with
    model-signing's own verifier. A complete run must have one; an incomplete run signs at its
    close (a ``model.sig`` it holds is checked all the same). False at a failure."""
    present = files.kind(MODEL_SIGNATURE_FILE)
    if not verifier.checks_model:
        if present is not None:
            report.notes.append(f"{MODEL_SIGNATURE_FILE}: not checked; the given key is Ed25519, and model-signing "
                                "verifies EC keys only (a run signed with one writes no model.sig)")
        return True
    if present is None:
        if manifest is None:
            return True
        report.problems.append(f"{MODEL_SIGNATURE_FILE}: missing; a run signed with an EC key writes it at its close, "
                               "after its manifest (verify: model_signing verify key RUN_DIR --signature "
                               "RUN_DIR/model.sig --public_key KEY.pub)")
        return False
    if present != _REGULAR:
        report.problems.append(f"{MODEL_SIGNATURE_FILE}: not checked; it is {present}, not a regular file")
        return False
    odd = sorted(name for name, kind in files.inventory.items() if kind not in (_REGULAR, _DIRECTORY))
    if odd:
        report.problems.append(f"{MODEL_SIGNATURE_FILE}: not checked; model-signing reads the directory itself, and "
                               f"it holds entries that are neither regular files nor directories "
                               f"({', '.join(printable(n, 80) for n in odd[:5])})")
        return False
    if files.run.size(MODEL_SIGNATURE_FILE) > MAX_SIGNATURE_BYTES:
        report.problems.append(f"{MODEL_SIGNATURE_FILE}: larger than {MAX_SIGNATURE_BYTES} bytes, far more than a "
                               "signature of a run's files")
        return False
    files.budget.check(f"verifying {MODEL_SIGNATURE_FILE} with model-signing")
    problem = verify_run(files.run.path, verifier)
    if problem is not None:
        report.problems.append(problem)
        return False
    report.checks.append(f"{MODEL_SIGNATURE_FILE} verifies with model-signing's own verifier and the given key: "
                         "every file of the run is as signed at its close")
    return True


def check_manifest_files(files: RunFiles, manifest: dict, report, *, stop_at_first: bool) -> bool:
    """The manifest lists exactly the run's files by their exact names, and each file's digest
    (each read and hashed once). False when something differs."""
    listed = manifest["files"]
    found: list[str] = []
    for name, digest in listed.items():
        if files.kind(name) != _REGULAR or name == MANIFEST_FILE:
            found.append(f"{MANIFEST_FILE}: lists {printable(name, 80)}, which is not a file of the run directory by "
                         "that exact name")
        else:
            files.budget.check("hashing the files the manifest lists")
            try:
                if files.digest(name) != digest:
                    found.append(f"{printable(name)}: changed since the manifest was written (its digest differs)")
            except (ValueError, OSError) as error:
                found.append(f"{printable(name)}: {printable(error)}")
        if stop_at_first and found:
            break
    if not (stop_at_first and found):
        for name, kind in files.inventory.items():
            if kind == _REGULAR and name not in listed and name not in (MANIFEST_FILE, MODEL_SIGNATURE_FILE) \
                    and not is_outside_books(name, kind):
                found.append(f"{printable(name)}: not in the manifest")
                if stop_at_first:
                    break
    report.problems += found[:20]
    if len(found) > 20:
        report.problems.append(f"{MANIFEST_FILE}: ... and {len(found) - 20} more differences from the run directory")
    return not found


def check_commitments(files: RunFiles, report, seals: list[dict], manifest: dict | None, heads: list[str],
                      planned: int | None, verifier: Verifier | None) -> None:
    """Seals and manifest against the tables: one seal per committed round naming its head and
    its record's digest; the manifest's rounds, planned rounds and head."""
    present, head = len(heads), heads[-1] if heads else None
    by_round = {}
    for seal in seals:
        t = seal["round"]
        if t in by_round or not 1 <= t <= present:
            report.problems.append(f"{SEALS_FILE}: a seal for round {t}, which rounds.csv does not commit once")
            continue
        by_round[t] = seal
        if seal.get("head") != heads[t - 1]:
            report.problems.append(f"{SEALS_FILE}: round {t}'s seal names another chain head than rounds.csv")
        record = seal.get("record")
        if record is not None:
            name = record_name(t)
            if not files.exists(name):
                report.problems.append(f"{name}: missing; round {t}'s seal committed to it")
            else:
                try:
                    if files.digest(name) != record:
                        report.problems.append(f"{name}: its digest is not the one its round's seal committed to")
                except ValueError as error:
                    report.problems.append(printable(error))
    unsealed = [t for t in range(1, present + 1) if t not in by_round]
    # A run killed between a round's commit and its seal leaves that last round unsealed.
    tolerated = [present] if manifest is None and present else []
    sealed = bool(seals) or verifier is not None or (manifest is not None and manifest.get("sealed") is not False)
    if [t for t in unsealed if t not in tolerated] and (sealed or manifest is None):
        status = report.problems if sealed else report.unverifiable
        status.append(f"{SEALS_FILE}: rounds {[t for t in unsealed if t not in tolerated][:10]} carry no seal")
    if manifest is None:
        if planned is not None and present > planned:
            report.problems.append(f"completeness: rounds.csv holds {counted(present, 'round')}; run.json planned {planned}")
        elif planned is not None and present == planned:
            report.unverifiable.append(f"completeness: no final manifest ({MANIFEST_FILE}); the run holds all {planned} "
                                       "planned rounds but never committed to its end (killed before writing it, "
                                       "written by an older version, or the manifest was removed)")
        else:
            of = f" of {planned} planned" if planned is not None else ""
            report.unverifiable.append(f"completeness: no final manifest ({MANIFEST_FILE}); the run holds {present} "
                                       f"rounds{of} and is incomplete (killed, or cut short)")
        return
    before = len(report.problems)
    if manifest.get("rounds") != present or manifest.get("complete") is not True:
        report.problems.append(f"{MANIFEST_FILE}: names {printable(manifest.get('rounds'), 40)} rounds (complete: "
                               f"{printable(manifest.get('complete'), 20)}); rounds.csv holds {present}")
    if manifest.get("planned_rounds") != present:
        report.problems.append(f"completeness: the run holds {counted(present, 'round')}; "
                               f"{printable(manifest.get('planned_rounds'), 40)} were planned")
    if planned is not None and manifest.get("planned_rounds") != planned:
        report.problems.append(f"{MANIFEST_FILE}: names {printable(manifest.get('planned_rounds'), 40)} planned rounds; "
                               f"run.json planned {planned}")
    if manifest.get("head") != head:
        report.problems.append(f"{MANIFEST_FILE}: names another final chain head than rounds.csv")
    if len(report.problems) == before:
        report.checks.append(f"the final manifest: {counted(present, 'round')} as planned, the chain's head, the digests of "
                             f"{len(manifest['files'])} files")
