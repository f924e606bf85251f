"""The ledger writer: exact cells, the hash chain recomputed from the files, resume rules and
the parquet mirror, on small hand-made rounds."""

from __future__ import annotations

import csv
import json
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedvalue.analysis.run_summary import load_run
from fedvalue.run.ledger_tables import GENESIS_HASH, LedgerWriter, chain_hash, csv_lines, genesis_hash, spreadsheet_safe
from fedvalue.schema import LEDGER_COLUMNS, LEDGER_PARQUET_FILE, ROUND_COLUMNS, LedgerRow, Method, RoundRow, Status


def ledger_row(t, client, method, value, status="ok", noisy=False):
    return LedgerRow(round=t, client_id=client, method=method, value=value, stderr=0.0, num_examples=10,
                     status=status, noisy=noisy)


def round_row(t, clients):
    return RoundRow(round=t, clients=";".join(map(str, clients)), num_clients=len(clients), num_failed=0,
                    utility_before=0.5, utility_after=0.75, utility_realized=0.75, num_evaluations=4,
                    valuation_seconds=0.01, ads_method="exact", efficiency_gap=0.0, num_unaggregatable=0)


def write_two_rounds(run_dir, config=None):
    writer = LedgerWriter(run_dir, config={"seed": 0} if config is None else config)
    writer.write_round(round_row(1, [0, 1]), [ledger_row(1, 0, "ads", 0.125, noisy=True),
                                              ledger_row(1, 1, "ads", 0.125)])
    writer.write_round(round_row(2, [0, 1]), [ledger_row(2, 0, "ads", 0.3, noisy=True),
                                              ledger_row(2, 1, "ads", -0.05)])
    return writer


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_floats_are_written_in_their_shortest_round_trip_form(value):
    line = csv_lines(["v"], [{"v": value}])[0]
    assert float(line) == value and line == repr(float(value)) + "\n"


def test_missing_values_and_bools_have_one_spelling():
    assert csv_lines(["a", "b", "c", "d"], [{"a": None, "b": float("nan"), "c": True, "d": np.bool_(False)}]) == \
        [",,true,false\n"]


def test_the_chain_is_recomputable_from_the_files_alone(tmp_path):
    write_two_rounds(tmp_path)
    ledger = (tmp_path / "ledger.csv").read_text().splitlines(keepends=True)[1:]
    with open(tmp_path / "rounds.csv", newline="") as handle:
        rounds = list(csv.DictReader(handle))
    previous = genesis_hash(tmp_path)
    assert previous != GENESIS_HASH  # the chain starts from run.json's bytes
    for t, row in enumerate(rounds, start=1):
        lines = [line for line in ledger if line.startswith(f"{t},")]
        round_line = csv_lines(ROUND_COLUMNS[:-1], [{k: row[k] for k in ROUND_COLUMNS[:-1]}])[0]
        assert row["hash"] == chain_hash(previous, lines, round_line)
        previous = row["hash"]


def test_any_changed_line_changes_the_link():
    lines = ["1,0,ads,0.125\n", "1,1,ads,0.125\n"]
    head = chain_hash("a" * 64, lines, "1,0;1\n")
    assert chain_hash("a" * 64, ["1,0,ads,0.126\n", lines[1]], "1,0;1\n") != head
    assert chain_hash("a" * 64, lines[::-1], "1,0;1\n") != head
    assert chain_hash("b" * 64, lines, "1,0;1\n") != head
    assert chain_hash("a" * 64, lines, "1,0;2\n") != head


def test_rows_that_are_not_typed_rows_are_refused_before_anything_is_written(tmp_path):
    writer = LedgerWriter(tmp_path, config={"seed": 0})
    with pytest.raises(ValueError, match="status: expected one of"):
        writer.write_round(round_row(1, [0]), [ledger_row(1, 0, "ads", 1.0, status="paid")])
    with pytest.raises(TypeError, match=r"round_row: expected a fedvalue.schema.RoundRow .*got dict"):
        writer.write_round(round_row(1, [0]).as_dict(), [ledger_row(1, 0, "ads", 1.0)])
    with pytest.raises(TypeError, match=r"ledger_rows: expected fedvalue.schema.LedgerRow rows .*got dict at position 1"):
        writer.write_round(round_row(1, [0]), [ledger_row(1, 0, "ads", 1.0), ledger_row(1, 1, "ads", 1.0).as_dict()])
    assert not (tmp_path / "ledger.csv").exists() and not (tmp_path / "rounds.csv").exists()


def test_resume_keeps_the_chain_and_refuses_a_changed_configuration(tmp_path):
    write_two_rounds(tmp_path, config={"seed": 0, "rounds": 3})
    with pytest.raises(ValueError, match=r"resume: the run in .* was started with seed=0; got seed=1"):
        LedgerWriter(tmp_path, config={"seed": 1, "rounds": 3}, resume=True)
    with pytest.raises(ValueError, match="resume: expected a run directory holding run.json"):
        LedgerWriter(tmp_path / "elsewhere", resume=True)
    writer = LedgerWriter(tmp_path, config={"seed": 0, "rounds": 3}, resume=True)
    writer.write_round(round_row(3, [1]), [ledger_row(3, 1, "ads", 0.01)])
    fresh = tmp_path / "fresh"
    write_two_rounds(fresh, config={"seed": 0, "rounds": 3}).write_round(round_row(3, [1]), [ledger_row(3, 1, "ads", 0.01)])
    assert (tmp_path / "rounds.csv").read_bytes() == (fresh / "rounds.csv").read_bytes()


