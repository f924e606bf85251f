"""One round's recomputation compares typed rows: the rows a round booked, read back as LedgerRow
and RoundRow, against those its record gives again; numbers to the tolerance, the rest exactly."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from fedvalue.audit.round import recompute_books, round_problems
from fedvalue.rounds.booking import BookedRound
from fedvalue.run.archive import RoundRecord
from fedvalue.run.ledger_reader import read_tables
from fedvalue.run.ledger_tables import LedgerWriter
from fedvalue.run.settings import RoundSettings
from fedvalue.schema import ClientEntry
from fedvalue.valuation.ads import AdsSettings

TARGET = np.array([1.0, -2.0, 0.5])


def utility(arrays) -> float:
    """U(A) = −‖w − target‖²: a coalition's aggregate scored in closed form."""
    return -float(np.sum((arrays["w"] - TARGET) ** 2))


def record() -> RoundRecord:
    """Round 1 of a FedAvg run: three clients valued by exact ADS and LOO, one failed."""
    replies = {c: {"w": np.array([0.2 * c, -0.5 * c, 0.1])} for c in (1, 2, 3)}
    entries = [ClientEntry(c, "ok", float(c), c) for c in (1, 2, 3)]
    entries.append(ClientEntry(4, "failed", None, None, "=timed out"))
    return RoundRecord(round=1, start_arrays={"w": np.zeros(3)}, entries=entries, replies=replies, accepted=[1, 2, 3],
                       settings=RoundSettings(methods=("ads", "loo"), valuation=AdsSettings(method="exact"), seed=3,
                                              strategy="FedAvg"))


@pytest.fixture(scope="module")
def booked(tmp_path_factory) -> BookedRound:
    """The round's books as a run writes them and a reader reads them back, typed."""
    books = recompute_books(record(), utility)[0]
    run_dir = tmp_path_factory.mktemp("run")
    LedgerWriter(run_dir, config={"seed": 3}).write_round(books.round_row, books.ledger_rows)
    tables = read_tables(run_dir)
    return BookedRound(tables.round_rows()[0], tables.rows())


def problems(booked: BookedRound, tolerance: float = 1e-9) -> list[str]:
    return round_problems(record(), utility, booked, tolerance, next_start=None)[0]


def test_books_read_back_from_the_files_equal_their_recomputation(booked):
    assert booked.round_row.num_unaggregatable == 0 and booked.ledger_rows[-1].reason == "'=timed out"
    assert problems(booked) == []


@pytest.mark.parametrize(("change", "finding"), [
    (dict(num_clients=5), "round 1 num_clients: booked '5' in rounds.csv; the saved arrays give '4'"),
    (dict(clients="2 1 3 4"), "round 1 clients: booked '2 1 3 4'"),
    (dict(ads_method="ads-mc"), "round 1 ads_method: booked 'ads-mc'"),
    (dict(num_unaggregatable=None), "round 1 num_unaggregatable: booked '' in rounds.csv; the saved arrays give '0'"),
    (dict(num_evaluations=7), "round 1 num_evaluations: booked '7'"),
    (dict(efficiency_gap=1e-3), "round 1 efficiency_gap: booked '0.001'"),
])
def test_a_changed_round_row_cell_is_named(booked, change, finding):
    found = problems(BookedRound(replace(booked.round_row, **change), booked.ledger_rows))
    assert any(finding in p for p in found), found


def test_numbers_are_compared_to_the_tolerance_and_a_timing_not_at_all(booked):
    row = booked.round_row
    near = replace(row, utility_after=row.utility_after * (1 + 1e-12), valuation_seconds=99.0)
    assert problems(BookedRound(near, booked.ledger_rows)) == []
    far = replace(row, utility_after=row.utility_after + 1e-3)
    assert any("round 1 utility_after: booked" in p for p in problems(BookedRound(far, booked.ledger_rows)))


def test_a_changed_ledger_cell_is_named_by_its_row(booked):
    rows = list(booked.ledger_rows)
    first = rows[0]
    rows[0] = replace(first, value=first.value + 1e-3, num_examples=first.num_examples + 1)
    rows[-1] = replace(rows[-1], reason="other")
    found = problems(BookedRound(booked.round_row, rows))
    where = f"round 1 {first.method} of client {first.client_id}"
    assert any(p.startswith(f"{where}: value is booked") for p in found), found
    assert any(p.startswith(f"{where}: num_examples is booked '{first.num_examples + 1}'") for p in found), found
    assert any("its reason is booked 'other'; the record gives \"'=timed out\"" in p for p in found), found
    assert any("the books lack rows" in p for p in problems(BookedRound(booked.round_row, rows[1:])))
