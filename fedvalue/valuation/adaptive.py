"""Adaptive MC-ADS: coalition evaluations spent only on the players whose decision is still unsure.

The caller states a decision (:class:`Decision`, from :class:`~fedvalue.valuation.settings.AdsSettings`'
``decision``, ``cut``, ``top_k``, ``z``); with φ̂_i, se_i the estimate and its standard error and z_L the
per-look quantile below, player i is **settled**

* ``"threshold"`` (cut c; c = 0 asks "is this client harmful?"): when |φ̂_i − c| ≥ z_L·se_i;
* ``"top-k"``: when its interval [φ̂_i − z_L·se_i, φ̂_i + z_L·se_i] lies wholly on its side of every interval of
  the other side: a player ranked in the top k when its lower end is ≥ the largest upper end of the rest, a
  player of the rest when its upper end is ≤ the smallest lower end of the top k. For the k-th and (k+1)-th
  ranked players this is φ̂_(k) − z_L·se_(k) ≥ φ̂_(k+1) + z_L·se_(k+1); it also holds every other pair apart.
  With k ≥ n every player is in the top k, settled.

**What is sampled.** Within group D_t of size d ([ADS] Eq. 9, one group in a round of federated learning,
Remark 4.1) a player's value is the mean over positions k = 0, ..., d − 1 of its mean marginal there,

    φ_i = (1/d) Σ_k μ_ik,   μ_ik = mean over k-subsets S of D_t ∖ {i} of v(U_{t−1} ∪ S ∪ {i}) − v(U_{t−1} ∪ S),

since the prefix before i at position k of a uniform σ-respecting permutation is U_{t−1} and a uniform
k-subset of the others ([ADS] Alg. 1, lines 6–11: each of its marginals is one such draw). Permutation
sampling cannot spend on one player: every permutation costs up to d evaluations and gives every player a
marginal. Here each marginal is drawn for one player alone, at a position chosen by stratum [STRAT]: the
positions 0, 1, d − 2 and d − 1, where a round's marginals vary most (a client alone, or all but one or two),
are computed exactly for every player (about d² coalitions, the exact end strata of
:class:`~fedvalue.valuation.shapley_sampling.StratifiedSampler`); positions 2, ..., d − 3 are split into B ≤
:data:`MAX_BINS` contiguous bins b of |b| positions, and a draw of player i in bin b takes k uniform in b and
S a uniform k-subset of the others: 2 coalitions, v(U_{t−1} ∪ S ∪ {i}) and v(U_{t−1} ∪ S), through the
game's cache. With E the exact positions and x̄_ib the mean of player i's c_i draws in bin b (every bin of a
player holds the same number of draws, each drawn independently),

    φ̂_i = (1/d) [Σ_{k∈E} μ_ik + Σ_b |b| x̄_ib],   Var φ̂_i = Σ_b (|b|/d)² σ_ib² / c_i,

unbiased; stratifying removes the spread between positions that a permutation's marginal carries. σ_ib² is
estimated by player i's sample variance in the bin moderated toward the bin's pool P_b (the mean of the
group's players' sample variances there) with d₀ = :data:`PRIOR_DEGREES` prior degrees of freedom [MODVAR], as
:mod:`fedvalue.valuation.result` does by position: s̃_ib² = ((c_i − 1) s_ib² + d₀ P_b) / (c_i − 1 + d₀), so that
a player whose few draws in a bin happened to agree is not taken for exact there. se_i² = Σ_b (|b|/d)² s̃_ib² / c_i.
Groups of d ≤ 4 have every position exact: their values are exact, se 0.

**Efficiency.** Independent draws give independent φ̂_i, and Σ_i φ_i = v(U_t) − v(U_{t−1}) = T
([ADS] Prop. 4.2). Each group's estimate is projected onto that constraint by generalized least squares
with the estimated variances V_i = se_i²,

    φ̃_i = φ̂_i + (V_i / Σ_j V_j) (T − Σ_j φ̂_j),   Var φ̃_i = V_i − V_i² / Σ_j V_j,

which is efficient (the ledger's group-efficiency check holds), moves a precise player little, and lowers
every variance. φ̃ and its standard error are what decisions look at and what the result books.

**Spending** (the look schedule). A pilot brings every player to c_0 = max(2, 1 + ⌈:data:`PILOT_DEGREES` / B⌉)
draws a bin, so that its se has at least PILOT_DEGREES residual degrees of freedom (±2 se of a t-statistic with
16 covers 0.937). Then at each look the players not yet settled (and, with a ``stderr_target``, whose se is still
above it) are brought to the schedule's next count, c_0, 2c_0, 4c_0, ..., up to the cap
c_max = max(c_0, ⌈m* Σ_b |b|² / d²⌉): with c_max draws a bin, φ̂_i is a mean of independent terms whose
squared ranges sum to at most r²/m* (Hoeffding's, as Alg. 1's m* permutations give each player m* marginals),
so the cap keeps [ADS] §5.1's (ε, δ) guarantee for the unprojected estimate. A player settled at one look
is checked again at every later one (the projection moves it a little as others are drawn) and drawn again
when it no longer is. Sampling stops when every player is settled or at its precision, at the cap, or when a
``budget`` of distinct evaluations is spent; under a budget a look serves the least settled players first
(smallest |φ̃_i − c| / se_i, with c the top-k boundary (φ̃_(k) + φ̃_(k+1))/2 there) and takes a player's draws
only while their uncached coalitions fit. A settled player costs nothing more, which is the saving: a pilot of
about d² + 2 c_0 B d coalitions, then 2 B c_i a player only where the decision is unsure.

**Stopping on an interval.** Testing at every look with a fixed z is a repeated significance test: the chance
that some look settles a player on the wrong side of the cut exceeds that of one look, and an interval read at
the look that stopped a player is optimistic, the more so the nearer the player is to the cut [GROUPSEQ]. Both
are corrected by a union (Bonferroni) bound over the schedule's L looks, which the settings and d fix in advance:

* the decision: the caller's ``z`` states the one-look level α = P(Z ≥ z) (z = 2: α = 0.023), and each look
  tests at z_L with P(Z ≥ z_L) = α / L, so a player on one side of the cut is settled on the other with
  probability at most α whatever look stops it (per player, not over all players at once);
* the booked standard error is se_i · z_L(2)/2 (z_L(2): the same quantile for z = 2; 1.26 for L = 4), so that
  ±2 booked se is [GROUPSEQ]'s repeated confidence interval: P(some look ℓ has |φ̃_i,ℓ − φ_i| > z_L(2) se_i,ℓ)
  ≤ L · 2α/L = 0.046, and ±2 booked se holds φ_i with probability at least 0.954 at the look that stopped
  the player, whichever it was. On 100 runs of random games of 10 players with the cut at the median exact
  value, ±2 unwidened se held 0.937 of the exact values and 0.871 of the settled players', against 0.947 when
  no player settles (all drawn to the cap); ±2 booked se held 0.977 and 0.936
  (tests/fedvalue/valuation/test_adaptive.py holds the booked ones at ≥ 0.93).

These bounds lean on the normal approximation of φ̃_i, which :data:`PILOT_DEGREES` and :data:`PRIOR_DEGREES`
are there to keep honest with few draws.

The draws depend only on the seed's generator, the settings and the game's values (players in group order,
looks in order), so a round valued adaptively is recomputed bit for bit by the audit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from fedvalue.valuation.game import CoalitionGame
from fedvalue.valuation.settings import THRESHOLD, AdsSettings
from fedvalue.valuation.shapley_sampling import exact_strata

#: Most bins the positions 2, ..., d − 3 are split into (a pilot then costs O(d·MAX_BINS) a player, not O(d²)).
MAX_BINS = 8
#: Residual degrees of freedom of a player's standard error after the pilot: ±2 se of a t-statistic with 16
#: covers 0.937 (8: 0.919), about the 0.94 the ledger's standard errors hold by position.
PILOT_DEGREES = 16
#: Prior degrees of freedom of the pool in each player's variance in a bin ([MODVAR]'s d₀; module docstring). Two,
#: not the one of :data:`fedvalue.valuation.result.POOLED_WEIGHT`: a cell holds only c_0 = 3–17 draws at the pilot,
#: and a utility with steps (accuracy moves by one held-out example; a vote is won or not) often gives a cell
#: draws that agree by chance. On a weighted-majority game (0/1 marginals, tests/fedvalue/valuation/test_adaptive.py)
#: ±2 booked se held 0.935 of the exact values with one prior degree and 0.974 with two.
PRIOR_DEGREES = 2.0
#: The interval the ledger's standard errors are read with, ±BOOKED_Z se: the booked se is widened so that it
#: holds at whatever look stopped the player (module docstring).
BOOKED_Z = 2.0
#: Factor between the draws a bin of successive looks (a geometric schedule keeps the looks, hence the
#: Bonferroni inflation of z, logarithmic in the cap).
GROWTH = 2


@dataclass(frozen=True)
class Decision:
    """What the caller decides from the values (module docstring): ``kind`` ``"threshold"`` at ``cut``, or
    ``"top-k"`` with ``top_k``; ``z`` the one-look quantile."""

    kind: str
    cut: float | None
    top_k: int | None
    z: float

    @classmethod
    def of(cls, settings: AdsSettings) -> Decision:
        """The decision an adaptive :class:`~fedvalue.valuation.settings.AdsSettings` states."""
        return cls(settings.decision, settings.cut, settings.top_k, float(settings.z))

    def settled(self, values: np.ndarray, stderr: np.ndarray, z: float) -> np.ndarray:
        """Whether each player's side of the decision is settled at quantile ``z`` (module docstring)."""
        values, stderr = np.asarray(values, dtype=np.float64), np.asarray(stderr, dtype=np.float64)
        if self.kind == THRESHOLD:
            return np.abs(values - self.cut) >= z * stderr
        top = self.top_mask(values)
        if top.all():
            return np.ones(len(values), dtype=bool)
        lower, upper = values - z * stderr, values + z * stderr
        return np.where(top, lower >= upper[~top].max(), upper <= lower[top].min())

    def top_mask(self, values: np.ndarray) -> np.ndarray:
        """The top ``top_k`` players by value (ties to the earlier player)."""
        ranked = np.argsort(-np.asarray(values), kind="stable")
        top = np.zeros(len(values), dtype=bool)
        top[ranked[: self.top_k]] = True
        return top

    def boundary(self, values: np.ndarray) -> float:
        """Where the decision cuts: ``cut``, or midway between the k-th and (k+1)-th values."""
        if self.kind == THRESHOLD:
            return float(self.cut)
        ranked = np.sort(np.asarray(values))[::-1]
        if self.top_k >= len(ranked):
            return float(ranked[-1])
        return float(ranked[self.top_k - 1] + ranked[self.top_k]) / 2.0


