"""A saved reply against its client's local training, replayed on the auditor's machine.

Float32 training rounds as the machine's kernels do (:mod:`fedvalue.scoring.kernels`). On
the run's own platform the replay gives the saved arrays bit for bit; on another one they
drift apart by a few 1e-8 of their size, and where rounding tips a unit over a ReLU's
kink during the 50 epochs, the two trainings take different branches and end about 1e-3
of the update apart (docs/faults-and-audit.md, "An audit on another machine"). No fixed
tolerance holds for every model and schedule, so the audit measures how far rounding
moves *this* training, on its own machine.

A reply r (arrays r_k) is what its client's training from A_{t−1} gives when, with ŕ the
replay,

1. ``np.allclose(r_k, ŕ_k, rtol=REPLAY_RTOL, atol=REPLAY_ATOL)`` for every array k (the
   replay on the run's platform, or where no rounding tipped a kink); or
2. ‖r − ŕ‖ ≤ ``ENVELOPE_FACTOR`` · max_j ‖p_j − ŕ‖ (norms over all floating arrays),
   where p_j is training replayed from A_{t−1} with each floating entry a multiplied by
   (1 ± 2^(j−24)), j = 1..``ROUNDING_PROBES`` (1 to 16 float32 units in the last place,
   random signs from a seeded draw): the reply lies within what float rounding alone does
   to this training. The probes run only for a reply that step 1 did not accept. One
   size is not enough: where a replay crosses a kink depends on which way and how far the
   start moves, and four perturbations of 2^-23 missed the branch another platform took in
   2 of 12 measured replies (once by 1,300 times); the four sizes together reached it in
   all 12 (drift at most 1.00 times the envelope).

A reply beyond both is not what honest training gives on any platform: a reply changed by
more than rounding, or trained with other settings, data or seed, fails. Step 2 lets a
forger move a reply at most ``ENVELOPE_FACTOR`` times as far as rounding moves that
training: 5e-5 to 2.2e-2 of the update in the seed-0 main job (median 4.5e-4).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field

import numpy as np

from fedvalue.scoring.kernels import kernel_platform, platform_differences

#: Step 1: the element-wise tolerance of a replay on the run's own platform.
REPLAY_RTOL, REPLAY_ATOL = 1e-5, 1e-6
#: Step 2: start perturbations replayed (probe j of relative size 2^(j−24): float32's epsilon
#: and up to 8 times it) and how far beyond the farthest of them a reply may lie.
ROUNDING_PROBES = 4
ENVELOPE_FACTOR = 10.0
#: Seed of the probes' perturbations (with the round and the probe's index).
PROBE_SEED = 20_250_417

Arrays = Mapping[str, np.ndarray]
Retrain = Callable[[int, Hashable, Arrays], Arrays]


@dataclass
class ReplayTally:
    """What the replays of an audit found: replies equal bit for bit, within step 1, within
    the rounding envelope (step 2), and of those the largest drift ‖r − ŕ‖ relative to the
    update ‖ŕ − A_{t−1}‖ and relative to the envelope max_j ‖p_j − ŕ‖; and the largest drift,
    relative to the update, of a reply step 1 accepted without being bit for bit
    (``largest_close_drift``: what rounding alone does where no kink was crossed)."""

    identical: int = 0
    close: int = 0
    within_rounding: int = 0
    largest_drift: float = 0.0
    largest_envelope_ratio: float = 0.0
    largest_close_drift: float = 0.0
    where: list[str] = field(default_factory=list)

    @property
    def replies(self) -> int:
        return self.identical + self.close + self.within_rounding

    def summary(self) -> str:
        """One line for the audit's verified check."""
        line = (f"local training replayed for {self.replies} replies: {self.identical} bit for bit, {self.close} "
                f"to {REPLAY_RTOL:g} relative")
        if self.within_rounding:
            line += (f", {self.within_rounding} ({', '.join(self.where[:4])}) only within float rounding of training on "
                     f"this machine (off by up to {self.largest_drift:.1e} of the update, "
                     f"{self.largest_envelope_ratio:.2f} times as far as the farthest replay from a start "
                     f"perturbed by float rounding; {ENVELOPE_FACTOR:g} allowed)")
        return line

    def measured(self) -> dict[str, float]:
        """The counts and largest drifts, by name, for the audit's machine-readable report."""
        return {"replies_bit_for_bit": self.identical, "replies_to_tolerance": self.close,
                "replies_within_rounding": self.within_rounding, "largest_reply_drift": self.largest_drift,
                "largest_reply_envelope_ratio": self.largest_envelope_ratio,
                "largest_close_reply_drift": self.largest_close_drift}


