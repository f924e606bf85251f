"""A booked number against its recomputation, to within what float32 rounding does to U on the
auditor's machine.

A loss utility (``neg_loss``, ``neg_mse``; ``rounded_by_machine`` of
:class:`~fedvalue.scoring.torch_utilities.TorchModelUtility`) is a float32 forward pass and a float32
sum over the held-out rows, so it rounds by the machine's kernels: torch's instruction set and MKL's code path move U(S) by a unit or two in float32's last
place (docs/faults-and-audit.md, "An audit on another machine"), and every value that scores S with
it, past the recompute's 1e-9. Accuracy does not (a count, its near ties decided in float64): its
books keep the exact comparison, and so does every round whose books recompute to 1e-9.

For a round whose recomputation differs from its books by more than τ_x = ``tolerance`` × max(1,
|booked x|) in some number x, the audit measures, on its own machine, for every state S whose U the
books use (each coalition of the round game, A_{t−1} and A_t),

    e_S = max(|U32(S) − U64(S)|, ROUNDOFF_FLOOR · |U64(S)|),

U32(S) its own recomputed value (by the path the books took: the linear fast path for a FedAvg
coalition, the plain path for the anchors) and U64(S) the same state scored by a float64 forward
pass and metric (:meth:`~fedvalue.scoring.torch_utilities.TorchModelUtility.float64_value`, ~1e-16 of
U on any machine); the floor is float32's unit roundoff, under which no float32 result is
resolved (the auditor's own sum may land on the exact value by chance; the run's need not).
Every booked number x the round's game gives (an ADS or LOO value and its standard error, a
value weight, utility_before, utility_after, the efficiency gap) then has the envelope

    E_x = Σ_S |x(U + e_S 1_S) − x(U)|,

x(U + e_S 1_S) being x revalued from the round's coalition values with U(S) alone moved by e_S
(the round's estimator rerun on the cached values with its own seed, so it draws the same
permutations; a rerun that asks for another coalition, a decision that turns on the rounding,
leaves the round unmeasured and its difference a finding). For a number linear in the U(S)
(exact or sampled ADS, LOO, the utilities, the gap) that is exactly Σ_S |c_xS| e_S, c_xS the
coefficient of U(S) in x; for a standard error or a value weight its first-order counterpart.
utility_realized, U(A_t), has E = e_{A_t}. x passes when

    |booked x − recomputed x| ≤ τ_x + ENVELOPE_FACTOR · E_x.

**Proposition.** If the run's machine rounded each U(S) by at most (K − 1) e_S, K =
``ENVELOPE_FACTOR`` (|U_run(S) − U64(S)| ≤ (K − 1) e_S), every honest linear x passes: booked and
recomputed x differ by Σ_S c_xS (r_S − a_S), r_S and a_S the two machines' rounding errors, at
most Σ_S |c_xS| ((K − 1) e_S + e_S) = K E_x. Conversely, a forger can move x by at most τ_x + K E_x
without failing: float32 rounding of U, K of it. K = 10 as the training replay's
(:mod:`fedvalue.audit.training_replay`): another kernel set's U32(S) lay within 3.2 e_S of the run's
on every state measured (docs/faults-and-audit.md, "A loss, measured": 563 states, three kernel
sets), and in the benchmark-sized cell there K E_x of an ADS value was at most 3.2e-6 (the values
1.8e-3 to 0.32 from 0, their MC standard errors 0.026 to 0.084), of a utility at most 1.9e-6 (|U|
1.3 to 2.3).

The envelope applies whatever platform run.json records, the auditor's own included: a run resumed
elsewhere keeps the platform it started on, and run.json is the run's own claim, so the files do not
tell which rounds were booked on this machine (where they would recompute bit for bit).

Not covered (compared exactly, to τ_x, as before): harms of rejected replies (states outside the
game), TracIn flows and fairness books (they score no coalition with U), and decisions taken on the
values (``selected`` marks, the clients a value-weighting rule accepts), which differ only where two
values tie within the envelope.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field

import numpy as np

from fedvalue.rounds.kinds.value_weights import value_weight_outcome
from fedvalue.run.archive import RoundRecord
from fedvalue.schema import Method, RoundRow
from fedvalue.valuation.game import CoalitionGame
from fedvalue.valuation.round_game import RoundValuation, round_rng, value_round

#: K: how many times its rounding envelope a recomputed number may differ from the booked one.
ENVELOPE_FACTOR = 10.0
#: Least e_S relative to |U64(S)|: float32's unit roundoff, 2^-24.
ROUNDOFF_FLOOR = 2.0 ** -24
#: Most coalitions of a round whose rounding is probed: each probe reruns the valuation, which reads
#: every coalition, so a round costs about the square of its coalitions (1.1 ms a rerun at 93 of them).
MAX_PROBED_COALITIONS = 1024

Arrays = Mapping[str, np.ndarray]
#: A booked number: ("round", rounds.csv column) or (method, client id as text, "value" | "stderr").
CellKey = tuple[str, ...]


def applies(utility: object) -> bool:
    """Whether ``utility`` rounds by the machine (``rounded_by_machine`` true) and can score a state in
    float64 (``float64_value``): only then is an envelope measured."""
    return getattr(utility, "rounded_by_machine", False) is True and callable(getattr(utility, "float64_value", None))


def rounding_error(float32_value: float, float64_value: float) -> float:
    """e_S = max(|U32(S) − U64(S)|, ``ROUNDOFF_FLOOR`` · |U64(S)|) (module docstring)."""
    return max(abs(float(float32_value) - float(float64_value)), ROUNDOFF_FLOOR * abs(float(float64_value)))


@dataclass
class RoundEnvelope:
    """K E_x of every number of a round its game gives (``allowed``, by :data:`CellKey`), the states
    measured, and why none was measured (``unmeasured``)."""

    allowed: dict[CellKey, float] = field(default_factory=dict)
    states: int = 0
    unmeasured: str | None = None

    def allowance(self, key: CellKey) -> float:
        """K E_x of the number ``key`` (0 where the envelope does not cover it)."""
        return self.allowed.get(key, 0.0)


@dataclass
class EnvelopeTally:
    """The numbers an audit accepted only within their rounding envelope: how many, in which rounds,
    their largest |booked − recomputed| and its largest ratio to E_x; and the value-weighted rounds whose
    next round started from A_t aggregated by the booked factors and not by the recomputed ones
    (``starts_by_booked_factors``: an exact comparison, which aggregates by the recomputed factors, finds
    each of them; the envelope accepts them)."""

    numbers: int = 0
    rounds: list[int] = field(default_factory=list)
    largest_difference: float = 0.0
    largest_ratio: float = 0.0
    starts_by_booked_factors: int = 0

    def count(self, t: int, difference: float, envelope: float) -> None:
        """A number of round ``t`` accepted within its envelope (``envelope``: K E_x)."""
        self.numbers += 1
        if t not in self.rounds:
            self.rounds.append(t)
        self.largest_difference = max(self.largest_difference, difference)
        self.largest_ratio = max(self.largest_ratio, difference / (envelope / ENVELOPE_FACTOR))

    def summary(self) -> str:
        """One line for the audit's verified checks."""
        return (f"{self.numbers} booked numbers of rounds {self.rounds[:10]} recompute only within float32 rounding "
                f"of the utility on this machine (off by up to {self.largest_difference:.1e}, "
                f"{self.largest_ratio:.2f} times their rounding envelope Σ_S |∂x/∂U(S)|·e_S; "
                f"{ENVELOPE_FACTOR:g} allowed)")

    def measured(self) -> dict[str, float]:
        """The counts and largest differences, by name, for the audit's machine-readable report."""
        return {"numbers_within_rounding": self.numbers, "largest_number_difference": self.largest_difference,
                "largest_number_envelope_ratio": self.largest_ratio,
                "starts_by_booked_factors": self.starts_by_booked_factors}


