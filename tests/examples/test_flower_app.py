"""examples/flower_app: Flower's PyTorch app template with fedvalue added through the mod and the
wrapper. In the default suite its ServerApp and ClientApp run in this process (an in-process grid
that answers as the engine does, real torch training) and ``fedvalue audit`` (the CLI's own entry)
says intact with ``--utility``, not verifiable without it or with another utility; ``-m slow``
runs it as a user does, ``flwr run .`` on Flower's default federation, then ``fedvalue audit``
in a fresh interpreter."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

import pytest
from flwr.app import Context, RecordDict

from fedvalue.analysis.run_summary import load_run
from fedvalue.run.seals import Verifier, generate_keypair
from simulations.cli.main import main as fedvalue_cli
from tests.simulations.experiments.noisy_clients.flower_processes import (
    BIN,
    flower_env,
    free_port,
    processes_with_home,
    stop_processes_with_home,
)
from tests.strategies.harness.clientapp_grid import EngineLikeGrid
from tests.strategies.harness.inprocess import set_server_identity

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "examples" / "flower_app"
UTILITY = "fedvalue_app.task:held_out_utility"
APP_CONFIG = tomllib.loads((APP / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
NUM_NODES = 3


class Logged(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture(scope="module")
def app_grid_run(tmp_path_factory) -> tuple[Path, EngineLikeGrid, list[str], Path]:
    """The template app's two apps once, in this process: 3 nodes, 2 rounds, 2 clients a round,
    signed with a fresh key named in the run config; (run directory, the grid that carried its
    messages, the lines Flower's logger took, the public key)."""
    base = tmp_path_factory.mktemp("flower-app")
    run_dir, private, public = base / "run", base / "key.pem", base / "key.pub"
    generate_keypair(private, public)
    logged = Logged()
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(APP))
        from fedvalue_app.client_app import app as client_app
        from fedvalue_app.server_app import app as server_app

        set_server_identity()
        run_config = {**APP_CONFIG, "run-dir": str(run_dir), "local-epochs": 1,  # the cheapest round
                      "sign-key": str(private)}
        grid = EngineLikeGrid(client_app, {701 + 13 * k: k for k in range(NUM_NODES)}, run_config)
        logging.getLogger("flwr").addHandler(logged)
        try:
            server_app(grid, Context(run_id=5, node_id=0, node_config={}, state=RecordDict(), run_config=run_config))
        finally:
            logging.getLogger("flwr").removeHandler(logged)
    return run_dir, grid, logged.lines, public


@pytest.fixture(scope="module")
def app_run(app_grid_run) -> Path:
    return app_grid_run[0]


def audit(run_dir: Path, *options: str, capsys, monkeypatch) -> tuple[int, str]:
    """``fedvalue audit`` through the CLI's entry, from the app's directory (where a user types it)."""
    monkeypatch.chdir(APP)
    code = fedvalue_cli(["audit", str(run_dir), *options])
    printed = capsys.readouterr()
    return code, printed.out + printed.err


def test_the_template_app_books_every_sampled_client_by_partition(app_run):
    run = load_run(app_run)
    assert list(run.rounds["round"]) == [1, 2]
    ads = run.ledger[run.ledger["method"] == "ads"]
    assert (ads.groupby("round").size() == APP_CONFIG["clients-per-round"]).all() and set(ads["status"]) == {"ok"}
    assert set(ads["client_id"].astype(int)) <= set(range(NUM_NODES))
    assert run.config["utility_reference"]["reference"] == UTILITY
    assert run.config["utility_reference"]["held_out_digest"].startswith("sha256:") and run.config["platform"]


