"""``fedvalue run --resume DIR --sign-key K`` verifies DIR (genesis, chain, the seal's
signature) before it reads, validates or probes any setting of its run.json.

A forger gives DIR a run.json naming a ``ray_address`` (a socket this test listens on): with
the chain recomputed and the seals rewritten (no key: unsigned), and without. The resume
must refuse the directory and never connect to the address.
"""

from __future__ import annotations

import csv
import json
import socket
from pathlib import Path

import numpy as np
import pytest

from fedvalue.run.ledger_tables import chain_hash, csv_lines, genesis_hash
from fedvalue.run.run_info import config_json
from fedvalue.run.writer import RunBooks
from fedvalue.run.seals import Signer, generate_keypair
from fedvalue.schema import ROUND_COLUMNS, LedgerRow, RoundRow
from simulations.cli.main import main
from simulations.experiments.noisy_clients.noisy_clients import NoisyClientsConfig


@pytest.fixture
def listener():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.setblocking(False)
    yield server
    server.close()


def _connections(server: socket.socket) -> int:
    count = 0
    while True:
        try:
            connection, _ = server.accept()
        except BlockingIOError:
            return count
        connection.close()
        count += 1


@pytest.fixture
def signed_run(tmp_path) -> tuple[Path, Path]:
    """A signed noisy-clients run directory killed after round 1 committed (real files)."""
    generate_keypair(tmp_path / "k.pem", tmp_path / "k.pub")
    config = {"simulation": "noisy-clients", **NoisyClientsConfig(rounds=3).as_dict()}
    books = RunBooks(tmp_path / "run", config=config, signer=Signer.from_file(tmp_path / "k.pem"))
    ledger = [LedgerRow(round=1, client_id=c, method="ads", value=0.1 * c, stderr=None, num_examples=5, status="ok",
                        noisy=False) for c in (1, 2)]
    books.commit(1, RoundRow(round=1, clients="1 2", num_clients=2, num_failed=0, utility_before=0.5,
                             utility_after=0.6, utility_realized=0.6, num_evaluations=4), ledger,
                 realized={"w": np.ones(2)}, state=({"$dict": []}, {}))
    books.release()
    return tmp_path / "run", tmp_path / "k.pem"


def _name_address(run_dir: Path, port: int, *, rechain: bool) -> None:
    """The forger's run.json (``ray_address`` set); with ``rechain``, rounds.csv's hashes and the
    seals recomputed from it (unsigned: no key)."""
    config = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(config_json({**config, "ray_address": f"127.0.0.1:{port}"}))
    if not rechain:
        return
    with open(run_dir / "rounds.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    ledger_lines = (run_dir / "ledger.csv").read_text().splitlines(keepends=True)[1:]
    previous = genesis_hash(run_dir)
    for row in rows:
        mine = [line for line in ledger_lines if line.split(",", 1)[0] == row["round"]]
        row["hash"] = previous = chain_hash(previous, mine, csv_lines(ROUND_COLUMNS[:-1], [row])[0])
    (run_dir / "rounds.csv").write_text(",".join(ROUND_COLUMNS) + "\n" + "".join(csv_lines(ROUND_COLUMNS, rows)))
    seals = []
    for line in (run_dir / "seals.jsonl").read_text().splitlines():
        seal = {k: v for k, v in json.loads(line).items() if k not in ("signature", "key", "algorithm")}
        seals.append(json.dumps({**seal, "head": rows[seal["round"] - 1]["hash"]}, sort_keys=True) + "\n")
    (run_dir / "seals.jsonl").write_text("".join(seals))


@pytest.mark.parametrize("rechain, refusal", [
    (True, "has a round 1 seal not signed by the given key (it carries no signature)"),
    (False, "does not chain up to its checkpoint"),
])
def test_a_forged_run_json_is_refused_before_its_ray_address_is_probed(signed_run, listener, capsys, rechain,
                                                                       refusal):
    run_dir, key = signed_run
    _name_address(run_dir, listener.getsockname()[1], rechain=rechain)
    before = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
    for argv in (["run", "--resume", str(run_dir), "--sign-key", str(key), "--quiet"],
                 ["run", "noisy-clients", "--resume", str(run_dir), "--sign-key", str(key), "--quiet"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"fedvalue: error: --resume: the run in {run_dir} ") and refusal in err, err
        assert _connections(listener) == 0  # nothing was probed
    assert {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()} == before
