"""A run that dies keeps its completed rounds, and ``resume`` gives the uninterrupted ledger.

The reference is the same run without interruption: ledger.csv and first_order.csv must be
byte-identical, rounds.csv equal except the wall-time column (and the hashes that cover
it), and the final global state identical. The runs use the real ClientApp behind an
in-process grid, a stateful server optimizer (FedAdam: its moments must survive the
crash) and a stateful sampler (ValueWeightedSampler: its accumulated values too).
"""

from __future__ import annotations

import functools

import numpy as np
import pandas as pd
import pytest
from flwr.app import ConfigRecord
from flwr.serverapp.strategy import FedAdam

from fedvalue.run.archive import read_checkpoint_pointer, read_round_record, round_record_paths
from fedvalue.run.rundir import RunDir
from fedvalue.audit.checks import audit_run
from fedvalue.analysis.run_summary import load_run
from strategies import RunInterrupted, ValueWeightedSampler, ValuingStrategy
from strategies.arrays import numpy_to_arrays
from fedvalue.valuation.settings import ValuationSettings
from fedvalue.run.settings import RunSettings
from strategies.book_settings import BookSettings

from tests.strategies.harness.inprocess import set_server_identity
from tests.strategies.hooks.test_flow_books import client_app_grid, initial_state, load_client, utility

ROUNDS = 4


class Crash(RuntimeError):
    """Stands in for the process dying right after a round committed."""


def make_strategy(run_dir, *, resume=False, crash_after=None) -> ValuingStrategy:
    def on_round(row):
        if crash_after is not None and row.round == crash_after:
            raise Crash(f"killed after round {crash_after}")

    strategy = ValuingStrategy(
        FedAdam(fraction_evaluate=0.0, eta=0.05), utility(), run_dir=str(run_dir),
        sampler=ValueWeightedSampler(3, method="ads", temperature=0.01, seed=2), seed=5,
        valuation=ValuationSettings(methods=("ads", "loo")), books=BookSettings(flows=True),
        run=RunSettings(run_config={"experiment": "resume"}, resume=resume),
    )
    strategy.on_round = on_round
    return strategy


def run(strategy: ValuingStrategy):
    grid = client_app_grid(load_client)
    config = {"lr": 0.05, "local-epochs": 2, "batch-size": 0, "seed": 0}
    return strategy.start(grid, numpy_to_arrays(initial_state()), num_rounds=ROUNDS, timeout=10,
                          train_config=ConfigRecord(config))


def rounds_without_wall_time(run_dir) -> pd.DataFrame:
    return load_run(run_dir).rounds.drop(columns=["valuation_seconds", "hash"])


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    set_server_identity()  # module-scoped: runs before the per-test identity fixture
    run_dir = tmp_path_factory.mktemp("uninterrupted")
    result = run(make_strategy(run_dir))
    return run_dir, result


@pytest.mark.parametrize("crash_after", [1, 2])
def test_resume_after_a_crash_writes_the_uninterrupted_ledger(tmp_path, uninterrupted, crash_after):
    reference_dir, reference = uninterrupted
    with pytest.raises(Crash):
        run(make_strategy(tmp_path, crash_after=crash_after))
    # Every completed round is on disk and readable, and the books are intact.
    assert list(load_run(tmp_path).rounds["round"]) == list(range(1, crash_after + 1))
    assert audit_run(tmp_path).ok
    # The process died while writing the next round: torn lines past the last commit.
    with open(tmp_path / "ledger.csv", "a") as handle:
        handle.write(f"{crash_after + 1},3,ads,0.123")
    with open(tmp_path / "first_order.csv", "a") as handle:
        handle.write(f"{crash_after},1,0.5,")

    result = run(make_strategy(tmp_path, resume=True))

    assert (tmp_path / "ledger.csv").read_bytes() == (reference_dir / "ledger.csv").read_bytes()
    assert (tmp_path / "first_order.csv").read_bytes() == (reference_dir / "first_order.csv").read_bytes()
    pd.testing.assert_frame_equal(rounds_without_wall_time(tmp_path), rounds_without_wall_time(reference_dir))
    for key, array in reference.arrays.items():  # FedAdam's moments survived: same final state
        np.testing.assert_array_equal(result.arrays[key].numpy(), array.numpy())
    report = audit_run(tmp_path)
    assert report.ok, report.problems
    assert read_checkpoint_pointer(RunDir(tmp_path))[0] == ROUNDS
    assert sorted(round_record_paths(tmp_path)) == list(range(1, ROUNDS + 1))


