"""Bad input wherever a user types: a message naming the parameter, a non-zero exit, no traceback,
and nothing left behind on disk. None of these cases starts Ray."""

from __future__ import annotations

import gzip
import re
import struct

import numpy as np
import pytest

from fedvalue import AdsSettings
from simulations.cli.main import main


@pytest.mark.parametrize(("argv", "named"), [
    # unknown simulation, dataset, method, strategy
    (["run", "noisy-clients", "--dataset", "cifar"], "dataset"),
    (["run", "noisy-clients", "--methods", "ads,shapley"], "methods"),
    (["run", "noisy-clients", "--methods", "ads,ads"], "methods"),
    (["run", "noisy-clients", "--ads-method", "kernel"], "ads_method"),
    # the expansions differentiate U and read FedAvg's weighted mean; the adaptive options need adaptive
    (["run", "noisy-clients", "--ads-method", "second-order"], "ads_method"),
    (["run", "noisy-clients", "--ads-method", "first-order", "--utility", "neg_loss", "--strategy", "fedmedian"],
     "ads_method"),
    (["run", "noisy-clients", "--ads-method", "second-order", "--utility", "neg_loss", "--strategy", "fedadam"],
     "ads_method"),
    (["run", "noisy-clients", "--adaptive-cut", "0.5"], "adaptive_cut"),
    # the fixed-weight game's second-order book differentiates U and weighs by FedAvg's round weights
    (["run", "noisy-clients", "--fixed-second-order"], "fixed_second_order"),
    (["run", "noisy-clients", "--fixed-second-order", "--utility", "neg_loss", "--strategy", "fedmedian"],
     "fixed_second_order"),
    (["run", "noisy-clients", "--ads-method", "mc", "--adaptive-decision", "top-k"], "adaptive_decision"),
    (["run", "noisy-clients", "--ads-method", "exact", "--adaptive-top-k", "2"], "adaptive_top_k"),
    (["run", "noisy-clients", "--adaptive-z", "3"], "adaptive_z"),
    (["run", "noisy-clients", "--ads-method", "adaptive", "--adaptive-decision", "bottom-k"], "adaptive_decision"),
    (["run", "noisy-clients", "--ads-method", "adaptive", "--adaptive-decision", "top-k"], "adaptive_top_k"),
    (["run", "noisy-clients", "--ads-method", "adaptive", "--adaptive-decision", "top-k", "--adaptive-top-k", "0"],
     "adaptive_top_k"),
    (["run", "noisy-clients", "--ads-method", "adaptive", "--adaptive-decision", "top-k", "--adaptive-top-k", "7"],
     "adaptive_top_k"),
    (["run", "noisy-clients", "--ads-method", "adaptive", "--adaptive-top-k", "2"], "adaptive_top_k"),
    (["run", "noisy-clients", "--ads-method", "adaptive", "--adaptive-decision", "top-k", "--adaptive-top-k", "2",
      "--adaptive-cut", "0.1"], "adaptive_cut"),
    (["run", "noisy-clients", "--ads-method", "adaptive", "--adaptive-cut", "inf"], "adaptive_cut"),
    (["run", "noisy-clients", "--ads-method", "adaptive", "--adaptive-z", "0"], "adaptive_z"),
    (["run", "noisy-clients", "--ads-method", "adaptive", "--adaptive-z", "nan"], "adaptive_z"),
    (["run", "noisy-clients", "--strategy", "fedsgd"], "strategy"),
    (["run", "noisy-clients", "--utility", "f1"], "utility"),
    (["run", "noisy-clients", "--schedule", "roundrobin"], "schedule"),
    (["run", "noisy-clients", "--partition", "natural-id"], "partition"),
    (["run", "reciprocity-federated", "--dataset", "digits"], "dataset"),
    (["run", "reciprocity", "--dataset", "mnist"], "dataset"),
    # k larger than the clients per round
    (["run", "noisy-clients-study", "--ks", "3,7"], "ks"),
    # rounds <= 0 and other counts
    (["run", "noisy-clients", "--rounds", "0"], "rounds"),
    (["run", "noisy-clients", "--rounds", "-2"], "rounds"),
    (["run", "noisy-clients-study", "--rounds", "0"], "rounds"),
    (["run", "reciprocity-federated", "--rounds", "0"], "rounds"),
    (["run", "noisy-clients", "--clients-per-round", "31"], "clients_per_round"),
    (["run", "noisy-clients", "--local-epochs", "0"], "local_epochs"),
    (["run", "noisy-clients", "--batch-size", "-1"], "batch_size"),
    (["run", "noisy-clients", "--hidden", "200,0"], "hidden"),
    (["run", "reciprocity-federated", "--num-clients", "400"], "num_clients"),
    # fractions and rates outside their ranges
    (["run", "noisy-clients", "--holdout-fraction", "0"], "holdout_fraction"),
    (["run", "noisy-clients", "--holdout-fraction", "1.2"], "holdout_fraction"),
    (["run", "noisy-clients", "--noisy-fraction", "1.5"], "noisy_fraction"),
    (["run", "noisy-clients", "--flip-probability", "-0.1"], "flip_probability"),
    (["run", "noisy-clients", "--delta", "1"], "delta"),
    (["run", "noisy-clients", "--epsilon", "0"], "epsilon"),
    (["run", "noisy-clients", "--stderr-target", "-0.01"], "stderr_target"),
    (["run", "noisy-clients", "--truncation-tolerance", "nan"], "truncation_tolerance"),
    # options the study cannot honour are refused, not ignored
    (["run", "noisy-clients-study", "--strategy", "fedadam"], "strategy"),
    (["run", "noisy-clients-study", "--methods", "ads"], "methods"),
    (["run", "noisy-clients", "--learning-rate", "nan"], "learning_rate"),
    (["run", "noisy-clients", "--dirichlet-alpha", "-1"], "dirichlet_alpha"),
    (["run", "noisy-clients", "--round-timeout", "0"], "round_timeout"),
    (["run", "noisy-clients", "--query-timeout", "0"], "query_timeout"),
    (["run", "noisy-clients", "--query-timeout=-5"], "query_timeout"),
    (["run", "noisy-clients", "--query-timeout", "inf"], "query_timeout"),
    (["run", "noisy-clients-study", "--query-timeout", "nan"], "query_timeout"),
    (["run", "noisy-clients", "--num-cpus-per-client", "0"], "num_cpus_per_client"),
    (["run", "reciprocity", "--p", "1.5"], "p"),
    (["run", "attacks", "--round-timeout", "0"], "round_timeout"),
    (["run", "attacks", "--seed", "-1"], "seed"),
    (["run", "reciprocity-federated", "--num-cpus-per-client", "inf"], "num_cpus_per_client"),
    # MNIST without files, or with missing ones
    (["run", "noisy-clients", "--dataset", "mnist"], "data_path"),
    (["run", "noisy-clients", "--dataset", "mnist", "--data-path", "/nonexistent/mnist"], "data_path"),
    # sizes that would exhaust memory, nothing to book, an address nothing answers at (refused in seconds)
    (["run", "noisy-clients", "--hidden", "1000000,1000000"], "hidden"),
    (["run", "noisy-clients", "--valuation-workers", "100000"], "valuation_workers"),
    (["run", "noisy-clients", "--methods", ""], "methods"),
    (["run", "noisy-clients", "--ray-address", "127.0.0.1:1"], "ray_address"),
    (["run", "noisy-clients", "--ray-address", "nowhere"], "ray_address"),
    (["run", "noisy-clients", "--sign-key", "/nonexistent/key.pem"], "sign_key"),
])
def test_bad_options_name_the_parameter_and_leave_nothing_behind(tmp_path, capsys, argv, named):
    out = tmp_path / "run"
    if argv[1] != "reciprocity":
        argv = [*argv, "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    option = "--" + named.replace("_", "-")  # the error names the option the user typed
    assert err.startswith(f"fedvalue: error: {option}:"), err
    assert "expected" in err and "Traceback" not in err
    assert not out.exists()


def test_an_out_directory_that_cannot_be_made_is_bad_input(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    assert main(["run", "noisy-clients", "--out", str(blocker / "run")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedvalue: error: --out: expected a directory fedvalue can create and write"), err


def write_idx(path, array: np.ndarray, *, magic_dtype: int = 0x08, compress: bool = False) -> None:
    header = struct.pack(">HBB", 0, magic_dtype, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    data = header + array.astype(np.uint8).tobytes()
    if compress:
        data = gzip.compress(data)
    path.write_bytes(data)


@pytest.mark.parametrize("damage", ["truncated", "bad-magic", "label-count", "not-gzip", "npz-keys"])
def test_malformed_mnist_files_are_named_not_a_traceback(tmp_path, capsys, damage):
    mnist = tmp_path / "mnist"
    mnist.mkdir()
    images, labels = np.zeros((20, 28, 28), np.uint8), np.arange(20) % 10
    for split, count in (("train", 20), ("t10k", 20)):
        write_idx(mnist / f"{split}-images-idx3-ubyte", images[:count])
        write_idx(mnist / f"{split}-labels-idx1-ubyte", labels[:count])
    path = mnist
    if damage == "truncated":
        (mnist / "train-images-idx3-ubyte").write_bytes((mnist / "train-images-idx3-ubyte").read_bytes()[:500])
    elif damage == "bad-magic":
        write_idx(mnist / "train-labels-idx1-ubyte", labels, magic_dtype=0x0D)
    elif damage == "label-count":
        write_idx(mnist / "t10k-labels-idx1-ubyte", labels[:7])
    elif damage == "not-gzip":
        (mnist / "train-images-idx3-ubyte").unlink()
        (mnist / "train-images-idx3-ubyte.gz").write_bytes(b"this is not gzip data")
    else:
        path = tmp_path / "mnist.npz"
        np.savez(path, images=images, labels=labels)
    out = tmp_path / "run"
    assert main(["run", "noisy-clients", "--dataset", "mnist", "--data-path", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedvalue: error: --data-path:") and "Traceback" not in err, err
    assert not out.exists()


def test_an_output_directory_holding_a_different_run_or_other_files_is_refused(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.json").write_text('{"simulation": "reciprocity-federated"}')
    (run_dir / "ledger.csv").write_text("round\n")
    assert main(["run", "noisy-clients", "--out", str(run_dir)]) == 2
    assert "out:" in capsys.readouterr().err and (run_dir / "ledger.csv").read_text() == "round\n"
    # Resuming it as another simulation is refused too.
    assert main(["run", "noisy-clients", "--resume", str(run_dir)]) == 2
    assert "resume:" in capsys.readouterr().err
    other = tmp_path / "photos"
    other.mkdir()
    (other / "holiday.jpg").write_bytes(b"\xff\xd8")
    assert main(["run", "noisy-clients", "--out", str(other)]) == 2
    assert "out: expected an empty or new directory" in capsys.readouterr().err
    assert main(["run", "noisy-clients"]) == 2
    assert "--out: expected the directory for the run's ledger" in capsys.readouterr().err


def test_unknown_simulation_and_unreadable_run_directories(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "federated-gan", "--out", str(tmp_path / "x")])
    assert exit_info.value.code == 2
    assert "invalid choice: 'federated-gan'" in capsys.readouterr().err
    for command in ("report", "audit"):
        assert main([command, str(tmp_path / "missing")]) == 2
        assert "run_dir: expected a fedvalue run directory" in capsys.readouterr().err
    assert main(["run", "noisy-clients", "--resume", str(tmp_path / "missing")]) == 2
    assert "resume: expected a run directory holding run.json" in capsys.readouterr().err


def test_estimator_options_reach_the_valuing_strategy():
    from fedvalue.valuation.settings import AdsSettings
    from simulations.experiments.noisy_clients.noisy_clients import NoisyClientsConfig, valuation_settings

    settings = valuation_settings(NoisyClientsConfig(ads_method="tmc", truncation_tolerance=5e-3, stderr_target=0.01,
                                                     methods=("ads",), valuation_budget="900"))
    assert settings.methods == ("ads",)
    assert settings.ads == AdsSettings(method="tmc", truncation_tolerance=5e-3, stderr_target=0.01, budget=900)
    assert valuation_settings(NoisyClientsConfig()).ads == AdsSettings()  # unset: all m* permutations, no budget


@pytest.mark.parametrize(("options", "expected"), [
    ({"ads_method": "first-order", "utility": "neg_loss"}, AdsSettings(method="first-order")),
    ({"ads_method": "second-order", "utility": "neg_loss", "strategy": "fedprox"}, AdsSettings(method="second-order")),
    ({"ads_method": "second-order", "methods": ("loo",)}, AdsSettings(method="second-order")),  # no ADS: no expansion
    ({"ads_method": "adaptive"}, AdsSettings(method="adaptive", decision="threshold", cut=0.0)),
    ({"ads_method": "adaptive", "adaptive_cut": -0.01, "adaptive_z": 3.0, "stderr_target": 0.01},
     AdsSettings(method="adaptive", decision="threshold", cut=-0.01, z=3.0, stderr_target=0.01)),
    ({"ads_method": "adaptive", "adaptive_decision": "top-k", "adaptive_top_k": 6, "valuation_budget": "400"},
     AdsSettings(method="adaptive", decision="top-k", top_k=6, budget=400)),
])
def test_the_expansions_and_adaptive_mc_ads_reach_the_valuing_strategy(options, expected):
    from simulations.experiments.noisy_clients.noisy_clients import NoisyClientsConfig, build, valuation_settings

    config = NoisyClientsConfig(**options)
    build(config)  # checked as a run checks it, before Ray starts
    assert valuation_settings(config).ads == expected


def test_the_adaptive_settings_are_written_by_an_adaptive_run_only_and_a_resume_keeps_them(tmp_path, capsys):
    """run.json of a run by any other method holds no adaptive key (its bytes are as before), and reads back,
    strictly, as the defaults; an adaptive run writes all four, and resuming either refuses a changed one."""
    import json

    from simulations.experiments.noisy_clients.noisy_clients import ADAPTIVE_KEYS, NoisyClientsConfig
    from simulations.runner import saved_config

    default = NoisyClientsConfig().as_dict()
    assert not set(ADAPTIVE_KEYS) & set(default)
    assert saved_config(NoisyClientsConfig, default) == NoisyClientsConfig()
    adaptive = NoisyClientsConfig(ads_method="adaptive", adaptive_decision="top-k", adaptive_top_k=3)
    written = adaptive.as_dict()
    assert {name: written[name] for name in ADAPTIVE_KEYS} == {
        "adaptive_decision": "top-k", "adaptive_cut": 0.0, "adaptive_top_k": 3, "adaptive_z": 2.0}
    assert saved_config(NoisyClientsConfig, json.loads(json.dumps(written))) == adaptive
    for settings, argv, named in ((default, ["--ads-method", "adaptive"], "--ads-method"),
                                  (default, ["--adaptive-z", "3"], "--adaptive-z"),
                                  (written, ["--adaptive-top-k", "2"], "--adaptive-top-k")):
        run_dir = tmp_path / named.strip("-")
        run_dir.mkdir(exist_ok=True)
        (run_dir / "run.json").write_text(json.dumps({"simulation": "noisy-clients", **settings}))
        assert main(["run", "noisy-clients", "--resume", str(run_dir), *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"fedvalue: error: {named}: the run in ") and "keeps its settings" in err, err


def test_the_fixed_second_order_flag_reaches_the_run_and_its_run_json_only_when_given(tmp_path, capsys):
    """``--fixed-second-order`` is a flag: given, the config books the fixed-weight game's second-order expansion and
    its run.json says so; not given, run.json holds no such key (its bytes are as before) and reads back strictly as
    off. Its refusal names the option, what was expected and what was got; a resume refuses turning it on."""
    import json

    from simulations.experiments.noisy_clients.flower_app import config_from_run_config, same_ledger_command
    from simulations.experiments.noisy_clients.noisy_clients import NoisyClientsConfig, build
    from simulations.runner import saved_config

    assert main(["run", "noisy-clients", "--fixed-second-order", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedvalue: error: --fixed-second-order: expected --utility 'neg_loss', the differentiable "
                          "utility the second-order expansion of the fixed-weight round game needs; got --utility "
                          "'accuracy'. "), err
    on = NoisyClientsConfig(fixed_second_order=True, utility="neg_loss", strategy="fedprox")
    build(on)  # checked as a run checks it, before Ray starts
    default = NoisyClientsConfig().as_dict()
    assert "fixed_second_order" not in default and on.as_dict()["fixed_second_order"] is True
    assert saved_config(NoisyClientsConfig, default) == NoisyClientsConfig()
    assert saved_config(NoisyClientsConfig, json.loads(json.dumps(on.as_dict()))) == on
    assert same_ledger_command(on, "x") == (
        "fedvalue run noisy-clients --out DIR --strategy fedprox --utility neg_loss --fixed-second-order")
    assert config_from_run_config({"fixed-second-order": True, "utility": "neg_loss"})[0].fixed_second_order
    with pytest.raises(ValueError, match="fixed-second-order: expected a bool; got 1"):
        config_from_run_config({"fixed-second-order": 1})
    run_dir = tmp_path / "resumed"
    run_dir.mkdir()
    (run_dir / "run.json").write_text(json.dumps({"simulation": "noisy-clients", **default}))
    assert main(["run", "noisy-clients", "--resume", str(run_dir), "--fixed-second-order"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedvalue: error: --fixed-second-order: the run in ") and "keeps its settings" in err, err


def test_the_attacks_help_lists_every_attack_it_knows(capsys):
    from simulations.experiments.attacks.attacks import ATTACKS, GROUP_SPLIT
    from simulations.experiments.attacks.plan import ADAPTIVE_ATTACKS, PLAIN_ATTACKS

    with pytest.raises(SystemExit):
        main(["run", "attacks", "--help"])
    shown = re.sub(r"(?<=\w-) ", "", " ".join(capsys.readouterr().out.split()))  # argparse wraps at hyphens
    for attack in (*ATTACKS, *PLAIN_ATTACKS, *ADAPTIVE_ATTACKS, GROUP_SPLIT, "sybil-split-K", "sybil-replica-K",
                   "module:callable"):
        assert attack in shown, attack
    assert "--attacks ATTACKS, --attack ATTACKS" in shown


@pytest.mark.parametrize(("spec", "said"), [
    ("own_attack:Tripld", "--attacks: attack 'own_attack:Tripld': own_attack imports, but has no 'Tripld'; did you "
                          "mean 'Tripled'?"),
    ("no_such_module:Tripled", "attack 'no_such_module:Tripled': cannot import it (ModuleNotFoundError"),
    ("own_attack:NOT_A_BEHAVIOUR", "attack 'own_attack:NOT_A_BEHAVIOUR': expected a ClientBehaviour or a callable of "
                                   "no arguments building one; got a int"),
    ("own_attack:make_list", "attack 'own_attack:make_list': expected it to build a clients.ClientBehaviour"),
])
def test_an_attack_of_ones_own_that_does_not_load_is_named_before_ray_starts(tmp_path, capsys, monkeypatch, spec,
                                                                            said):
    (tmp_path / "own_attack.py").write_text("from clients import ClientBehaviour\n"
                                            "class Tripled(ClientBehaviour):\n    pass\n"
                                            "NOT_A_BEHAVIOUR = 3\n"
                                            "def make_list():\n    return []\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(__import__("sys").modules, "own_attack", raising=False)
    assert main(["run", "attacks", "--attack", spec, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedvalue: error: ") and said in err and "Traceback" not in err, err
    assert not (tmp_path / "run").exists()
