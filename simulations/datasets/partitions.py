"""Client partitions through Flower Datasets' partitioners, on data held in memory.

The simulations' data (scikit-learn's embedded sets, local MNIST files) becomes a Hugging
Face ``datasets.Dataset`` of two columns, the row ``index`` and the ``label``, built from
the arrays (no download, no cache files); a ``flwr_datasets.partitioner`` partitions it and
each partition's ``index`` column says which rows a client holds. Schemes:

- ``"iid"``: the rows in a seeded random order (``Dataset.shuffle(generator=...)``), cut
  by ``IidPartitioner`` into contiguous shards whose sizes differ by at most 1;
- ``"dirichlet"``: ``DirichletPartitioner``, each class split across the partitions by
  proportions q ~ Dir(α, …, α) (small α: strong label skew), redrawn until every
  partition holds ``min_partition_size`` rows;
- ``"pathological"``: ``PathologicalPartitioner``, each partition holds
  ``classes_per_partition`` classes (randomly assigned), each class split evenly among
  the partitions holding it;
- ``"shard"``: ``ShardPartitioner`` ([FEDAVG] §3), rows sorted by label and cut into
  equal shards, ``shards_per_partition`` random shards per partition (the remainder of
  the division is left out).

Every partition must be non-empty (a client with no data cannot train): a scheme that
leaves one empty is an error naming the setting to change. The same seed gives the
same partitions.
"""

from __future__ import annotations

import numbers
import warnings

import numpy as np

from clients.seeding import Seed, as_generator
from fedvalue._checks import check_integer

__all__ = ["PARTITION_SCHEMES", "partition", "partition_iid"]

#: Partition schemes (``partition``'s ``scheme``); every one but ``iid`` needs class labels.
PARTITION_SCHEMES = ("iid", "dirichlet", "pathological", "shard")
_INDEX, _LABEL = "index", "label"


def _in_memory(labels: np.ndarray):
    """The rows as a Hugging Face Dataset held in memory (row index, label)."""
    import datasets  # imported here: seconds to import, only partitioning needs it

    return datasets.Dataset.from_dict({_INDEX: np.arange(len(labels), dtype=np.int64), _LABEL: labels})


def _partitioner(scheme: str, num_partitions: int, seed: int, *, alpha: float, min_partition_size: int,
                 classes_per_partition: int, shards_per_partition: int):
    from flwr_datasets.partitioner import (
        DirichletPartitioner,
        IidPartitioner,
        PathologicalPartitioner,
        ShardPartitioner,
    )

    if scheme == "iid":
        return IidPartitioner(num_partitions)
    if scheme == "dirichlet":
        return DirichletPartitioner(num_partitions, _LABEL, float(alpha), min_partition_size=min_partition_size,
                                    seed=seed)
    if scheme == "pathological":
        return PathologicalPartitioner(num_partitions, _LABEL, classes_per_partition, seed=seed)
    return ShardPartitioner(num_partitions, _LABEL, num_shards_per_partition=shards_per_partition, seed=seed)


