"""What each client is paid from the books: the rule by hand, and the command line's payout.csv; a book the
defences do not vouch for (TracIn outflow) is refused without the opt-in, and paid with it, saying so; the book paid
by default; the figures UNDEFENDED quotes are the attack study's; and the audit recomputes payout.csv, reading it as
untrusted input."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedvalue.analysis.payout import (
    PAYOUT_COLUMNS,
    UNDEFENDED,
    check_payable,
    default_payout_method,
    paid_share,
    payments,
    payout_table,
)
from fedvalue.audit.checks import audit_run
from simulations.cli.main import main
from tests.fedvalue.analysis.test_report import write_books

DOC = Path(__file__).resolve().parents[3] / "docs" / "faults-and-audit.md"
RESULTS = DOC.parent / "results"
#: The attack study's table of TracIn outflow gains in docs/faults-and-audit.md, by its header.
OUTFLOW_TABLE = ("| data | strategy | attack | outflow | outflow, books | outflow, books + aggregation | LOO | "
                 "LOO, books | LOO, books + aggregation |")

LEDGER = pd.DataFrame({"round": [1, 1, 2, 2, 2], "client_id": ["0", "1", "0", "1", "1"],
                       "method": ["ads", "ads", "ads", "ads", "tracin_outflow"], "value": [0.2, 0.1, 0.1, -0.3, 5.0],
                       "status": ["ok", "ok", "ok", "ok", "ok"]})


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
    table = payout_table(ledger, 10.0, floor=0.0, allow_undefended=True)
    assert list(table.columns) == list(PAYOUT_COLUMNS)
    assert table.set_index("client_id")["payment"].to_dict() == pytest.approx({"0": 10.0, "1": 0.0})
    assert set(table["rule"]) == {"share-of-positive"} and set(table["floor"]) == {0.0}
    with pytest.raises(ValueError, match="method: expected a method the ledger books"):
        payout_table(ledger, 10.0, method="ads_defended", allow_undefended=True)


def test_an_undefended_book_is_refused_without_the_opt_in_and_its_rows_say_so_with_it():
    """Every book a payout can be made from is one identities buy (the adaptive sweep), so every one is refused
    without the opt-in, the default included, and paid with it, saying so on every row."""
    assert set(UNDEFENDED) == {"ads", "ads_defended", "loo", "loo_defended", "tracin_outflow",
                               "tracin_outflow_defended", "ads_fixed_second_order", "ads_fixed_second_order_defended"}
    for method in UNDEFENDED:
        with pytest.raises(ValueError, match=rf"^method: {method} is not paid by default: .*identit.*"
                                             r"docs/faults-and-audit.md.*allow_undefended=True"):
            payout_table(LEDGER, 10.0, method=method)
        check_payable(method, allow_undefended=True)
    with pytest.raises(ValueError, match=r"^payout: no book is paid by default: the books paid without --method "
                                         r"\(ads_defended or ads\) can be bought by identities: 4 identities .*"
                                         r"allow_undefended=True \(--allow-undefended\) where each identity is a "
                                         r"distinct, verified participant\.$"):
        payout_table(LEDGER, 10.0)
    check_payable("ads_fairness")  # a book the study never measured is not refused on its behalf
    paid = payout_table(LEDGER, 10.0, method="tracin_outflow", allow_undefended=True)
    assert paid.set_index("client_id")["payment"].to_dict() == pytest.approx({"1": 10.0})
    assert list(paid.columns) == list(PAYOUT_COLUMNS) and paid["undefended"].tolist() == [True]
    assert payout_table(LEDGER, 10.0, allow_undefended=True)["undefended"].all()  # ads: undefended too
    with pytest.raises(TypeError, match="allow_undefended: expected True or False"):
        payout_table(LEDGER, 10.0, allow_undefended="yes")


def test_the_payout_command_refuses_outflow_in_one_line_and_pays_it_with_the_opt_in(tmp_path, capsys):
    """On a run directory written by the ledger writer (6 clients, 4 rounds, TracIn flows; no Ray); seed 1's
    outflow totals are positive for clients 0 and 1."""
    run_dir = tmp_path / "run"
    write_books(run_dir, seed=1)
    capsys.readouterr()
    assert main(["report", str(run_dir), "--payout", "100", "--method", "tracin_outflow"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1  # refused before the books are printed
    assert captured.err.startswith("fedvalue: error: --method: tracin_outflow is not paid by default: a participant "
                                   "that splits into identities gains up to 3.43 times its honest TracIn outflow")
    assert captured.err.rstrip().endswith("; pass --allow-undefended to pay from it anyway.")
    assert not (run_dir / "payout.csv").exists()

    assert main(["report", str(run_dir), "--payout", "100", "--method", "tracin_outflow", "--allow-undefended"]) == 0
    captured = capsys.readouterr()
    warning = [line for line in captured.err.splitlines() if line.startswith("fedvalue: warning: ")]
    assert warning == [f"fedvalue: warning: --method tracin_outflow: paid from a book the defences do not vouch for "
                       f"(--allow-undefended): {UNDEFENDED['tracin_outflow']}"]
    assert "tracin_outflow totals, UNDEFENDED: paid by --allow-undefended)" in captured.out
    table = pd.read_csv(run_dir / "payout.csv", dtype={"client_id": str})
    assert table["undefended"].all() and set(table["method"]) == {"tracin_outflow"}
    assert table["payment"].sum() == pytest.approx(100.0) and table.set_index("client_id").loc["0", "payment"] > 0

    assert main(["report", str(run_dir), "--payout", "100"]) == 2  # the default book: refused too, before reading
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("fedvalue: error: --payout: no book is paid by default")
    assert main(["report", str(run_dir), "--payout", "100", "--method", "ads", "--allow-undefended"]) == 0
    assert "fedvalue: warning: --method ads: paid from a book the defences do not vouch for" in capsys.readouterr().err
    assert pd.read_csv(run_dir / "payout.csv")["undefended"].all()
    assert main(["report", str(run_dir), "--allow-undefended"]) == 2
    assert "--allow-undefended: expected --payout BUDGET with it" in capsys.readouterr().err


def test_the_default_book_is_the_defended_ads_when_the_run_booked_it():
    assert default_payout_method(LEDGER) == "ads"
    ads = LEDGER[LEDGER["method"] == "ads"]
    defended = pd.concat([LEDGER, ads.assign(method="ads_defended", value=[0.0, 0.4, 0.0, 0.1])])
    assert default_payout_method(defended) == "ads_defended"
    paid = payout_table(defended, 10.0, allow_undefended=True)  # no method: the default book
    assert set(paid["method"]) == {"ads_defended"} and paid.set_index("client_id")["payment"].to_dict() == \
        pytest.approx({"0": 0.0, "1": 10.0})
    assert set(payout_table(defended, 10.0, method="ads", allow_undefended=True)["method"]) == {"ads"}  # named wins
    failed = pd.concat([LEDGER, ads.assign(method="ads_defended", value=np.nan, status="failed")])
    assert default_payout_method(failed) == "ads"  # only ok rows are a booked book
    assert default_payout_method(LEDGER[LEDGER["method"] != "ads"]) == "ads"  # neither: ads, which then says so
    with pytest.raises(ValueError, match="method: expected a method the ledger books for its clients; got 'ads'"):
        payout_table(LEDGER[LEDGER["method"] != "ads"], 10.0, allow_undefended=True)


def outflow_gains(lines: list[str]) -> pd.DataFrame:
    """The outflow table of ``lines`` (:data:`OUTFLOW_TABLE`): one row per (data, strategy, attack), each gain
    column's point estimate, NaN for "n/a" and "—" (the aggregation defence left that attack's runs as they are)."""
    start = lines.index(OUTFLOW_TABLE)
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    header = [cell.strip() for cell in lines[start].strip("|").split("|")]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[start + 2:end]]
    table = pd.DataFrame(rows, columns=header)
    for column in header[3:]:
        table[column] = pd.to_numeric(table[column].str.split(" ").str[0], errors="coerce")
    return table


def undefended_figures(lines: list[str]) -> dict[str, list[str]]:
    """The figures :data:`UNDEFENDED` should quote, from the outflow table of ``lines``: a split participant's
    largest gain, plain and with every defence on (the books' gain where the aggregation defence left the runs
    alone), at the table's two decimals, and a replicated update's largest plain gain to one decimal."""
    gains = outflow_gains(lines)
    split = gains[gains["attack"].str.startswith("sybil-split-")]
    replica = gains[gains["attack"].str.startswith("sybil-replica-")]
    assert len(split) and len(replica), "the outflow table lists no sybil-split or sybil-replica rows"
    defended = split["outflow, books + aggregation"].fillna(split["outflow, books"])
    return {"tracin_outflow": [f"{split['outflow'].max():.2f}", f"{replica['outflow'].max():.1f}"],
            "tracin_outflow_defended": [f"{defended.max():.2f}"]}


def adaptive_figures(gains: pd.DataFrame) -> dict[str, list[str]]:
    """The figures :data:`UNDEFENDED` quotes for ADS and LOO, from the adaptive sweep's results: the largest ADS gain
    of an identity attack (plain, and with the defences on) at two decimals, where the honest earnings are clearly
    positive; and for LOO, whose honest earnings on IID data are about 0, the identities' largest paid share beside
    their seats' honest share, at three."""
    identity = gains[gains["attack"].str.match(r"adaptive-(cluster|split)-")]
    figures = {}
    for book, prefix in (("ads", ""), ("ads_defended", "defended_")):
        rows = identity[(identity["book"] == "ads") & identity[f"{prefix}honest_positive"]]
        figures[book] = [f"{rows[f'{prefix}gain'].max():.2f}"]
    for book, prefix in (("loo", ""), ("loo_defended", "defended_")):
        rows = identity[identity["book"] == "loo"]
        top = rows.loc[rows[f"{prefix}paid"].idxmax()]
        figures[book] = [f"{top[f'{prefix}paid']:.3f}", f"{top[f'{prefix}paid_honest']:.3f}"]
    return figures


