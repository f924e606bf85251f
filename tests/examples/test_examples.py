"""The scripts in examples/, run as a user runs them (a fresh interpreter, small settings),
their output checked against the library's own readers; and the first one again in this
process after disturbing every global generator: the same seed, the same ledger bytes.
``read_ledger.py`` reads the session's real run (``signed_run``, conftest.py). The default
suite runs ``value_a_serverapp.py`` and ``read_ledger.py``; ``simulate_own_model.py`` and
``value_driven_serverapp.py`` run under ``-m slow``."""

from __future__ import annotations

import importlib
import random
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from fedvalue.analysis.detection import detection_metrics
from fedvalue.analysis.run_summary import load_run
from strategies.aggregation.random_state import RandomState

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
SMALL = {"num-clients": 4, "clients-per-round": 4, "rounds": 2, "local-epochs": 2, "num-noisy": 2, "seed": 1}


def example(name: str, *args: str) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, str(EXAMPLES / name), *args], cwd=ROOT, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return result


def flags(options: dict) -> list[str]:
    return [item for key, value in options.items() for item in (f"--{key}", str(value))]


@pytest.fixture(scope="module")
def own_model_run(tmp_path_factory) -> Path:
    """``examples/simulate_own_model.py`` once (Ray, real training), shared by the tests that read it."""
    out = tmp_path_factory.mktemp("examples") / "own-model"
    printed = example("simulate_own_model.py", "--out", str(out), *flags(SMALL)).stdout
    assert f"wrote {out}" in printed and "total_ads" in printed
    return out


@pytest.mark.slow  # the fast sibling: the pair fixture of tests/simulations/runner/test_simulate_policies.py
# (simulate() with a user's own model, data and Flower strategy on real Ray, real training) and
# test_honest_clients_are_valued_as_in_the_run_without_the_attackers in tests/hostile/replies/test_replies.py (TracIn
# inflow and outflow booked on real Ray); an example run as a user runs it:
# test_a_serverapp_wrapping_fedadam_books_its_clients below
def test_own_model_data_and_strategy_are_valued_with_flows(own_model_run):
    run = load_run(own_model_run)
    assert list(run.rounds["round"]) == [1, 2]
    assert set(run.ledger["method"]) == {"ads", "loo", "tracin_inflow", "tracin_outflow", "tracin_self"}
    assert (run.rounds["efficiency_gap"].abs() < 1e-9).all()
    ads = run.ledger[run.ledger["method"] == "ads"]
    assert (ads.groupby("round").size() == SMALL["clients-per-round"]).all() and set(ads["status"]) == {"ok"}
    assert run.ledger["noisy"].astype(str).str.lower().eq("true").groupby(run.ledger["client_id"]).first().sum() == 2
    assert run.config["strategy"] == "DecayingLrFedAvg" and run.config["train_config"]["seed"] == SMALL["seed"]


def test_read_ledger_prints_what_the_library_computes(signed_run):
    """On the session's real noisy-clients run (conftest.py), which it only reads."""
    printed = example("read_ledger.py", str(signed_run[0]), "--k", "1").stdout
    run = load_run(signed_run[0])
    summary = run.summary()
    for client, total in summary["total_ads"].items():
        assert any(line.split()[:2] == [str(client), f"{total:.4f}"] for line in printed.splitlines()), printed
    metrics = detection_metrics(run.ledger, methods="ads").iloc[0]
    assert f"ROC AUC of -ads total {metrics['auc']:.3f}" in printed
    assert f"precision at {int(metrics['n_noisy'])} (lowest totals) {metrics['precision_at_k']:.3f}" in printed
    top = run.ledger[(run.ledger["method"] == "ads") & (run.ledger["status"] == "ok")]
    for server_round, rows in top.groupby("round"):
        best = rows.loc[rows["value"].idxmax(), "client_id"]
        assert f"{server_round}    {best}" in printed


def disturb_global_generators() -> None:
    np.random.seed(12345)
    np.random.normal(size=7)
    random.seed("not the run's seed")
    random.random()
    torch.manual_seed(999)
    torch.randn(11)