def test_a_rounds_client_updates_are_read_through_the_public_face(app_run):
    """``fedvalue.ledger.round_updates``: what each client sent in a round, as Δ_i = w_i − A_{t−1},
    from the round's saved record (``fedvalue.ledger.read_round``)."""
    from fedvalue.ledger import read_round, round_updates

    booked = load_run(app_run).ledger
    for t in (1, 2):
        record, updates = read_round(app_run, t), round_updates(app_run, t)
        sampled = booked.loc[(booked["round"] == t) & (booked["method"] == "ads"), "client_id"].astype(int)
        assert sorted(updates) == sorted(sampled) and len(updates) == APP_CONFIG["clients-per-round"]
        for client, update in updates.items():
            assert set(update) == set(record.start_arrays) and any(abs(u).max() > 0 for u in update.values())
            for key, delta in update.items():
                assert (delta == record.replies[client][key] - record.start_arrays[key]).all()
    with pytest.raises(FileNotFoundError, match=r"server_round: expected a round with a saved record in .* \(\[1, 2\]\); got 3"):
        round_updates(app_run, 3)


def test_run_json_keeps_the_apps_run_config(app_grid_run):
    """The template passes ``RunSettings(run_config=dict(context.run_config))``: every key of its
    ``[tool.flwr.app.config]``, with the values this run was given."""
    run = load_run(app_grid_run[0])
    assert {key: run.config[key] for key in APP_CONFIG} == {**APP_CONFIG, "run-dir": str(app_grid_run[0]),
                                                            "local-epochs": 1, "sign-key": run.config["sign-key"]}
    assert run.config["sign-key"].endswith("key.pem")


def test_a_run_signed_from_the_run_config_names_its_key_at_the_start_and_audits_intact(app_grid_run, capsys,
                                                                                       monkeypatch):
    run_dir, _, lines, public = app_grid_run
    fingerprint = Verifier.from_file(public).fingerprint
    started = [line for line in lines if line.startswith("fedvalue: valuing FedAvg's clients")]
    assert started == [f"fedvalue: valuing FedAvg's clients by ['ads', 'loo'] into {run_dir}, signed by key "
                       f"{fingerprint} (ecdsa-p256-sha256)"], started
    assert (run_dir / "model.sig").is_file()
    code, printed = audit(run_dir, "--utility", UTILITY, "--public-key", str(public), capsys=capsys,
                          monkeypatch=monkeypatch)
    assert code == 0 and f"signed by key {fingerprint} (verified with the given public key)" in printed, printed


def test_no_node_answers_with_an_error(app_grid_run):
    """The mod's query handler lets Flower hand the server's queries to the mod: no ClientApp
    raises (the engine would log each as an ERROR traceback), and no query is asked twice."""
    grid = app_grid_run[1]
    assert grid.errors == []
    queries = [m for m in grid.sent if m.content.config_records.get("config", {}).get("fedvalue-query")]
    assert queries and {str(m.metadata.message_type) for m in queries} == {"query"}


def test_the_cli_audit_says_intact_given_the_utility(app_run, capsys, monkeypatch):
    code, printed = audit(app_run, "--utility", UTILITY, capsys=capsys, monkeypatch=monkeypatch)
    assert code == 0 and printed.rstrip().endswith("intact"), printed
    assert "NOT VERIFIABLE" not in printed


def test_the_cli_imports_nothing_a_run_names_unless_told(app_run, capsys, monkeypatch):
    code, printed = audit(app_run, capsys=capsys, monkeypatch=monkeypatch)
    assert code == 1 and f"NOT VERIFIABLE: values: not recomputed (run.json names the utility '{UTILITY}'" in printed
    assert f"give --utility {UTILITY} (or --trust-run-utility)" in printed
    code, printed = audit(app_run, "--trust-run-utility", capsys=capsys, monkeypatch=monkeypatch)
    assert code == 0 and printed.rstrip().endswith("intact"), printed


