"""The conjoint rating generator of [ADS] §6.3 / App. C.3 and its part-worth estimate.

A product profile is three attributes (color, size, material) with four levels each,
x = (a_1, a_2, a_3). A generator holds part-worths u_ij ~ U(0, 95/3) and rates

    y = Σ_i u_{i,a_i} + ε,   ε ~ N(0, σ²),   y clipped to [0, 100].

App. C.3 writes the noise as N(0, 5). The paper does not say whether 5 is the variance or
the standard deviation; we read it in the usual N(μ, σ²) convention, σ² = 5 (σ ≈ 2.24),
and expose it as ``noise_variance``. The noisy generator draws its own part-worths u'_ij
from the same law with an independent seed ("a different random seed").

Identification. Under dummy coding y = β_0 + Σ_i Σ_j u_ij 1[a_i = j], adding c_i to every
level of attribute i and subtracting c_i from β_0 leaves every rating unchanged, so OLS
identifies the part-worths only up to one additive constant per attribute. We therefore
report and compare part-worths centred within each attribute (effects coding,
Σ_j û_ij = 0 for every i); AvgErr = (1/12) Σ_ij |û_ij − (u_ij − ū_i)| with ū_i the mean of
attribute i's true part-worths ([ADS] §6.3).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

NUM_ATTRIBUTES = 3
NUM_LEVELS = 4
#: Attribute and level names of [ADS] §6.3 (for tables and plots).
ATTRIBUTES = {
    "color": ("red", "blue", "green", "black"),
    "size": ("small", "medium", "large", "extra-large"),
    "material": ("cotton", "wool", "polyester", "leather"),
}
#: Every profile of the full factorial design, 4³ = 64 rows of level indices.
ALL_PROFILES = np.array(list(itertools.product(range(NUM_LEVELS), repeat=NUM_ATTRIBUTES)), dtype=np.int64)


def one_hot(profiles: np.ndarray) -> np.ndarray:
    """Profiles (n, 3) of level indices as 12 indicator columns, attribute by attribute."""
    profiles = np.asarray(profiles, dtype=np.int64)
    if profiles.ndim != 2 or profiles.shape[1] != NUM_ATTRIBUTES or profiles.min(initial=0) < 0 \
            or profiles.max(initial=0) >= NUM_LEVELS:
        raise ValueError(f"profiles: expected an (n, {NUM_ATTRIBUTES}) array of level indices in "
                         f"0..{NUM_LEVELS - 1}; got shape {profiles.shape}.")
    encoded = np.zeros((len(profiles), NUM_ATTRIBUTES * NUM_LEVELS), dtype=np.float32)
    rows = np.arange(len(profiles))
    for i in range(NUM_ATTRIBUTES):
        encoded[rows, i * NUM_LEVELS + profiles[:, i]] = 1.0
    return encoded


def centered(part_worths: np.ndarray) -> np.ndarray:
    """Part-worths (3, 4) minus each attribute's mean: the identified part (module docstring)."""
    part_worths = np.asarray(part_worths, dtype=np.float64)
    return part_worths - part_worths.mean(axis=1, keepdims=True)


@dataclass(frozen=True)
class RatingGenerator:
    """Ratings y = Σ_i u_{i,a_i} + ε, ε ~ N(0, ``noise_variance``), clipped to [0, 100]."""

    part_worths: np.ndarray
    noise_variance: float = 5.0

    @classmethod
    def draw(cls, seed: int | np.random.Generator | None, *, upper: float = 95.0 / 3.0,
             noise_variance: float = 5.0) -> RatingGenerator:
        """A generator with part-worths u_ij ~ U(0, ``upper``) ([ADS] App. C.3)."""
        if not (np.isfinite(upper) and upper > 0):
            raise ValueError(f"upper: expected a finite number > 0 (part-worths ~ U(0, upper)); got {upper!r}.")
        rng = np.random.default_rng(seed)
        return cls(rng.uniform(0.0, upper, size=(NUM_ATTRIBUTES, NUM_LEVELS)), float(noise_variance))

    def mean_rating(self, profiles: np.ndarray) -> np.ndarray:
        """Σ_i u_{i,a_i} per profile (no noise, no clipping)."""
        profiles = np.asarray(profiles, dtype=np.int64)
        return self.part_worths[np.arange(NUM_ATTRIBUTES), profiles].sum(axis=1)

    def rate(self, profiles: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Noisy ratings of ``profiles``, clipped to [0, 100]."""
        noise = rng.normal(0.0, np.sqrt(self.noise_variance), size=len(profiles))
        return np.clip(self.mean_rating(profiles) + noise, 0.0, 100.0)


def random_profiles(count: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` profiles with every attribute level drawn uniformly."""
    return rng.integers(0, NUM_LEVELS, size=(count, NUM_ATTRIBUTES))


def mixed_ratings(true: RatingGenerator, noisy: RatingGenerator, count: int, noise_share: float,
                  rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``count`` rated profiles, round(noise_share · count) of them by ``noisy`` (a contributor's offer)."""
    profiles = random_profiles(count, rng)
    from_noisy = np.zeros(count, dtype=bool)
    from_noisy[rng.choice(count, size=int(round(noise_share * count)), replace=False)] = True
    ratings = np.empty(count)
    ratings[~from_noisy] = true.rate(profiles[~from_noisy], rng)
    ratings[from_noisy] = noisy.rate(profiles[from_noisy], rng)
    return profiles, ratings


def validation_profiles(ratings_per_profile: int = 5) -> np.ndarray:
    """The evaluation design of App. C.3: all 64 profiles, each rated ``ratings_per_profile`` times."""
    return np.repeat(ALL_PROFILES, ratings_per_profile, axis=0)


def part_worths_ols(profiles: np.ndarray, ratings: np.ndarray) -> np.ndarray:
    """OLS part-worths (3, 4) from rated profiles, centred within each attribute.

    Fits y = β_0 + Σ_i Σ_j u_ij 1[a_i = j] by least squares (minimum-norm solution of the
    rank-deficient dummy design) and centres each attribute's block, which removes exactly
    the unidentified constants (module docstring). Needs every level observed.
    """
    profiles = np.asarray(profiles, dtype=np.int64)
    ratings = np.asarray(ratings, dtype=np.float64)
    if ratings.shape != (len(profiles),):
        raise ValueError(f"ratings: expected one rating per profile, shape ({len(profiles)},); got {ratings.shape}.")
    design = np.hstack([np.ones((len(profiles), 1)), one_hot(profiles).astype(np.float64)])
    coefficients, *_ = np.linalg.lstsq(design, ratings, rcond=None)
    return centered(coefficients[1:].reshape(NUM_ATTRIBUTES, NUM_LEVELS))


def average_error(estimated: np.ndarray, true_part_worths: np.ndarray) -> float:
    """AvgErr = (1/12) Σ_ij |û_ij − u_ij| on centred part-worths ([ADS] §6.3)."""
    return float(np.mean(np.abs(centered(estimated) - centered(true_part_worths))))