def test_the_figures_undefended_quotes_are_the_attack_studys():
    """TracIn outflow's figures are held to the docs' table (which tests/test_faults_audit_tables.py holds to
    docs/results/attack_gains.csv), ADS's and LOO's to the adaptive sweep's results file, and the doc's quoted
    refusal is the message the code gives."""
    lines = DOC.read_text().splitlines()
    adaptive = pd.read_csv(RESULTS / "attack_gains_adaptive.csv", comment="#")
    # The plain second-order book quotes no figure (what identities are paid there is its formula's:
    # tests/strategies/test_fixed_second_order.py); its defended book quotes the live study's relative-cluster part.
    relative = pd.read_csv(RESULTS / "attack_gains_relative_second_order.csv", comment="#")
    escaped = relative[(relative["partition"] == "iid") & (relative["duplicate_median_fraction"] > 0)
                       & (relative["book"] == "ads_fixed_second_order")].set_index("attack")["defended_gain"]
    assert {method: re.findall(r"\d+\.\d+", text) for method, text in UNDEFENDED.items()} == \
        undefended_figures(lines) | adaptive_figures(adaptive) | {
            "ads_fixed_second_order": [],
            "ads_fixed_second_order_defended": [f"{escaped[f'adaptive-cluster-{k}@5']:.2f}" for k in (2, 4)]}
    changed = adaptive.copy()
    changed.loc[changed["book"] == "ads", "defended_gain"] += 0.01
    assert adaptive_figures(changed)["ads_defended"] != adaptive_figures(adaptive)["ads_defended"]
    start = next(i for i, line in enumerate(lines) if line.startswith("fedvalue: error: --method: tracin_outflow "))
    quoted = " ".join(lines[start:lines.index("```", start)])  # the refusal as the doc wraps it
    assert quoted == (f"fedvalue: error: --method: tracin_outflow is not paid by default: "
                      f"{UNDEFENDED['tracin_outflow']}; pass --allow-undefended to pay from it anyway.")
    at = lines.index(next(line for line in lines if line.startswith("| dirichlet | fedavg | sybil-replica-8 | 36.72")))
    changed = [*lines[:at], lines[at].replace("36.72", "38.72", 1), *lines[at + 1:]]
    assert undefended_figures(changed)["tracin_outflow"] == ["3.43", "38.7"]  # a changed table is caught