def test_the_parquet_mirror_and_the_run_read_back_equal_the_csv(tmp_path):
    writer = write_two_rounds(tmp_path)
    assert not (tmp_path / LEDGER_PARQUET_FILE).exists()  # written at the close (and at a resume), not each round
    writer.close(2)
    run = load_run(tmp_path)
    assert list(run.ledger.columns) == list(LEDGER_COLUMNS)
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / LEDGER_PARQUET_FILE), run.ledger)
    assert run.config == json.loads((tmp_path / "run.json").read_text()) == {"seed": 0}
    assert list(run.rounds["round"]) == [1, 2]


def test_a_directory_without_a_ledger_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="run_dir: expected a fedvalue run directory holding ledger.csv"):
        load_run(tmp_path)


# A row as any book may build it: a core method or a plug-in's own, every cell known or None.
ledger_rows = st.builds(
    LedgerRow,
    round=st.integers(1, 10**6),
    client_id=st.one_of(st.integers(-10**6, 10**6), st.text(alphabet="abc-_ 0123456789,\"", min_size=1, max_size=6)),
    method=st.one_of(st.sampled_from(Method), st.text(alphabet="abcxyz_", min_size=1, max_size=8)),
    value=st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False)),
    stderr=st.one_of(st.none(), st.floats(0.0, 1e300)),
    num_examples=st.one_of(st.none(), st.integers(0, 2**53)),
    status=st.sampled_from(Status),
    noisy=st.one_of(st.none(), st.booleans()),
    reason=st.one_of(st.none(), st.text(max_size=20)),
)


@settings(deadline=None)  # files written and read per example: time depends on the machine
@given(st.lists(ledger_rows, min_size=1, max_size=8, unique_by=lambda r: (str(r.client_id), str(r.method))))
def test_ledger_rows_round_trip_through_the_writer_and_load_run(rows):
    t = rows[0].round
    rows = [replace(row, round=t) for row in rows]
    with tempfile.TemporaryDirectory() as tmp:
        typed, mapped = Path(tmp, "typed"), Path(tmp, "mapped")
        LedgerWriter(typed, config={"seed": 0}).write_round(round_row(t, [0]), rows)
        # A row read from the mapping of its columns is the same row, written to the same bytes.
        LedgerWriter(mapped, config={"seed": 0}).write_round(
            RoundRow.from_mapping(round_row(t, [0]).as_dict()), [LedgerRow.from_mapping(row.as_dict()) for row in rows])
        assert (typed / "ledger.csv").read_bytes() == (mapped / "ledger.csv").read_bytes()
        assert (typed / "rounds.csv").read_bytes() == (mapped / "rounds.csv").read_bytes()
        back = load_run(typed).rows()
    # What comes back: the ids as the text the file holds, a reason as written (defused), None as None.
    assert back == [replace(row, client_id=str(row.client_id), reason=spreadsheet_safe(row.reason) or None)
                    for row in rows]
    assert all(type(row.status) is Status for row in back)


def test_a_row_is_typed_and_names_what_it_lacks():
    assert tuple(LedgerRow.__dataclass_fields__) == LEDGER_COLUMNS
    row = LedgerRow(1, 0, Method.ADS, float("nan"), np.float64("nan"), None, "ok", pd.NA, "")
    assert (row.value, row.stderr, row.noisy, row.reason, row.status) == (None, None, None, None, Status.OK)
    with pytest.raises(ValueError, match=r"status: expected one of \['ok', 'failed', 'rejected', 'idle'\]; got 'paid'"):
        LedgerRow(1, 0, "ads", 1.0, 0.0, 1, "paid")
    with pytest.raises(ValueError, match=r"ledger row: expected the columns .*got no \['stderr'\]"):
        LedgerRow.from_mapping({"round": 1, "client_id": 0, "method": "ads", "value": 1.0, "num_examples": 1,
                                "status": "ok"})
    with pytest.raises(ValueError, match=r"got unknown \['weight'\]"):
        LedgerRow.from_mapping({**row.as_dict(), "weight": 2.0})


def test_the_writer_joins_the_runs_noisy_clients_into_the_noisy_column(tmp_path):
    """The books come with ``noisy`` unknown; a writer given the run's ground truth writes each
    row's flag from it (overriding what the row says), one without it writes the rows as given."""
    rows = [ledger_row(1, 0, "ads", 0.125, noisy=None), ledger_row(1, 1, "ads", 0.125, noisy=True)]
    joined = LedgerWriter(tmp_path / "joined", noisy_clients={0})
    joined.write_round(round_row(1, [0, 1]), rows)
    as_given = LedgerWriter(tmp_path / "as-given")
    as_given.write_round(round_row(1, [0, 1]), rows)
    for run_dir, flags in (("joined", ["true", "false"]), ("as-given", ["", "true"])):
        with open(tmp_path / run_dir / "ledger.csv", newline="") as handle:
            assert [r["noisy"] for r in csv.DictReader(handle)] == flags
