"""docs/flower.md's deployment recipe, as a user pastes it: a SuperLink and three SuperNodes on
loopback, ``flwr run . loopback``, every process stopped by its PID, then ``fedvalue audit``.

The fast test reads the recipe: it waits for the SuperLink to listen before ``flwr run`` (without
the wait ``flwr run`` exits 1 with ``Connection to the SuperLink is unavailable``) and says why.
The slow test runs the recipe's shell lines with bash, in a home of its own (``~/.flwr/config.toml``
written from the recipe's TOML block), its ports moved to free ones (the only change), and checks
that it ran, the books audit intact and no process it started is left."""

from __future__ import annotations

import re
import socket
import subprocess

import pytest

from tests.simulations.experiments.noisy_clients.flower_processes import (
    PROJECT,
    flower_env,
    processes_with_home,
    stop_processes_with_home,
)

DOCS = PROJECT / "docs" / "flower.md"
SECTION = "## Deployment: a SuperLink and SuperNodes as processes"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def recipe() -> tuple[str, str, str]:
    """(the federation's TOML, the shell lines, the prose) of the docs' deployment section."""
    text = DOCS.read_text()
    section = text[text.index(SECTION):]
    section = section[:section.index("\n## ", len(SECTION))]
    blocks = FENCE.findall(section)
    (toml,) = [code for kind, code in blocks if kind == "toml"]
    (shell,) = [code for kind, code in blocks if kind == ""]
    return toml, shell, FENCE.sub("", section)


def test_the_recipe_waits_for_the_superlink_before_flwr_run_and_says_why():
    _, shell, prose = recipe()
    lines = shell.splitlines()
    started = next(k for k, line in enumerate(lines) if line.startswith("flower-superlink "))
    waited = next(k for k, line in enumerate(lines) if "http://127.0.0.1:9000/health" in line)
    submitted = next(k for k, line in enumerate(lines) if line.startswith("flwr run "))
    assert started < waited < submitted and "break" in lines[waited]
    assert "Connection to the SuperLink is unavailable" in " ".join(prose.split())
    assert "pkill" not in shell and "killall" not in shell and "ray stop" not in shell  # by PID only


def _free_ports(count: int, start: int = 20000) -> int:
    """The first of ``count`` consecutive ports from ``start`` on that nothing listens on."""
    for base in range(start, 60000, 97):
        sockets = []
        try:
            for port in range(base, base + count):
                sock = socket.socket()
                sockets.append(sock)
                sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise RuntimeError("no free ports")


@pytest.mark.slow
def test_the_deployment_recipe_runs_as_written_and_stops_every_process_it_started(tmp_path):
    toml, shell, _ = recipe()
    superlink = _free_ports(1)
    supernodes = _free_ports(3, start=superlink + 1)
    moved = {"9000": str(superlink), "9100": str(supernodes)}
    shell, toml = (re.sub(r"\b(9000|9100)\b", lambda m: moved[m.group(1)], code) for code in (shell, toml))
    env = flower_env(tmp_path)
    (tmp_path / ".flwr").mkdir(parents=True, exist_ok=True)
    (tmp_path / ".flwr" / "config.toml").write_text(toml)  # the recipe's ~/.flwr/config.toml
    try:
        done = subprocess.run(["bash", "-c", shell], cwd=PROJECT, env=env, capture_output=True, text=True,
                              timeout=1500)
    finally:
        left = stop_processes_with_home(env["FLWR_HOME"])  # only what the recipe failed to stop
    printed = done.stdout + done.stderr
    assert "Connection to the SuperLink is unavailable" not in printed, printed[-3000:]
    assert (tmp_path / "fedvalue-runs" / "deployed" / "ledger.csv").exists(), printed[-3000:]
    assert done.returncode == 0 and done.stdout.rstrip().endswith("intact"), printed[-3000:]
    assert not left and not processes_with_home(env["FLWR_HOME"]), left
