"""An honest run audits intact on the auditor's machine; a forged reply fails there too.

The run is made with this machine's own kernels; each audit runs in a fresh process whose
kernels round differently: torch's portable kernels and MKL without AVX (a CPU without
AVX2), MKL's conditional-reproducibility code path (another BLAS path: it moves float32
logits by ~1e-6), and one OpenMP thread. The job is the main one at seed 0 and 3 rounds,
where the audit's old element-wise replay check (1e-5 relative) failed round 3's client 0
under the portable kernels: rounding tipped a ReLU over its kink in epoch 29 and the two
trainings ended 1.4e-3 of the update apart.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fedvalue.audit.training_replay import ReplayTally, platform_note, reply_problem
from fedvalue.run.archive import (
    read_round_record,
    record_path,
)
from fedvalue.run.ledger_reader import read_ledger_csv
from fedvalue.run.ledger_tables import LedgerWriter
from fedvalue.scoring.kernels import KERNEL_ENVIRONMENT, kernel_platform
from simulations.experiments.noisy_clients.noisy_clients import utility_from_run
from tests.fedvalue.forgery import rebook_last_round, rechain

ROOT = Path(__file__).resolve().parents[2]
#: Kernel sets an auditor's machine may compute with, as environment variables.
OTHER_KERNELS = {
    "portable-aten-and-mkl-sse4.2": {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},
    "mkl-compatible-path": {"MKL_CBWR": "COMPATIBLE"},
    "one-openmp-thread": {"OMP_NUM_THREADS": "1"},
}


def _environment(kernels: dict[str, str]) -> dict[str, str]:
    """This process's environment without its kernel settings, then ``kernels``."""
    environment = {k: v for k, v in os.environ.items() if k not in KERNEL_ENVIRONMENT}
    environment["PYTHONPATH"] = os.pathsep.join([str(ROOT), environment.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return {**environment, **kernels}


def _cli(kernels: dict[str, str], *argv: str, timeout: float = 400) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "simulations.cli", *argv], capture_output=True, text=True,
                          cwd=ROOT, env=_environment(kernels), timeout=timeout, check=False)


def _run(out: Path, seed: int) -> Path:
    made = _cli({}, "run", "noisy-clients", "--out", str(out), "--rounds", "3", "--seed", str(seed), "--quiet")
    assert made.returncode == 0, made.stderr[-2000:]
    return out


def _verdict(audit: subprocess.CompletedProcess) -> str:
    return audit.stdout.strip().splitlines()[-1].rsplit(": ", 1)[-1]


@pytest.fixture(scope="module")
def made_here(tmp_path_factory) -> Path:
    """The main job, seed 0, 3 rounds, made with this machine's kernels (Ray starts once)."""
    return _run(tmp_path_factory.mktemp("portable") / "run", seed=0)


def _audits_intact_with(run_dir: Path, kernels: dict[str, str], replies: int) -> None:
    audit = _cli(kernels, "audit", str(run_dir))
    assert audit.returncode == 0 and _verdict(audit) == "intact", audit.stdout[-3000:]
    assert f"local training replayed for {replies} replies" in audit.stdout
    # Accuracy is a count, the same on every machine: every value recomputes exactly, no rounding envelope.
    assert "(largest difference 0.0e+00)" in audit.stdout and "float32 rounding of the utility" not in audit.stdout
    recorded = json.loads((run_dir / "run.json").read_text())["platform"]
    assert recorded["cpu_capability"] and recorded["torch"] and "torch_threads" in recorded
    if "ATEN_CPU_CAPABILITY" in kernels and recorded["cpu_capability"] != "DEFAULT":
        # The replay ran on other kernels than the run's: no reply came back bit for bit.
        assert f"replayed for {replies} replies: 0 bit for bit" in audit.stdout
        assert "training was replayed on another platform than the run's (cpu_capability: " in audit.stdout


@pytest.mark.timeout(600)
def test_the_session_run_audits_intact_with_portable_kernels(signed_run):
    """The default suite's case: the session's small real run (conftest.py; 3 rounds of 2 clients),
    audited in a process with torch's portable kernels and MKL without AVX."""
    _audits_intact_with(signed_run[0], OTHER_KERNELS["portable-aten-and-mkl-sse4.2"], replies=6)


@pytest.mark.slow  # the fast sibling: test_the_session_run_audits_intact_with_portable_kernels
@pytest.mark.timeout(600)
@pytest.mark.parametrize("kernels", [pytest.param(kernels, id=name) for name, kernels in OTHER_KERNELS.items()])
def test_an_honest_run_audits_intact_with_other_kernels(made_here, kernels):
    """The main job at seed 0, whose round 3 the old element-wise check failed, with every kernel set."""
    _audits_intact_with(made_here, kernels, replies=18)


