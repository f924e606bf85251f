"""Shapley estimators for groups past exact that reuse their samples better than plain MC.

Within one group D_t of [ADS] (Eq. 9), a player's value is the classical Shapley value of
the game v_t(S) = v(U_{t−1} ∪ S), S ⊆ D_t; every estimator here samples that game
through the coalition cache and reports a standard error per player, drawing in blocks
until every standard error is at most a target (or a cap on samples is reached).

* :class:`PermutationSampler`: MC-ADS ([ADS] Alg. 1) in blocks, the baseline; each
  permutation gives every player one marginal. Its standard errors are post-stratified by
  position (:func:`fedvalue.valuation.result.permutation_stderr`), or ``"plain"``.
* :class:`AntitheticSampler`: permutations in antithetic pairs (π and its reverse)
  [SAMPLPERM]; a sample is the pair's mean marginal. The reverse's prefixes are the
  complements of π's, so for a game whose interactions are at most pairwise,
  v(S) = Σ_{i∈S} a_i + Σ_{{i,j}⊆S} b_ij, the pair mean a_i + ½ Σ_{j≠i} b_ij is exact:
  near-additive rounds (most FL rounds) leave a small variance.
* :class:`StratifiedSampler`: stratified by coalition size [STRAT]: φ_i = (1/d) Σ_s μ_{i,s}
  with μ_{i,s} the mean marginal of i on the s-subsets of D_t ∖ {i}. The strata s = 0, 1,
  d−2, d−1 are computed exactly (2d² + 2d + 2 coalitions at most), where the marginals of
  FL rounds vary most (a client alone, or all but one or two). The others are sampled by
  blocks: the d cyclic shifts of a uniform permutation σ, in which every player takes
  every position exactly once, and the prefix before player i at position s is the arc
  of s players before i on σ's cycle, a uniform s-subset of the others: one unbiased
  marginal per (i, s) and block, with no variance between strata. The block of reversed
  σ is added (the antithetic partner of each shift, [SAMPLPERM]); a sample is the
  pair of blocks, 2d² prefixes. Strata means do not telescope, so each sample is made
  efficient by adding (v(U_t) − v(U_{t−1}) − Σ_i φ̂_i)/d to every player, zero in
  expectation (Σ_i φ̂_i is unbiased for the gain): the estimate stays unbiased.
* :class:`KernelSampler`: KernelSHAP with paired sampling [KERNELSHAP]: coalitions
  z ∈ {0,1}^d drawn from the Shapley kernel p(z) ∝ (d−1) / (C(d,|z|) |z| (d−|z|)), each
  with its complement, and φ the efficiency-constrained least squares solution

      φ = Â⁻¹ (b̂ − 1 (1ᵀÂ⁻¹b̂ − (v(U_t) − v(U_{t−1}))) / (1ᵀÂ⁻¹1)),
      Â = mean z zᵀ,   b̂ = mean z (v_t(z) − v_t(∅)),

  which is exact for additive games and efficient by construction. Its standard errors
  are the sandwich (delta-method) estimate: φ̂ = G b̂ + h with G = Â⁻¹ − Â⁻¹11ᵀÂ⁻¹/(1ᵀÂ⁻¹1),
  so Cov φ̂ ≈ G Cov(b_k − A_k φ̂) Gᵀ / (m − d) over the m independent pairs k (HC1's
  degrees of freedom; used for stopping only from 4d pairs on).

A sampler's ``coalitions`` counts the distinct coalitions it asked for (what it would cost
from an empty cache), which :func:`choose_sampler` uses to pick the cheapest one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from fedvalue.valuation.game import CoalitionGame
from fedvalue.valuation.result import permutation_stderr, positions_in


def _masks_of_rows(base: int, positions: np.ndarray, rows: np.ndarray) -> list[int]:
    """Global mask base ∪ {positions[k] : rows[r, k] = 1} per row (bit k -> positions[k])."""
    bits = [1 << int(p) for p in positions.tolist()]
    return [base | sum(b for b, on in zip(bits, row) if on) for row in rows.tolist()]


def _prefix_masks(base: int, positions: np.ndarray, orders: np.ndarray) -> list[int]:
    """Masks of the d + 1 prefixes of each order (row of local indices), row after row."""
    bits = [1 << int(p) for p in positions.tolist()]
    masks: list[int] = []
    for row in orders.tolist():
        mask = base
        masks.append(mask)
        for k in row:
            mask |= bits[k]
            masks.append(mask)
    return masks


def exact_strata(values: Callable[[list[int]], np.ndarray], base: int, positions: np.ndarray,
                 sizes: Sequence[int]) -> np.ndarray:
    """Σ over the coalition ``sizes`` s (among 0, 1, d − 2, d − 1) of each player's mean marginal on the s-subsets
    of the group's other players, on top of ``base`` = U_{t−1}, in group order; ``values`` gives the coalition values
    of a list of masks (the game's, or a sampler's that counts them). About d² coalitions: 2d + 2 for sizes 0 and
    d − 1, d(d − 1)/2 more for each of 1 and d − 2."""
    d = len(positions)
    bits = [1 << int(p) for p in positions.tolist()]
    full = base | sum(bits)
    total = np.zeros(d)
    for s in sizes:
        if s == 0:
            utilities = values([base] + [base | b for b in bits])
            total += utilities[1:] - utilities[0]
        elif s == d - 1:
            utilities = values([full] + [full & ~b for b in bits])
            total += utilities[0] - utilities[1:]
        elif s == 1:
            pairs = [(i, j) for i in range(d) for j in range(d) if i != j]
            utilities = values([base | bits[i] | bits[j] for i, j in pairs] + [base | bits[j] for _, j in pairs])
            marginals = utilities[: len(pairs)] - utilities[len(pairs):]
            np.add.at(total, [i for i, _ in pairs], marginals / (d - 1))
        elif s == d - 2:  # the others but one
            pairs = [(i, j) for i in range(d) for j in range(d) if i != j]
            utilities = values([full & ~bits[j] for _, j in pairs] + [full & ~bits[j] & ~bits[i] for i, j in pairs])
            marginals = utilities[: len(pairs)] - utilities[len(pairs):]
            np.add.at(total, [i for i, _ in pairs], marginals / (d - 1))
        else:
            raise ValueError(f"sizes: expected sizes among 0, 1, d − 2 and d − 1 (d = {d}); got {s}.")
    return total


class _Sampler:
    """Common state: a group of ``game`` on top of ``base`` = U_{t−1}, its samples so far;
    ``stderr_estimator`` (:data:`fedvalue.valuation.result.STDERR_ESTIMATORS`) is the permutation
    sampler's (the others' samples are not permutations)."""

    name = ""

    def __init__(self, game: CoalitionGame, base: int, positions: np.ndarray, rng: np.random.Generator,
                 stderr_estimator: str = "by-position") -> None:
        self.game, self.base, self.positions, self.rng = game, base, positions, rng
        self.stderr_estimator = stderr_estimator
        self.size = len(positions)
        self.samples = 0
        self._seen: set[int] = set()

    @property
    def coalitions(self) -> int:
        """Distinct coalitions this sampler has asked for."""
        return len(self._seen)

    def _values(self, masks: list[int]) -> np.ndarray:
        self._seen.update(masks)
        return self.game.values(masks)

    def block(self) -> int:
        """Samples per draw."""
        raise NotImplementedError

    @property
    def min_samples(self) -> int:
        """Samples before the standard errors are trusted for stopping."""
        return 2

    def draw(self, count: int) -> None:
        raise NotImplementedError

    def estimate(self) -> tuple[np.ndarray, np.ndarray]:
        """(values, standard errors) in group order; stderr NaN below two samples."""
        raise NotImplementedError

    @property
    def cost_per_sample(self) -> int:
        """Most distinct coalitions one sample can add (budgets cut blocks by it)."""
        raise NotImplementedError

    def run(self, cap: float, target: float | None, budget: int | None = None,
            cached_cap: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Draw blocks until every stderr ≤ ``target`` (None: never), ``cap`` samples, or
        ``budget`` distinct evaluations of the game from now on: a block is cut to the
        samples whose worst case (:attr:`cost_per_sample`) still fits, and once a block
        finds every coalition it draws cached (a small group seen whole, where the budget
        cannot be spent) sampling stops at ``cached_cap`` samples (the estimator's usual cap)."""
        start = self.game.num_evaluations
        while self.samples < cap:
            count = min(self.block(), cap - self.samples)
            before = self.game.num_evaluations
            if budget is not None:
                count = min(count, (budget - (before - start)) // self.cost_per_sample)
                if count < 1:
                    break
            self.draw(int(count))
            if budget is not None and self.game.num_evaluations == before and \
                    self.samples >= max(self.min_samples, cached_cap):
                break  # every coalition it draws is cached: the budget cannot be spent
            if target is not None and self.samples >= self.min_samples and np.all(self.estimate()[1] <= target):
                break
        return self.estimate()


class _MarginalSampler(_Sampler):
    """Samplers whose samples are vectors of per-player marginals (mean and stderr of rows)."""

    def __init__(self, *args, **keywords) -> None:
        super().__init__(*args, **keywords)
        self._rows: list[np.ndarray] = []

    def _marginals(self, orders: np.ndarray) -> np.ndarray:
        """Marginal of every player along each order: (orders × d), columns in group order."""
        count = len(orders)
        utilities = self._values(_prefix_masks(self.base, self.positions, orders)).reshape(count, self.size + 1)
        marginals = np.empty((count, self.size))
        np.put_along_axis(marginals, orders, np.diff(utilities, axis=1), axis=1)
        return marginals

    def estimate(self) -> tuple[np.ndarray, np.ndarray]:
        rows = np.concatenate(self._rows)
        if len(rows) < 2:
            return rows.mean(axis=0), np.full(self.size, np.nan)
        return rows.mean(axis=0), rows.std(axis=0, ddof=1) / math.sqrt(len(rows))


class PermutationSampler(_MarginalSampler):
    """Plain permutation MC ([ADS] Alg. 1): one sample = one permutation's marginals."""

    name = "mc"

    def block(self) -> int:
        return max(10, self.size)

    @property
    def cost_per_sample(self) -> int:
        return max(self.size, 1)

    def __init__(self, *args, **keywords) -> None:
        super().__init__(*args, **keywords)
        self._positions: list[np.ndarray] = []

    def draw(self, count: int) -> None:
        orders = self.rng.permuted(np.tile(np.arange(self.size), (count, 1)), axis=1)
        self._rows.append(self._marginals(orders))
        self._positions.append(positions_in(orders))
        self.samples += count

    def estimate(self) -> tuple[np.ndarray, np.ndarray]:
        rows = np.concatenate(self._rows)
        return rows.mean(axis=0), permutation_stderr(rows, np.concatenate(self._positions),
                                                     estimator=self.stderr_estimator)


class AntitheticSampler(_MarginalSampler):
    """Antithetic permutations [SAMPLPERM]: one sample = the mean marginals of π and reversed π."""

    name = "antithetic"

    def block(self) -> int:
        return max(5, -(-self.size // 2))

    @property
    def cost_per_sample(self) -> int:
        return max(2 * self.size, 1)

    def draw(self, count: int) -> None:
        orders = self.rng.permuted(np.tile(np.arange(self.size), (count, 1)), axis=1)
        paired = np.empty((2 * count, self.size), dtype=orders.dtype)
        paired[0::2], paired[1::2] = orders, orders[:, ::-1]
        marginals = self._marginals(paired)
        self._rows.append(0.5 * (marginals[0::2] + marginals[1::2]))
        self.samples += count


class StratifiedSampler(_Sampler):
    """Stratified by coalition size [STRAT] with exact end strata (module docstring): one
    sample = a block of the d cyclic shifts of a random permutation σ and of its reverse."""

    name = "stratified"
    antithetic = True

    def __init__(self, *args, **keywords) -> None:
        super().__init__(*args, **keywords)
        d = self.size
        self.exact_sizes = sorted({0, 1, d - 2, d - 1} & set(range(d))) if d > 4 else list(range(d))
        self.sampled_sizes = [s for s in range(d) if s not in self.exact_sizes]
        self._exact = self._exact_strata()
        empty, full = self._values([self.base, self.base | sum(1 << int(p) for p in self.positions.tolist())])
        self.total = float(full - empty)
        self._rows: list[np.ndarray] = []

    def _exact_strata(self) -> np.ndarray:
        """Σ over the exact sizes s of the mean marginal of each player on s-subsets of the others."""
        return exact_strata(self._values, self.base, self.positions, self.exact_sizes)

    def block(self) -> int:
        return 2

    @property
    def cost_per_sample(self) -> int:  # d shifts of σ and of reversed σ, d new prefixes each
        return max(2 * self.size * self.size, 1) if self.sampled_sizes else 1

    def draw(self, count: int) -> None:
        d = self.size
        if not self.sampled_sizes:
            self.samples += count
            return
        sigmas = self.rng.permuted(np.tile(np.arange(d), (count, 1)), axis=1)
        if self.antithetic:
            sigmas = np.stack([sigmas, sigmas[:, ::-1]], axis=1).reshape(-1, d)
        shifts = (np.arange(d)[:, None] + np.arange(d)[None, :]) % d  # row k: σ rotated by k
        orders = sigmas[:, shifts].reshape(-1, d)
        utilities = self._values(_prefix_masks(self.base, self.positions, orders)).reshape(len(orders), d + 1)
        steps = np.diff(utilities, axis=1)[:, self.sampled_sizes]  # marginals at the sampled positions
        players = orders[:, self.sampled_sizes]
        sums = np.zeros((len(sigmas), d))
        block_of = np.repeat(np.arange(len(sigmas)), d)[:, None].repeat(len(self.sampled_sizes), axis=1)
        np.add.at(sums, (block_of, players), steps)  # each player once per sampled size per block
        rows = (self._exact + sums.reshape(count, -1, d).mean(axis=1)) / d
        # Each sample made efficient: + (v(U_t) − v(U_{t−1}) − Σ_i φ_i)/d, zero in expectation.
        self._rows.append(rows + (self.total - rows.sum(axis=1, keepdims=True)) / d)
        self.samples += count

    def estimate(self) -> tuple[np.ndarray, np.ndarray]:
        if not self._rows:
            if not self.sampled_sizes:
                return self._exact / self.size, np.zeros(self.size)
            return np.full(self.size, np.nan), np.full(self.size, np.nan)
        rows = np.concatenate(self._rows)
        if len(rows) < 2:
            return rows.mean(axis=0), np.full(self.size, np.nan)
        return rows.mean(axis=0), rows.std(axis=0, ddof=1) / math.sqrt(len(rows))


def shapley_kernel_sizes(size: int) -> np.ndarray:
    """P(|z| = s) for s = 1..d−1 under the Shapley kernel: ∝ 1 / (s (d − s)) ([KERNELSHAP])."""
    s = np.arange(1, size)
    weights = 1.0 / (s * (size - s))
    return weights / weights.sum()


class KernelSampler(_Sampler):
    """KernelSHAP with paired sampling [KERNELSHAP] (module docstring): one sample = a
    coalition drawn from the Shapley kernel and its complement."""

    name = "kernelshap"
    #: Pairs per player before the sandwich errors are used: with about d pairs the
    #: regression interpolates them and its residuals, hence its errors, vanish.
    pairs_per_player = 4

    def __init__(self, *args, **keywords) -> None:
        super().__init__(*args, **keywords)
        self._z: list[np.ndarray] = []
        self._y: list[np.ndarray] = []
        empty, full = self._values([self.base, self.base | sum(1 << int(p) for p in self.positions.tolist())])
        self.empty, self.total = float(empty), float(full - empty)

    def block(self) -> int:
        # Growing blocks: each estimate refits on every pair, so checks stay O(log samples).
        return max(10, self.size, self.samples // 4)

    @property
    def min_samples(self) -> int:
        return self.pairs_per_player * self.size

    @property
    def cost_per_sample(self) -> int:
        return 2

    def draw(self, count: int) -> None:
        d = self.size
        if d < 2:  # one player: its value is v(U_t) − v(U_{t−1}), nothing to sample
            self.samples += count
            return
        sizes = 1 + self.rng.choice(d - 1, size=count, p=shapley_kernel_sizes(d))
        ranks = np.argsort(self.rng.random((count, d)), axis=1)
        z = (ranks < sizes[:, None]).astype(np.float64)
        pairs = np.stack([z, 1.0 - z], axis=1).reshape(2 * count, d)
        utilities = self._values(_masks_of_rows(self.base, self.positions, pairs))
        self._z.append(pairs.reshape(count, 2, d))
        self._y.append((utilities - self.empty).reshape(count, 2))
        self.samples += count

    def estimate(self) -> tuple[np.ndarray, np.ndarray]:
        d = self.size
        if d < 2:  # efficiency alone gives the value
            return np.full(d, self.total), np.zeros(d)
        if not self._z:
            return np.full(d, np.nan), np.full(d, np.nan)
        z, y = np.concatenate(self._z), np.concatenate(self._y)  # (m, 2, d), (m, 2)
        a_k = 0.5 * np.einsum("kpi,kpj->kij", z, z)
        b_k = 0.5 * np.einsum("kpi,kp->ki", z, y)
        inverse = np.linalg.pinv(a_k.mean(axis=0))
        b = b_k.mean(axis=0)
        ones = np.ones(d)
        inverse_ones = inverse @ ones
        scale = float(ones @ inverse_ones)
        values = inverse @ b - inverse_ones * (float(ones @ inverse @ b) - self.total) / scale
        m = len(z)
        if m < 2:
            return values, np.full(d, np.nan)
        g = inverse - np.outer(inverse_ones, inverse_ones) / scale
        residuals = b_k - np.einsum("kij,j->ki", a_k, values)
        covariance = np.atleast_2d(np.cov(residuals, rowvar=False))
        # HC1's m / (m − d): the fit spends d of the m pairs' degrees of freedom.
        variances = np.einsum("ij,jk,ik->i", g, covariance, g) / max(m - d, 1)
        return values, np.sqrt(np.maximum(variances, 0.0))


SAMPLERS = {s.name: s for s in (PermutationSampler, AntitheticSampler, StratifiedSampler, KernelSampler)}


def choose_sampler(
    game: CoalitionGame,
    groups: list[tuple[int, np.ndarray]],
    rng: np.random.Generator,
    target: float,
    stderr_estimator: str = "by-position",
) -> tuple[str, list[_Sampler]]:
    """The sampler expected to reach every stderr ≤ ``target`` with the fewest coalitions.

    Each candidate draws one block (at least its minimum of samples) per group (a pilot, kept for the chosen one); its
    projected cost is coalitions × (largest stderr / target)², the samples a stderr ∝
    1/√samples needs. Ties go to the earlier in ``SAMPLERS``.
    """
    best: tuple[float, str, list[_Sampler]] | None = None
    for name, kind in SAMPLERS.items():
        samplers = [kind(game, base, positions, rng, stderr_estimator) for base, positions in groups]
        for sampler in samplers:
            sampler.draw(max(sampler.block(), sampler.min_samples))
        worst = max(float(np.nanmax(s.estimate()[1], initial=0.0)) for s in samplers)
        coalitions = sum(s.coalitions for s in samplers)
        projected = coalitions * max(1.0, (worst / target) ** 2) if math.isfinite(worst) else math.inf
        if best is None or projected < best[0]:
            best = (projected, name, samplers)
    return best[1], best[2]
