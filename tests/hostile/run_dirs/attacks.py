"""The attacks of ``tests/hostile/run_dirs/battery.py``: what a hostile sender does to a run directory.

Each attack is a function ``attack(case) -> list[Action]`` registered with :func:`attack`:
it rewrites ``case.run`` (a fresh copy of a real signed ``noisy-clients`` run, or of a
procurement study for the table-directory attacks) as a forger without the signing key
would, recomputing the hash chain, the seals and the manifest wherever that helps, and
returns the commands a reader then runs on it (the audit without and with the signer's
public key, the report, a resume). The runner measures what the commands do; an attack
may add its own harm check (``case.harm_checks``).

The readers are reached through the project's command line only, and every forger's step that goes
through the project's own file formats (the Parquet copy, a round record, a re-booking) runs as a child
in the reader's checkout (:func:`in_checkout`), so the same attacks run against another version of the
project (``battery.py --code DIR``) and rewrite its files as its own code writes them. The chain, the
seals and the manifest are recomputed here (tests.fedvalue.forgery), as the versions since the battery
came hash them.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

from bench.docs_tables.run_dir_battery import NO_KEY, WITH_KEY  # the audit modes, as the docs' tables read them
from tests.fedvalue.forgery import rechain, reseal  # the forger's own tools

SECRET = "SECRET-7f3a91"


@dataclass
class Action:
    """One command a reader runs: ``fedvalue ARGV`` (or ``python -c CODE``) in ``cwd``."""

    name: str
    argv: list[str]
    cwd: Path | None = None
    env: dict[str, str] = field(default_factory=dict)
    python: bool = False  # argv[0] is Python code run with the project's interpreter


@dataclass
class Case:
    """What an attack works on and what the runner checks after it."""

    name: str
    kind: str
    root: Path  # the case's own scratch directory
    run: Path  # the run directory the attack rewrites
    outside: Path  # files a reader must never touch
    marker: Path  # created only if attacker code runs
    public: Path
    private: Path
    port: int  # a listener that counts connections (a beacon)
    forged: tuple[str, ...] = ()  # audit modes that must not say intact
    protected: dict[str, bytes] = field(default_factory=dict)  # run files a refused command must not change
    harm_checks: list[Callable[["Case", dict], str | None]] = field(default_factory=list)
    code: Path = ROOT  # the checkout whose readers are measured

    def audits(self, *modes: str) -> list[Action]:
        actions = []
        for mode in modes or (NO_KEY, WITH_KEY):
            argv = ["audit", str(self.run)] + (["--public-key", str(self.public)] if mode == WITH_KEY else [])
            actions.append(Action(mode, argv))
        return actions

    def protect(self, *names: str) -> None:
        for name in names:
            path = self.run / name
            self.protected[name] = path.read_bytes() if path.is_file() else b"<absent>"


@dataclass(frozen=True)
class Attack:
    name: str
    kind: str
    base: str  # "signed" (a noisy-clients run) or "tables" (a procurement study)
    make: Callable[[Case], list[Action]]
    forged: tuple[str, ...]


ATTACKS: list[Attack] = []  # filled here and by run_dir_attacks_audit.py


def attack(kind: str, *, base: str = "signed", forged: tuple[str, ...] = ()):
    def register(make):
        ATTACKS.append(Attack(make.__name__, kind, base, make, forged))
        return make
    return register


# --------------------------------------------------------------------------- helpers


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines(keepends=True)


def _config(run: Path) -> dict:
    return json.loads((run / "run.json").read_text())


def _write_config(run: Path, config: dict) -> None:
    (run / "run.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def in_checkout(case: Case, script: str, *args: str) -> str:
    """Run the Python ``script`` with ``args`` from the reader's checkout (``case.code``), so a step that goes
    through the project's file formats writes that version's; its stdout. RuntimeError with its last lines when
    it fails (the battery keeps the attack as not forged)."""
    done = subprocess.run([sys.executable, "-c", script, *args], cwd=case.code, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(case.code)}, timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the forger's step failed in {case.code}: {done.stderr.strip()[-600:]}")
    return done.stdout


#: The version's own reader of a ledger (its module moved into fedvalue.run; fedvalue.ledger before).
READ_LEDGER_CSV = """try:
    from fedvalue.run.ledger_reader import read_ledger_csv
except ImportError:
    from fedvalue.ledger import read_ledger_csv
"""
PARQUET_COPY = READ_LEDGER_CSV + """import io, sys
from pathlib import Path
run = Path(sys.argv[1])
path = run / "ledger.parquet"
if path.exists() or path.is_symlink():
    path.unlink()