def _forge_reply(run_dir: Path, change) -> str:
    """Round 3's first reply replaced by ``change(start, reply)``, and everything that depends on
    it booked again by the project's own recompute, re-chained and resealed (a forger without
    a key): only the replay of local training can tell."""
    config = json.loads((run_dir / "run.json").read_text())
    record = read_round_record(record_path(run_dir, 3))
    client = next(iter(record.replies))
    record.replies[client] = change(record.start_arrays, record.replies[client])
    rebook_last_round(run_dir, record, utility_from_run(config), config["noisy_clients"])
    (run_dir / "ledger.parquet").unlink()
    read_ledger_csv(io.StringIO((run_dir / "ledger.csv").read_text(), newline="")).to_parquet(
        run_dir / "ledger.parquet", index=False)
    rechain(run_dir)
    return str(client)


def _shrunk_update(start, reply):
    """A client made to look less useful: its update shortened by a tenth."""
    return {k: (start[k] + 0.9 * (reply[k] - start[k])).astype(reply[k].dtype) for k in reply}


@pytest.mark.slow  # the default suite audits the same run with the portable kernels (above)
@pytest.mark.timeout(600)
def test_a_forged_reply_fails_the_audit_with_other_kernels(made_here, tmp_path):
    forged = tmp_path / "forged"
    shutil.copytree(made_here, forged)
    client = _forge_reply(forged, _shrunk_update)
    audit = _cli(OTHER_KERNELS["portable-aten-and-mkl-sse4.2"], "audit", str(forged))
    assert audit.returncode == 1 and _verdict(audit) == "NOT intact", audit.stdout[-3000:]
    assert f"round 3 client {client}: its saved reply is not what local training" in audit.stdout
    assert "of its update; float rounding moves this training by at most" in audit.stdout
    failed = [line for line in audit.stdout.splitlines() if line.startswith("FAILED")]
    assert len(failed) == 1, failed  # the books were booked again: only the replay tells


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_other_seeds_audit_intact_with_portable_kernels(tmp_path, seed):
    run_dir = _run(tmp_path / "run", seed=seed)
    audit = _cli(OTHER_KERNELS["portable-aten-and-mkl-sse4.2"], "audit", str(run_dir))
    assert audit.returncode == 0 and _verdict(audit) == "intact", audit.stdout[-3000:]


# --------------------------------------------------------------------------- the parts, without Ray


def near_tie_hits() -> dict[str, int]:
    """Hits of one state on 2,000 rows whose two top classes tie to ~1e-6 (two output units
    equal up to that): by float32 argmax alone, and by the utility's plain, batched and
    linear paths (run in a subprocess per kernel set)."""
    import torch

    from fedvalue.scoring.torch_utilities import TorchModelUtility
    from simulations.datasets.models import make_mlp

    model = make_mlp(64, 3, hidden=(200,), seed=5)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(2000, 64)).astype(np.float32), rng.integers(0, 2, size=2000)
    state = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    state["2.weight"][1] = state["2.weight"][0] * (1 + 1e-6 * rng.normal(size=200)).astype(np.float32)
    state["2.bias"][1] = state["2.bias"][0]
    state["2.weight"][2] = -10.0
    utility = TorchModelUtility(model, x, y)
    with torch.no_grad():
        logits = torch.func.functional_call(model, utility.tensors(state), (utility.x,))
    return {"float32 argmax": int((logits.argmax(dim=-1) == utility.y).sum()),
            "plain": round(utility(state) * len(x)), "batch": round(utility.batch([state])[0] * len(x)),
            "linear": round(utility.linear([state]).values(np.array([[1.0]]))[0] * len(x))}


@pytest.mark.timeout(300)
def test_accuracy_counts_the_same_hits_with_every_kernel_set():
    """Float32 logits move by ~1e-6 with the kernels, which flips near ties; the utility
    decides those rows in float64, so every machine books the same accuracy."""
    code = "import json; from tests.hostile.test_portability import near_tie_hits; print(json.dumps(near_tie_hits()))"
    found, kernel_sets = {}, {name: OTHER_KERNELS[name] for name in ("portable-aten-and-mkl-sse4.2", "mkl-compatible-path")}
    if any(name in os.environ for name in KERNEL_ENVIRONMENT):
        kernel_sets = {"this machine's": {}, **kernel_sets}  # this process was given other kernels: a fresh one
    else:
        found["this machine's"] = near_tie_hits()  # this process computes with this machine's kernels
    for name, kernels in kernel_sets.items():  # threads leave the logits as they are
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                              env=_environment(kernels), timeout=240, check=False)
        assert done.returncode == 0, done.stderr[-2000:]
        found[name] = json.loads(done.stdout.strip().splitlines()[-1])
    booked = {name: {found[name][path] for path in ("plain", "batch", "linear")} for name in found}
    assert all(len(hits) == 1 for hits in booked.values()), found  # every path the same
    assert len(set.union(*booked.values())) == 1, found  # every machine the same
    # What the float64 decision buys: float32 argmax alone counts differently across kernel sets.
    assert len({found[name]["float32 argmax"] for name in found}) > 1, found


