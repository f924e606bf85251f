"""The attack study with the fixed-weight game's second-order books, none of it through Ray.

Live (``fedvalue run attacks --fixed-second-order``): refused before Ray starts, naming the option, without the
differentiable utility or with a strategy that aggregates by its own code; the study's plan hands the switch to the
books of every run (and the defended book where the defences are on), and leaves no trace of it when off; runs
that booked the books get them as books of the gains tables, the defended one as their defended gain.

Booked again (``python -m bench.attack_study --rebook``): on real recorded FedAvg rounds (in-process grid, torch
training), K exact replicas of one client are paid K copies' value by the second-order book and one copy's by its
defended book, every other client its plain value; the defended rebook under the run's own utility is the live
``ads_fixed_second_order_defended`` total; a run without the defences has no screen to repeat; and the rebook's
table renders the defended book only where its file holds it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd
import pytest
from flwr.app import ConfigRecord, MessageType, MetricRecord, RecordDict

from fedvalue import gains_table, honest_cost, manipulation_gains
from fedvalue.analysis.run_summary import load_run
from fedvalue.rounds.defences.settings import DefenceSettings
from simulations.cli.main import main
from simulations.experiments.attacks.attacks import AttacksConfig, check
from simulations.experiments.attacks.plan import plan_of
from simulations.experiments.attacks.rebook import (
    BOOKS,
    part_books,
    rebooked_cost,
    rebooked_gains,
    rebooked_totals,
)
from simulations.experiments.attacks.study import (
    SECOND_ORDER_TOTALS,
    TOTALS,
    StudyRun,
    _strategy,
    run_frames,
    study_run_config,
    study_runs,
    study_totals,
    utility_of,
)
from simulations.runner import saved_config
from strategies import BookSettings, NodeDirectory
from strategies.arrays import arrays_to_numpy, numpy_to_arrays
from tests.strategies.harness.inprocess import set_server_identity
from tests.strategies.test_fixed_second_order import valued_run
from tests.strategies.test_valuing import (
    PID_OF,
    local_training,
    make_handler,
    utility,  # noqa: F401 (a fixture)
)

PLAIN, DEFENDED = "ads_fixed_second_order", "ads_fixed_second_order_defended"
DOCS_RESULTS = Path(__file__).resolve().parents[3] / "docs" / "results"
#: The client the replicas copy (its data and claim, bit for bit).
ORIGINAL = 3
BOTH = BookSettings(defences=DefenceSettings(), fixed_second_order=True)
STUDY = AttacksConfig(attacks=("none", "sybil-split-2", "sybil-replica-2"), num_clients=3, seeds=2,
                      partitions=("iid", "dirichlet"), utility="neg_loss", defences=1, fixed_second_order=True)


@pytest.fixture(autouse=True)
def server_identity():
    """The in-process runs build Messages outside a running ServerApp (tests/strategies/conftest.py)."""
    set_server_identity()


@pytest.mark.parametrize(("options", "said"), [
    ([], "--fixed-second-order: expected --utility 'neg_loss', the differentiable utility the second-order "
         "expansion of the fixed-weight round game needs; got --utility 'accuracy'."),
    (["--utility", "neg_loss", "--strategies", "fedavg,fedmedian"],
     "--fixed-second-order: expected strategies that aggregate by FedAvg's weighted mean ('fedavg'; "),
])
def test_the_switch_is_refused_before_ray_without_what_it_needs_naming_the_option(tmp_path, capsys, options, said):
    out = tmp_path / "study"
    assert main(["run", "attacks", "--attacks", "none,sybil-split-2", "--fixed-second-order", *options,
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"fedvalue: error: {said}"), err
    assert "Traceback" not in err and not out.exists()
    with pytest.raises(ValueError, match="^fixed_second_order: expected utility='neg_loss'"):
        check(AttacksConfig(attacks=("none", "sybil-split-2"), fixed_second_order=True))
    check(AttacksConfig(attacks=("none", "sybil-split-2"), fixed_second_order=True, utility="neg_loss"))


def test_the_study_plan_passes_the_switch_to_every_run_and_leaves_no_trace_when_off(tmp_path):
    assert STUDY.is_study and study_totals(STUDY) == TOTALS + SECOND_ORDER_TOTALS
    runs = study_runs(STUDY)
    assert len(runs) == 2 * 2 * 3
    for run in runs:
        run_config = study_run_config(STUDY, run)
        strategy = _strategy(STUDY, run, tmp_path, utility_of(STUDY, run), NodeDirectory(), run_config)
        assert strategy.book_settings.fixed_second_order is True, run.directory
        assert strategy.book_settings.defences is not None  # so the defended book follows the plain one
        assert run_config["fixed_second_order"] is True
    off = dataclasses.replace(STUDY, fixed_second_order=False)
    assert study_totals(off) == TOTALS
    for run in study_runs(off):
        strategy = _strategy(off, run, tmp_path, utility_of(off, run), NodeDirectory(), study_run_config(off, run))
        assert strategy.book_settings.fixed_second_order is False
        assert "fixed_second_order" not in study_run_config(off, run)
    assert "fixed_second_order" not in AttacksConfig().as_dict() and not AttacksConfig().is_study
    assert saved_config(AttacksConfig, AttacksConfig().as_dict()) == AttacksConfig()
    assert saved_config(AttacksConfig, STUDY.as_dict()) == STUDY


def replica_handler(copies: int):
    """Clients 0-3 train as in test_valuing; clients 4, 5, ... (``copies`` − 1 of them) reply client 3's trained
    model and claim, bit for bit: K = ``copies`` exact replicas of one reply."""
    honest = make_handler()

    def handler(message, node_id):
        pid = PID_OF[node_id]
        if message.metadata.message_type == MessageType.QUERY or pid <= ORIGINAL:
            return honest(message, node_id)
        arrays, n, loss = local_training(arrays_to_numpy(message.content["arrays"]), ORIGINAL)
        return RecordDict({"arrays": numpy_to_arrays(arrays), "metrics": MetricRecord({"num-examples": n,
                                                                                       "train-loss": loss}),
                           "client": ConfigRecord({"partition-id": pid})})
    return handler


def replicated_run(run_dir, utility, copies: int, books=BOTH):  # noqa: F811
    """A real 2-round FedAvg run of clients 0-3 and ``copies`` − 1 replicas of client 3 (in-process grid)."""
    return valued_run(run_dir, utility, replica_handler(copies), range(ORIGINAL + copies), num_rounds=2, books=books)


@pytest.mark.parametrize("copies", [2, 3])
def test_the_rebook_pays_k_exact_replicas_one_copy_defended_and_k_copies_plain(tmp_path, utility, copies):  # noqa: F811
    run_dir = replicated_run(tmp_path / "run", utility, copies)
    again = rebooked_totals(run_dir, utility, ("ads_second_order", "ads_second_order_defended"))
    plain, defended = again["ads_second_order"], again["ads_second_order_defended"]
    replicas = range(ORIGINAL, ORIGINAL + copies)
    one_copy = plain[ORIGINAL]
    scale = max(abs(v) for v in plain.values())
    assert abs(one_copy) > 1e-6 * scale
    assert all(plain[r] == one_copy for r in replicas)  # the same reply, the same claim: the same value
    assert sum(plain[r] for r in replicas) == pytest.approx(copies * one_copy, rel=1e-12)
    assert sum(defended[r] for r in replicas) == pytest.approx(one_copy, rel=1e-12)
    for client in range(ORIGINAL):
        assert defended[client] == plain[client]  # neither flagged nor clustered: c_k = 1.0
    # Under the run's own utility the rebook is the live book, row for row summed.
    ledger = load_run(run_dir).ledger
    for method, book in ((PLAIN, plain), (DEFENDED, defended)):
        live = ledger[(ledger["method"] == method) & (ledger["status"] == "ok")].groupby("client_id")["value"].sum()
        assert {int(c): v for c, v in live.items()} == pytest.approx(book, rel=1e-12, abs=1e-15)


def test_the_rebook_of_a_run_without_the_defences_refuses_the_defended_book_naming_them(tmp_path, utility):  # noqa: F811
    run_dir = replicated_run(tmp_path / "run", utility, 2, books=BookSettings())
    with pytest.raises(ValueError, match="^defences: expected round 1's record to hold the defence settings"):
        rebooked_totals(run_dir, utility, ("ads_second_order_defended",))
    assert part_books(AttacksConfig(defences=0)) == tuple(BOOKS)
    assert part_books(AttacksConfig(defences=1)) == (*BOOKS, "ads_second_order_defended")


def test_the_rebooks_tables_gain_the_defended_book_as_rows(tmp_path, utility):  # noqa: F811
    """The rebook's gains and honest cost over an honest run and a replicated one (seats: client 3; identities: it
    and its replica): the defended book is a row of each, the replicas' defended gain half their plain one."""
    books = (*BOOKS, "ads_second_order_defended")
    rows = []
    for attack, copies in (("none", 1), ("sybil-replica-2", 2)):
        totals = rebooked_totals(replicated_run(tmp_path / attack, utility, copies), utility, books)
        rows += [{"partition": "iid", "strategy": "fedavg", "seed": 0, "attack": attack, "client_id": client}
                 | {book: totals[book][client] for book in books} for client in sorted(totals["ads"])]
    totals = pd.DataFrame(rows)
    runs = pd.DataFrame([{"partition": "iid", "strategy": "fedavg", "seed": 0, "attack": "none",
                          "identities": "", "seats": "3"},
                         {"partition": "iid", "strategy": "fedavg", "seed": 0, "attack": "sybil-replica-2",
                          "identities": "3 4", "seats": "3"}])
    gains = rebooked_gains(totals, runs).set_index("book")
    assert list(gains.index) == list(books)
    assert gains.loc["ads_second_order_defended", "gain"] == pytest.approx(
        gains.loc["ads_second_order", "gain"] / 2, rel=1e-9)
    cost = rebooked_cost(totals)
    assert list(cost["book"]) == [b for b in books if b != "ads"]
    assert cost.set_index("book").loc["ads_second_order_defended", "mean_share_change"] == pytest.approx(
        cost.set_index("book").loc["ads_second_order", "mean_share_change"], abs=1e-12)  # no attack: c_k = 1