def test_records_hold_each_rounds_start_state_and_replies(uninterrupted):
    run_dir, _ = uninterrupted
    ledger = load_run(run_dir).ledger
    paths = round_record_paths(run_dir)
    for server_round, path in paths.items():
        record = read_round_record(path)
        assert record.round == server_round
        sampled = ledger[(ledger["round"] == server_round) & (ledger["method"] == "ads")]
        assert [str(c) for c in record.replies] == list(sampled["client_id"])
        assert set(record.accepted) == set(record.replies)
        assert len(record.gradients) == 6 and set(record.losses) == set(record.gradients)
        assert record.settings.methods == ("ads", "loo") and record.settings.aggregation == "strategy"
    # A round's start state is the state the previous round moved to.
    first, second = read_round_record(paths[1]), read_round_record(paths[2])
    assert set(first.start_arrays) == set(initial_state())
    for key, value in initial_state().items():
        np.testing.assert_array_equal(first.start_arrays[key], value)
    assert any(not np.array_equal(second.start_arrays[k], first.start_arrays[k]) for k in first.start_arrays)


def test_resuming_a_finished_run_or_with_another_configuration_is_refused(tmp_path, uninterrupted):
    reference_dir, _ = uninterrupted
    with pytest.raises(ValueError, match="the run .* already completed 4 rounds"):
        run(make_strategy(reference_dir, resume=True))
    with pytest.raises(Crash):
        run(make_strategy(tmp_path, crash_after=1))
    other = functools.partial(make_strategy, tmp_path, resume=True)
    with pytest.raises(ValueError, match="resume: the run .* was started with experiment='resume'"):
        ValuingStrategy(
            FedAdam(), utility(), run_dir=str(tmp_path),
            run=RunSettings(run_config={"experiment": "other"}, resume=True)
        ).open_books()  # constructors do no I/O: the books are opened here
    with pytest.raises(ValueError, match="resume: expected run_dir"):
        ValuingStrategy(FedAdam(), utility(), run=RunSettings(resume=True))
    with pytest.raises(ValueError, match="resume: expected a run directory holding run.json"):
        ValuingStrategy(FedAdam(), utility(), run_dir=str(tmp_path / "empty"), run=RunSettings(resume=True)).open_books()
    assert other() is not None


def test_a_stop_request_ends_the_run_after_the_round_in_flight_and_it_resumes(tmp_path, uninterrupted):
    """What SIGINT/SIGTERM do (simulations.runner.engine.stop_on_signals sets the event): the round in
    flight commits, then RunInterrupted; the run is incomplete, unfailed, and resumes to the
    uninterrupted ledger and its final manifest."""
    reference_dir, _ = uninterrupted
    strategy = make_strategy(tmp_path)
    strategy.on_round = lambda row: strategy.stop_requested.set() if row.round == 2 else None
    with pytest.raises(RunInterrupted, match="stopped on request after round 2 committed"):
        run(strategy)
    report = audit_run(tmp_path)
    assert report.ok and not report.intact and any("incomplete" in u for u in report.unverifiable)
    run(make_strategy(tmp_path, resume=True))
    assert (tmp_path / "ledger.csv").read_bytes() == (reference_dir / "ledger.csv").read_bytes()
    assert (tmp_path / "manifest.json").exists() and audit_run(tmp_path).ok


def test_runs_named_by_relative_tilde_and_linked_paths_resume_to_the_uninterrupted_ledger(
        tmp_path, uninterrupted, monkeypatch):
    """The run directory is resolved once, however it is named: a crash after round 1 of a run
    in a relative directory under a linked parent keeps the round, resumes through ``~``, and
    its audit names the resolved directory."""
    reference_dir, _ = uninterrupted
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    monkeypatch.chdir(tmp_path / "link")
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(Crash):
        run(make_strategy("runs/x", crash_after=1))
    assert list(load_run("runs/x").rounds["round"]) == [1]
    run(make_strategy("~/link/runs/x", resume=True))
    assert (real / "runs" / "x" / "ledger.csv").read_bytes() == (reference_dir / "ledger.csv").read_bytes()
    for named in ("runs/x", "~/link/runs/x", str(real / "runs" / "x")):
        report = audit_run(named)
        assert report.ok, report.problems
        assert report.run_dir == str(real / "runs" / "x")


