"""A loss utility's books are compared to within float32 rounding of U measured on the auditor's
machine (:mod:`fedvalue.audit.rounding_envelope`); accuracy's stay exact. One FedAvg round of a small
MLP scored on held-out rows, without Ray: the envelope against the coefficients of exact ADS and LOO,
books whose sums add in another order accepted within it, and a number moved past it refused."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from fedvalue.audit import rounding_envelope
from fedvalue.audit.round import recompute, recompute_books, round_problems
from fedvalue.audit.rounding_envelope import ENVELOPE_FACTOR, EnvelopeTally, rounding_error
from fedvalue.rounds.booking import BookedRound
from fedvalue.rounds.kinds.value_weights import weighting_rule
from fedvalue.run.archive import RoundRecord
from fedvalue.run.ledger_reader import read_tables
from fedvalue.run.ledger_tables import LedgerWriter
from fedvalue.run.settings import RoundSettings
from fedvalue.schema import ClientEntry
from fedvalue.scoring.torch_utilities import TorchModelUtility
from fedvalue.valuation.ads import AdsSettings

CLIENTS = (1, 2, 3)


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def utility(metric: str, batch_size: int = 4096) -> TorchModelUtility:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(300, 12)).astype(np.float32)
    return TorchModelUtility(model(), x, rng.integers(0, 4, size=300), metric=metric, batch_size=batch_size)


def record(method: str = "exact", weighting: dict | None = None) -> RoundRecord:
    """Round 1 of a FedAvg run: three replies, each the start moved by its own seeded step (``weighting``:
    a value-weighting rule, its factors on FedAvg's weights)."""
    start = {k: v.detach().numpy().copy() for k, v in model().state_dict().items()}
    rng = np.random.default_rng(2)
    replies = {c: {k: (v + 0.3 * rng.normal(size=v.shape)).astype(np.float32) for k, v in start.items()}
               for c in CLIENTS}
    entries = [ClientEntry(c, "ok", float(10 * c), 10 * c) for c in CLIENTS]
    valuation = AdsSettings(method=method) if method == "exact" else AdsSettings(method=method, budget=12)
    return RoundRecord(round=1, start_arrays=start, entries=entries, replies=replies, accepted=list(CLIENTS),
                       settings=RoundSettings(methods=("ads", "loo"), valuation=valuation, seed=3, strategy="FedAvg",
                                              weighting=weighting))


def booked_as_written(books, tmp_path) -> BookedRound:
    """Books as a run writes them and the audit reads them back, typed."""
    LedgerWriter(tmp_path, config={"seed": 3}).write_round(books.round_row, books.ledger_rows)
    tables = read_tables(tmp_path)
    return BookedRound(tables.round_rows()[0], tables.rows())


def envelope_of(u: TorchModelUtility, rec: RoundRecord):
    done = recompute(rec, u)
    return done, rounding_envelope.measure(rec, done.valuation, u, state_of=done.state_of(rec),
                                           realized=done.realized, recomputed=done.books.round_row, ok=done.ok)


def test_only_a_loss_utility_is_compared_within_an_envelope():
    assert rounding_envelope.applies(utility("neg_loss")) and rounding_envelope.applies(utility("neg_mse"))
    assert not rounding_envelope.applies(utility("accuracy"))
    assert not rounding_envelope.applies(lambda arrays: 0.0)  # a utility that says nothing of its rounding


def test_the_envelope_of_exact_ads_and_loo_is_their_coefficients_times_each_coalition_s_rounding():
    """E_x = Σ_S |c_xS| e_S: φ_k's coefficients are ±1/(n C(n−1, |S|)) of Eq. 9, LOO's ±1 on I and I∖{k}."""
    u, rec = utility("neg_loss"), record()
    done, envelope = envelope_of(u, rec)
    assert envelope.unmeasured is None and envelope.states == 2 ** len(CLIENTS)  # every coalition (A_t is I_t's state)
    state_of, cached = done.state_of(rec), done.valuation.game.cached_values()
    e = {s: rounding_error(v, u.float64_value(state_of(s))) for s, v in cached.items()}
    full, n = frozenset(CLIENTS), len(CLIENTS)
    for k in CLIENTS:
        ads = sum((e[s] + e[s | {k}]) / (n * math.comb(n - 1, len(s))) for s in cached if k not in s)
        assert envelope.allowance(("ads", str(k), "value")) == pytest.approx(ENVELOPE_FACTOR * ads, rel=1e-6)
        loo = e[full] + e[full - {k}]
        assert envelope.allowance(("loo", str(k), "value")) == pytest.approx(ENVELOPE_FACTOR * loo, rel=1e-6)
        assert envelope.allowance(("ads", str(k), "stderr")) == 0.0  # exact: its standard error is 0 whatever U is
    assert envelope.allowance(("round", "utility_before")) == pytest.approx(ENVELOPE_FACTOR * e[frozenset()])
    # No rounding error is taken under float32's unit roundoff of U.
    assert all(e[s] >= rounding_envelope.ROUNDOFF_FLOOR * abs(v) * (1 - 1e-6) for s, v in cached.items())


@pytest.mark.parametrize("method", ["exact", "mc"])
def test_books_summed_in_another_order_pass_within_their_envelope(method, tmp_path):
    """Books whose float32 loss sums add the held-out rows in another order (batches of 7 rows, as another
    machine's kernels may split them) differ in the last bits, past 1e-9, and pass within the rounding
    envelope measured with the audit's own order, which the tally counts."""
    u, rec = utility("neg_loss"), record(method)
    other = booked_as_written(recompute_books(rec, utility("neg_loss", batch_size=7))[0], tmp_path)
    tally = EnvelopeTally()
    assert round_problems(rec, u, other, 1e-9, next_start=None, envelopes=tally)[0] == []
    assert tally.numbers > 0 and tally.rounds == [1] and 0 < tally.largest_ratio <= ENVELOPE_FACTOR
    assert "recompute only within float32 rounding of the utility on this machine" in tally.summary()
    # What the audit's --json reports of it: the count, the largest difference and its ratio to E_x.
    assert tally.measured() == {"numbers_within_rounding": tally.numbers,
                                "largest_number_difference": tally.largest_difference,
                                "largest_number_envelope_ratio": tally.largest_ratio, "starts_by_booked_factors": 0}


def test_a_value_weighted_round_aggregates_by_its_booked_factors_once_they_pass(tmp_path):
    """Value-weighted FedAvg (softmax of the ADS values): factors derived from values that round otherwise
    differ in the last bits, and so would A_t; the booked factors, within their envelope, give the run's own
    A_t bit for bit, which the next round started from."""
    rule = weighting_rule("ads", "softmax", 1.0)
    u, rec = utility("neg_loss"), record(weighting=rule)
    elsewhere = recompute(rec, utility("neg_loss", batch_size=7))
    other = booked_as_written(elsewhere.books, tmp_path)
    assert recompute(rec, u).factors != elsewhere.factors  # the factors moved with the values
    tally = EnvelopeTally()
    assert round_problems(rec, u, other, 1e-9, next_start=elsewhere.realized, envelopes=tally)[0] == []
    assert tally.numbers > 0
    # The exact comparison, aggregating by the recomputed factors, would not have met the next round's start.
    by_recomputed = recompute(rec, u).realized
    moved = not all(np.array_equal(by_recomputed[k], elsewhere.realized[k]) for k in by_recomputed)
    assert moved and tally.starts_by_booked_factors == 1 and tally.measured()["starts_by_booked_factors"] == 1


def test_a_number_moved_past_its_envelope_is_refused(tmp_path):
    """A forger moves one client's ADS value up and another's down (group efficiency kept): within the
    envelope the move passes, as rounding would; 1.5 times past it, the value is a finding."""
    u, rec = utility("neg_loss"), record()
    booked = booked_as_written(recompute_books(rec, u)[0], tmp_path)
    envelope = envelope_of(u, rec)[1]
    allowed = min(envelope.allowance(("ads", str(c), "value")) for c in (1, 2))
    assert 0 < allowed < 1e-5 * abs(booked.round_row.utility_before)  # float32 rounding, K times

    def moved(by: float) -> BookedRound:
        rows = [replace(r, value=r.value + (by if r.client_id == "1" else -by)) if r.method == "ads" and r.client_id
                in ("1", "2") else r for r in booked.ledger_rows]
        return BookedRound(booked.round_row, rows)

    assert round_problems(rec, u, moved(0.5 * allowed), 1e-9, next_start=None)[0] == []
    found = round_problems(rec, u, moved(1.5 * allowed), 1e-9, next_start=None)[0]
    assert len(found) == 2 and all("float32 rounding of the utility moves it by at most" in p for p in found), found
    assert found[0].startswith("round 1 ads of client 1: value is booked")


def test_an_accuracy_run_is_still_compared_exactly(tmp_path):
    """Accuracy is a count (near ties decided in float64): no envelope, and 1e-8 is a finding."""
    u, rec = utility("accuracy"), record()
    booked = booked_as_written(recompute_books(rec, u)[0], tmp_path)
    assert round_problems(rec, u, booked, 1e-9, next_start=None)[0] == []
    rows = [replace(r, value=r.value + 1e-8) if (r.method, r.client_id) == ("ads", "1") else r
            for r in booked.ledger_rows]
    found = round_problems(rec, u, BookedRound(booked.round_row, rows), 1e-9, next_start=None)[0]
    assert len(found) == 1 and found[0].startswith("round 1 ads of client 1: value is booked"), found
    assert "rounding" not in found[0]


def test_a_round_past_the_probed_coalitions_keeps_its_difference_as_a_finding(tmp_path, monkeypatch):
    """Each probe reruns the valuation: a round of more coalitions than the audit probes is left unmeasured,
    and its numbers that differ past 1e-9 stay findings, saying why."""
    monkeypatch.setattr(rounding_envelope, "MAX_PROBED_COALITIONS", 2 ** len(CLIENTS) - 1)
    u, rec = utility("neg_loss"), record()
    other = booked_as_written(recompute_books(rec, utility("neg_loss", batch_size=7))[0], tmp_path)
    found = round_problems(rec, u, other, 1e-9, next_start=None)[0]
    assert found[-1] == ("round 1: its float32 rounding envelope was not measured: it scored 8 coalitions; the audit "
                         "probes the rounding of at most 7 (each probe reruns its valuation)"), found
    assert len(found) > 1