def exact_positions(size: int) -> list[int]:
    """The positions valued exactly: 0, 1, d − 2, d − 1 (every position for d ≤ 4)."""
    return sorted({0, 1, size - 2, size - 1} & set(range(size))) if size > 4 else list(range(size))


def sampled_bins(size: int) -> list[np.ndarray]:
    """Positions 2, ..., d − 3 in at most :data:`MAX_BINS` contiguous bins of near-equal width (none for d ≤ 4)."""
    if size <= 4:
        return []
    positions = np.arange(2, size - 2)
    return [b for b in np.array_split(positions, min(MAX_BINS, len(positions))) if len(b)]


def exact_strata_coalitions(size: int) -> int:
    """Distinct coalitions of the exact positions of one group from an empty cache: 2^d for d ≤ 4, else
    2 + 2d + d(d − 1) (U_{t−1}, U_t, the d singletons and d complements, the pairs and the complements of pairs)."""
    return 1 << size if size <= 4 else 2 + 2 * size + size * (size - 1)


def pilot_draws(num_bins: int) -> int:
    """c_0 = max(2, 1 + ⌈:data:`PILOT_DEGREES` / B⌉) draws a bin (0 without bins)."""
    return 0 if num_bins == 0 else max(2, 1 + math.ceil(PILOT_DEGREES / num_bins))