def test_the_report_reads_an_own_apps_run_and_leaves_out_columns_without_data(app_run, capsys):
    """``fedvalue report`` of a ValuingStrategy's run (its help says it takes one): no ``noisy``
    column of ``<NA>`` for a run without ground truth."""
    assert fedvalue_cli(["report", str(app_run)]) == 0
    printed = capsys.readouterr().out
    header = printed.splitlines()[0].split()
    assert header[:2] == ["total_ads", "total_loo"] and "noisy" not in header and "<NA>" not in printed, printed
    with pytest.raises(SystemExit):
        fedvalue_cli(["report", "--help"])
    assert "by a ValuingStrategy in your own app" in " ".join(capsys.readouterr().out.split())


def test_a_missing_or_mismatched_utility_is_not_verifiable_with_the_reason(app_run, capsys, monkeypatch, tmp_path):
    (tmp_path / "other_data.py").write_text(
        "from fedvalue_app.task import HELD_OUT, Net, _digits\n"
        "from fedvalue.utilities import TorchModelUtility\n"
        "def utility():\n"
        "    images, labels = _digits()\n"
        "    return TorchModelUtility(Net(), images[:HELD_OUT], labels[:HELD_OUT])  # the clients' images\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    code, printed = audit(app_run, "--utility", "other_data:utility", capsys=capsys, monkeypatch=monkeypatch)
    assert code == 1 and "NOT VERIFIABLE: values: not recomputed (the utility scores held-out data with digest" in printed
    code, printed = audit(app_run, "--utility", "no_such_module:utility", capsys=capsys, monkeypatch=monkeypatch)
    assert code == 1 and "utility 'no_such_module:utility': cannot import it (ModuleNotFoundError" in printed
    code, printed = audit(app_run, "--utility", "fedvalue_app.task:held_out_utilty", capsys=capsys,
                          monkeypatch=monkeypatch)  # a misspelled callable
    assert code == 1 and ("utility 'fedvalue_app.task:held_out_utilty': fedvalue_app.task imports, but has no "
                          "'held_out_utilty'; did you mean 'held_out_utility'?") in printed, printed
    assert "cannot import it" not in printed
    code, printed = audit(app_run, "--utility", "not a reference", capsys=capsys, monkeypatch=monkeypatch)
    assert code == 2 and printed.strip() == ("fedvalue: error: --utility: expected an importable 'module:callable' "
                                             "(e.g. 'my_app.task:held_out_utility', a function of no arguments "
                                             "returning U); got 'not a reference'."), printed
    assert "Traceback" not in printed


@pytest.mark.slow
def test_flwr_run_of_the_template_app_then_the_cli_audit_says_intact(tmp_path):
    """As a user runs it: ``flwr run .`` in the app's directory on Flower's default federation
    (a local SuperLink Flower starts itself, 2 simulated SuperNodes), every process it leaves
    stopped by PID; then ``fedvalue audit`` in a fresh interpreter."""
    env = {**flower_env(tmp_path), "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(free_port())}
    run_dir = tmp_path / "books"
    try:
        result = subprocess.run([str(BIN / "flwr"), "run", ".", "--stream", "--run-config", f"run-dir='{run_dir}'"],
                                cwd=APP, env=env, capture_output=True, text=True, timeout=900)
    finally:
        killed = stop_processes_with_home(env["FLWR_HOME"])
    printed = result.stdout + result.stderr
    assert (run_dir / "rounds.csv").exists(), printed[-3000:]
    assert f"fedvalue: round 2: 2 of 2 sampled clients valued, into {run_dir}" in printed, printed[-3000:]
    assert "fraction_evaluate" not in printed  # the template's settings make Flower warn about nothing
    errors = [line for line in printed.splitlines() if line.lstrip("\x1b[0123456789;m").startswith("ERROR")]
    assert errors == [], printed[-3000:]  # the query handler: no node refuses the server's queries
    assert not killed and not processes_with_home(env["FLWR_HOME"])
    audited = subprocess.run([sys.executable, "-m", "simulations.cli", "audit", str(run_dir), "--utility", UTILITY],
                             cwd=APP, capture_output=True, text=True, timeout=600)
    assert audited.returncode == 0 and audited.stdout.rstrip().endswith("intact"), audited.stdout + audited.stderr
