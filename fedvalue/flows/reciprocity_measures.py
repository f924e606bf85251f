"""Reciprocity of inflows and outflows ([RECIP], Def. 2.1 and §5).

[RECIP] (Sundararajan & Krichene, "Inflow, Outflow, and Reciprocity in Machine
Learning") measures, per individual u, the inflow I_u (influence of others'
training data on u's predictions, Eq. 1) and the outflow O_u (influence of u's training
data on others' predictions, Eq. 2); :mod:`fedvalue.flows.round_flows` computes them with TracIn.

**Per-individual reciprocity** (Def. 2.1). A model is α-reciprocal for u when
I_u / O_u ∈ [α, 1/α], α ∈ [0, 1], and 0-reciprocal when the signs of I_u and O_u differ.
The largest such α is

    r_u = min(I_u / O_u, O_u / I_u)      if I_u and O_u have the same strict sign,
    r_u = 0                              if the signs differ,

so r_u ∈ [0, 1] and r_u = 1 exactly when I_u = O_u. Zeros (the definition leaves them
open; the convention here): I_u = O_u = 0 gives r_u = 1 (nothing in, nothing out:
balanced, and I_u = O_u holds); exactly one of them zero gives r_u = 0 (the ratio is 0 or
∞, inside [α, 1/α] only for α = 0) — a free-rider with zero outflow and non-zero inflow
is 0-reciprocal.

**Population reciprocity** (Def. 2.1). A model is (p, α)-reciprocal when it is
α-reciprocal for a fraction p of the individuals. For a given p the figure reported is
the largest such α,

    α(p) = max{α : #{u : r_u ≥ α} / n ≥ p} = r_(k),  k = ⌈p n⌉,

the k-th largest ratio (α(0) = 1 by convention, the best possible). The paper reports
α(0.75): e.g. "(0.75, 0.93)-TracIn-reciprocal" (§5.2).

**Correlations** (§2.2). Pearson and Spearman correlation between inflow and outflow
across individuals (Spearman: Pearson on average ranks, ties averaged); NaN when either
vector is constant. **Signs** (§5.1): the share of individuals with a negative inflow,
resp. outflow. **Evolution** (§5.1, Fig. 1c): all of the above on the cumulative flows
after each round.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from fedvalue._checks import check_finite_array, check_unit_interval

__all__ = [
    "DEFAULT_P",
    "ReciprocityReport",
    "alpha_at",
    "alpha_curve",
    "reciprocity",
    "reciprocity_over_rounds",
    "reciprocity_ratio",
]

#: The population fraction at which [RECIP] reports α ("(0.75, α)-reciprocal").
DEFAULT_P = 0.75


#: The scalar figures of a report, in to_dict order.
_SCALARS = ("p", "alpha", "pearson", "spearman", "negative_inflow_share", "negative_outflow_share",
            "mean_ratio", "median_ratio", "num_individuals")


def _check_p(value: object, name: str = "p") -> float:
    return check_unit_interval(name, value)


def _vector(name: str, values: object) -> np.ndarray:
    return check_finite_array(name, values, 1, "1-D array")


def _aligned(inflow: object, outflow: object) -> tuple[np.ndarray, np.ndarray, pd.Index]:
    """Inflow and outflow as float64 vectors of equal length, with their labels."""
    if isinstance(inflow, pd.Series) and isinstance(outflow, pd.Series):
        if not inflow.index.equals(outflow.index):
            if set(inflow.index) != set(outflow.index) or inflow.index.has_duplicates:
                raise ValueError(
                    "outflow: expected a Series with the same individuals (index) as inflow; got "
                    f"{len(set(outflow.index) ^ set(inflow.index))} individuals in only one of them."
                )
            outflow = outflow.reindex(inflow.index)
        index = inflow.index
    elif isinstance(inflow, pd.Series):
        index = inflow.index
    elif isinstance(outflow, pd.Series):
        index = outflow.index
    else:
        index = None
    i = _vector("inflow", inflow)
    o = _vector("outflow", outflow)
    if len(i) != len(o):
        raise ValueError(f"outflow: expected {len(i)} values, one per individual of inflow; got {len(o)}.")
    if index is None or len(index) != len(i):
        index = pd.RangeIndex(len(i))
    return i, o, index


def reciprocity_ratio(inflow: object, outflow: object) -> np.ndarray:
    """Per-individual reciprocity r_u of [RECIP] Def. 2.1.

    r_u = min(I_u/O_u, O_u/I_u) when I_u and O_u have the same strict sign, 0 when the
    signs differ or exactly one is zero, 1 when both are zero (module docstring).

    Parameters
    ----------
    inflow, outflow
        I_u and O_u per individual (1-D, same length, finite).

    Returns
    -------
    numpy.ndarray
        r_u ∈ [0, 1], float64.

    Raises
    ------
    ValueError
        Non-1-D, non-finite or different-length inputs.
    """
    i, o, _ = _aligned(inflow, outflow)
    ratio = np.zeros(len(i))
    same = (np.sign(i) == np.sign(o)) & (i != 0)  # same strict sign (no product: it can underflow)
    a, b = np.abs(i[same]), np.abs(o[same])
    ratio[same] = np.minimum(a, b) / np.maximum(a, b)
    ratio[(i == 0) & (o == 0)] = 1.0
    return ratio


def _rank_needed(p: float, n: int) -> int:
    """Smallest k with k / n ≥ p; p·n a rounding hair above an integer (0.7·10) counts as it."""
    return min(n, max(0, math.ceil(p * n - 1e-9)))


def alpha_at(ratios: object, p: float = DEFAULT_P) -> float:
    """Largest α such that a fraction ≥ ``p`` of individuals has r_u ≥ α (Def. 2.1).

    α(p) = r_(k), the k-th largest ratio with k = ⌈p n⌉; α(0) = 1.

    Parameters
    ----------
    ratios
        r_u per individual (from :func:`reciprocity_ratio`), each in [0, 1].
    p
        Fraction of the population, in [0, 1].

    Returns
    -------
    float
        α ∈ [0, 1]; NaN when there are no individuals.
    """
    p = _check_p(p)
    r = _vector("ratios", ratios)
    if np.any((r < 0) | (r > 1)):
        raise ValueError(f"ratios: expected reciprocity ratios in [0, 1]; got values in [{r.min()}, {r.max()}].")
    if len(r) == 0:
        return float("nan")
    k = _rank_needed(p, len(r))
    if k == 0:
        return 1.0
    return float(np.sort(r)[::-1][k - 1])


def alpha_curve(ratios: object, ps: Sequence[float] | np.ndarray | None = None) -> pd.DataFrame:
    """α(p) over a grid of p (the (p, α) trade-off curve of Def. 2.1).

    Parameters
    ----------
    ratios
        r_u per individual.
    ps
        Fractions in [0, 1]; default 0, 0.01, ..., 1.

    Returns
    -------
    pandas.DataFrame
        Columns ``p`` and ``alpha``, α non-increasing in p.
    """
    grid = np.linspace(0.0, 1.0, 101) if ps is None else np.asarray(ps, dtype=np.float64).ravel()
    alphas = [alpha_at(ratios, _check_p(float(p), "ps")) for p in grid]
    return pd.DataFrame({"p": grid, "alpha": alphas})


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    if len(x) < 2:
        return float("nan")
    xc, yc = x - x.mean(), y - y.mean()
    denominator = math.sqrt(float(xc @ xc) * float(yc @ yc))
    if denominator == 0.0:
        return float("nan")
    return float(np.clip((xc @ yc) / denominator, -1.0, 1.0))


def _ranks(x: np.ndarray) -> np.ndarray:
    return pd.Series(x).rank(method="average").to_numpy(dtype=np.float64)


@dataclass(frozen=True)
class ReciprocityReport:
    """Reciprocity figures of one set of inflows and outflows ([RECIP], Def. 2.1, §5).

    Attributes
    ----------
    p
        The population fraction of the headline figure.
    alpha
        α(p): the largest α such that the model is (p, α)-reciprocal.
    pearson, spearman
        Correlation between inflow and outflow across individuals (NaN if undefined).
    negative_inflow_share, negative_outflow_share
        Fraction of individuals with I_u < 0, resp. O_u < 0.
    mean_ratio, median_ratio
        Mean and median of r_u.
    num_individuals
        n.
    inflow, outflow, ratio
        Per individual (pandas Series sharing one index).
    """

    p: float
    alpha: float
    pearson: float
    spearman: float
    negative_inflow_share: float
    negative_outflow_share: float
    mean_ratio: float
    median_ratio: float
    num_individuals: int
    inflow: pd.Series = field(repr=False)
    outflow: pd.Series = field(repr=False)
    ratio: pd.Series = field(repr=False)

    def to_dict(self) -> dict[str, float | int]:
        """The scalar figures (no per-individual data)."""
        return {
            "p": self.p,
            "alpha": self.alpha,
            "pearson": self.pearson,
            "spearman": self.spearman,
            "negative_inflow_share": self.negative_inflow_share,
            "negative_outflow_share": self.negative_outflow_share,
            "mean_ratio": self.mean_ratio,
            "median_ratio": self.median_ratio,
            "num_individuals": self.num_individuals,
        }

    def to_frame(self) -> pd.DataFrame:
        """The scalar figures as a one-row frame (rows of several reports stack)."""
        return pd.DataFrame([self.to_dict()])

    def per_individual(self) -> pd.DataFrame:
        """Inflow, outflow, balance = inflow − outflow and ratio r_u per individual."""
        return pd.DataFrame({
            "inflow": self.inflow,
            "outflow": self.outflow,
            "balance": self.inflow - self.outflow,
            "ratio": self.ratio,
        })

    def curve(self, ps: Sequence[float] | np.ndarray | None = None) -> pd.DataFrame:
        """α(p) over ``ps`` (default 0, 0.01, ..., 1); see :func:`alpha_curve`."""
        return alpha_curve(self.ratio.to_numpy(), ps)


def reciprocity(inflow: object, outflow: object, *, p: float = DEFAULT_P) -> ReciprocityReport:
    """Reciprocity figures of inflows and outflows ([RECIP], Def. 2.1, §2.2, §5).

    Parameters
    ----------
    inflow, outflow
        I_u and O_u per individual: 1-D arrays of equal length, or pandas Series (two
        Series are aligned on their index; their labels name the individuals).
    p
        Population fraction of the headline α (default 0.75, the paper's).

    Returns
    -------
    ReciprocityReport
        α(p), Pearson, Spearman, negative shares, ratio summary and per-individual data.

    Raises
    ------
    ValueError
        ``p`` outside [0, 1]; inputs not 1-D, not finite, of different lengths, or Series
        over different individuals.
    """
    p = _check_p(p)
    i, o, index = _aligned(inflow, outflow)
    ratio = reciprocity_ratio(i, o)
    n = len(i)
    return ReciprocityReport(
        p=p,
        alpha=alpha_at(ratio, p),
        pearson=_pearson(i, o),
        spearman=_pearson(_ranks(i), _ranks(o)) if n else float("nan"),
        negative_inflow_share=float(np.mean(i < 0)) if n else float("nan"),
        negative_outflow_share=float(np.mean(o < 0)) if n else float("nan"),
        mean_ratio=float(ratio.mean()) if n else float("nan"),
        median_ratio=float(np.median(ratio)) if n else float("nan"),
        num_individuals=n,
        inflow=pd.Series(i, index=index, name="inflow"),
        outflow=pd.Series(o, index=index, name="outflow"),
        ratio=pd.Series(ratio, index=index, name="ratio"),
    )


def reciprocity_over_rounds(
    rounds: pd.DataFrame,
    *,
    p: float = DEFAULT_P,
    client_column: str = "client",
) -> pd.DataFrame:
    """Reciprocity after each round, on the cumulative flows ([RECIP] §5.1, Fig. 1c).

    After round t the flows of every client are summed over rounds ≤ t,
    I_u(t) = Σ_{s≤t} I_{u,s}, O_u(t) = Σ_{s≤t} O_{u,s}, and :func:`reciprocity` is
    applied to the clients that have appeared in some round ≤ t (a client not yet seen
    is left out rather than counted as balanced).

    Parameters
    ----------
    rounds
        Per-round flows: columns ``round``, ``client`` (``client_column``), ``inflow``,
        ``outflow`` (e.g. :meth:`fedvalue.flows.flow_totals.FlowTotals.rounds_frame`).
    p
        Population fraction of α.
    client_column
        Name of the client column.

    Returns
    -------
    pandas.DataFrame
        One row per round (ascending): ``round`` and :meth:`ReciprocityReport.to_dict`'s
        figures.
    """
    p = _check_p(p)
    if not isinstance(rounds, pd.DataFrame):
        raise TypeError(f"rounds: expected a pandas DataFrame; got {type(rounds).__name__}.")
    missing = [c for c in ("round", client_column, "inflow", "outflow") if c not in rounds.columns]
    if missing:
        raise ValueError(f"rounds: expected columns round, {client_column}, inflow, outflow; missing {missing}.")
    if rounds.empty:
        return pd.DataFrame(columns=["round", *_SCALARS])
    per_round = rounds.groupby(["round", client_column], sort=True)[["inflow", "outflow"]].sum()
    wide_in = per_round["inflow"].unstack(client_column)
    wide_out = per_round["outflow"].unstack(client_column)
    seen = wide_in.notna().cummax()
    cum_in = wide_in.fillna(0.0).cumsum()
    cum_out = wide_out.fillna(0.0).cumsum()
    rows = []
    for t in cum_in.index:
        mask = seen.loc[t].to_numpy()
        report = reciprocity(cum_in.loc[t].to_numpy()[mask], cum_out.loc[t].to_numpy()[mask], p=p)
        rows.append({"round": t, **report.to_dict()})
    return pd.DataFrame(rows)
