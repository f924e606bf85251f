"""The noisy-clients job on Fashion-MNIST with the CNN: the paper's data protocol built from
the Debian package, and one small real run (Flower, Ray, torch) that audits intact."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedvalue.audit.checks import audit_run
from simulations.cli.main import main
from simulations.datasets.loaders import DEFAULT_DATA_PATHS
from simulations.experiments.noisy_clients.noisy_clients import NoisyClientsConfig, _prepared, audit_from_run, build

pytestmark = pytest.mark.skipif(not Path(DEFAULT_DATA_PATHS["fashion-mnist"]).is_dir(),
                                reason="needs Debian's dataset-fashion-mnist (.ci/run installs it)")


def test_the_papers_protocol_on_fashion_mnist():
    """[ADS] App. C.2: 30 clients × 120 images sampled balanced by class (360 per class) from
    the training split; held out: the test split (here a balanced 1,000 of it)."""
    import dataclasses
    import json

    config = NoisyClientsConfig(dataset="fashion-mnist", examples_per_client=120, holdout_examples=1000,
                                learning_rate=0.01, model="cnn")
    train, holdout, partitions, noisy = _prepared(json.dumps(config.as_dict(), sort_keys=True))
    assert len(train) == 3600 and np.bincount(train.y).tolist() == [360] * 10
    assert [len(p) for p in partitions] == [120] * 30
    assert len(holdout) == 1000 and np.bincount(holdout.y).tolist() == [100] * 10
    assert len(noisy) == 15
    loader, model_factory, utility, _ = build(config)
    assert utility.first_linear is not None and utility.first_linear.weight_key == "1.weight"  # the first conv
    client = loader(0)
    assert client.x_train.shape == (120, 784) and model_factory()(utility.x[:2]).shape == (2, 10)
    # Another seed draws other images, clients and noisy set.
    other = _prepared(json.dumps(dataclasses.replace(config, seed=1).as_dict(), sort_keys=True))
    assert not np.array_equal(other[0].x, train.x) and other[3] != noisy


@pytest.mark.slow  # the default suite: the CNN in-process (tests/simulations/datasets/test_models.py, the audit's
# conv layers in tests/fedvalue/scoring/test_linear_layers.py) and Fashion-MNIST's loader (test_loaders.py)
def test_a_cnn_run_on_fashion_mnist_audits_intact(tmp_path, capsys):
    out = tmp_path / "cnn"
    argv = ["run", "noisy-clients", "--dataset", "fashion-mnist", "--model", "cnn", "--rounds", "2",
            "--num-clients", "4", "--clients-per-round", "3", "--examples-per-client", "20",
            "--holdout-examples", "200", "--local-epochs", "2", "--learning-rate", "0.05", "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "round 2/2" in printed
    saved = json_of(out / "run.json")
    assert saved["dataset"] == "fashion-mnist" and saved["model"] == "cnn"
    report = audit_run(out, **audit_from_run(saved))
    assert report.intact, report.problems
    assert main(["audit", str(out)]) == 0
    assert "intact" in capsys.readouterr().out


def test_the_audit_reads_the_package_but_no_data_path(tmp_path):
    """Fashion-MNIST where Debian put it is rebuilt like digits; a run on files a user named
    (data_path, or MNIST) is refused before any of them is opened."""
    from simulations.experiments.noisy_clients.noisy_clients import audited_config

    saved = {"simulation": "noisy-clients", **NoisyClientsConfig(dataset="fashion-mnist").as_dict()}
    assert audited_config(saved).dataset == "fashion-mnist"
    for changes in ({"data_path": str(tmp_path)}, {"dataset": "mnist", "data_path": str(tmp_path)}):
        with pytest.raises(ValueError, match="^data_path: the run's data lie outside the run directory"):
            audited_config({**saved, **changes})


def json_of(path: Path) -> dict:
    import json

    return json.loads(path.read_text())