def draw_cap(size: int, m_star: int) -> int:
    """c_max = max(c_0, ⌈m* Σ_b |b|² / d²⌉) draws a bin (module docstring; 0 without bins)."""
    bins = sampled_bins(size)
    if not bins:
        return 0
    return max(pilot_draws(len(bins)), math.ceil(m_star * sum(len(b) ** 2 for b in bins) / size ** 2))


def look_schedule(size: int, m_star: int) -> tuple[int, ...]:
    """Draws a bin at each look: c_0, GROWTH·c_0, ... below c_max, then c_max (empty without bins)."""
    cap = draw_cap(size, m_star)
    if cap == 0:
        return ()
    counts = [pilot_draws(len(sampled_bins(size)))]
    while counts[-1] * GROWTH < cap:
        counts.append(counts[-1] * GROWTH)
    return (*counts, cap) if counts[-1] < cap else tuple(counts)


def look_quantile(z: float, looks: int) -> float:
    """z_L with P(Z ≥ z_L) = P(Z ≥ z) / L, Bonferroni over ``looks`` looks (z itself for one look)."""
    alpha = 0.5 * math.erfc(z / math.sqrt(2.0))  # P(Z ≥ z), kept accurate in the far tail
    if looks <= 1 or alpha <= 0.0:
        return float(z)
    return -NormalDist().inv_cdf(alpha / looks)