def test_a_dp_strategy_drawing_from_the_global_generator_resumes_to_the_uninterrupted_ledger(tmp_path):
    """Flower's DP noise is drawn from numpy's global generator: the checkpoint saves the global
    random state as data, so the noise after a resume is the uninterrupted run's, and the
    adaptive clipping norm (the wrapper's own state) is restored."""
    from flwr.serverapp.strategy import DifferentialPrivacyServerSideAdaptiveClipping, FedAvg

    from simulations.runner.api import seeded_server_generators
    from strategies import PartitionSampler

    def make(run_dir, *, resume=False, crash_after=None) -> ValuingStrategy:
        def on_round(row):
            if crash_after is not None and row.round == crash_after:
                raise Crash(f"killed after round {crash_after}")

        inner = DifferentialPrivacyServerSideAdaptiveClipping(FedAvg(fraction_evaluate=0.0), noise_multiplier=0.3,
                                                             clipped_count_stddev=1.0, num_sampled_clients=3)
        strategy = ValuingStrategy(
            inner, utility(), run_dir=str(run_dir), sampler=PartitionSampler(3, seed=4), seed=5,
            valuation=ValuationSettings(methods=("ads",)),
            run=RunSettings(run_config={"experiment": "dp"}, resume=resume),
        )
        strategy.on_round = on_round
        return strategy

    with seeded_server_generators(5):
        run(make(tmp_path / "reference"))
    with seeded_server_generators(5), pytest.raises(Crash):
        run(make(tmp_path / "resumed", crash_after=2))
    with seeded_server_generators(5):  # a resumed process seeds afresh: the checkpoint's state wins
        resumed = make(tmp_path / "resumed", resume=True)
        run(resumed)
    assert (tmp_path / "resumed" / "ledger.csv").read_bytes() == (tmp_path / "reference" / "ledger.csv").read_bytes()
    assert resumed.strategy.clipping_norm != 0.1  # the adaptive norm moved and came back from the checkpoint


def test_a_strategy_whose_state_is_not_data_is_refused_before_anything_is_written(tmp_path):
    import threading

    class LockedFedAdam(FedAdam):
        def __init__(self) -> None:
            super().__init__(fraction_evaluate=0.0)
            self.lock = threading.Lock()

    with pytest.raises(TypeError, match="strategy.lock: a _thread.lock cannot be saved as data for resume"):
        ValuingStrategy(LockedFedAdam(), utility(), run_dir=str(tmp_path / "run")).open_books()
    assert not (tmp_path / "run").exists()
    ValuingStrategy(LockedFedAdam(), utility(), run_dir=str(tmp_path / "run"), run=RunSettings(checkpoint=False)).open_books()


def test_a_strategy_with_a_state_dict_hook_is_saved_and_restored_by_it():
    import threading

    from strategies.aggregation import server_state

    class Counted(FedAdam):
        def __init__(self) -> None:
            super().__init__(fraction_evaluate=0.0)
            self.lock, self.calls = threading.Lock(), 0

        def state_dict(self) -> dict:
            return {"calls": self.calls, "m_t": self.m_t}

        def load_state_dict(self, state: dict) -> None:
            self.calls, self.m_t = state["calls"], state["m_t"]

    saved = Counted()
    saved.calls, saved.m_t = 7, {"w": np.arange(3.0)}
    tree, arrays = server_state.capture({"strategy": saved})
    restored = server_state.apply(Counted(), server_state.load(tree, arrays)["strategy"], "strategy")
    assert restored.calls == 7 and restored.m_t["w"].tolist() == [0.0, 1.0, 2.0]
    with pytest.raises(ValueError, match="the checkpoint saved a .*Counted; the resumed run has a .*FedAdam"):
        server_state.apply(FedAdam(), server_state.load(tree, arrays)["strategy"], "strategy")


def test_a_resume_with_another_strategy_is_refused_before_anything_is_cut(tmp_path):
    from flwr.serverapp.strategy import FedYogi

    with pytest.raises(Crash):
        run(make_strategy(tmp_path, crash_after=1))
    with open(tmp_path / "ledger.csv", "a") as handle:
        handle.write("2,3,ads,0.123")  # a torn round a resume would cut
    before = {p.name: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    other = ValuingStrategy(
        FedYogi(fraction_evaluate=0.0), utility(), run_dir=str(tmp_path),
        sampler=ValueWeightedSampler(3, method="ads", temperature=0.01, seed=2), seed=5,
        books=BookSettings(flows=True), run=RunSettings(run_config={"experiment": "resume"}, resume=True)
    )
    with pytest.raises(ValueError, match="saved a flwr.serverapp.strategy.fedadam.FedAdam; the resumed run has a "
                                         "flwr.serverapp.strategy.fedyogi.FedYogi"):
        other.open_books()
    assert {p.name: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