def test_live_runs_that_booked_the_books_have_them_in_the_gains_tables(tmp_path, utility):  # noqa: F811
    """Real runs of the study's plan for client 3 (an honest run, and one with a replica of it), summed as the study
    sums them: with the switch, totals.csv holds both books and gains.csv the plain one as a book, its defended gain
    half its gain (the replicas one copy, the honest seat c = 1); without, the same runs' tables are as before."""
    done = []
    for attack, copies in (("none", 1), ("sybil-replica-2", 2)):
        run = StudyRun("iid", "fedavg", 0, plan_of(attack, 4, ORIGINAL, 2))
        done.append((run, load_run(replicated_run(tmp_path / attack, utility, copies))))
    totals, runs = run_frames(done, study_totals(STUDY))
    assert list(totals.columns[-2:]) == list(SECOND_ORDER_TOTALS) and totals[list(SECOND_ORDER_TOTALS)].notna().all().all()
    table = gains_table(totals, runs)
    assert list(table["book"]) == ["ads", "loo", "tracin_outflow", PLAIN]
    row = table.set_index("book").loc[PLAIN]
    assert row["defended_gain"] == pytest.approx(row["gain"] / 2, rel=1e-9)
    assert row["defended_paid"] < row["paid"]
    assert list(honest_cost(totals)["book"]) == ["ads", "loo", "tracin_outflow", PLAIN]
    plain_totals, _ = run_frames(done)  # the study without the switch sums the same runs' other books
    assert list(plain_totals.columns) == [c for c in totals.columns if c not in SECOND_ORDER_TOTALS]
    pd.testing.assert_frame_equal(gains_table(plain_totals, runs), table[table["book"] != PLAIN].reset_index(drop=True))
    # One's own runs: manipulation_gains gives the same row (no flows booked here: no outflow row).
    own = manipulation_gains([tmp_path / "none"], [tmp_path / "sybil-replica-2"], identities=[3, 4], seats=[3])
    assert list(own["book"]) == ["ads", "loo", PLAIN]
    for column in ("gain", "defended_gain", "paid", "defended_paid"):
        assert own.set_index("book").loc[PLAIN, column] == pytest.approx(row[column], rel=1e-12)
    # A study's parts each by their own runs: the book's rows only for the part whose totals hold it.
    mixed = pd.concat([totals, plain_totals.assign(partition="dirichlet")], ignore_index=True)
    both = pd.concat([runs, runs.assign(partition="dirichlet")], ignore_index=True)
    table = gains_table(mixed, both)
    assert list(table.loc[table["partition"] == "iid", "book"]) == ["ads", "loo", "tracin_outflow", PLAIN]
    assert list(table.loc[table["partition"] == "dirichlet", "book"]) == ["ads", "loo", "tracin_outflow"]