def payout_run(tmp_path, capsys):
    """A run directory written by the ledger writer (no Ray) and its default payout.csv."""
    run_dir = tmp_path / "run"
    write_books(run_dir, seed=1)
    assert main(["report", str(run_dir), "--payout", "100", "--allow-undefended"]) == 0
    assert ("ads totals, the default: the run booked no ads_defended, UNDEFENDED: paid by --allow-undefended)"
            in capsys.readouterr().out)
    return run_dir


def payout_findings(run_dir) -> list[str]:
    report = audit_run(run_dir, recompute=False)
    return [p for p in report.problems if "payout.csv" in p] + [c for c in report.checks if "payout.csv" in c]


def test_the_audit_recomputes_payout_csv_and_names_a_changed_payment(tmp_path, capsys):
    run_dir = payout_run(tmp_path, capsys)
    assert payout_findings(run_dir) == ["payout.csv equals the payout the ledger gives (ads, share-of-positive, "
                                        "floor 0, budget 100; 6 clients), exactly"]
    assert audit_run(run_dir, recompute=False).ok
    text = (run_dir / "payout.csv").read_text()
    rows = [line.split(",") for line in text.splitlines()[1:]]
    client, payment = next((row[0], float(row[4])) for row in rows if float(row[4]) > 0)
    changed = payment + 1e-9  # one payment, by far less than any rounding a reader would see
    (run_dir / "payout.csv").write_text(text.replace(repr(payment), repr(changed), 1))
    assert payout_findings(run_dir) == [f"payout.csv: client {client}: payment is {changed!r}; the ledger gives "
                                        f"{payment!r}"]
    (run_dir / "payout.csv").write_text(text.replace("\n5,", "\n7,"))  # a client the ledger does not have
    assert payout_findings(run_dir) == ["payout.csv: clients ['7'] are paid, the ledger's ads book values no such "
                                        "client", "payout.csv: clients ['5'] of the ledger's ads book have no row"]
    (run_dir / "payout.csv").write_text(text.replace("True\n", "False\n"))  # the opt-in denied: ads is refused
    assert payout_findings(run_dir) == ["payout.csv: the ledger gives no payout for its settings (ads, "
                                        "share-of-positive, floor 0, budget 100): method: ads is not paid by default: "
                                        f"{UNDEFENDED['ads']}; pass allow_undefended=True (--allow-undefended) to pay "
                                        "from it anyway."]
    flipped = text.replace(",ads,", ",tracin_outflow,")  # another book's name on ADS's totals
    (run_dir / "payout.csv").write_text(flipped)
    assert payout_findings(run_dir)[0].startswith("payout.csv: client 0: total_value is ")
    assert not audit_run(run_dir, recompute=False).ok


