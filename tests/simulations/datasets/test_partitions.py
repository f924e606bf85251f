"""Client partitions through Flower Datasets: determinism, sizes against the partitioners'
own, the IID scheme against its reference (a seeded permutation cut by np.array_split)."""

from __future__ import annotations

import datasets
import numpy as np
import pytest
from flwr_datasets.partitioner import DirichletPartitioner, PathologicalPartitioner, ShardPartitioner
from hypothesis import given, settings
from hypothesis import strategies as st

from simulations.datasets.loaders import load_dataset
from simulations.datasets.partitions import PARTITION_SCHEMES, partition, partition_iid


@pytest.fixture(scope="module")
def digits_labels() -> np.ndarray:
    return load_dataset("digits").y


def reference_iid(num_examples: int, num_partitions: int, seed: int) -> list[np.ndarray]:
    order = np.random.default_rng(seed).permutation(num_examples)
    return [np.sort(part) for part in np.array_split(order, num_partitions)]


@settings(max_examples=20, deadline=None)
@given(num_examples=st.integers(1, 200), data=st.data())
def test_iid_is_a_seeded_permutation_cut_into_near_equal_parts(num_examples, data):
    num_partitions = data.draw(st.integers(1, num_examples))
    seed = data.draw(st.integers(0, 2**32))
    parts = partition_iid(num_examples, num_partitions, seed=seed)
    for part, expected in zip(parts, reference_iid(num_examples, num_partitions, seed), strict=True):
        assert part.dtype == np.int64
        np.testing.assert_array_equal(part, expected)
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1


def flower_partition_labels(partitioner, labels: np.ndarray) -> list[np.ndarray]:
    """Each partition's sorted labels, as Flower's partitioner makes them on its own."""
    partitioner.dataset = datasets.Dataset.from_dict({"label": labels})
    return [np.sort(np.asarray(partitioner.load_partition(k)["label"])) for k in range(partitioner.num_partitions)]


@pytest.mark.parametrize("scheme", ["dirichlet", "pathological", "shard"])
def test_label_schemes_match_flower_datasets_partitioner_and_are_seeded(scheme, digits_labels):
    seed = 7
    parts = partition(digits_labels, 20, scheme=scheme, seed=seed, alpha=0.3, classes_per_partition=3,
                      shards_per_partition=2)
    # The partitioner gets its seed as the first draw of the seed's generator.
    flower_seed = int(np.random.default_rng(seed).integers(2**32))
    partitioner = {
        "dirichlet": lambda: DirichletPartitioner(20, "label", 0.3, min_partition_size=1, seed=flower_seed),
        "pathological": lambda: PathologicalPartitioner(20, "label", 3, seed=flower_seed),
        "shard": lambda: ShardPartitioner(20, "label", num_shards_per_partition=2, seed=flower_seed),
    }[scheme]()
    expected = flower_partition_labels(partitioner, digits_labels)
    assert [len(p) for p in parts] == [len(e) for e in expected]
    for part, labels in zip(parts, expected, strict=True):
        np.testing.assert_array_equal(np.sort(digits_labels[part]), labels)
    joined = np.concatenate(parts)
    assert len(np.unique(joined)) == len(joined) and all(np.all(np.diff(p) > 0) for p in parts)
    assert min(len(p) for p in parts) >= 1
    again = partition(digits_labels, 20, scheme=scheme, seed=seed, alpha=0.3, classes_per_partition=3,
                      shards_per_partition=2)
    assert all(np.array_equal(a, b) for a, b in zip(again, parts))
    other = partition(digits_labels, 20, scheme=scheme, seed=seed + 1, alpha=0.3, classes_per_partition=3,
                      shards_per_partition=2)
    assert not all(np.array_equal(a, b) for a, b in zip(other, parts))


def top_class_share(labels: np.ndarray, parts: list[np.ndarray]) -> float:
    return float(np.mean([np.bincount(labels[p]).max() / len(p) for p in parts]))


def test_dirichlet_covers_every_row_and_low_alpha_skews_labels(digits_labels):
    skewed = partition(digits_labels, 10, scheme="dirichlet", alpha=0.1, seed=0, min_partition_size=10)
    near_iid = partition(digits_labels, 10, scheme="dirichlet", alpha=1000.0, seed=0, min_partition_size=10)
    for parts in (skewed, near_iid):
        np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(len(digits_labels)))
        assert min(len(p) for p in parts) >= 10
    # 10 balanced classes: an iid partition's top class holds ~10-15%; alpha=0.1 concentrates.
    assert top_class_share(digits_labels, near_iid) < 0.2
    assert top_class_share(digits_labels, skewed) > 0.5


def test_pathological_holds_the_asked_number_of_classes_and_shard_equal_shards(digits_labels):
    parts = partition(digits_labels, 15, scheme="pathological", classes_per_partition=2, seed=0)
    assert all(len(np.unique(digits_labels[p])) <= 2 for p in parts)
    shards = partition(digits_labels, 15, scheme="shard", shards_per_partition=3, seed=0)
    shard_size = len(digits_labels) // (15 * 3)
    assert [len(p) for p in shards] == [3 * shard_size] * 15


def test_bad_settings_and_empty_partitions_are_errors_naming_the_setting(digits_labels):
    with pytest.raises(ValueError, match="scheme: expected one of"):
        partition(digits_labels, 3, scheme="natural", seed=0)
    with pytest.raises(ValueError, match="num_partitions: expected at most 3"):
        partition_iid(3, 4, seed=0)
    with pytest.raises(ValueError, match="num_partitions: expected a positive integer"):
        partition_iid(3, 0, seed=0)
    with pytest.raises(ValueError, match="seed"):
        partition_iid(10, 2, seed=-1)
    with pytest.raises(ValueError, match="labels: the 'dirichlet' scheme splits by class"):
        partition(np.linspace(0, 1, 20), 2, scheme="dirichlet", seed=0)
    with pytest.raises(ValueError, match="classes_per_partition: expected at most the 10 classes"):
        partition(digits_labels, 5, scheme="pathological", classes_per_partition=11, seed=0)
    with pytest.raises(ValueError, match="alpha: expected a finite number > 0"):
        partition(digits_labels, 5, scheme="dirichlet", alpha=0, seed=0)
    labels = np.repeat(np.arange(3), 5).astype(np.int64)
    with pytest.raises(ValueError, match="min_partition_size: 4 partitions of at least 4 need 16"):
        partition(labels, 4, scheme="dirichlet", alpha=1.0, seed=0, min_partition_size=4)
    with pytest.raises(ValueError, match="alpha: Flower Datasets' DirichletPartitioner found no partition"):
        partition(labels, 15, scheme="dirichlet", alpha=0.01, seed=0)
    # Two rows of a class cannot feed the three partitions it is assigned to: Flower's error, named.
    with pytest.raises(ValueError, match="classes_per_partition: Flower Datasets' PathologicalPartitioner found"):
        partition(np.arange(3, dtype=np.int64).repeat(2), 6, scheme="pathological", classes_per_partition=1,
                  seed=0)


def test_every_scheme_is_known_to_the_noisy_clients_options():
    from simulations.experiments.noisy_clients.noisy_clients import NoisyClientsConfig, _check

    for scheme in PARTITION_SCHEMES:
        _check(NoisyClientsConfig(partition=scheme))
    with pytest.raises(ValueError, match="partition: expected one of"):
        _check(NoisyClientsConfig(partition="natural"))
