"""Who plays what in one run of the attack study: the participants, the identities of the
attacking participant and the data and behaviour of every identity.

The base federation is ``num_clients`` clients (partition ids 0..N−1); each keeps a random half
of its partition for training and the other half as its inference split (TracIn flows). An
attack may add identities (ids N, N+1, ...), each a node of its own:

``none``                   every client honest (the baseline of every gain)
``sybil-split-K``          the attacker's data split over K identities (its own seat and K−1 more)
``sybil-replica-K``        the attacker's one update under K identities (K copies of its data)
``colluding-free-riders``  the attacker and the next ``colluders`` − 1 clients free-ride together
``delta-weights``          the attacker replays the last global step
``dynamic-free-rider``     the attacker is honest for ``honest_rounds`` rounds, then replays
``crafted-update``         the attacker crafts its update (ACE-style)
``adaptive-cluster-K@M``   K replicas of the attacker's update, every two (1 + M) τ apart (past the clusters)
``adaptive-replay@M``      the attacker replays the last global step turned (1 + M) ρ off its line
``adaptive-split-K@M``     the attacker's data over K identities on overlapping shards, each claim true, the
                           claims adding up to (1 + M) × its size (past what arrivals by size cancel)
``adaptive-crafted@M``     the attacker crafts its update within the run's norm cap, at 1 / (1 + M) of it
``free-rider``, ``free-rider-noise``, ``inflated-count``, ``replicator``, ``sign-flip``, ``boost``
                           the single-client manipulations of :mod:`clients.behaviours`
``module:callable``        the attacker plays a ClientBehaviour of one's own (:func:`clients.load_behaviour`)

The ``adaptive-*`` attacks (:mod:`clients.attacks.adaptive`) each stay a margin M ≥ 0 outside one
defence's threshold, in that defence's units (M = 0: on it); a sweep is a list of names, e.g.
``adaptive-replay@0.05,adaptive-replay@0.2,adaptive-replay@0.5``.

``seats`` are the clients the attacking identities stand for: a gain divides what the
identities earned by what those seats earned in the ``none`` run of the same seed, data and
strategy.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from clients import (
    AdaptiveCraftedUpdate,
    AdaptiveReplayer,
    AdaptiveReplica,
    AdaptiveShard,
    BoostedUpdate,
    ClientBehaviour,
    ColludingFreeRider,
    CraftedUpdate,
    DeltaWeightsFreeRider,
    DynamicFreeRider,
    FreeRider,
    HonestClient,
    InflatedExampleCount,
    Replicator,
    SignFlip,
    SybilReplica,
    SybilShard,
    is_behaviour_reference,
    load_behaviour,
)

#: Attacks of the study without a size in their name.
PLAIN_ATTACKS = ("none", "colluding-free-riders", "delta-weights", "dynamic-free-rider", "crafted-update",
                 "free-rider", "free-rider-noise", "inflated-count", "replicator", "sign-flip", "boost")
SIZED = re.compile(r"(sybil-split|sybil-replica)-([0-9]+)")
#: The adaptive attacks, as their names read (K identities, margin M).
ADAPTIVE_ATTACKS = ("adaptive-cluster-K@M", "adaptive-replay@M", "adaptive-split-K@M", "adaptive-crafted@M")
ADAPTIVE = re.compile(r"(adaptive-cluster|adaptive-split)-([0-9]+)@(.*)|(adaptive-replay|adaptive-crafted)@(.*)")


def adaptive_parts(name: str) -> tuple[str, int, float] | None:
    """(kind, identities, margin) of an ``adaptive-*`` attack's name, None for any other name;
    ValueError naming the attack when it reads adaptive-... but is not one (a missing or bad K or M)."""
    if not name.startswith("adaptive-"):
        return None
    match = ADAPTIVE.fullmatch(name)
    if match is None:
        raise ValueError(f"attacks: expected {', '.join(ADAPTIVE_ATTACKS)} (K >= 2 identities, a margin M >= 0); "
                         f"got {name!r}.")
    kind, size, text = (match.group(1), int(match.group(2)), match.group(3)) if match.group(1) else \
        (match.group(4), 1, match.group(5))
    try:
        margin = float(text)
    except ValueError:
        margin = float("nan")
    if not (margin >= 0 and margin != float("inf")):
        raise ValueError(f"attacks: {name}: expected a margin M >= 0 after '@' (how far outside the defence's "
                         f"threshold, as a multiple of it); got {text!r}.")
    if kind != "adaptive-replay" and kind != "adaptive-crafted" and size < 2:
        raise ValueError(f"attacks: {name}: expected K >= 2 identities; got {size}.")
    return kind, size, margin


@dataclass(frozen=True)
class RunPlan:
    """One attack's run: participants (partition ids, each a node), the attacker's identities
    and the honest seats they stand for."""

    attack: str
    participants: tuple[int, ...]
    identities: tuple[int, ...]
    seats: tuple[int, ...]

    @property
    def kind(self) -> str:
        match, adaptive = SIZED.fullmatch(self.attack), adaptive_parts(self.attack)
        return match.group(1) if match else adaptive[0] if adaptive else self.attack

    @property
    def margin(self) -> float | None:
        """M of an adaptive attack (None for the others)."""
        adaptive = adaptive_parts(self.attack)
        return adaptive[2] if adaptive else None

    @property
    def size(self) -> int:
        """K of a Sybil attack, the ring of colluders' size, else 1."""
        return len(self.identities)