def _training(start):
    """A stand-in for local training: smooth in its start, as SGD is between kinks."""
    return {k: (0.5 * v + 1.0).astype(v.dtype) for k, v in start.items()}


def test_a_reply_is_checked_bit_for_bit_then_element_wise_then_against_rounding():
    start = {"w": np.linspace(-1, 1, 50, dtype=np.float32), "steps": np.array(3)}

    def retrain(t, client, arrays):
        return _training(arrays)

    honest = _training(start)
    tally = ReplayTally()
    assert reply_problem(1, 0, honest, start, retrain, tally) is None
    nudged = {**honest, "w": np.nextafter(honest["w"], np.float32(np.inf))}  # one unit in the last place
    assert reply_problem(1, 0, nudged, start, retrain, tally) is None
    assert (tally.identical, tally.close, tally.within_rounding) == (1, 1, 0)
    assert 0 < tally.largest_close_drift < 1e-6 and tally.largest_drift == 0  # a unit in the last place, of the update
    for name, forged in (("scaled", {**honest, "w": honest["w"] * np.float32(1.001)}),
                         ("nan", {**honest, "w": np.where(np.arange(50) == 3, np.nan, honest["w"]).astype(np.float32)}),
                         ("other keys", {"w": honest["w"]}),
                         ("integer entry", {**honest, "steps": np.array(4)})):
        problem = reply_problem(2, 7, forged, start, retrain, tally)
        assert problem and problem.startswith("round 2 client 7: its saved reply is not what local training"), name
    assert tally.replies == 2


def test_a_reply_within_the_rounding_envelope_is_accepted_and_counted():
    """A training that rounding tips over a kink: the probes from a perturbed start reach the
    other branch, so a reply on it is accepted; ten times farther is not."""
    start = {"w": np.linspace(0.5, 1.5, 40, dtype=np.float32)}

    def kinked(t, client, arrays):
        jump = np.float32(1e-3) if float(arrays["w"][17]) > float(start["w"][17]) else np.float32(0.0)
        return {"w": (arrays["w"] * np.float32(2.0) + jump).astype(np.float32)}

    replay = kinked(1, 0, start)
    other_branch = {"w": replay["w"] + np.float32(1e-3)}
    tally = ReplayTally()
    assert reply_problem(1, 0, other_branch, start, kinked, tally) is None
    assert tally.within_rounding == 1 and tally.largest_envelope_ratio <= 1.01
    assert "only within float rounding of training on this machine" in tally.summary()
    assert tally.measured() == {"replies_bit_for_bit": 0, "replies_to_tolerance": 0, "replies_within_rounding": 1,
                                "largest_reply_drift": tally.largest_drift,
                                "largest_reply_envelope_ratio": tally.largest_envelope_ratio,
                                "largest_close_reply_drift": 0.0}
    farther = {"w": replay["w"] + np.float32(2e-2)}
    assert "float rounding moves this training by at most" in reply_problem(1, 0, farther, start, kinked)


def test_the_platform_is_recorded_and_a_resume_elsewhere_keeps_it(tmp_path):
    here = kernel_platform()
    assert {"cpu", "cpu_capability", "torch_blas", "numpy_blas", "torch", "numpy", "torch_threads", "cpus"} <= set(here)
    assert here == kernel_platform()  # nothing volatile: two runs on one machine record the same
    LedgerWriter(tmp_path, config={"seed": 0, "platform": here})
    elsewhere = {**here, "cpu_capability": "DEFAULT", "torch_threads": 1}
    LedgerWriter(tmp_path, config={"seed": 0, "platform": elsewhere}, resume=True)  # not compared
    assert json.loads((tmp_path / "run.json").read_text())["platform"] == here  # kept as written
    with pytest.raises(ValueError, match="started with seed=0"):
        LedgerWriter(tmp_path, config={"seed": 1, "platform": here}, resume=True)


def test_the_audit_says_which_platforms_it_compared():
    here = kernel_platform()
    assert "run's own platform" in platform_note(here)
    assert "cpu_capability: AVX9 -> " in platform_note({**here, "cpu_capability": "AVX9"})
    assert platform_note(None).startswith("the run recorded no platform (an older version wrote it)")
