"""The ledger's tables read back typed: rounds.csv rows as RoundRow (empty cells None, counts ints),
ledger rows as LedgerRow, and a row that is not one named by its round."""

from __future__ import annotations

import io

import pandas as pd
import pytest

from fedvalue.run.ledger_reader import ledger_rows_of, read_ledger_csv, read_rounds_csv, read_tables, round_rows_of
from fedvalue.run.ledger_tables import LedgerWriter
from fedvalue.schema import RoundRow

HEADER = ("round,clients,num_clients,num_failed,utility_before,utility_after,utility_realized,num_evaluations,"
          "valuation_seconds,ads_method,efficiency_gap,num_unaggregatable,hash\n")


def written_rows() -> list[dict]:
    """Two rounds as a live run books them: one aggregated by the weighted mean (no count of
    unaggregatable coalitions), one by a strategy's own code; the first valued nothing."""
    return [
        {"round": 1, "clients": "3 1", "num_clients": 2, "num_failed": 2, "utility_before": 0.5, "utility_after": None,
         "utility_realized": 0.5, "num_evaluations": 0, "valuation_seconds": 0.0, "ads_method": None,
         "efficiency_gap": None},
        {"round": 2, "clients": "1 3", "num_clients": 2, "num_failed": 0, "utility_before": 0.5, "utility_after": 0.75,
         "utility_realized": 0.7, "num_evaluations": 4, "valuation_seconds": 0.01, "ads_method": "ads-exact",
         "efficiency_gap": 5.551115123125783e-17, "num_unaggregatable": 1},
    ]


def test_rounds_read_back_as_the_typed_rows_that_were_written(tmp_path):
    writer = LedgerWriter(tmp_path, config={"seed": 0})
    for row in written_rows():
        writer.write_round(RoundRow.from_mapping(row), [])
    back = read_tables(tmp_path).round_rows()
    assert back == [RoundRow.from_mapping(row) for row in written_rows()]
    assert back[0].num_unaggregatable is None and back[0].ads_method is None and back[0].utility_after is None
    assert type(back[1].num_unaggregatable) is int and type(back[1].num_evaluations) is int


def test_a_round_whose_cells_are_not_a_round_rows_is_named():
    lines = "1,0 1,2,0,0.5,0.75,0.75,4.5,0.01,ads-exact,0.0,,h\n"
    with pytest.raises(ValueError, match=r"rounds.csv: the row of round 1: round row: num_evaluations: expected a "
                                         r"whole number; got 4.5"):
        round_rows_of(read_rounds_csv(io.StringIO(HEADER + lines)))
    lines = "1,0 1,2,0,0.5,0.75,0.75,4,0.01,ads-exact,0.0,two,h\n"
    with pytest.raises(ValueError, match=r"round 1: num_unaggregatable: expected a number; got 'two'"):
        round_rows_of(read_rounds_csv(io.StringIO(HEADER + lines)))


def test_a_ledger_row_with_a_count_that_is_not_whole_is_named_not_rounded():
    text = ("round,client_id,method,value,stderr,num_examples,status,noisy,reason\n"
            "1,7,ads,0.25,0.0,10,ok,false,\n1,8,ads,0.25,0.0,10.5,ok,false,\n")
    ledger = read_ledger_csv(io.StringIO(text))
    with pytest.raises(ValueError, match=r"ledger.csv: the row of round 1, client 8, method ads: num_examples: "
                                         r"expected a whole number; got 10.5"):
        ledger_rows_of(ledger)
    assert [row.num_examples for row in ledger_rows_of(ledger.iloc[:1])] == [10]
    with pytest.raises(ValueError, match=r"client 7, method ads: status: expected one of"):
        ledger_rows_of(ledger.iloc[:1].assign(status=pd.Series(["paid"])))
