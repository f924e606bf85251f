"""What a run's books add up to, on small hand-written rounds: per-client totals, and the books
read back by load_run with their summaries as methods."""

from __future__ import annotations

from fedvalue.analysis.run_summary import client_summary, load_run
from tests.fedvalue.run.test_ledger_tables import write_two_rounds


def test_client_totals_sum_each_clients_rounds(tmp_path):
    write_two_rounds(tmp_path)
    summary = client_summary(load_run(tmp_path).ledger)
    # ids read back as strings (client_key makes them the ints the run wrote)
    assert summary.loc["0", "total_ads"] == 0.125 + 0.3 and summary.loc["1", "total_ads"] == 0.125 - 0.05
    assert list(summary.index) == ["0", "1"]  # sorted by total ADS
    assert summary["noisy"].tolist() == [True, False]
    assert summary["rounds"].tolist() == [2, 2]


def test_a_run_is_its_tables_with_their_summaries(tmp_path):
    write_two_rounds(tmp_path)
    run = load_run(tmp_path)
    assert run.summary().equals(client_summary(run.ledger))
    figures = run.run_summary()
    assert figures["rounds"] == 2 and figures["utility_start"] == 0.5 and figures["num_evaluations"] == 8
    assert run.flows().empty  # no TracIn rows
    assert [row.round for row in run.round_rows()] == [1, 2] and len(run.rows()) == 4
