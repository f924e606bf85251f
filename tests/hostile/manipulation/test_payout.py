"""What each client is paid from the books: the rule by hand, and the command line's payout.csv."""

from __future__ import annotations

import pandas as pd
import pytest

from fedvalue.analysis.payout import PAYOUT_COLUMNS, paid_share, payments, payout_table


def test_share_of_positive_value_and_equal_payments_by_hand():
    totals = pd.Series({"a": 0.3, "b": 0.1, "c": -0.2, "d": 0.0})
    assert payments(totals, 100.0).to_dict() == pytest.approx({"a": 75.0, "b": 25.0, "c": 0.0, "d": 0.0})
    assert payments(totals, 100.0, floor=0.15).to_dict() == pytest.approx({"a": 100.0, "b": 0, "c": 0, "d": 0})
    assert payments(totals, 90.0, rule="equal").to_dict() == pytest.approx({"a": 45.0, "b": 45.0, "c": 0, "d": 0})
    assert payments(pd.Series({"a": -1.0}), 10.0).sum() == 0.0  # nobody clears the floor: nothing is spent
    assert paid_share(totals, ["a", "c"]) == pytest.approx(0.75)
    with pytest.raises(ValueError, match="rule: expected one of"):
        payments(totals, 1.0, rule="rank")
    with pytest.raises(ValueError, match="budget: expected a finite number ≥ 0"):
        payments(totals, -1.0)


def test_the_table_states_its_rule_on_every_row_and_names_an_unknown_method():
    ledger = pd.DataFrame({"round": [1, 1, 2, 2, 2], "client_id": ["0", "1", "0", "1", "1"],
                           "method": ["ads", "ads", "ads", "ads", "loo"], "value": [0.2, 0.1, 0.1, -0.3, 5.0],
                           "status": ["ok", "ok", "ok", "ok", "ok"]})
    table = payout_table(ledger, 10.0, floor=0.0)
    assert list(table.columns) == list(PAYOUT_COLUMNS)
    assert table.set_index("client_id")["payment"].to_dict() == pytest.approx({"0": 10.0, "1": 0.0})
    assert set(table["rule"]) == {"share-of-positive"} and set(table["floor"]) == {0.0}
    with pytest.raises(ValueError, match="method: expected a method the ledger books"):
        payout_table(ledger, 10.0, method="ads_defended")
