"""Attack battery: a run directory from a hostile sender, and what reading it costs the reader.

    python -m tests.hostile.run_dirs.battery                   # every attack (about 15 minutes on 2 shared cores)
    python -m tests.hostile.run_dirs.battery --only resume,report   # attacks whose names contain either
    python -m tests.hostile.run_dirs.battery --json out.json   # every measurement, for comparing two versions
    python -m tests.hostile.run_dirs.battery --code DIR --json before.json   # the readers of another checkout

Makes one small real signed ``fedvalue run noisy-clients`` run (6 clients, 3 rounds, 2 per
round) and one procurement study (a folder of tables with a run below it), then, for each
attack of ``tests/hostile/run_dirs/attacks.py`` (and ``run_dir_attacks_audit.py``), rewrites a fresh copy as a forger without the key
would and runs what a reader runs on it (``fedvalue audit`` without and with the signer's
public key, ``fedvalue report``, ``--resume``), each command a child process under a time
limit (default 60 s: a hang is measured, not suffered) whose memory is sampled from /proc
and killed past a cap. It then counts, per attack:

- **hang**: a command gave no answer within the limit, or was killed for memory;
- **traceback**: a command printed a Python traceback;
- **reader harmed**: attacker code ran (a marker file appeared), a file outside the run
  directory was written or read (outside sentinels, a leaked secret, an outside file's
  access time), the network was touched (a listener counts connections), a refused
  command changed committed files, control characters reached the terminal, memory went
  past 2 GB, or the attack's own check (a forged line in report.html, value paid to the
  wrong client, a private key overwritten, a bad option accepted, a report broken);
- **intact and harmful**: the reader was harmed and an audit said ``intact``;
- **missed forgery**: the directory was rewritten and an audit mode that must catch it
  said ``intact``; **false alarm**: an untouched run not called intact.

The counts are printed per class and in total; ``--json`` keeps every command's result, headed by the
command, the commit and the limits (:mod:`bench.docs_tables.run_dir_battery` renders the docs' tables
from two such files). ``--code DIR`` runs every reader command, the base runs and the forger's steps that go
through the project's own file formats from another checkout (``git archive REV | tar -x -C DIR``): the
attacks stay this version's, the readers and formats are that version's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench import results_header
from bench.load import tree_rss
from tests.hostile.run_dirs import attacks
from tests.hostile.run_dirs import attacks_audit  # noqa: F401  (registers the second half of the attacks)
from tests.hostile.run_dirs.attacks import ATTACKS, LEDGER_TOTALS, SECRET, Case

ROOT = Path(__file__).resolve().parents[3]
TINY = ["--num-clients", "6", "--rounds", "3", "--clients-per-round", "2", "--local-epochs", "2", "--hidden", "8",
        "--quiet"]
#: ``fedvalue ARGV`` in a child: the command line's main is a module of its own package here, a function of the
#: module simulations/cli.py in versions before that package.
CLI = """import sys
try:
    from simulations.cli.main import main
except ImportError:
    from simulations.cli import main
