"""The attack measurement end to end on one real Ray engine (small), through the CLI. Slow: the
default suite runs the attack study through the same command on Ray (tests/hostile/manipulation/
test_attacks_study.py) and books a sign-flipper and a reviewed inflated claim on real ClientApps
in process (tests/strategies/policies/test_manipulation.py)."""

from __future__ import annotations

import pandas as pd
import pytest

from fedvalue.audit.checks import audit_run
from fedvalue.analysis.run_summary import load_run
from simulations.cli.main import main


@pytest.mark.slow  # the fast sibling: the study fixture of tests/hostile/manipulation/test_attacks_study.py
# (`fedvalue run attacks` on one real Ray engine: attackers' books, the gains table, every run audited intact), and
# test_a_sign_flipper_gets_negative_ads_loo_and_outflow and
# test_registered_sizes_cap_the_claim_flag_it_and_undo_the_attack in tests/strategies/policies/test_manipulation.py
# (the same two attacks on real ClientApps with real training, their books compared with the honest run's)
def test_attacks_table_through_the_cli(tmp_path, capsys):
    out = tmp_path / "attacks"
    argv = ["run", "attacks", "--attacks", "none,sign-flip,inflated-count-reviewed", "--num-clients", "4",
            "--source", "3", "--rounds", "2", "--local-epochs", "2", "--out", str(out), "--quiet"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "sign-flip" in printed and "inflated-count-reviewed" in printed
    table = pd.read_csv(out / "attacks.csv").set_index("attack")
    # A sign-flipper is booked below the honest clients by ADS, LOO and TracIn outflow.
    for book in ("ads", "loo", "outflow"):
        assert table.loc["sign-flip", book] < table.loc["sign-flip", f"{book}_honest"]
    # A reviewed inflated claim is capped every round and books exactly what the honest run books.
    assert table.loc["inflated-count-reviewed", "claim_flags"] == "claim_capped×2"
    for book in ("ads", "loo", "outflow", "inflow", "accuracy"):
        assert table.loc["inflated-count-reviewed", book] == table.loc["none", book]
    reviewed = load_run(out / "inflated-count-reviewed")
    assert reviewed.summary().loc["0", "claim_flags"] == 2
    for attack in table.index:
        assert audit_run(out / attack).ok