read_ledger_csv(io.StringIO((run / "ledger.csv").read_text(), newline="")).to_parquet(path, index=False)
"""
#: Each client's ADS total as the version's load_run pays it (JSON), or {"refused": why}.
LEDGER_TOTALS = """import json, sys
try:
    from fedvalue.analysis.run_summary import load_run
except ImportError:
    from fedvalue.ledger import load_run
try:
    totals = load_run(sys.argv[1]).summary()["total_ads"].to_dict()
except Exception as error:
    totals = {"refused": f"{type(error).__name__}: {error}"[:300]}
print(json.dumps({str(client): value for client, value in totals.items()}))
"""


def _forge_tables(case: Case) -> None:
    """The forger keeps ledger.parquet in step with the CSV (as the reader's version writes it), then rechains."""
    in_checkout(case, PARQUET_COPY, str(case.run))
    rechain(case.run)


def _resumable(run: Path) -> None:
    (run / "manifest.json").unlink()


def _arrays_file(run: Path) -> Path:
    """The checkpoint's file of A_k (not its server state)."""
    return next(p for p in sorted((run / "checkpoint").iterdir()) if p.name.endswith(".npz")
                and not p.name.endswith("-state.npz"))


def _state_key(path: Path) -> str:
    return "state" if path.name.endswith("-state.npz") else path.suffix.lstrip(".")


def _state_files(run: Path) -> list[Path]:
    """The checkpoint's server-state files (a pickle in the version before, data after)."""
    return sorted(p for p in (run / "checkpoint").iterdir() if _state_key(p) != "npz")


def _seal_checkpoint_digests(run: Path) -> None:
    """Reseal the last seal's checkpoint digests to the files now there (no key)."""
    lines = (run / "seals.jsonl").read_text().splitlines()
    seal = json.loads(lines[-1])
    digests = {}
    for path in sorted((run / "checkpoint").iterdir()):
        digests[_state_key(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    seal["checkpoint"] = {**(seal.get("checkpoint") or {}), **digests}
    for key in ("signature", "key", "algorithm"):
        seal.pop(key, None)
    lines[-1] = json.dumps(seal, sort_keys=True)
    (run / "seals.jsonl").write_text("\n".join(lines) + "\n")


class _Payload:
    """Unpickling this creates the marker file: attacker code ran on the reader's machine."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _payload(case: Case) -> bytes:
    return pickle.dumps(_Payload(str(case.marker)), protocol=4)


def _resume(case: Case, *extra: str) -> Action:
    return Action("resume", ["run", "noisy-clients", "--resume", str(case.run), "--quiet", *extra])


# --------------------------------------------------------------------------- controls and paths


@attack("control")
def unchanged(case: Case) -> list[Action]:
    return case.audits()


@attack("paths")
def unchanged_audited_by_relative_path(case: Case) -> list[Action]:
    return [Action(NO_KEY, ["audit", case.run.name], cwd=case.run.parent)]


@attack("paths")
def unchanged_audited_through_tilde(case: Case) -> list[Action]:
    return [Action(NO_KEY, ["audit", "~/" + case.run.name], env={"HOME": str(case.run.parent)})]


@attack("paths")
def unchanged_audited_under_a_symlinked_parent(case: Case) -> list[Action]:
    (case.root / "via").symlink_to(case.run.parent)
    return [Action(NO_KEY, ["audit", "via/" + case.run.name], cwd=case.root)]


@attack("paths")
def run_and_audit_with_a_relative_out(case: Case) -> list[Action]:
    """README's first command with a relative --out: the run must finish and audit intact."""
    shutil.rmtree(case.run)
    case.run = case.root / "runs" / "x"

    def lost(case: Case, results: dict) -> str | None:
        if results["run"]["rc"] != 0:
            return "the run with a relative --out failed" + ("" if case.run.exists() else " and its directory was removed")
        return None

    case.harm_checks.append(lost)
    tiny = ["--num-clients", "6", "--clients-per-round", "2", "--local-epochs", "2", "--hidden", "8", "--quiet"]
    return [Action("run", ["run", "noisy-clients", "--out", "runs/x", "--rounds", "2", *tiny], cwd=case.root),
            Action(NO_KEY, ["audit", "runs/x"], cwd=case.root)]


# --------------------------------------------------------------------------- code execution through --resume


@attack("code execution through --resume")
def resume_checkpoint_of_round_zero(case: Case) -> list[Action]:
    """checkpoint.json names round 0 (no seal checked) and round 0's state file is a pickle."""
    _resumable(case.run)
    case.protect("ledger.csv", "rounds.csv", "seals.jsonl", "records/round-000001.npz")
    (case.run / "checkpoint.json").write_text(json.dumps({"round": 0, "files": {}}) + "\n")
    shutil.copy(_arrays_file(case.run), case.run / "checkpoint" / "round-000000.npz")
    for suffix in (".pkl", ".json", ".state"):
        (case.run / "checkpoint" / f"round-000000{suffix}").write_bytes(_payload(case))
    return [_resume(case, "--sign-key", str(case.private))]


@attack("code execution through --resume")
def resume_resealed_pickle_without_key(case: Case) -> list[Action]:
    """The checkpoint's server state replaced by a pickle payload, its seal recomputed (no key)."""
    _resumable(case.run)
    for path in _state_files(case.run):
        path.write_bytes(_payload(case))
    if not _state_files(case.run):
        (case.run / "checkpoint" / "round-000003.pkl").write_bytes(_payload(case))
    _seal_checkpoint_digests(case.run)
    return [_resume(case)]


@attack("code execution through --resume")
def resume_with_unsealed_sizes(case: Case) -> list[Action]:
    """checkpoint.json's table sizes shrunk: a refused resume must cut nothing."""
    _resumable(case.run)
    case.protect("ledger.csv", "rounds.csv", "seals.jsonl")
    pointer = json.loads((case.run / "checkpoint.json").read_text())
    pointer["files"] = {name: 40 for name in pointer.get("files", {})} or {"ledger.csv": 40, "rounds.csv": 40}
    (case.run / "checkpoint.json").write_text(json.dumps(pointer) + "\n")
    return [_resume(case)]


# --------------------------------------------------------------------------- writes through links in report


def _victim(case: Case, name: str = "victim.txt") -> Path:
    path = case.outside / name
    path.write_text("the reader's own file\n")
    return path


@attack("writes through links in report", forged=(NO_KEY, WITH_KEY))
def report_html_linked_outside(case: Case) -> list[Action]:
    (case.run / "report.html").symlink_to(_victim(case))
    return [*case.audits(), Action("report --html", ["report", str(case.run), "--html"])]


@attack("writes through links in report", forged=(NO_KEY, WITH_KEY))
def figures_dir_linked_outside(case: Case) -> list[Action]:
    target = case.outside / "somewhere"
    target.mkdir()
    (case.run / "figures").symlink_to(target)
    return [*case.audits(), Action("report --plots", ["report", str(case.run), "--plots"])]


@attack("writes through links in report", forged=(NO_KEY, WITH_KEY))
def figure_file_linked_outside(case: Case) -> list[Action]:
    (case.run / "figures").mkdir()
    (case.run / "figures" / "value_heatmap.png").symlink_to(_victim(case, "victim.png"))
    return [*case.audits(), Action("report --plots", ["report", str(case.run), "--plots"])]


@attack("writes through links in report")
def run_json_writes_lines_into_the_report(case: Case) -> list[Action]:
    """A run.json string with newlines: html.escape keeps them, so the sender writes whole lines."""
    config = _config(case.run)
    config["simulation"] = "noisy-clients\nINJECTED-LINE\n"
    _write_config(case.run, config)
    rechain(case.run)

    def injected(case: Case, results: dict) -> str | None:
        page = case.run / "report.html"
        if page.is_file() and "INJECTED-LINE" in page.read_text(errors="replace").splitlines():
            return "run.json put a whole line of its own into report.html"
        return None

    case.harm_checks.append(injected)
    return [*case.audits(NO_KEY), Action("report --html", ["report", str(case.run), "--html"])]


@attack("writes through links in report", base="tables")
def table_directory_reads_linked_files(case: Case) -> list[Action]:
    (case.outside / "secret.csv").write_text(f"a,b\n{SECRET},1\n")
    (case.run / "leak.csv").symlink_to(case.outside / "secret.csv")
    return [Action("report --html", ["report", str(case.run), "--html"])]


@attack("writes through links in report", base="tables")
def table_directory_embeds_a_linked_run(case: Case) -> list[Action]:
    sub = next(p.parent for p in case.run.rglob("ledger.csv"))
    outside_run = case.outside / "other-run"
    shutil.copytree(sub, outside_run)
    lines = _lines(outside_run / "ledger.csv")
    cells = lines[1].split(",")
    cells[1] = SECRET
    lines[1] = ",".join(cells)
    (outside_run / "ledger.csv").write_text("".join(lines))
    (case.run / "linked-run").symlink_to(outside_run)
    return [Action("report --html", ["report", str(case.run), "--html"])]


# --------------------------------------------------------------------------- work before verification


#: Round 1's record with its replies copied to 22 clients and the estimator set to exact, in the version's format:
#: entries and settings here; weights and statuses by client and the settings in ``meta`` in older records.
COPIED_REPLIES = """import dataclasses, sys
from pathlib import Path
try:
    from fedvalue.run.archive import read_round_record, record_path, write_round_record
except ImportError:
    from fedvalue.archive import read_round_record, record_path, write_round_record
run = Path(sys.argv[1])
record = read_round_record(record_path(run, 1))
replies = list(record.replies.items())
for k in range(22 - len(replies)):
    client = 1000 + k
    source, arrays = replies[k % len(replies)]
    weight = record.weights[source]
    record.replies[client] = arrays
    if hasattr(record, "entries"):
        from fedvalue.schema import ClientEntry
        record.entries.append(ClientEntry(client, "ok", weight, int(weight)))
    else:
        record.weights[client], record.statuses[client] = weight, "ok"
    record.accepted.append(client)
if hasattr(record, "settings"):
    record.settings = dataclasses.replace(record.settings,
                                          valuation=dataclasses.replace(record.settings.valuation, method="exact"))
else:
    record.meta["valuation"] = {**record.meta["valuation"], "method": "exact"}
write_round_record(run, record)
"""


@attack("work before verification", forged=(NO_KEY, WITH_KEY))
def record_names_an_exact_estimator_over_copied_replies(case: Case) -> list[Action]:
    """Round 1's record: its two replies copied to 22 clients and the estimator set to exact."""
    in_checkout(case, COPIED_REPLIES, str(case.run))
    reseal(case.run)
    return case.audits()


@attack("work before verification", forged=(NO_KEY, WITH_KEY))
def manifest_names_one_big_file_by_many_spellings(case: Case) -> list[Action]:
    """A 64 MB file listed under 3,000 spellings of its name: each spelling hashed again."""
    with open(case.run / "blob.bin", "wb") as handle:
        handle.write(os.urandom(1 << 20) * 64)
    reseal(case.run)
    manifest = json.loads((case.run / "manifest.json").read_text())
    digest = manifest["files"]["blob.bin"]
    for k in range(1, 3001):
        name = "./" * (k % 1000 + 1) + "/" * (k // 1000) + "blob.bin"
        manifest["files"][name] = digest
    (case.run / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return case.audits()


@attack("work before verification", base="tables", forged=(NO_KEY,))
def replayed_ledger_is_a_fifo(case: Case) -> list[Action]:
    sub = next(p.parent for p in case.run.rglob("ledger.csv"))
    (sub / "ledger.csv").unlink()
    os.mkfifo(sub / "ledger.csv")
    return [Action(NO_KEY, ["audit", str(sub)])]


@attack("work before verification", forged=(NO_KEY, WITH_KEY))
def parquet_that_expands_to_gigabytes(case: Case) -> list[Action]:
    """A dictionary-encoded ledger.parquet of 300 M rows of one string: a few KB on disk."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = case.run / "ledger.parquet"
    path.unlink()
    chunk = pa.table({"client_id": pa.array(["x" * 24] * 5_000_000)})
    with pq.ParquetWriter(path, chunk.schema, use_dictionary=True, compression="zstd") as writer:
        for _ in range(60):
            writer.write_table(chunk)
    reseal(case.run)
    return case.audits()


# --------------------------------------------------------------------------- network and outside files


@attack("network and files outside", forged=(WITH_KEY,))
def ray_address_beacon(case: Case) -> list[Action]:
    """run.json's ray_address points at a listener. An engine setting: the books are what they
    were, so without a key ``intact`` is the truth; the harm is any connection at all."""
    config = _config(case.run)
    config["ray_address"] = f"127.0.0.1:{case.port}"
    _write_config(case.run, config)
    rechain(case.run)
    return case.audits()


@attack("network and files outside", forged=(NO_KEY, WITH_KEY))
def mnist_path_outside(case: Case) -> list[Action]:
    """run.json names MNIST files outside the run directory (Fashion-MNIST's, copied): reading
    them shows as a newer access time (set to 1970 before the audit)."""
    data = case.root / "mnist-outside"  # not under case.outside: the runner's own snapshot reads those files
    shutil.copytree("/usr/share/datasets/fashion-mnist", data)
    for path in data.iterdir():
        os.utime(path, (1, path.stat().st_mtime))
    config = _config(case.run)
    config.update(dataset="mnist", mnist_path=str(data))
    _write_config(case.run, config)
    rechain(case.run)

    def read(case: Case, results: dict) -> str | None:
        touched = [p.name for p in data.iterdir() if p.stat().st_atime > 1]
        return f"the audit read files outside the run directory named by run.json ({touched})" if touched else None

    case.harm_checks.append(read)
    return case.audits()
