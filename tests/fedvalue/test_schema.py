"""Client ids as every reader compares and sorts them, and the ledger's named contract."""

from __future__ import annotations

import io

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fedvalue import schema
from fedvalue.analysis.run_summary import load_run
from fedvalue.schema import ROUND_COLUMNS, LedgerRow, Method, RoundRow, Status, client_key, client_sort_key

ids = st.one_of(st.integers(-10**6, 10**6), st.text(alphabet="abc-_ 0123456789", min_size=1, max_size=6))
#: Ids a CSV cell holds as written (no blanks: a blank cell reads as missing).
csv_ids = st.one_of(st.integers(-10**6, 10**6), st.text(alphabet="abc-_0123456789", min_size=1, max_size=6))


@given(st.integers(-10**12, 10**12))
def test_an_int_its_numpy_form_and_its_decimal_string_are_one_client(value):
    assert client_key(value) == client_key(np.int64(value)) == client_key(str(value)) == value
    assert client_sort_key(value) == client_sort_key(str(value)) == client_sort_key(np.int64(value))


@given(st.lists(ids, max_size=12))
def test_ids_sort_integers_numerically_then_the_rest_by_text(values):
    ordered = sorted(values, key=client_sort_key)
    ints = [client_key(v) for v in ordered if isinstance(client_key(v), int)]
    rest = [str(v) for v in ordered if not isinstance(client_key(v), int)]
    assert ints == sorted(ints) and rest == sorted(rest)
    assert ordered[:len(ints)] == [v for v in ordered if isinstance(client_key(v), int)]


@given(st.lists(csv_ids, min_size=1, max_size=12, unique_by=lambda v: client_key(v)))
def test_ids_read_back_from_a_csv_keep_their_identity_and_order(values):
    # The ledger is a CSV: pandas returns int ids as int64, mixed ids as strings.
    frame = pd.read_csv(io.StringIO(pd.DataFrame({"client_id": values}).to_csv(index=False)),
                        dtype={"client_id": object} if any(isinstance(v, str) for v in values) else None)
    back = list(frame["client_id"])
    assert [client_key(v) for v in back] == [client_key(v) for v in values]
    assert [client_key(v) for v in sorted(back, key=client_sort_key)] == \
        [client_key(v) for v in sorted(values, key=client_sort_key)]


def test_bools_and_other_ids_are_themselves():
    assert client_key(True) is True and client_key("edge-a") == "edge-a" and client_key(2.5) == 2.5


def test_the_contract_names_each_status_column_and_file_once():
    assert len(set(schema.CLIENT_STATUSES)) == len(schema.CLIENT_STATUSES) == 4
    assert set(schema.PROBLEM_STATUSES) < set(schema.CLIENT_STATUSES)
    assert len(set(schema.LEDGER_COLUMNS)) == len(schema.LEDGER_COLUMNS)
    assert len(set(schema.ROUND_COLUMNS)) == len(schema.ROUND_COLUMNS)
    assert schema.ROUND_COLUMNS[-1] == "hash"  # the chain link closes every round row


def test_every_named_method_is_a_member_and_compares_as_its_text():
    named = [*schema.VALUATION_METHODS, *schema.FLOW_METHODS, *schema.FAIRNESS_VALUATION_METHODS.values()]
    assert all(type(m) is Method for m in named) and set(named) < set(Method)
    # The enum's members are the one spelling: the schema keeps no alias of a member or of a status.
    aliases = [name for name, value in vars(schema).items()
               if not name.startswith("_") and isinstance(value, (Method, Status)) and name not in ("Method", "Status")]
    assert aliases == [], aliases
    assert [m for m in Method if m.startswith(schema.CLAIM_PREFIX)] == [Method.CLAIM_CAPPED, Method.CLAIM_JUMPED]
    assert Method.ADS == "ads" and {"ads": 1}[Method.ADS] == 1 and f"{Method.LOO}" == "loo"
    assert repr(list(schema.CLIENT_STATUSES)) == "['ok', 'failed', 'rejected', 'idle']"  # messages show the text


def test_every_method_and_status_a_real_run_writes_is_a_member_of_the_enums(signed_run):
    run_dir, _, _ = signed_run
    run = load_run(run_dir)
    assert set(run.ledger["method"]) == {Method.ADS, Method.LOO} and set(run.ledger["status"]) <= set(Status)
    rows = run.rows()
    assert len(rows) == len(run.ledger) and all(isinstance(row, LedgerRow) for row in rows)
    assert {type(row.status) for row in rows} == {Status} and {Method(row.method) for row in rows} <= set(Method)
    # No stand-ins read back: a valued row has its numbers, any other row None where nothing is known.
    assert all(row.reason is None and row.value is not None for row in rows if row.status == Status.OK)


def test_a_round_row_is_typed_and_names_the_field_it_refuses():
    assert tuple(RoundRow.__dataclass_fields__) == ROUND_COLUMNS[:-1]
    row = RoundRow(round=np.int64(2), clients="0 1", num_clients=2.0, num_failed=0, utility_before=np.float64(0.5),
                   utility_after=float("nan"), utility_realized=pd.NA, ads_method="")
    assert (row.round, row.num_clients, row.utility_after, row.utility_realized, row.ads_method) == (2, 2, None, None,
                                                                                                     None)
    assert type(row.round) is int and type(row.utility_before) is float
    assert row["num_clients"] == 2 and row.as_dict()["num_unaggregatable"] is None  # dict readers keep working
    with pytest.raises(KeyError):
        row["hash"]
    with pytest.raises(ValueError, match=r"round row: num_failed: expected a whole number; got 0.5"):
        RoundRow(round=1, clients="0", num_clients=1, num_failed=0.5, utility_before=0.0, utility_realized=0.0)
    with pytest.raises(ValueError, match=r"round row: clients: expected the clients' ids .* got tuple"):
        RoundRow(round=1, clients=(0,), num_clients=1, num_failed=0, utility_before=0.0, utility_realized=0.0)
    with pytest.raises(ValueError, match=r"round row: expected the columns .*got no \['utility_realized'\]"):
        RoundRow.from_mapping({"round": 1, "clients": "0", "num_clients": 1, "num_failed": 0, "utility_before": 0.0})
    with pytest.raises(ValueError, match=r"got unknown \['weight'\]"):
        RoundRow.from_mapping({**row.as_dict(), "weight": 2.0})
    assert RoundRow.from_mapping({**row.as_dict(), "hash": "0" * 64}) == row  # the chain link is the writer's