@pytest.mark.slow  # a second run of the example; the default suite checks the generators in tests/simulations/runner/
# test_api.py
def test_an_unseeded_model_factory_gives_the_same_ledger_whatever_the_global_generators(own_model_run, tmp_path,
                                                                                      monkeypatch):
    """The example's model seeds nothing (torch.nn.Linear draws from torch's global generator).
    Run again in this process with every global generator moved elsewhere: the same bytes as
    the fresh interpreter's run, and ``simulate`` leaves this process's generators where they
    were (Ray's start and stop draw from Python's ``random``; the factory from torch's)."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    own_model = importlib.import_module("simulate_own_model")
    digits_clients = importlib.import_module("digits_clients")
    states = []

    def simulate(**arguments):  # the real one, with the generators captured around it
        states.append(RandomState.capture())
        try:
            return own_model_simulate(**arguments)
        finally:
            states.append(RandomState.capture())

    own_model_simulate = own_model.simulate
    monkeypatch.setattr(own_model, "simulate", simulate)
    disturb_global_generators()
    options = {key.replace("-", "_"): value for key, value in SMALL.items()}
    own_model.run(str(tmp_path / "again"), **options)
    assert (tmp_path / "again" / "ledger.csv").read_bytes() == (own_model_run / "ledger.csv").read_bytes()
    before, after = states
    assert repr(after.numpy) == repr(before.numpy) and after.python == before.python
    assert torch.equal(after.torch_cpu, before.torch_cpu)
    # The control: the factory itself differs from draw to draw; only the seed pins A_0.
    assert not torch.equal(digits_clients.make_model()[0].weight, digits_clients.make_model()[0].weight)


def test_a_serverapp_wrapping_fedadam_books_its_clients(tmp_path):
    out = tmp_path / "serverapp"
    done = example("value_a_serverapp.py", "--out", str(out), "--num-clients", "4", "--clients-per-round", "3",
                   "--rounds", "2", "--seed", "2")
    printed = done.stdout
    run = load_run(out)
    assert "total_ads" in printed and list(run.rounds["round"]) == [1, 2]
    # A user's ServerApp through run_flower_simulation meets no deprecated Flower feature (Flower warns on stderr).
    assert "DEPRECATED FEATURE" not in done.stdout + done.stderr
    assert run.config is not None and (run.rounds["num_clients"] == 3).all()
    # FedAdam is a server optimizer: v_t(I_t) is its step, which the run then takes.
    np.testing.assert_allclose(run.rounds["utility_after"], run.rounds["utility_realized"], rtol=0, atol=1e-12)
    assert (run.rounds["efficiency_gap"].abs() < 1e-9).all()
    pd.testing.assert_series_equal(run.summary()["rounds"].sort_index(),
                                   run.ledger[run.ledger["method"] == "ads"].groupby("client_id")["round"].nunique()
                                   .rename("rounds").sort_index())


def test_readme_snippets_are_taken_from_the_examples():
    """Every Python block of README and docs/python-api.md headed ``# examples/NAME.py`` is that
    file's lines, in order ("..." elides), so what they show is what the tests run."""
    pages = [(ROOT / name).read_text(encoding="utf-8") for name in ("README.md", "docs/python-api.md")]
    blocks = [block for page in pages for block in re.findall(r"```python\n# (examples/\S+\.py)\n(.*?)```", page,
                                                                flags=re.S)]
    assert {name for name, _ in blocks} == {"examples/digits_clients.py", "examples/simulate_own_model.py",
                                            "examples/value_a_serverapp.py", "examples/read_ledger.py"}
    for name, block in blocks:
        source = iter(line.strip() for line in (ROOT / name).read_text(encoding="utf-8").splitlines())
        for line in block.splitlines():
            line = line.strip()
            if line and line != "...":
                assert any(line == candidate for candidate in source), f"{name}: not found in order: {line!r}"


@pytest.mark.slow  # the fast sibling: test_value_samplers_decide_as_their_rules_replayed_on_the_books and
# test_topk_accepts_the_k_best_by_its_score_and_value_weighting_books_the_rule_s_factors in
# tests/simulations/experiments/noisy_federation/test_noisy_federation.py (value-ucb: the same ValueEliminationSampler,
# UCB, confidence 0.5, and ValueWeighting("ads") around FedAvg on real Ray, replayed on the books and audited intact);
# an example run as a user runs it: test_a_serverapp_wrapping_fedadam_books_its_clients above
@pytest.mark.parametrize("policy", ["value-ucb", "value-guard"])
def test_the_value_driven_serverapp_weighs_by_value_and_rules_out_noisy_clients(tmp_path, monkeypatch, policy):
    out = tmp_path / "value-driven"
    printed = example("value_driven_serverapp.py", "--out", str(out), "--num-clients", "6", "--num-noisy", "2",
                      "--clients-per-round", "3", "--rounds", "4", "--seed", "1", "--policy", policy).stdout
    from fedvalue.audit.checks import audit_run
    from fedvalue.ledger import read_round
    from fedvalue.rounds.kinds.value_weights import value_weight_outcome, weighting_rule
    from fedvalue.scoring.torch_utilities import TorchModelUtility

    run = load_run(out)
    assert set(run.ledger["method"]) == {"ads", "selected", "value_weight"} and list(run.rounds["round"]) == [1, 2, 3, 4]
    rule = weighting_rule("ads", "softmax", 1.0) if policy == "value-guard" else weighting_rule("ads")
    for _, rows in run.ledger.groupby("round"):
        ads = rows[rows["method"] == "ads"].set_index("client_id")["value"].to_dict()
        weights = rows[rows["method"] == "value_weight"].set_index("client_id")["value"].to_dict()
        assert weights == pytest.approx(value_weight_outcome(rule, ads)[1])
    settings = read_round(out, 1).settings
    expected = ("second-order", "fixed-weight") if policy == "value-guard" else ("mc", "renormalized")
    assert (settings.valuation.method, settings.coalition_rule) == expected
    assert sum(line.startswith("round ") and "ruled out" in line for line in printed.splitlines()) == 4
    monkeypatch.syspath_prepend(str(EXAMPLES))
    digits_clients = importlib.import_module("digits_clients")
    _, _, x_held_out, y_held_out = digits_clients.digits(1)
    utility = TorchModelUtility(digits_clients.make_model(), x_held_out, y_held_out, metric="neg_loss")
    report = audit_run(out, utility=utility)
    assert report.intact, report.problems + report.unverifiable