def state_digest(arrays: Arrays) -> bytes:
    """SHA-256 of a state's keys, dtypes, shapes and bytes (its identity in a memo)."""
    digest = hashlib.sha256()
    for key in arrays:
        value = np.ascontiguousarray(arrays[key])
        digest.update(f"{key}|{value.dtype.str}{value.shape}|".encode())
        digest.update(value.tobytes())
    return digest.digest()


def _numbers(valuation: RoundValuation, rule: Mapping | None, ok: list[Hashable]) -> dict[CellKey, float]:
    """Every number the round's books take from its game: values and standard errors by method and
    client, the value weights (``rule``), utility_before, utility_after and the efficiency gap."""
    numbers: dict[CellKey, float] = {("round", "utility_before"): valuation.utility_before,
                                     ("round", "utility_after"): valuation.utility_after}
    for method, result in valuation.results.items():
        for client in result.values.index:
            numbers[(str(method), str(client), "value")] = float(result.values[client])
            numbers[(str(method), str(client), "stderr")] = float(result.stderr[client])
    ads = valuation.results.get(Method.ADS)
    if ads is not None:
        numbers[("round", "efficiency_gap")] = ads.max_efficiency_gap
    if rule and rule.get("score") in valuation.results:
        values = valuation.results[rule["score"]].values
        for client, factor in value_weight_outcome(rule, {c: float(values[c]) for c in ok})[1].items():
            numbers[(str(Method.VALUE_WEIGHT), str(client), "value")] = factor
    return numbers


class _BranchChanged(Exception):
    """A rerun asked for a coalition the recomputation did not score."""