sys.exit(main(sys.argv[1:]))"""
HARMFUL_MEMORY_MB = 2048


# --------------------------------------------------------------------------- probes


class Listener:
    """A TCP listener on localhost that counts the connections it accepts."""

    def __init__(self) -> None:
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.socket.listen(16)
        self.socket.settimeout(0.2)
        self.port = self.socket.getsockname()[1]
        self.connections = 0
        self._stop = False
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop:
            try:
                connection, _ = self.socket.accept()
            except OSError:
                continue
            self.connections += 1
            connection.close()

    def close(self) -> None:
        self._stop = True
        self._thread.join()
        self.socket.close()


def run_command(action: attacks.Action, timeout: float, memory_cap_mb: float, code: Path = ROOT) -> dict:
    """Run one reader command of the checkout ``code`` in its own process group; its outcome and peak memory."""
    if action.python:
        argv = [sys.executable, "-c", action.argv[0], *action.argv[1:]]
    else:
        argv = [sys.executable, "-c", CLI, *action.argv]
    env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0", "PYTHONPATH": str(code), **action.env}
    started = time.perf_counter()
    process = subprocess.Popen(["nice", "-n", "10", *argv], cwd=action.cwd or code, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, start_new_session=True)
    out: list[bytes] = []
    err: list[bytes] = []
    readers = [threading.Thread(target=lambda s=stream, b=buf: b.append(s.read()), daemon=True)
               for stream, buf in ((process.stdout, out), (process.stderr, err))]
    for reader in readers:
        reader.start()
    peak, outcome = 0.0, None
    while process.poll() is None:
        peak = max(peak, tree_rss(process.pid)[1] / 1e6)
        if peak > memory_cap_mb:
            outcome = "memory"
        elif time.perf_counter() - started > timeout:
            outcome = "timeout"
        if outcome is not None:
            os.killpg(process.pid, signal.SIGKILL)
            break
        time.sleep(0.1)
    process.wait()
    for reader in readers:
        reader.join()
    stdout = b"".join(out).decode("utf-8", "replace")
    stderr = b"".join(err).decode("utf-8", "replace")
    lines = stdout.strip().splitlines()
    verdict = lines[-1].rsplit(": ", 1)[-1] if lines and action.argv[:1] == ["audit"] else None
    return {"argv": [str(a)[:120] for a in action.argv[1:]] if action.python else action.argv,
            "rc": process.returncode, "seconds": round(time.perf_counter() - started, 1), "peak_mb": round(peak),
            "outcome": outcome or "exited", "verdict": verdict, "stdout": stdout[-4000:], "stderr": stderr[-4000:]}


# --------------------------------------------------------------------------- cases


def _snapshot(directory: Path) -> dict[str, bytes]:
    found = {}
    for path in sorted(directory.rglob("*")):
        if path.is_file() and not path.is_symlink() and not path.is_fifo() and path.stat().st_size < 1 << 26:
            found[str(path.relative_to(directory))] = path.read_bytes()
        else:
            found[str(path.relative_to(directory))] = b"<special>"
    return found


def _harms(case: Case, results: dict, outside_before: dict, listener_before: int, listener: Listener,
           run_files_before: set[str]) -> list[str]:
    harms = []
    if case.marker.exists():
        harms.append("attacker code ran (the payload's marker file exists)")
    if _snapshot(case.outside) != outside_before:
        harms.append("a file outside the run directory was written")
    if listener.connections > listener_before:
        harms.append(f"{listener.connections - listener_before} network connection(s) to the run's ray_address")
    for name, result in results.items():
        if not isinstance(result, dict) or "stdout" not in result:
            continue
        if SECRET in result["stdout"] + result["stderr"]:
            harms.append(f"{name}: printed the content of a file outside the run directory")
        if any(c in result["stdout"] for c in "\x1b\r\x07"):
            harms.append(f"{name}: sent control characters to the terminal")
        if result["peak_mb"] > HARMFUL_MEMORY_MB:
            harms.append(f"{name}: drove memory to {result['peak_mb']} MB")
    for path in case.run.rglob("*") if case.run.is_dir() else []:
        relative = str(path.relative_to(case.run))
        if relative not in run_files_before and path.is_file() and not path.is_symlink():
            if SECRET.encode() in path.read_bytes():
                harms.append(f"{relative}: embeds the content of a file outside the run directory")
    refused = any(r.get("rc") not in (0, None) for r in results.values() if isinstance(r, dict) and "rc" in r)
    if refused:
        for name, content in case.protected.items():
            path = case.run / name
            now = path.read_bytes() if path.is_file() else b"<absent>"
            if now != content:
                harms.append(f"{name}: a refused command changed or removed it (committed data lost)")
    for check in case.harm_checks:
        found = check(case, results)
        if found:
            harms.append(found)
    return harms


def run_case(spec: attacks.Attack, bases: dict, work: Path, listener: Listener, timeout: float,
             memory_cap_mb: float, code: Path = ROOT) -> dict:
    """One attack on a fresh copy of its base, its reader commands run from ``code``: what they did and the harm.
    A forgery the attack cannot make on that checkout's files is kept as such (``forger_failed``), unmeasured."""
    root = work / spec.name
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    (root / "outside").mkdir()
    (root / "outside" / "sentinel.txt").write_text("untouched\n")
    run = root / "run"
    shutil.copytree(bases[spec.base], run, symlinks=True)
    case = Case(spec.name, spec.kind, root, run, root / "outside", root / "payload-ran", bases["public"],
                bases["private"], listener.port, spec.forged, code=code)
    try:
        actions = spec.make(case)
    except Exception as error:  # noqa: BLE001 - another version's files the forger cannot rewrite: kept, not fatal
        return {**case_row(spec, [], {}), "forger_failed": f"{type(error).__name__}: {error}"[:400]}
    outside_before = _snapshot(case.outside)
    run_files_before = {str(p.relative_to(run)) for p in run.rglob("*")} if run.is_dir() else set()
    listener_before = listener.connections
    results: dict = {"original_totals": bases["totals"]}
    for action in actions:
        name = action.name
        while name in results:
            name += "'"
        results[name] = run_command(action, timeout, memory_cap_mb, code)
    harms = _harms(case, results, outside_before, listener_before, listener, run_files_before)
    results.pop("original_totals")
    return case_row(spec, harms, results)


