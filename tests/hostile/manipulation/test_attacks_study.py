"""The attack study end to end on a real Ray engine (small), through the command line: the
free-riders are flagged and paid nothing by the defended books, the plain books are those of a
run without the defences, every run audits intact with its values (defences included)
recomputed, and the payout export states its rule."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from fedvalue.audit.checks import audit_run
from fedvalue.analysis.run_summary import load_run
from simulations.cli.main import main
from simulations.experiments.attacks.attacks import audit_from_run

#: A user's own attack, as a module beside where the study is run: the attacker triples its update.
OWN = "own_attack:Tripled"
OWN_MODULE = """
from clients import ClientBehaviour


class Tripled(ClientBehaviour):
    def transform_reply(self, global_arrays, trained_arrays, num_examples, rng):
        return {k: g + 3 * (trained_arrays[k] - g) for k, g in global_arrays.items()}, num_examples
"""
ATTACKS = f"none,delta-weights,colluding-free-riders,{OWN}"
COMMON = ["--num-clients", "4", "--source", "3", "--rounds", "2", "--local-epochs", "2", "--colluders", "2",
          "--quiet"]


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    out = tmp_path_factory.mktemp("study") / "attacks"
    here = tmp_path_factory.mktemp("own")
    (here / "own_attack.py").write_text(OWN_MODULE)
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(here)  # a user runs the study where their module is
        assert main(["run", "attacks", "--attacks", ATTACKS, "--defences", "1", "--out", str(out), *COMMON]) == 0
    return out


def test_an_attack_of_ones_own_runs_by_module_callable_and_its_gain_is_in_the_table(study):
    """``module:callable`` names a ClientBehaviour of one's own: client 0 plays it, its books are
    under the attack's name, its gain is in gains.csv, and the public gain function gives the
    same gains from the two run directories."""
    from fedvalue import manipulation_gains

    gains = pd.read_csv(study / "gains.csv").set_index(["attack", "book"])
    assert {("own_attack:Tripled", book) for book in ("ads", "loo", "tracin_outflow")} <= set(gains.index)
    assert gains.loc[(OWN, "ads"), "gain"] > 0 and gains.loc[(OWN, "ads"), "seeds"] == 1
    runs = study / "iid-fedavg-seed0"
    own = manipulation_gains([runs / "none"], [runs / "own_attack-Tripled"], identities=[0], attack=OWN)
    for column in ("gain", "paid", "paid_honest", "accuracy_change"):
        assert own.set_index("book")[column].to_dict() == pytest.approx(gains.loc[OWN][column].to_dict())
    ledger = _ledger(study, "own_attack-Tripled")
    assert set(ledger.loc[ledger["method"] == "ads", "client_id"]) == {"0", "1", "2", "3"}


def _ledger(study, attack: str) -> pd.DataFrame:
    return load_run(study / "iid-fedavg-seed0" / attack).ledger


def test_free_riders_are_flagged_and_paid_nothing_by_the_defended_books(study):
    for attack, members in (("delta-weights", ["0"]), ("colluding-free-riders", ["0", "1"])):
        ledger = _ledger(study, attack)
        flags = ledger[ledger["method"] == "defence_free_rider"].set_index(["round", "client_id"])["value"]
        for member in members:
            assert flags[(1, member)] == 1.0 and flags[(2, member)] == 1.0  # round 1: zero update; 2: replay
            for book in ("ads_defended", "loo_defended", "tracin_outflow_defended"):
                assert (ledger[(ledger["method"] == book) & (ledger["client_id"] == member)]["value"] == 0).all()
        honest = ledger[(ledger["method"] == "defence_free_rider") & ~ledger["client_id"].isin(members)]
        assert (honest["value"] == 0).all()
    gains = pd.read_csv(study / "gains.csv").set_index(["attack", "book"])
    assert gains.loc[("delta-weights", "ads"), "defended_gain"] == 0.0
    assert gains.loc[("colluding-free-riders", "ads"), "defended_paid"] == 0.0


def test_without_attackers_the_defended_books_are_the_plain_ones(study):
    ledger = _ledger(study, "none")
    for book in ("ads", "loo", "tracin_outflow"):
        plain = ledger[ledger["method"] == book].set_index(["round", "client_id"])["value"]
        defended = ledger[ledger["method"] == f"{book}_defended"].set_index(["round", "client_id"])["value"]
        if book == "ads":  # IID shares differ by an example or so: arrivals by size are nearly uniform
            assert (defended - plain).abs().max() <= 0.02 * plain.abs().max()
        else:  # nothing flagged or clustered: the same game, the same step
            pd.testing.assert_series_equal(plain, defended, check_names=False, rtol=1e-12)
    assert (pd.read_csv(study / "honest_cost.csv")["free_rider_flags"] == 0).all()


def test_every_run_audits_intact_with_the_defences_recomputed(study, capsys):
    for attack in ATTACKS.split(","):
        run_dir = study / "iid-fedavg-seed0" / attack.replace(":", "-")  # a module:callable's directory
        saved = json.loads((run_dir / "run.json").read_text())
        report = audit_run(run_dir, **audit_from_run(saved))
        assert report.intact, report.problems + report.unverifiable
        assert any("recomputed every value" in check for check in report.checks)
    capsys.readouterr()
    assert main(["audit", str(study / "iid-fedavg-seed0" / "delta-weights")]) == 0
    assert "recomputed every value of 2 rounds" in capsys.readouterr().out


def test_the_payout_export_pays_the_defended_book_by_default_and_the_audit_recomputes_it(study, capsys):
    """Without --method a run with the defences is paid from ads_defended (the free-rider gets nothing), and the
    audit recomputes payout.csv from the ledger; a named --method still wins."""
    from fedvalue.analysis.payout import default_payout_method

    run_dir = study / "iid-fedavg-seed0" / "delta-weights"
    assert default_payout_method(load_run(run_dir).ledger) == "ads_defended"
    capsys.readouterr()
    opt_in = "--allow-undefended"  # identities buy every book (the adaptive sweep): the opt-in is always asked for
    assert main(["report", str(run_dir), "--payout", "100", "--method", "ads", "--floor", "0.01", opt_in]) == 0
    assert set(pd.read_csv(run_dir / "payout.csv")["method"]) == {"ads"}
    assert "ads totals, UNDEFENDED" in capsys.readouterr().out  # named: no default said
    assert main(["report", str(run_dir), "--payout", "100", "--floor", "0.01", opt_in]) == 0
    assert "ads_defended totals, the default: the run booked the defended ADS, UNDEFENDED" in capsys.readouterr().out
    table = pd.read_csv(run_dir / "payout.csv", dtype={"client_id": str}).set_index("client_id")
    assert set(table["method"]) == {"ads_defended"}
    assert table.loc["0", "payment"] == 0.0 and table["payment"].sum() == pytest.approx(100.0)
    assert set(table["rule"]) == {"share-of-positive"} and set(table["floor"]) == {0.01}
    report = audit_run(run_dir)
    assert report.ok and "payout.csv equals the payout the ledger gives (ads_defended, share-of-positive, floor " \
                         "0.01, budget 100; 4 clients), exactly" in report.checks
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        main(["report", str(run_dir), "--payout", "-1"])
    assert exited.value.code == 2 and "payout: expected a finite number >= 0" in capsys.readouterr().err


def test_a_tampered_previous_global_model_fails_the_audit(study, tmp_path):
    import shutil

    import numpy as np

    from fedvalue.run.archive import read_round_record, record_path, write_round_record

    run_dir = tmp_path / "tampered"
    shutil.copytree(study / "iid-fedavg-seed0" / "delta-weights", run_dir)
    record = read_round_record(record_path(run_dir, 2))
    record.references["previous-global"] = {k: v + np.float32(0.01) for k, v in
                                            record.references["previous-global"].items()}
    write_round_record(run_dir, record)
    report = audit_run(run_dir, **audit_from_run(json.loads((run_dir / "run.json").read_text())))
    assert any("previous global model its record keeps is not the state round 1 started from" in p
               for p in report.problems)


@pytest.mark.slow
def test_every_attack_runs_and_audits_under_fedavg_and_fedmedian_on_both_partitions(tmp_path):
    """The whole list (minutes): every run of every attack audits intact, values recomputed."""
    out = tmp_path / "all"
    attacks = ("none,sybil-split-2,sybil-split-8,sybil-replica-2,sybil-replica-8,colluding-free-riders,"
               "delta-weights,dynamic-free-rider,crafted-update,group-split")
    assert main(["run", "attacks", "--attacks", attacks, "--defences", "1", "--partitions", "iid,dirichlet",
                 "--strategies", "fedavg,fedmedian", "--valuation-budget", "600", "--craft-steps", "10",
                 "--shells", "1,2", "--out", str(out), *COMMON]) == 0
    for run_dir in sorted(out.glob("*-seed0/*")):
        report = audit_run(run_dir, **audit_from_run(json.loads((run_dir / "run.json").read_text())))
        assert report.intact, (run_dir, report.problems + report.unverifiable)
    gains = pd.read_csv(out / "gains.csv")
    assert set(gains["attack"]) == set(attacks.split(",")) - {"none", "group-split"}
    assert (out / "shells.csv").exists()