def _revalued(record: RoundRecord, valuation: RoundValuation, values: Mapping[frozenset, float]) -> RoundValuation:
    """The round's valuation rerun on ``values`` (coalition -> U) with its settings and seed; the
    game carries the FedAvg structure of the recomputed one (an expansion method's derivatives)."""
    players = valuation.game.players

    def scored(coalitions):
        try:
            return [values[c] for c in coalitions]
        except KeyError:
            raise _BranchChanged from None

    game = CoalitionGame(None, players, batch_utility=scored)
    structure = getattr(valuation.game, "fedavg_round", None)
    if structure is not None:
        game.fedavg_round = structure
    settings = record.settings
    return value_round(game, settings.methods, settings.valuation, seed=round_rng(settings.seed, record.round))


def _same(a: Mapping[CellKey, float], b: Mapping[CellKey, float] | None) -> bool:
    """Equal number for number (NaN equal to NaN)."""
    return b is not None and set(a) == set(b) and all(
        a[k] == b[k] or (math.isnan(a[k]) and math.isnan(b[k])) for k in a)


def measure(record: RoundRecord, valuation: RoundValuation | None, utility, *, state_of: Callable[[frozenset], Arrays],
            realized: Arrays | None, recomputed: RoundRow, ok: list[Hashable],
            budget: Callable[[str], None] | None = None) -> RoundEnvelope:
    """The round's envelope (module docstring): e_S of every coalition its game scored (``state_of``
    materializes one), of A_t (``realized``) and, without a valuation, of A_{t−1}, against the
    ``recomputed`` rounds.csv row's U32; then E_x of every number of :func:`_numbers` by reruns of the
    valuation; K E_x in ``allowed``. ``budget`` is called before each rerun (the audit's time budget).
    A round of more than :data:`MAX_PROBED_COALITIONS` coalitions is left unmeasured."""
    envelope = RoundEnvelope()
    memo: dict[bytes, float | None] = {}

    def error_of(state: Arrays, float32_value: float) -> float:
        key = state_digest(state)
        if key not in memo:
            memo[key] = utility.float64_value(state)
        wide = memo[key]
        if wide is None or not math.isfinite(wide):
            raise _Unmeasured("the utility cannot score its states in float64")
        return rounding_error(float32_value, wide)

    try:
        _measure_into(envelope.allowed, record, valuation, error_of, state_of, realized, recomputed, ok,
                      budget or (lambda doing: None))
    except _Unmeasured as reason:
        envelope.allowed.clear()
        envelope.unmeasured = str(reason)
    envelope.states = len(memo)
    return envelope


class _Unmeasured(Exception):
    """Why a round's envelope was not measured."""


def _measure_into(allowed: dict[CellKey, float], record: RoundRecord, valuation: RoundValuation | None,
                  error_of: Callable[[Arrays, float], float], state_of: Callable[[frozenset], Arrays],
                  realized: Arrays | None, recomputed: RoundRow, ok: list[Hashable],
                  budget: Callable[[str], None]) -> None:
    """:func:`measure`'s work: K E_x by number into ``allowed``; :class:`_Unmeasured` says why not."""
    if valuation is None:
        allowed[("round", "utility_before")] = ENVELOPE_FACTOR * error_of(record.start_arrays,
                                                                           recomputed.utility_before)
    else:
        cached = valuation.game.cached_values()
        if len(cached) > MAX_PROBED_COALITIONS:
            raise _Unmeasured(f"it scored {len(cached)} coalitions; the audit probes the rounding of at most "
                              f"{MAX_PROBED_COALITIONS} (each probe reruns its valuation)")
        errors = {coalition: error_of(state_of(coalition), value) for coalition, value in cached.items()}
        rule = record.settings.weighting or None
        base = _numbers(valuation, rule, ok)
        try:
            rerun = _numbers(_revalued(record, valuation, cached), rule, ok)
        except _BranchChanged:
            rerun = None
        if not _same(base, rerun):
            raise _Unmeasured("its valuation does not rerun on its scored coalitions as it was recomputed")
        sums = dict.fromkeys(base, 0.0)
        for coalition, error in errors.items():
            budget("measuring float32 rounding of the utility")
            try:
                moved = _numbers(_revalued(record, valuation, {**cached, coalition: cached[coalition] + error}),
                                 rule, ok)
            except _BranchChanged:
                raise _Unmeasured("its estimator asks for other coalitions when one coalition's U moves by its "
                                  "float32 rounding (a decision turns on the rounding)") from None
            for key, value in base.items():
                if math.isfinite(value):
                    sums[key] += abs(moved.get(key, math.nan) - value)
        allowed.update({key: ENVELOPE_FACTOR * total for key, total in sums.items() if math.isfinite(total)})
    if realized is not None:
        allowed[("round", "utility_realized")] = ENVELOPE_FACTOR * error_of(realized, recomputed.utility_realized)
    elif ("round", "utility_before") in allowed:  # nothing aggregated: U(A_t) is U(A_{t−1})
        allowed[("round", "utility_realized")] = allowed[("round", "utility_before")]