def test_the_rebook_table_renders_the_defended_book_only_where_its_file_holds_it():
    from bench.attack_study import RESULTS, rebook_markdown

    kept = pd.read_csv(DOCS_RESULTS / RESULTS["rebook-gains"], comment="#")
    before = rebook_markdown(kept)
    assert "defended" not in before.splitlines()[0]
    first = kept[kept["book"] == "ads_second_order"].iloc[[0]].assign(book="ads_second_order_defended", paid=0.125)
    shown = rebook_markdown(pd.concat([kept, first], ignore_index=True)).splitlines()
    assert shown[0].endswith("| second order | second order, defended | paid, second order (honestly) | "
                             "paid, second order, defended (honestly) |")
    assert shown[1] == "|" + "---|" * 10
    row = f"| {first['part'].iloc[0]} | {first['attack'].iloc[0]} |"
    assert [line for line in shown if line.startswith(row)][0].endswith(f" | 0.125 ({first['paid_honest'].iloc[0]:.3f}) |")
    # Every other row: its cells as before, "—" for the book its part lacks and for that book's paid share.
    for old, new in zip(before.splitlines()[3:], shown[3:], strict=True):
        cells, paid = old.rsplit(" | ", 1)
        assert new == f"{cells} | — | {paid.removesuffix(' |')} | — |"