HEADER = ",".join(PAYOUT_COLUMNS)


@pytest.mark.parametrize(("content", "finding"), [
    ("", "payout.csv: empty, expected the columns ['client_id', 'method', "),
    ("client,payment\n0,1.0\n", "payout.csv: columns ['client', 'payment'], expected ['client_id', 'method', "),
    (HEADER + "\n", "payout.csv: no rows, expected one per client"),
    (HEADER + "\n0,ads,0.1,True,100.0\n", "payout.csv: line 2 has 5 cells, expected 9"),
    (HEADER + "\n0,ads,nan,True,1.0,equal,0.0,1.0,False\n", "payout.csv: line 2: total_value is 'nan', expected a "
                                                             "finite number"),
    (HEADER + "\n0,ads,0.1,True,1e999,equal,0.0,1.0,False\n", "payout.csv: line 2: payment is '1e999', expected a "
                                                                "finite number"),
    (HEADER + "\n0,ads,0.1,yes,1.0,equal,0.0,1.0,False\n", "payout.csv: line 2: eligible is 'yes', expected True or "
                                                            "False"),
    (HEADER + "\n0,ads,0.1,True,1.0,equal,0.0,1.0,False\n1,ads,0.1,True,1.0,equal,0.0,2.0,False\n",
     "payout.csv: rows state 2 values of budget (['1.0', '2.0']), expected one"),
    (HEADER + "\n0,ads,0.1,True,1.0,equal,0.0,1.0,False\n0,ads,0.1,True,1.0,equal,0.0,1.0,False\n",
     "payout.csv: clients ['0'] have more than one row, expected one row per client"),
    (HEADER + "\n0,ads,0.1,True,1.0,rank,0.0,1.0,True\n", "payout.csv: the ledger gives no payout for its settings "
                                                            "(ads, rank, floor 0, budget 1): rule: expected one of"),
    ('"unclosed\x00\n\x01', "payout.csv: columns ['unclosed"),  # an unclosed quote: one cell, NUL and all
])
def test_a_garbage_payout_csv_is_one_finding_saying_what_was_expected(tmp_path, capsys, content, finding):
    run_dir = payout_run(tmp_path, capsys)
    (run_dir / "payout.csv").write_text(content)
    report = audit_run(run_dir, recompute=False)
    assert [p for p in report.problems if p.startswith("payout.csv")] == report.problems
    assert len(report.problems) == 1 and report.problems[0].startswith(finding)
    assert not any("stopped" in u for u in report.unverifiable)  # a finding, not an exception caught at the top
    (run_dir / "payout.csv").write_bytes(b"\xff" + content.encode())
    assert audit_run(run_dir, recompute=False).problems == ["payout.csv: unreadable (UnsafeRunFile: payout.csv: "
                                                             "expected UTF-8 text (invalid start byte))"]