def partition(
    labels: np.ndarray,
    num_partitions: int,
    *,
    scheme: str = "iid",
    seed: Seed,
    alpha: float = 0.5,
    min_partition_size: int = 1,
    classes_per_partition: int = 2,
    shards_per_partition: int = 2,
) -> list[np.ndarray]:
    """Partition the rows of a dataset with ``labels`` among ``num_partitions`` clients.

    Parameters
    ----------
    labels
        1-D labels, one per row (int class labels for every scheme but ``"iid"``, which
        only counts them).
    num_partitions
        Number of partitions (clients).
    scheme
        One of :data:`PARTITION_SCHEMES` (module docstring).
    seed
        Seed of the partition (:func:`clients.seeding.as_generator`).
    alpha, min_partition_size
        ``"dirichlet"``: concentration (> 0) and the fewest rows a partition may hold (≥ 1).
    classes_per_partition
        ``"pathological"``: classes each partition holds.
    shards_per_partition
        ``"shard"``: shards each partition holds.

    Returns
    -------
    list of np.ndarray
        Sorted, disjoint int64 row indices, one non-empty array per partition (``"iid"``
        and ``"dirichlet"`` cover every row).

    Raises
    ------
    ValueError
        Bad input, or a scheme whose settings leave a partition empty (the message names
        the setting).
    """
    labels = np.asarray(labels)
    num_partitions, min_partition_size, classes_per_partition, shards_per_partition = _check_partition(
        labels, num_partitions, scheme, alpha, min_partition_size, classes_per_partition, shards_per_partition)

    rng = as_generator(seed)
    dataset = _in_memory(labels)
    if scheme == "iid":
        # IidPartitioner cuts the rows in their order: the seeded shuffle makes them random.
        dataset = dataset.shuffle(generator=rng, keep_in_memory=True)
    partitioner = _partitioner(scheme, num_partitions, int(rng.integers(2**32)), alpha=alpha,
                               min_partition_size=min_partition_size, classes_per_partition=classes_per_partition,
                               shards_per_partition=shards_per_partition)
    partitioner.dataset = dataset
    with warnings.catch_warnings():
        # Flower warns on each Dirichlet redraw; a final failure is raised below instead.
        warnings.simplefilter("ignore", UserWarning)
        warnings.filterwarnings("ignore", message=".*null_placement", category=FutureWarning)  # pyarrow, in sort
        try:
            # Read the index column through Arrow: a Dataset column read as Python rows takes seconds.
            parts = [np.sort(partitioner.load_partition(k).with_format("arrow")[:][_INDEX].to_numpy())
                     for k in range(num_partitions)]
        except ValueError as error:
            raise ValueError(f"{_setting(scheme)}: Flower Datasets' {type(partitioner).__name__} found no "
                             f"partition of {labels.size} rows into {num_partitions}: {error}") from error
    empty = [k for k, part in enumerate(parts) if part.size == 0]
    if empty:
        raise ValueError(f"{_setting(scheme)}: the {scheme!r} partition leaves {len(empty)} of {num_partitions} "
                         f"partitions empty (e.g. {empty[0]}); every client needs data: use fewer partitions or "
                         "change the setting.")
    return parts


def _check_partition(labels: np.ndarray, num_partitions: int, scheme: str, alpha: float, min_partition_size: int,
                     classes_per_partition: int, shards_per_partition: int) -> tuple[int, int, int, int]:
    """ValueError naming the setting when :func:`partition`'s input cannot be partitioned;
    returns the four counts checked (as ints)."""
    if labels.ndim != 1 or labels.size == 0:
        raise ValueError(f"labels: expected a non-empty 1-D array; got shape {labels.shape}.")
    if scheme not in PARTITION_SCHEMES:
        raise ValueError(f"scheme: expected one of {list(PARTITION_SCHEMES)}; got {scheme!r}.")
    if scheme != "iid" and not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"labels: the {scheme!r} scheme splits by class and needs integer class labels; got "
                         f"dtype {labels.dtype} (use scheme='iid' for regression targets).")
    num_partitions = check_integer("num_partitions", num_partitions)
    if num_partitions > labels.size:
        raise ValueError(f"num_partitions: expected at most {labels.size}, the number of rows (every partition "
                         f"non-empty); got {num_partitions}.")
    min_partition_size = check_integer("min_partition_size", min_partition_size)
    classes_per_partition = check_integer("classes_per_partition", classes_per_partition)
    shards_per_partition = check_integer("shards_per_partition", shards_per_partition)
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or not np.isfinite(alpha) or alpha <= 0:
        raise ValueError(f"alpha: expected a finite number > 0; got {alpha!r}.")
    num_classes = len(np.unique(labels))
    if scheme == "pathological" and classes_per_partition > num_classes:
        raise ValueError(f"classes_per_partition: expected at most the {num_classes} classes present; "
                         f"got {classes_per_partition}.")
    if scheme == "dirichlet" and num_partitions * min_partition_size > labels.size:
        raise ValueError(f"min_partition_size: {num_partitions} partitions of at least {min_partition_size} need "
                         f"{num_partitions * min_partition_size} rows; there are {labels.size}.")
    if scheme == "shard" and num_partitions * shards_per_partition > labels.size:
        raise ValueError(f"shards_per_partition: {num_partitions} partitions of {shards_per_partition} shards need "
                         f"at least {num_partitions * shards_per_partition} rows; there are {labels.size}.")
    return num_partitions, min_partition_size, classes_per_partition, shards_per_partition


def _setting(scheme: str) -> str:
    return {"iid": "num_partitions", "dirichlet": "alpha", "pathological": "classes_per_partition",
            "shard": "shards_per_partition"}[scheme]


def partition_iid(num_examples: int, num_partitions: int, *, seed: Seed) -> list[np.ndarray]:
    """``num_examples`` rows in ``num_partitions`` IID parts (:func:`partition`, ``"iid"``):
    disjoint, covering every row once, sizes differing by at most 1."""
    num_examples = check_integer("num_examples", num_examples)
    return partition(np.zeros(num_examples, dtype=np.int64), num_partitions, scheme="iid", seed=seed)