def case_row(spec: attacks.Attack, harms: list[str], results: dict[str, dict]) -> dict:
    """What the JSON keeps of one attack: its harms, its flags, the audits' verdicts and every command's result
    (:func:`run_command`'s, by the name the attack gave it)."""
    verdicts = {name: r["verdict"] for name, r in results.items() if r["verdict"] is not None}
    said_intact = [name for name, verdict in verdicts.items() if verdict == "intact"]
    missed = [name for name in said_intact if name.rstrip("'") in spec.forged]
    return {
        "name": spec.name, "kind": spec.kind, "harms": harms,
        "hang": any(r["outcome"] != "exited" for r in results.values()),
        "traceback": any("Traceback (most recent call last)" in r["stderr"] for r in results.values()),
        "intact_and_harmful": bool(harms and said_intact), "missed_forgery": bool(missed),
        "false_alarm": spec.kind in ("control", "paths") and (
            any(v != "intact" for v in verdicts.values()) or any(r["rc"] != 0 for r in results.values())),
        "verdicts": verdicts, "commands": results,
    }


def kept_record(command: str, timeout: float, memory_cap_mb: float, counts: dict, rows: list[dict]) -> dict:
    """The ``--json`` file's content: the command and commit that made it, the limits the counts depend on, the
    counts and every attack's row."""
    return {"made_by": results_header(command).removeprefix("# ").strip(), "timeout_s": timeout,
            "memory_cap_mb": memory_cap_mb, "harmful_memory_mb": HARMFUL_MEMORY_MB, "counts": counts,
            "attacks": rows}


