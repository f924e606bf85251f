"""Flower's robust and DP strategies through the CLI on real Ray, and their options."""

from __future__ import annotations

import functools
import logging

import numpy as np
import pytest
from flwr.serverapp.strategy import FedAvg

from clients.app import ClientData
from fedvalue.analysis.run_summary import load_run
from fedvalue.scoring.torch_utilities import TorchModelUtility
from simulations import simulate
from simulations.runner.api import NoClientValued
from simulations.cli.main import main
from simulations.datasets.models import make_mlp
from simulations.runner.inner_strategies import STRATEGIES, STRATEGY_PARAMETERS, build_strategy, fedavg_without_evaluation

TINY = ["--num-clients", "6", "--rounds", "2", "--clients-per-round", "3", "--local-epochs", "3",
        "--hidden", "16", "--quiet"]


@pytest.mark.slow  # the default suite runs every strategy in-process (tests/strategies/test_conformance.py,
# test_audit_every_strategy.py) and FedAvg on Ray
def test_fedmedian_and_server_side_dp_noise_run_on_ray_value_exactly_and_audit_intact(tmp_path, capsys):
    runs = {
        "median": ["--strategy", "fedmedian"],
        "dp": ["--strategy", "dp-server-fixed", "--noise", "0.5", "--clipping-norm", "0.5"],
        "dp-again": ["--strategy", "dp-server-fixed", "--noise", "0.5", "--clipping-norm", "0.5"],
    }
    for name, argv in runs.items():
        assert main(["run", "noisy-clients", "--out", str(tmp_path / name), *TINY, *argv]) == 0, name
        run = load_run(tmp_path / name)
        assert set(run.ledger["status"]) == {"ok"}
        # v_t(I_t) is U(A_t): the full coalition drew the realized step's noise.
        assert (run.rounds["utility_after"] == run.rounds["utility_realized"]).all()
        assert (run.rounds["efficiency_gap"].abs() < 1e-9).all()
        capsys.readouterr()
        # The audit replays the strategy's own aggregation (DP noise included) from the state its records saved.
        assert main(["audit", str(tmp_path / name)]) == 0, capsys.readouterr().out
        out = capsys.readouterr().out
        assert "recomputed every value of 2 rounds" in out and "intact" in out and "NOT" not in out
    # The server's generators are seeded from the run's seed: the same seed draws the same DP noise.
    assert (tmp_path / "dp" / "ledger.csv").read_bytes() == (tmp_path / "dp-again" / "ledger.csv").read_bytes()
    assert (tmp_path / "median" / "ledger.csv").read_bytes() != (tmp_path / "dp" / "ledger.csv").read_bytes()


def _mismatched_client(partition_id: int) -> ClientData:
    """Data with 5 features for a model that takes 4: every training step raises."""
    rng = np.random.default_rng(partition_id)
    return ClientData(partition_id=partition_id, x_train=rng.normal(size=(10, 5)).astype(np.float32),
                      y_train=np.zeros(10, dtype=np.int64), x_infer=np.zeros((0, 5), np.float32),
                      y_infer=np.zeros(0, np.int64))


def test_a_run_where_every_client_fails_every_round_raises_with_the_reason(tmp_path):
    model = functools.partial(make_mlp, 4, 2, hidden=(), seed=0)
    utility = TorchModelUtility(model(), np.zeros((4, 4), np.float32), np.zeros(4, np.int64))
    with pytest.raises(NoClientValued, match="no client gave a usable reply in any of the 2 rounds") as caught:
        simulate(strategy=FedAvg(fraction_evaluate=0.0, min_available_nodes=2), model_factory=model,
                 load_client_data=_mismatched_client, num_clients=2, num_rounds=2, utility=utility,
                 out=tmp_path / "run", round_timeout=120, train_config={"lr": 0.1, "local-epochs": 1})
    assert "mat1 and mat2 shapes cannot be multiplied" in str(caught.value)
    run = load_run(tmp_path / "run")  # the ledger books every failure with its reason
    assert set(run.ledger["status"]) == {"failed"} and len(run.rounds) == 2
    assert run.ledger["reason"].str.contains("mat1 and mat2").all()
    assert not run.ledger["reason"].str.contains("\x1b|ray::|\n").any()  # one readable line each


@pytest.mark.parametrize("argv, fragment", [
    (["--noise", "2"], "noise: only strategies ['dp-client-adaptive', 'dp-client-fixed', 'dp-server-adaptive', "
                       "'dp-server-fixed'] read it; got 2.0 with strategy 'fedavg'"),
    (["--strategy", "bulyan", "--num-malicious", "1"], "bulyan needs clients_per_round >= 4 * num_malicious + 3"),
    (["--strategy", "fedtrimmedavg", "--trimmed-beta", "0.5"], "--trimmed-beta: expected a number in [0, 0.5)"),
    (["--strategy", "dp-server-fixed", "--clipping-norm", "0"], "--clipping-norm: expected a finite number > 0"),
    (["--strategy", "dp-server-adaptive", "--target-clipped-quantile", "1"], "--target-clipped-quantile"),
    (["--strategy", "multikrum", "--num-selected", "9"], "--num-selected: expected at most --clients-per-round 6"),
    (["--strategy", "qfedavg", "--q", "-1"], "q: expected a finite number > 0"),
    (["--strategy", "fedmedian", "--proximal-mu", "0.5"], "--proximal-mu: only strategies ['fedprox'] read it"),
])
def test_bad_strategy_options_are_refused_before_anything_is_written(tmp_path, capsys, argv, fragment):
    assert main(["run", "noisy-clients", "--out", str(tmp_path / "run"), *argv]) == 2
    err = capsys.readouterr().err
    assert fragment in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_every_strategy_reads_only_declared_parameters_and_help_lists_them(capsys):
    for name, choice in STRATEGIES.items():
        assert set(choice.reads) <= set(STRATEGY_PARAMETERS), name
    with pytest.raises(SystemExit):
        main(["run", "noisy-clients", "--help"])
    out = capsys.readouterr().out
    assert all(f"--{p.replace('_', '-')}" in out for p in STRATEGY_PARAMETERS)


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_no_strategy_announces_the_federated_evaluation_it_skips_on_purpose():
    from simulations.experiments.noisy_clients.noisy_clients import NoisyClientsConfig

    flower, records = logging.getLogger("flwr"), _Records()
    flower.addHandler(records)
    try:
        FedAvg(fraction_evaluate=0.0)  # Flower's own warning, seen by this handler
        assert any("Federated evaluation will be skipped" in m for m in records.messages)
        records.messages.clear()
        fedavg_without_evaluation()
        for name in STRATEGIES:
            build_strategy(NoisyClientsConfig(strategy=name, clients_per_round=30), 30)
    finally:
        flower.removeHandler(records)
    assert not [m for m in records.messages if "Federated evaluation will be skipped" in m]
    assert FedAvg(fraction_evaluate=0.0).fraction_evaluate == 0.0  # the filter is gone again