def minimum_coalitions(size: int) -> int:
    """Distinct coalitions the pilot may cost for a group of ``size`` (never above exact's 2^d)."""
    bins = sampled_bins(size)
    return min(1 << size, exact_strata_coalitions(size) + 2 * pilot_draws(len(bins)) * len(bins) * size)


def worst_coalitions(size: int, m_star: int) -> int:
    """Distinct coalitions a group may cost with every player drawn to the cap (never above exact's 2^d)."""
    bins = sampled_bins(size)
    return min(1 << size, exact_strata_coalitions(size) + 2 * draw_cap(size, m_star) * len(bins) * size)


class _GroupDraws:
    """One group's exact positions and every player's draws by bin (module docstring)."""

    def __init__(self, game: CoalitionGame, base: int, positions: np.ndarray, m_star: int) -> None:
        self.game, self.base, self.positions = game, base, positions
        self.size = len(positions)
        self.bins = sampled_bins(self.size)
        self.widths = np.array([len(b) for b in self.bins], dtype=np.float64)
        self.schedule = look_schedule(self.size, m_star)
        self.exact = exact_strata(game.values, base, positions, exact_positions(self.size))
        self.full = base | sum(1 << int(p) for p in positions.tolist())
        empty, full = game.values([base, self.full])
        self.total = float(full - empty)
        self.draws = [np.empty((0, len(self.bins))) for _ in range(self.size)]

    def count(self, player: int) -> int:
        return len(self.draws[player])

    def target(self, look: int) -> int:
        """Draws a bin every unsettled player holds after ``look`` (the last count past the schedule's end)."""
        return self.schedule[min(look, len(self.schedule) - 1)] if self.schedule else 0

    def masks(self, player: int, count: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """``count`` draws of ``player``, one a bin: the masks U_{t−1} ∪ S and U_{t−1} ∪ S ∪ {i}, (count, B)
        each (object arrays of ints), S a uniform k-subset of the others, k uniform in the bin."""
        d, num_bins = self.size, len(self.bins)
        others = np.delete(np.arange(d), player)
        sizes = np.stack([rng.integers(b[0], b[-1] + 1, size=count) for b in self.bins], axis=1)
        orders = rng.permuted(np.tile(others, (count * num_bins, 1)), axis=1).reshape(count, num_bins, d - 1)
        own = 1 << int(self.positions[player])
        if self.game.num_players <= 62:
            bits = np.left_shift(np.int64(1), self.positions.astype(np.int64))
            prefixes = np.cumsum(bits[orders], axis=2)
            without = np.int64(self.base) + np.take_along_axis(prefixes, sizes[:, :, None] - 1, axis=2)[:, :, 0]
            without = np.array(without.tolist(), dtype=object)
        else:
            bits = [1 << int(p) for p in self.positions.tolist()]
            without = np.empty((count, num_bins), dtype=object)
            for r in range(count):
                for b in range(num_bins):
                    mask = self.base
                    for k in orders[r, b, : sizes[r, b]].tolist():
                        mask |= bits[k]
                    without[r, b] = mask
        return without, without | own

    def add(self, player: int, marginals: np.ndarray) -> None:
        self.draws[player] = np.concatenate([self.draws[player], marginals])

    def estimate(self) -> tuple[np.ndarray, np.ndarray]:
        """(φ̂, se) in group order before the efficiency projection (module docstring)."""
        d = self.size
        if not self.bins:
            return self.exact / d, np.zeros(d)
        counts = np.array([len(x) for x in self.draws], dtype=np.float64)
        means = np.stack([x.mean(axis=0) for x in self.draws])
        variances = np.stack([x.var(axis=0, ddof=1) for x in self.draws])
        pooled = variances.mean(axis=0)
        moderated = ((counts[:, None] - 1.0) * variances + PRIOR_DEGREES * pooled) / (counts[:, None] - 1.0
                                                                                       + PRIOR_DEGREES)
        values = (self.exact + means @ self.widths) / d
        stderr = np.sqrt((moderated * (self.widths / d) ** 2).sum(axis=1) / counts)
        return values, stderr

    def projected(self) -> tuple[np.ndarray, np.ndarray]:
        """(φ̃, its se): :meth:`estimate` projected onto Σ_i φ_i = v(U_t) − v(U_{t−1}) (module docstring)."""
        values, stderr = self.estimate()
        variances = stderr ** 2
        spread = float(variances.sum())
        if spread <= 0.0:
            return values, stderr
        share = variances / spread
        values = values + share * (self.total - float(values.sum()))
        return values, np.sqrt(np.maximum(variances * (1.0 - share), 0.0))


@dataclass(frozen=True)
class AdaptiveEstimate:
    """What adaptive MC-ADS found, in concatenated group order: ``values`` φ̃, ``stderr`` (the booked one, se_i
    widened by ``widening`` = z_L(2)/2), ``settled`` (the decision's side known at the looks' ``quantile`` z_L),
    ``draws`` (each player's draws a bin; 0 in a group valued exactly) and ``looks`` (looks taken, the pilot
    included)."""

    values: np.ndarray
    stderr: np.ndarray
    settled: np.ndarray
    draws: np.ndarray
    looks: int
    quantile: float
    widening: float


def adaptive_ads(game: CoalitionGame, prefix_masks: Sequence[int], group_positions: Sequence[np.ndarray],
                 decision: Decision, m_star: int, rng: np.random.Generator, *, stderr_target: float | None = None,
                 budget: int | None = None) -> AdaptiveEstimate:
    """Adaptive MC-ADS of every group (module docstring) on ``game``: group t on top of ``prefix_masks[t]`` with
    its players at bits ``group_positions[t]``; ``m_star`` is Alg. 1's permutation count (the cap), ``budget``
    the most distinct evaluations from now on (the pilot must fit: :func:`minimum_coalitions`)."""
    start = game.num_evaluations
    groups = [_GroupDraws(game, base, positions, m_star) for base, positions in zip(prefix_masks[:-1], group_positions)]
    looks = max((len(g.schedule) for g in groups), default=0)
    quantile = look_quantile(decision.z, looks)
    widening = look_quantile(BOOKED_Z, looks) / BOOKED_Z
    members = [(g, i) for g in groups for i in range(g.size)]
    taken = 0
    for look in range(looks):
        if look == 0:
            wanting = [k for k, (g, i) in enumerate(members) if g.bins]
        else:
            values, stderr = _projected(groups)
            unsure = ~decision.settled(values, stderr, quantile)
            if stderr_target is not None:
                unsure &= stderr * widening > stderr_target
            if not unsure.any():
                break
            boundary = decision.boundary(values)
            with np.errstate(divide="ignore", invalid="ignore"):
                closeness = np.abs(values - boundary) / stderr
            wanting = [int(k) for k in np.argsort(closeness, kind="stable") if unsure[k]]
        spent = None if budget is None else game.num_evaluations - start
        if not _draw(members, wanting, look, rng, budget, spent, game):
            break
        taken = look + 1
    values, stderr = _projected(groups)
    return AdaptiveEstimate(values, stderr * widening, decision.settled(values, stderr, quantile),
                            np.array([g.count(i) for g, i in members], dtype=np.int64), taken, quantile, widening)


def _projected(groups: list[_GroupDraws]) -> tuple[np.ndarray, np.ndarray]:
    estimates = [g.projected() for g in groups]
    return np.concatenate([e[0] for e in estimates]), np.concatenate([e[1] for e in estimates])


def _draw(members: list[tuple[_GroupDraws, int]], wanting: list[int], look: int, rng: np.random.Generator,
          budget: int | None, spent: int | None, game: CoalitionGame) -> bool:
    """Bring each ``wanting`` player (in that order) to its group's count for ``look``, all in one batch of the
    game; under a ``budget`` a player's draws are taken while their uncached coalitions fit. False when no
    draw was taken (nothing wanted one, or nothing fits)."""
    pending: list[tuple[_GroupDraws, int, np.ndarray, np.ndarray]] = []
    seen: set[int] = set()
    fresh = 0
    for k in wanting:
        group, player = members[k]
        count = group.target(look) - group.count(player)
        if count < 1:
            continue
        without, with_player = group.masks(player, count, rng)
        kept = count
        if budget is not None:
            kept = 0
            for r in range(count):
                new = set(without[r].tolist()) | set(with_player[r].tolist())
                new -= seen
                cost = game.num_missing(new)
                if spent + fresh + cost > budget:
                    break
                seen |= new
                fresh += cost
                kept += 1
        if kept:
            pending.append((group, player, without[:kept], with_player[:kept]))
        if budget is not None and kept < count:
            break  # the budget is spent: the players after this one are served at no look
    if not pending:
        return False
    masks: list[int] = []
    for _, _, without, with_player in pending:
        masks += without.ravel().tolist() + with_player.ravel().tolist()
    utilities = game.values(masks)
    offset = 0
    for group, player, without, _ in pending:
        size = without.size
        before = utilities[offset: offset + size].reshape(without.shape)
        after = utilities[offset + size: offset + 2 * size].reshape(without.shape)
        group.add(player, after - before)
        offset += 2 * size
    return True