def is_study_attack(name: str) -> bool:
    """Whether ``name`` is an attack of the study (a sized Sybil attack needs K ≥ 2; a
    ``module:callable`` is a behaviour of one's own)."""
    match = SIZED.fullmatch(name)
    try:
        adaptive = adaptive_parts(name) is not None
    except ValueError:
        adaptive = False
    return (name in PLAIN_ATTACKS or (match is not None and int(match.group(2)) >= 2) or adaptive
            or is_behaviour_reference(name))


def plan_of(attack: str, num_clients: int, attacker: int, colluders: int) -> RunPlan:
    """The plan of ``attack`` in a federation of ``num_clients`` with seat ``attacker``."""
    base = tuple(range(num_clients))
    match, adaptive = SIZED.fullmatch(attack), adaptive_parts(attack)
    if match or adaptive:
        size = int(match.group(2)) if match else adaptive[1]
        extra = tuple(range(num_clients, num_clients + size - 1))
        return RunPlan(attack, base + extra, (attacker,) + extra, (attacker,))
    if attack == "colluding-free-riders":
        ring = tuple((attacker + k) % num_clients for k in range(colluders))
        return RunPlan(attack, base, ring, ring)
    if attack not in PLAIN_ATTACKS and not is_behaviour_reference(attack):
        raise ValueError(f"attack: expected one of {list(PLAIN_ATTACKS)}, sybil-split-K / sybil-replica-K with "
                         f"K >= 2 or one of {list(ADAPTIVE_ATTACKS)}; got {attack!r}.")
    return RunPlan(attack, base, () if attack == "none" else (attacker,), (attacker,))


@dataclass(frozen=True)
class AttackSettings:
    """The attacks' own numbers (the study's config passes them on)."""

    seed: int
    noise_std: float
    inflation: float
    boost: float
    replica_noise: float
    colluder_spread: float
    honest_rounds: int
    craft_budget: float
    craft_steps: int
    norm_cap: float = 0.0


def behaviour_of(plan: RunPlan, identity: int, settings: AttackSettings, *, counts: dict[int, int],
                 model_factory, source_data=None) -> ClientBehaviour:
    """What ``identity`` does in ``plan``'s run (honest unless it is one of the attacker's)."""
    if identity not in plan.identities:
        return HonestClient()
    position = plan.identities.index(identity)
    kind = plan.kind
    if kind == "sybil-split":
        return SybilShard(position, plan.size, seed=settings.seed)
    if kind == "sybil-replica":
        return SybilReplica(settings.replica_noise)
    if kind.startswith("adaptive-"):
        return adaptive_behaviour(plan, position, settings, model_factory)
    if kind == "colluding-free-riders":
        return ColludingFreeRider(position, [counts[c] for c in plan.identities], spread=settings.colluder_spread,
                                  secret=settings.seed)
    single = {
        "delta-weights": lambda: DeltaWeightsFreeRider(),
        "dynamic-free-rider": lambda: DynamicFreeRider(settings.honest_rounds),
        "crafted-update": lambda: CraftedUpdate(model_factory, others=len(plan.participants) - 1,
                                                budget=settings.craft_budget, steps=settings.craft_steps),
        "free-rider": lambda: FreeRider(),
        "free-rider-noise": lambda: FreeRider(settings.noise_std),
        "inflated-count": lambda: InflatedExampleCount(settings.inflation),
        "sign-flip": lambda: SignFlip(),
        "boost": lambda: BoostedUpdate(settings.boost),
    }
    if kind == "replicator":  # its data is the source's, which the caller holds
        return Replicator(*source_data)
    if kind not in single:  # a behaviour of one's own (is_study_attack said it is a module:callable)
        return load_behaviour(kind)
    return single[kind]()


def adaptive_behaviour(plan: RunPlan, position: int, settings: AttackSettings, model_factory) -> ClientBehaviour:
    """What identity ``position`` of an adaptive attack's ``plan`` plays (its margin read from the name)."""
    kind, margin = plan.kind, plan.margin
    if kind == "adaptive-cluster":
        return AdaptiveReplica(position, plan.size, margin=margin, secret=settings.seed)
    if kind == "adaptive-split":
        return AdaptiveShard(position, plan.size, margin=margin, seed=settings.seed)
    if kind == "adaptive-replay":
        return AdaptiveReplayer(margin, seed=settings.seed)
    if not settings.norm_cap > 0:
        raise ValueError(f"norm_cap: {plan.attack} stays within the defences' norm cap; expected a cap > 0 to stay "
                         f"within; got {settings.norm_cap!r}.")
    return AdaptiveCraftedUpdate(model_factory, others=len(plan.participants) - 1, norm_cap=settings.norm_cap,
                                 margin=margin, budget=settings.craft_budget, steps=settings.craft_steps)