def _floating(arrays: Arrays) -> list[str]:
    return [k for k, v in arrays.items() if np.issubdtype(np.asarray(v).dtype, np.floating)]


def _norm(a: Arrays, b: Arrays, keys: list[str]) -> float:
    """‖a − b‖ over the entries ``keys``, in float64 (NaN when either holds one)."""
    with np.errstate(all="ignore"):
        squares = sum(float(np.sum((np.asarray(a[k], dtype=np.float64) - np.asarray(b[k], dtype=np.float64)) ** 2))
                      for k in keys)
    return math.nan if math.isnan(squares) else math.sqrt(squares)


def perturbed(arrays: Arrays, server_round: int, probe: int) -> dict[str, np.ndarray]:
    """``arrays`` with every floating entry multiplied by (1 ± 2^(probe−24)), signs drawn
    from (``PROBE_SEED``, round, probe); other entries unchanged."""
    rng = np.random.default_rng([PROBE_SEED, int(server_round), int(probe)])
    relative = 2.0 ** (int(probe) - 24)
    result = {}
    for key, value in arrays.items():
        value = np.asarray(value)
        if np.issubdtype(value.dtype, np.floating):
            signs = rng.choice(np.array([-1.0, 1.0]), size=value.shape)
            value = (value.astype(np.float64) * (1.0 + relative * signs)).astype(value.dtype)
        result[key] = value
    return result


def _same_layout(reply: Arrays, replay: Arrays) -> bool:
    return set(reply) == set(replay) and all(np.shape(reply[k]) == np.shape(replay[k]) for k in replay)


def reply_problem(server_round: int, client: Hashable, reply: Arrays, start: Arrays, retrain: Retrain,
                  tally: ReplayTally | None = None) -> str | None:
    """None when ``reply`` is what ``client``'s training from ``start`` gives (module
    docstring), counted in ``tally``; else the finding."""
    replay = retrain(server_round, client, start)
    failed = (f"round {server_round} client {client}: its saved reply is not what local training from the "
              "round's start, run.json's training settings and seed give")
    if not _same_layout(reply, replay):
        return failed + " (other array names or shapes)"
    if all(np.array_equal(reply[k], replay[k]) for k in replay):
        if tally is not None:
            tally.identical += 1
        return None
    keys = _floating(replay)
    if all(np.allclose(reply[k], replay[k], rtol=REPLAY_RTOL, atol=REPLAY_ATOL) for k in replay):
        if tally is not None:
            tally.close += 1
            if all(k in start and np.shape(start[k]) == np.shape(replay[k]) for k in keys):  # an update to measure by
                drift = _norm(reply, replay, keys) / (_norm(replay, start, keys) or 1.0)
                tally.largest_close_drift = max(tally.largest_close_drift, drift)
        return None
    if any(not np.array_equal(reply[k], replay[k]) for k in replay if k not in keys):
        return failed + " (a non-floating entry differs)"
    drift = _norm(reply, replay, keys)
    envelope = max(_norm(retrain(server_round, client, perturbed(start, server_round, probe)), replay, keys)
                   for probe in range(1, ROUNDING_PROBES + 1))
    update = _norm(replay, start, keys) or 1.0
    ratio = drift / envelope if envelope > 0 else math.inf
    if not ratio <= ENVELOPE_FACTOR:  # NaN or inf in the reply fails here too
        return failed + (f" (off by {drift / update:.2e} of its update; float rounding moves this training by at "
                         f"most {envelope / update:.2e} on this machine)")
    if tally is not None:
        tally.within_rounding += 1
        tally.largest_drift = max(tally.largest_drift, drift / update)
        tally.largest_envelope_ratio = max(tally.largest_envelope_ratio, ratio)
        tally.where.append(f"round {server_round} client {client}")
    return None


def platform_note(recorded: object) -> str:
    """What the audit tells about the platforms: the run's (run.json's ``platform``) against
    this machine's (:func:`fedvalue.scoring.kernels.kernel_platform`)."""
    differences = platform_differences(recorded, kernel_platform())
    if not differences:
        return "training was replayed on the run's own platform (run.json's platform is this machine's)"
    where = ("the run recorded no platform (an older version wrote it)" if not isinstance(recorded, dict) else
             "training was replayed on another platform than the run's (" + "; ".join(differences[:5]) + ")")
    return (where + ": float32 training replays bit for bit only on the run's platform, so a reply that differs is "
            "checked to within float rounding of training on this machine")
