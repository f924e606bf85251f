"""What a round's defences are set to, as the round record keeps them (``RoundSettings.defences``, JSON).

Every threshold is relative, so one setting fits models of any size; each was chosen from the
attack-free rounds of a prototype before any attack was measured (Fashion-MNIST softmax
regression, 8 IID clients: honest updates of a round lay at least 0.35 of their norm apart and at
most 0.65 in cosine from the previous global step, the smallest honest update norm about half the
round's median). The relative near-duplicate rule's κ was fixed the same way, from attack-free
rounds only (:mod:`.relative_clusters`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from fedvalue._checks import check_number

#: The settings' fields that are relative tolerances (None: that test is off).
TOLERANCES = ("duplicate_tolerance", "zero_tolerance", "replay_tolerance", "collusion_tolerance", "norm_cap")
#: The thresholds' defaults, by name, so that what reads them (an adaptive attack that stays just
#: outside them, :mod:`clients.attacks.adaptive`) never repeats the number: τ, ε₀, ρ, ρ₂.
DUPLICATE_TOLERANCE = 0.05
ZERO_TOLERANCE = 0.1
REPLAY_TOLERANCE = 0.05
COLLUSION_TOLERANCE = 0.5
#: κ of the relative near-duplicate rule when it is on (:mod:`.relative_clusters`; off by default).
DUPLICATE_MEDIAN_FRACTION = 0.25
#: Fields a round record notes only when they differ from their default, so that a record of settings
#: that leave them at it is written byte for byte as before they existed.
NOTED_WHEN_SET = ("duplicate_median_fraction",)


@dataclass(frozen=True)
class DefenceSettings:
    """The defences a round's books apply (:mod:`fedvalue.rounds.kinds.defences`).

    Parameters
    ----------
    duplicate_tolerance
        τ: replies i and j are near-duplicates when ‖Δ_i − Δ_j‖ ≤ τ · min(‖Δ_i‖, ‖Δ_j‖); their
        clusters (single linkage) are valued as one player (:mod:`.clusters`). None: off.
    zero_tolerance
        ε₀: a reply with ‖Δ_i‖ ≤ ε₀ · median_j ‖Δ_j‖ returned the global model it was sent:
        a free-rider (:mod:`.free_riders`). None: off.
    replay_tolerance
        ρ: a reply whose update lies within ρ‖Δ_i‖ of the line of the previous global step
        A_{t−1} − A_{t−2} replays past global models (delta weights): a free-rider. None: off.
    collusion_tolerance
        ρ₂ ≥ ρ: replies within ρ₂ of that line whose weighted mean lies within ρ times the
        smallest member's share of it are free-riders together (colluders whose perturbations
        cancel). None: off.
    size_weighted
        Value the round by arrivals in proportion to each player's weight (claimed examples)
        instead of uniform orders (:mod:`.random_order`); equal weights give ADS itself.
    norm_cap
        c: a representative's update is clipped to c · median_j ‖Δ_j‖ in the defended game
        (rounds aggregated by the weighted mean only). None: off.
    duplicate_median_fraction
        κ in (0, 1): link replies by the round's own spread instead, when r_ij ≤ max(τ, κ · median of the
        round's r), r_ij = ‖Δ_i − Δ_j‖ / min(‖Δ_i‖, ‖Δ_j‖) (:mod:`.relative_clusters`; τ alone in a round of
        fewer than 3 non-zero updates). None: τ alone, the fixed rule. Needs ``duplicate_tolerance``.
    """

    duplicate_tolerance: float | None = DUPLICATE_TOLERANCE
    zero_tolerance: float | None = ZERO_TOLERANCE
    replay_tolerance: float | None = REPLAY_TOLERANCE
    collusion_tolerance: float | None = COLLUSION_TOLERANCE
    size_weighted: bool = True
    norm_cap: float | None = None
    duplicate_median_fraction: float | None = None

    def __post_init__(self) -> None:
        for name in TOLERANCES:
            low_open = name == "norm_cap"
            object.__setattr__(self, name, check_number(name, getattr(self, name), low=0.0, low_open=low_open,
                                                        none_ok=True))
        object.__setattr__(self, "duplicate_median_fraction", check_number(
            "duplicate_median_fraction", self.duplicate_median_fraction, low=0.0, high=1.0, low_open=True,
            high_open=True, none_ok=True, why="κ links pairs closer than κ × the round's median distance"))
        if self.duplicate_median_fraction is not None and self.duplicate_tolerance is None:
            raise ValueError("duplicate_median_fraction: the relative rule never links below duplicate_tolerance τ "
                             "and is off with it; set duplicate_tolerance too, or duplicate_median_fraction=None.")
        if not isinstance(self.size_weighted, bool):
            raise TypeError(f"size_weighted: expected True or False; got {self.size_weighted!r}.")
        if self.collusion_tolerance is not None and self.replay_tolerance is None:
            raise ValueError("collusion_tolerance: the collusion test judges a group's mean by replay_tolerance; "
                             "set replay_tolerance too, or collusion_tolerance=None.")
        if self.collusion_tolerance is not None and self.collusion_tolerance < self.replay_tolerance:
            raise ValueError(f"collusion_tolerance: expected at least replay_tolerance ({self.replay_tolerance}); "
                             f"got {self.collusion_tolerance}.")

    @property
    def needs_history(self) -> bool:
        """Whether the round needs the previous global model (the replay and collusion tests)."""
        return self.replay_tolerance is not None

    def as_meta(self) -> dict:
        """The settings as the round record's settings note them (JSON): the fields of
        :data:`NOTED_WHEN_SET` only when set, so older settings are noted as they always were."""
        meta = dataclasses.asdict(self)
        for name in NOTED_WHEN_SET:
            if meta[name] is None:
                del meta[name]
        return meta

    @classmethod
    def from_meta(cls, meta: object) -> DefenceSettings:
        """Settings from a round record's ``settings.defences`` (untrusted: ValueError naming the field)."""
        if not isinstance(meta, Mapping):
            raise ValueError(f"defences: expected an object of settings; got {type(meta).__name__}.")
        unknown = sorted(set(meta) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"defences: unknown settings {unknown[:5]}.")
        return cls(**meta)
