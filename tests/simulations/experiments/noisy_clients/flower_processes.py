"""Flower processes for the ``flwr run`` tests: a SuperLink (simulation runtime or deployment)
and SuperNodes, each started here and stopped by PID with everything it started; Flower's
home is a temporary directory so nothing outside the test is read or written."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[4]
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def flower_env(home: Path) -> dict[str, str]:
    """The environment of every Flower process: Flower's home (and HOME) under ``home``, no
    dependency installation, no telemetry, this interpreter's scripts first on PATH."""
    return {**os.environ, "FLWR_HOME": str(home / ".flwr"), "HOME": str(home),
            "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1", "FLWR_TELEMETRY_ENABLED": "0",
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}


def _children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(parent, []).append(int(entry.name))
    return children


def descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (Flower starts SuperExecs in sessions of their own)."""
    children, found, todo = _children(), set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


class FlowerProcesses:
    """Processes started for one test; :meth:`stop_all` ends each by PID, children first seen."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.env = flower_env(home)
        self.started: list[subprocess.Popen] = []
        self.seen: set[int] = set()
        self.logs = home / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)

    def start(self, name: str, *args: str) -> subprocess.Popen:
        log = open(self.logs / f"{name}.log", "wb")  # noqa: SIM115 (closed with the process)
        process = subprocess.Popen([str(BIN / args[0]), *args[1:]], env=self.env, stdout=log,
                                   stderr=subprocess.STDOUT, cwd=self.home)
        self.started.append(process)
        return process

    def superlink(self, port: int, *, simulation: bool) -> subprocess.Popen:
        process = self.start("superlink", "flower-superlink", "--insecure", *(["--simulation"] if simulation else []),
                             "--isolation", "subprocess", "--host", "127.0.0.1", "--port", str(port),
                             "--database", str(self.home / "state.db"))
        wait_healthy(port, process, self.logs / "superlink.log")
        return process

    def supernode(self, superlink_port: int, partition_id: int, num_partitions: int) -> subprocess.Popen:
        return self.start(f"supernode-{partition_id}", "flower-supernode", "--insecure", "--superlink",
                          f"127.0.0.1:{superlink_port}", "--isolation", "subprocess", "--port", str(free_port()),
                          "--node-config", f"partition-id={partition_id} num-partitions={num_partitions}")

    def remember_children(self) -> None:
        for process in self.started:
            self.seen |= descendants(process.pid)

    def stop_all(self) -> list[int]:
        """SIGTERM the processes Flower started below ours (a SuperNode leaves its SuperExec
        running when it stops), then ours, newest first; returns the PIDs that survived
        SIGTERM and had to be killed."""
        self.remember_children()
        for pid in self.seen:
            if alive(pid):
                os.kill(pid, signal.SIGTERM)
        for process in reversed(self.started):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.started:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        deadline = time.monotonic() + 20
        while any(alive(pid) for pid in self.seen) and time.monotonic() < deadline:
            time.sleep(0.2)
        killed = [pid for pid in self.seen if alive(pid)]
        for pid in killed:
            os.kill(pid, signal.SIGKILL)
        return killed


def wait_healthy(port: int, process: subprocess.Popen, log: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"flower-superlink exited with {process.returncode}: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"flower-superlink on port {port} not healthy after {timeout}s: {log.read_text()[-2000:]}")


def write_federation(home: Path, name: str, port: int, *, num_supernodes: int | None = None) -> None:
    """A SuperLink connection in Flower's config (``$FLWR_HOME/config.toml``)."""
    lines = ["[superlink]", f'default = "{name}"', "", f"[superlink.{name}]", f'address = "127.0.0.1:{port}"',
             "insecure = true"]
    if num_supernodes is not None:
        lines += [f"options.num-supernodes = {num_supernodes}", "options.backend.client-resources.num-cpus = 1"]
    (home / ".flwr").mkdir(parents=True, exist_ok=True)
    (home / ".flwr" / "config.toml").write_text("\n".join(lines) + "\n", encoding="utf-8")


def flwr_run(processes: FlowerProcesses, federation: str, run_config: str,
             timeout: float = 900) -> subprocess.CompletedProcess:
    """``flwr run . FEDERATION --stream --run-config ...`` from the project directory; while it
    runs, the processes Flower starts are noted (an orphaned one would otherwise be missed)."""
    with open(processes.logs / "flwr-run.log", "w+", encoding="utf-8") as log:
        command = subprocess.Popen([str(BIN / "flwr"), "run", ".", federation, "--stream", "--run-config", run_config],
                                   cwd=PROJECT, env=processes.env, stdout=log, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + timeout
        while command.poll() is None:
            processes.remember_children()
            if time.monotonic() > deadline:
                command.kill()
                command.wait()
                break
            time.sleep(1.0)
        log.seek(0)
        return subprocess.CompletedProcess(command.args, command.returncode, log.read(), "")


def processes_with_home(flwr_home: str) -> list[int]:
    """PIDs of the processes whose environment sets ``FLWR_HOME`` to ``flwr_home``: everything a
    ``flwr`` command started for one test (the SuperLink ``flwr run`` starts for the default
    federation detaches from it, so it is found by its environment, not by its parent)."""
    wanted = f"FLWR_HOME={flwr_home}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                environ = (entry / "environ").read_bytes()
            except OSError:
                continue
            if wanted in environ.split(b"\0"):
                found.append(int(entry.name))
    return found


def stop_processes_with_home(flwr_home: str) -> list[int]:
    """SIGTERM every process of :func:`processes_with_home`, by PID; returns those that had to be
    killed after 20 s."""
    pids = [pid for pid in processes_with_home(flwr_home) if alive(pid)]
    for pid in pids:
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 20
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    killed = [pid for pid in pids if alive(pid)]
    for pid in killed:
        os.kill(pid, signal.SIGKILL)
    return killed


@contextmanager
def flower_processes(home: Path):
    processes = FlowerProcesses(home)
    try:
        yield processes
    finally:
        left = processes.stop_all()
        assert not left, f"processes still running after SIGTERM (killed now): {left}"