def make_bases(work: Path, timeout: float, code: Path = ROOT) -> dict:
    """The signed noisy-clients run and the procurement study every case copies, made by the checkout ``code``."""
    bases = {"private": work / "key.pem", "public": work / "key.pub"}
    for argv in (["keygen", str(bases["private"]), str(bases["public"])],
                 ["run", "noisy-clients", "--out", str(work / "signed"), *TINY, "--sign-key", str(bases["private"])],
                 ["run", "procurement", "--out", str(work / "tables"), "--seeds", "1", "--stages", "2",
                  "--offer-size", "10", "--initial-epochs", "20", "--biased-samples", "50", "--rules", "ads"]):
        result = run_command(attacks.Action("setup", argv), max(timeout, 600), 1e9, code)
        if result["rc"] != 0:
            raise SystemExit(f"setup failed: fedvalue {' '.join(argv)}\n{result['stderr']}")
    bases["signed"], bases["tables"] = work / "signed", work / "tables"
    result = run_command(attacks.Action("totals", [LEDGER_TOTALS, str(bases["signed"])], python=True), 120, 1e9, code)
    bases["totals"] = json.loads(result["stdout"])
    if not isinstance(bases["totals"], dict) or "refused" in bases["totals"]:
        raise SystemExit(f"setup failed: load_run of the signed run\n{result['stdout']}{result['stderr']}")
    return bases


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="run the attacks whose name contains one of these (comma-separated)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds each command may take")
    parser.add_argument("--memory-cap", type=float, default=3000.0, help="MB at which a command is killed")
    parser.add_argument("--json", type=Path, help="write every measurement here")
    parser.add_argument("--workdir", type=Path, help="scratch directory (default: a new temporary one)")
    parser.add_argument("--code", type=Path, default=ROOT, metavar="DIR",
                        help="checkout whose readers are measured (default: this one)")
    args = parser.parse_args(argv)
    code = args.code.resolve()
    if not (code / "fedvalue").is_dir() or not (code / "simulations").is_dir():
        parser.error(f"--code: expected a checkout of the project (fedvalue/, simulations/); got {args.code}")
    work = args.workdir or Path(tempfile.mkdtemp(prefix="attack-battery-"))
    work.mkdir(parents=True, exist_ok=True)
    listener = Listener()
    started = time.perf_counter()
    bases = make_bases(work, args.timeout, code)
    rows = []
    for spec in ATTACKS:
        if not any(part in spec.name for part in args.only.split(",")):
            continue
        row = run_case(spec, bases, work / "cases", listener, args.timeout, args.memory_cap, code)
        rows.append(row)
        flags = [k for k in ("hang", "traceback", "intact_and_harmful", "missed_forgery", "false_alarm") if row[k]]
        print(f"{spec.name:<55} {' '.join(f'{k}={v}' for k, v in row['verdicts'].items()):<48} "
              f"{','.join(flags) or '-'}  {'; '.join(row['harms'])[:160]}{row.get('forger_failed', '')[:160]}",
              flush=True)
    listener.close()
    counts = summarize(rows, time.perf_counter() - started)
    if args.json:
        command = "python -m tests.hostile.run_dirs.battery " + " ".join(sys.argv[1:] if argv is None else argv)
        args.json.write_text(json.dumps(kept_record(command, args.timeout, args.memory_cap, counts, rows), indent=1))
    if args.workdir is None:
        shutil.rmtree(work, ignore_errors=True)


def summarize(rows: list[dict], seconds: float) -> dict[str, int]:
    """Print the counts in total and per class; the totals."""
    counts = {key: sum(bool(r[key]) for r in rows) for key in
              ("intact_and_harmful", "harms", "hang", "traceback", "missed_forgery", "false_alarm")}
    failed = sum("forger_failed" in r for r in rows)
    print(f"\n{len(rows)} attacks in {seconds:.0f} s: intact and harmful "
          f"{counts['intact_and_harmful']}, reader harmed {counts['harms']}, hang {counts['hang']}, traceback "
          f"{counts['traceback']}, missed forgery {counts['missed_forgery']}, false alarm {counts['false_alarm']}"
          + (f"; {failed} not forged on these files (forger failed)" if failed else ""))
    kinds = sorted({r["kind"] for r in rows}, key=[r["kind"] for r in rows].index)
    for kind in kinds:
        mine = [r for r in rows if r["kind"] == kind]
        print(f"  {kind:<36} {len(mine):>2} attacks: harmed {sum(bool(r['harms']) for r in mine)}, hang "
              f"{sum(r['hang'] for r in mine)}, traceback {sum(r['traceback'] for r in mine)}, missed "
              f"{sum(r['missed_forgery'] for r in mine)}")
    return counts


if __name__ == "__main__":
    main()
