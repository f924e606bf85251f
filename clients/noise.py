"""Noisy contributors beyond symmetric label flips: structured label noise, corrupted inputs and
noisy updates, each a :class:`clients.behaviours.ClientBehaviour`.

- :class:`ClassPairSwap`: each label of a class in one of the given pairs moves to its partner
  class with probability p (structured, class-dependent noise: a contributor who confuses
  T-shirts with shirts), fixed per client by its seed as :class:`clients.behaviours.LabelNoise`'s;
- :class:`FeatureNoise`: each training example, with probability p, gets Gaussian noise of
  standard deviation σ on every input feature (clipped to a range when given); labels stay
  correct;
- :class:`NoisyUpdate`: trains honestly, then replies w + ε with ε ~ N(0, (s · rms(w − A_{t−1}))²)
  per floating-point array (a Gaussian attack scaled to the client's own update, so the same s
  means the same signal-to-noise ratio whatever the model's scale).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from clients.behaviours import ClientBehaviour
from clients.seeding import Seed, as_generator, fixed_entropy
from fedvalue._checks import check_integer, check_non_negative, check_unit_interval


class ClassPairSwap(ClientBehaviour):
    """Structured label noise: y ↦ partner(y) with probability ``p`` for y in a pair (module docstring).

    Parameters
    ----------
    pairs
        Disjoint class pairs (a, b); a label a becomes b and b becomes a. Classes in no pair are
        never changed.
    p
        Swap probability in [0, 1] per label.
    seed
        ``None``: fresh swaps every round from the round's generator; otherwise fixed once, as a
        contributor whose dataset is mislabelled.
    """

    def __init__(self, pairs: Sequence[Sequence[int]], p: float = 1.0, *, seed: Seed = None) -> None:
        partner: dict[int, int] = {}
        for pair in pairs:
            if len(pair) != 2:
                raise ValueError(f"pairs: expected pairs of two classes; got {list(pair)!r}.")
            a, b = (check_integer("pairs", c, 0) for c in pair)
            if a == b or a in partner or b in partner:
                raise ValueError(f"pairs: expected disjoint pairs of two different classes; got {list(pairs)!r}.")
            partner[a], partner[b] = b, a
        if not partner:
            raise ValueError("pairs: expected at least one class pair; got none.")
        self.pairs = tuple(sorted((min(a, b), max(a, b)) for a, b in partner.items() if a < b))
        self.p = check_unit_interval("p", p)
        self._entropy = fixed_entropy(seed)

    def transform_training_data(self, x: np.ndarray, y: np.ndarray, rng: np.random.Generator):
        y = np.asarray(y)
        draw = as_generator(rng if self._entropy is None else self._entropy)
        swapped = y.copy()
        hit = draw.random(y.size) < self.p
        for a, b in self.pairs:
            swapped[hit & (y == a)] = b
            swapped[hit & (y == b)] = a
        return x, swapped


class FeatureNoise(ClientBehaviour):
    """Corrupted inputs, correct labels: x ↦ clip(x + N(0, σ²)) for a share ``p`` of the examples.

    Parameters
    ----------
    std
        σ ≥ 0 of the Gaussian noise on every feature, in the inputs' own units.
    p
        Probability in [0, 1] that an example is corrupted.
    clip
        ``(low, high)`` the corrupted features are clipped to (e.g. (0, 1) for pixels / 255), or None.
    seed
        ``None``: fresh noise every round; otherwise fixed once (a noisy dataset).
    """

    def __init__(self, std: float = 1.0, p: float = 1.0, *, clip: tuple[float, float] | None = None,
                 seed: Seed = None) -> None:
        self.std = check_non_negative("std", std)
        self.p = check_unit_interval("p", p)
        if clip is not None:
            low, high = (float(v) for v in clip)
            if not low < high:
                raise ValueError(f"clip: expected (low, high) with low < high; got {clip!r}.")
            clip = (low, high)
        self.clip = clip
        self._entropy = fixed_entropy(seed)

    def transform_training_data(self, x: np.ndarray, y: np.ndarray, rng: np.random.Generator):
        x = np.asarray(x)
        draw = as_generator(rng if self._entropy is None else self._entropy)
        hit = draw.random(len(x)) < self.p
        noise = draw.normal(0.0, self.std, size=x.shape)
        noisy = x.astype(np.float64, copy=True)
        noisy[hit] += noise[hit]
        if self.clip is not None:
            noisy[hit] = np.clip(noisy[hit], *self.clip)
        return noisy.astype(x.dtype if x.dtype.kind == "f" else np.float32), y


class NoisyUpdate(ClientBehaviour):
    """Replies w + ε, ε ~ N(0, (s · rms(w − A_{t−1}))²) per floating-point array (module docstring).

    Parameters
    ----------
    relative_std
        s ≥ 0: the noise's standard deviation over the root mean square of the client's own
        update, per array; integer buffers are replied as trained.
    """

    def __init__(self, relative_std: float = 3.0) -> None:
        self.relative_std = check_non_negative("relative_std", relative_std)

    def transform_reply(self, global_arrays, trained_arrays, num_examples, rng):
        reply = {}
        for key, trained in trained_arrays.items():
            if trained.dtype.kind != "f":
                reply[key] = trained
                continue
            update = trained.astype(np.float64) - np.asarray(global_arrays[key], dtype=np.float64)
            scale = self.relative_std * float(np.sqrt(np.mean(update**2))) if update.size else 0.0
            reply[key] = (trained.astype(np.float64) + rng.normal(0.0, scale, size=trained.shape)).astype(trained.dtype)
        return reply, num_examples
