"""A new kind of round book is one book kind, one hook and two registrations, all written outside the
package: the round runs its hook at the same points as the package's own, its rows are booked from
the round record, an acceptance policy reads what its hook offers, and the audit books the same rows
again from the saved records and says the run is intact (in-process grid, no Ray)."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.serverapp.strategy import FedAvg

from fedvalue.audit.checks import audit_run
from fedvalue.rounds.book_kind import RoundBook, RoundContext
from fedvalue.rounds.kinds.registry import ROUND_BOOKS, register_round_book, unregister_round_book
from fedvalue.run.archive import read_round_record, round_record_paths
from fedvalue.analysis.run_summary import load_run
from fedvalue.schema import Status
from strategies import (AcceptInputs, Acceptance, PartitionSampler, RoundHook, ValuingStrategy, register_round_hook,
                        unregister_round_hook)
from strategies.hooks.registry import ROUND_HOOKS
from tests.strategies.harness.inprocess import InProcessGrid
from tests.strategies.test_valuing import NODE_OF, initial_arrays, make_handler, utility  # noqa: F401 - the fixture

KIND, METHOD, OFFER = "update_norm", "update_norm", "update_norms"


def update_norm(reply, start, order: float) -> float:
    """‖w_u − A_{t−1}‖ of a reply's arrays, all of them flattened together."""
    return float(np.linalg.norm(np.concatenate([(np.asarray(reply[k], np.float64) - start[k]).ravel()
                                                for k in start]), ord=order))


class UpdateNormBook(RoundBook):
    """Books ``update_norm`` = ‖Δ_u‖ per valid reply (empty for the others), read from the record alone."""

    def __init__(self, context: RoundContext, order: float) -> None:
        self.context, self.order = context, order

    def entry_rows(self, entry):
        record, ok = self.context.record, entry.status == Status.OK
        norm = update_norm(record.replies[entry.client_id], record.start_arrays, self.order) if ok else None
        return [self.context.entry_row(entry, METHOD, norm, 0.0 if ok else None, entry.num_examples)]


def update_norm_book(context: RoundContext) -> UpdateNormBook | None:
    note = (context.settings.notes or {}).get(KIND)
    return None if note is None else UpdateNormBook(context, float(note["order"]))


class UpdateNormHook(RoundHook):
    """Notes the norm's order in the run's settings and offers the round's norms to a policy."""

    offers = frozenset({OFFER})
    calls: list[str] = []

    def settings(self):
        return {"notes": {KIND: {"order": 2.0}}}

    def start_round(self, arrays, start_arrays, idle):
        self.calls.append("start_round")

    def offer(self, round, inputs):
        return {OFFER: lambda: {r.client_id: update_norm(r.arrays, round.start_arrays, 2.0) for r in round.ok}}

    def before_commit(self, round, books, ledger):
        self.calls.append("before_commit")


class DropLargestUpdate(Acceptance):
    """Every valid reply but the one whose update is largest (what the new hook offers)."""

    books_selection = True
    needs = frozenset({OFFER})

    def accept(self, round: AcceptInputs) -> set:
        norms = round.read(OFFER)
        return set(round.clients) - {max(norms, key=norms.get)}


@pytest.fixture
def registered():
    kinds, hooks = list(ROUND_BOOKS), list(ROUND_HOOKS)
    register_round_book(KIND, update_norm_book)
    register_round_hook(KIND, lambda context: UpdateNormHook())
    UpdateNormHook.calls = []
    yield
    for unregister, name in ((unregister_round_book, KIND), (unregister_round_hook, KIND)):
        if name in (ROUND_BOOKS if unregister is unregister_round_book else ROUND_HOOKS):
            unregister(name)
    assert (list(ROUND_BOOKS), list(ROUND_HOOKS)) == (kinds, hooks)


def test_a_kind_registered_from_outside_is_booked_read_by_a_policy_and_audited_intact(tmp_path, utility,  # noqa: F811
                                                                                       registered):
    strategy = ValuingStrategy(FedAvg(fraction_evaluate=0.0), utility, run_dir=str(tmp_path),
                               sampler=PartitionSampler(4, seed=1), acceptance=DropLargestUpdate(), seed=0)
    strategy.start(InProcessGrid(NODE_OF.values(), make_handler()), initial_arrays(), num_rounds=3, timeout=10)
    assert UpdateNormHook.calls == ["start_round", "before_commit"] * 3

    run = load_run(tmp_path)
    norms = run.ledger[run.ledger["method"] == METHOD]
    selected = run.ledger[run.ledger["method"] == "selected"]
    assert len(norms) == len(selected) == 12
    for path in round_record_paths(tmp_path).values():
        record = read_round_record(path)
        assert record.settings.notes == {KIND: {"order": 2.0}}
        booked = norms[norms["round"] == record.round].set_index("client_id")["value"]
        expected = {c: update_norm(record.replies[c], record.start_arrays, 2.0) for c in record.replies}
        assert booked.to_dict() == {str(c): norm for c, norm in expected.items()}  # the ledger's ids are text
        # The policy dropped the largest update of the round, as the books record it.
        assert set(record.accepted) == set(expected) - {max(expected, key=expected.get)}
    report = audit_run(tmp_path, utility=utility)
    assert report.intact
    # What the audit measured (its --json): every number recomputed exactly here, no reply replayed (no retrain).
    assert report.measured["numbers_within_rounding"] == report.measured["replies_bit_for_bit"] == 0

    # The auditor must know the kind too: without it the rows are ones the record does not imply.
    unregister_round_book(KIND)
    report = audit_run(tmp_path, utility=utility)
    assert not report.intact
    assert any("rows booked that the record does not imply" in p and METHOD in p for p in report.problems)


def test_a_policy_that_reads_what_no_book_offers_is_refused_when_the_strategy_is_made(utility):  # noqa: F811
    with pytest.raises(ValueError, match=r"acceptance: the policy .*DropLargestUpdate.* reads 'update_norms', which "
                                         r"no book of this run offers; register a round hook that offers it"):
        ValuingStrategy(FedAvg(fraction_evaluate=0.0), utility, acceptance=DropLargestUpdate())


def test_the_registries_refuse_a_taken_name_and_name_the_registered_ones(registered):
    with pytest.raises(ValueError, match=f"name: a round hook '{KIND}' is registered already"):
        register_round_hook(KIND, lambda context: None)
    with pytest.raises(ValueError, match=r"name: expected a registered round hook, one of \[.*'update_norm'\]; got 'nothing'"):
        unregister_round_hook("nothing")
    with pytest.raises(ValueError, match="name: expected a round book kind's name"):
        register_round_book("not a name", update_norm_book)
    with pytest.raises(TypeError, match=r"factory: expected a callable RoundContext -> RoundBook \| None; got int"):
        register_round_book("other", 3)
