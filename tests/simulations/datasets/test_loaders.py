"""Datasets, MNIST loaders on files written here, holdout split, label noise."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from simulations.datasets.loaders import (
    DEFAULT_DATA_PATHS,
    Dataset,
    flip_labels,
    load_dataset,
    sample_per_class,
    split_holdout,
)

# --- embedded datasets ---------------------------------------------------------------------


def test_digits_is_float32_scaled_to_unit_interval_with_ten_classes():
    digits = load_dataset("digits")
    assert digits.x.shape == (1797, 64) and digits.x.dtype == np.float32
    assert digits.y.dtype == np.int64 and digits.num_classes == 10 and digits.name == "digits"
    assert digits.x.min() == 0.0 and digits.x.max() == 1.0
    assert set(np.unique(digits.y)) == set(range(10))


def test_breast_cancer_features_are_standardized():
    data = load_dataset("breast-cancer")
    assert data.x.shape == (569, 30) and data.num_classes == 2
    np.testing.assert_allclose(data.x.mean(axis=0), 0.0, atol=1e-5)
    np.testing.assert_allclose(data.x.std(axis=0), 1.0, atol=1e-4)


def test_diabetes_is_regression_with_standardized_features_and_target():
    data = load_dataset("diabetes")
    assert data.num_classes == 0 and data.y.dtype == np.float32 and data.x.shape == (442, 10)
    np.testing.assert_allclose(data.x.mean(axis=0), 0.0, atol=1e-5)
    np.testing.assert_allclose(data.x.std(axis=0), 1.0, atol=1e-4)
    assert abs(float(data.y.mean())) < 1e-5 and abs(float(data.y.std()) - 1.0) < 1e-4


def test_unknown_dataset_name_is_rejected_by_name():
    with pytest.raises(ValueError, match="name: expected one of"):
        load_dataset("cifar10")


def test_data_path_with_another_dataset_is_rejected():
    with pytest.raises(ValueError, match="data_path: only used with name in"):
        load_dataset("digits", data_path="/tmp")


def test_dataset_validates_its_arrays():
    x = np.zeros((3, 2), np.float32)
    with pytest.raises(ValueError, match="x: expected a 2-D float32"):
        Dataset(x.astype(np.float64), np.zeros(3, np.int64), 2, "t")
    with pytest.raises(ValueError, match="y: expected a 1-D numpy array of int64"):
        Dataset(x, np.zeros(3, np.float32), 2, "t")
    with pytest.raises(ValueError, match="y: expected labels in"):
        Dataset(x, np.array([0, 1, 2]), 2, "t")
    with pytest.raises(ValueError, match="num_classes"):
        Dataset(x, np.zeros(3, np.int64), 1, "t")
    with pytest.raises(ValueError, match="y: expected 3 entries"):
        Dataset(x, np.zeros(2, np.int64), 2, "t")


# --- MNIST from local files ----------------------------------------------------------------


def fake_mnist(num_train: int = 12, num_test: int = 5, side: int = 28, seed: int = 0):
    rng = np.random.default_rng(seed)
    return (
        rng.integers(0, 256, size=(num_train, side, side), dtype=np.uint8),
        rng.integers(0, 10, size=num_train, dtype=np.uint8),
        rng.integers(0, 256, size=(num_test, side, side), dtype=np.uint8),
        rng.integers(0, 10, size=num_test, dtype=np.uint8),
    )


def idx_bytes(array: np.ndarray, type_code: int = 0x08) -> bytes:
    header = bytes([0, 0, type_code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.astype(np.uint8).tobytes()


def write_idx_dir(directory, arrays, *, gz: bool = False, separator: str = "-"):
    directory.mkdir(parents=True, exist_ok=True)
    names = ["train-images", "train-labels", "t10k-images", "t10k-labels"]
    suffixes = ["idx3-ubyte", "idx1-ubyte", "idx3-ubyte", "idx1-ubyte"]
    for name, suffix, array in zip(names, suffixes, arrays):
        data = idx_bytes(array)
        path = directory / f"{name}{separator}{suffix}{'.gz' if gz else ''}"
        path.write_bytes(gzip.compress(data) if gz else data)
    return directory


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("separator", ["-", "."])
def test_mnist_idx_directory_loads_scaled_flattened_train_then_test(tmp_path, gz, separator):
    x_train, y_train, x_test, y_test = arrays = fake_mnist()
    directory = write_idx_dir(tmp_path / "mnist", arrays, gz=gz, separator=separator)
    data = load_dataset("mnist", data_path=directory)
    assert data.x.shape == (17, 784) and data.x.dtype == np.float32 and data.num_classes == 10
    expected = np.concatenate([x_train, x_test]).reshape(17, 784) / 255.0
    np.testing.assert_allclose(data.x, expected, rtol=1e-6)
    np.testing.assert_array_equal(data.y, np.concatenate([y_train, y_test]).astype(np.int64))
    test_only = load_dataset("mnist", data_path=str(directory), split="test")
    np.testing.assert_array_equal(test_only.y, y_test)
    assert test_only.name == "mnist-test" and len(load_dataset("mnist", data_path=directory, split="train")) == 12


def test_mnist_npz_gives_the_same_dataset_as_idx(tmp_path):
    x_train, y_train, x_test, y_test = arrays = fake_mnist()
    npz = tmp_path / "mnist.npz"
    np.savez(npz, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
    from_npz = load_dataset("mnist", data_path=npz)
    from_idx = load_dataset("mnist", data_path=write_idx_dir(tmp_path / "idx", arrays))
    np.testing.assert_array_equal(from_npz.x, from_idx.x)
    np.testing.assert_array_equal(from_npz.y, from_idx.y)


def test_mnist_npz_with_flat_rows_is_accepted(tmp_path):
    x_train, y_train, x_test, y_test = fake_mnist()
    npz = tmp_path / "flat.npz"
    np.savez(npz, x_train=x_train.reshape(12, -1), y_train=y_train, x_test=x_test.reshape(5, -1), y_test=y_test)
    assert load_dataset("mnist", data_path=npz).x.shape == (17, 784)


def test_mnist_without_path_or_with_missing_path_names_data_path(tmp_path):
    with pytest.raises(ValueError, match="data_path: expected a directory .* got None"):
        load_dataset("mnist")
    with pytest.raises(ValueError, match="data_path: .*does not exist"):
        load_dataset("mnist", data_path=tmp_path / "nowhere")
    with pytest.raises(ValueError, match="split"):
        load_dataset("mnist", data_path=tmp_path, split="validation")


def test_mnist_directory_missing_a_file_names_the_file(tmp_path):
    directory = write_idx_dir(tmp_path / "mnist", fake_mnist())
    (directory / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(ValueError, match="t10k-labels-idx1-ubyte"):
        load_dataset("mnist", data_path=directory)
    # The train split alone does not need it.
    assert len(load_dataset("mnist", data_path=directory, split="train")) == 12


@pytest.mark.parametrize(
    "corrupt, message",
    [
        (lambda raw: b"\x01\x02" + raw[2:], "not an IDX file"),
        (lambda raw: raw[:2] + b"\x0d" + raw[3:], "unsigned-byte IDX file with 3 dimensions"),
        (lambda raw: raw[:-10], "declares shape"),
        (lambda raw: raw[:9], "truncated|declares shape"),
        (lambda raw: b"", "not an IDX file"),
    ],
)
def test_malformed_idx_files_raise_value_errors_naming_data_path(tmp_path, corrupt, message):
    directory = write_idx_dir(tmp_path / "mnist", fake_mnist())
    path = directory / "train-images-idx3-ubyte"
    path.write_bytes(corrupt(path.read_bytes()))
    with pytest.raises(ValueError, match=f"data_path: .*({message})"):
        load_dataset("mnist", data_path=directory)


def test_idx_label_count_mismatch_and_bad_labels_are_rejected(tmp_path):
    x_train, y_train, x_test, y_test = fake_mnist()
    directory = write_idx_dir(tmp_path / "a", (x_train, y_train[:-1], x_test, y_test))
    with pytest.raises(ValueError, match="data_path: expected N images .* and N labels"):
        load_dataset("mnist", data_path=directory)
    bad_labels = y_train.copy()
    bad_labels[0] = 11
    directory = write_idx_dir(tmp_path / "b", (x_train, bad_labels, x_test, y_test))
    with pytest.raises(ValueError, match="data_path: expected integer labels 0-9"):
        load_dataset("mnist", data_path=directory)


def test_corrupt_gzip_is_a_value_error(tmp_path):
    directory = write_idx_dir(tmp_path / "mnist", fake_mnist(), gz=True)
    path = directory / "train-labels-idx1-ubyte.gz"
    path.write_bytes(path.read_bytes()[:15])
    with pytest.raises(ValueError, match="data_path"):
        load_dataset("mnist", data_path=directory)


def test_compressed_bombs_are_refused_past_the_cap_before_they_fill_memory(tmp_path, monkeypatch):
    """A gzip IDX file or an .npz that unpacks past MAX_DATA_BYTES is refused (the cap is
    lowered here so that the bomb is small: 4 MB of zeros compress to 4 KB)."""
    import simulations.datasets.loaders as data_module

    directory = write_idx_dir(tmp_path / "mnist", fake_mnist(), gz=True)
    monkeypatch.setattr(data_module, "MAX_DATA_BYTES", 1_000_000)
    bomb = gzip.compress(bytes([0, 0, 8, 3]) + bytes(4_000_000))
    assert len(bomb) < 10_000
    (directory / "train-images-idx3-ubyte.gz").write_bytes(bomb)
    with pytest.raises(ValueError, match="data_path: .* unpacks to more than 1000000 bytes"):
        load_dataset("mnist", data_path=directory)
    archive = tmp_path / "bomb.npz"
    np.savez_compressed(archive, x_train=np.zeros((2000, 28, 28), np.uint8), y_train=np.zeros(2000, np.uint8),
                        x_test=np.zeros((1, 28, 28), np.uint8), y_test=np.zeros(1, np.uint8))
    with pytest.raises(ValueError, match="data_path: .* unpacks to .* bytes, more than 1000000"):
        load_dataset("mnist", data_path=archive)


def test_bad_npz_files_raise_value_errors_naming_data_path(tmp_path):
    x_train, y_train, x_test, y_test = fake_mnist()
    missing_key = tmp_path / "missing.npz"
    np.savez(missing_key, x_train=x_train, y_train=y_train, x_test=x_test)
    with pytest.raises(ValueError, match=r"data_path: expected keys .*missing \['y_test'\]"):
        load_dataset("mnist", data_path=missing_key)
    not_npz = tmp_path / "garbage.npz"
    not_npz.write_bytes(b"this is not a zip archive")
    with pytest.raises(ValueError, match="data_path: expected a readable .npz archive"):
        load_dataset("mnist", data_path=not_npz)
    single_array = tmp_path / "single.npy"
    np.save(single_array, x_train)
    with pytest.raises(ValueError, match="data_path: .*holds a single array"):
        load_dataset("mnist", data_path=single_array)
    floats = tmp_path / "floats.npz"
    np.savez(floats, x_train=x_train / 255.0, y_train=y_train, x_test=x_test / 255.0, y_test=y_test)
    with pytest.raises(ValueError, match="data_path: expected integer pixel values"):
        load_dataset("mnist", data_path=floats)


# --- holdout split -------------------------------------------------------------------------


def indexed_dataset(labels: np.ndarray, num_classes: int) -> Dataset:
    """x[:, 0] is the row index, so a split's rows can be traced back."""
    x = np.arange(len(labels), dtype=np.float32).reshape(-1, 1)
    return Dataset(x, labels, num_classes, "indexed")


def test_split_holdout_is_disjoint_covering_stratified_and_seeded():
    labels = np.repeat(np.arange(4), [40, 20, 12, 8]).astype(np.int64)
    data = indexed_dataset(labels, 4)
    train, holdout = split_holdout(data, 0.25, seed=3)
    rows_train, rows_holdout = train.x[:, 0].astype(int), holdout.x[:, 0].astype(int)
    assert set(rows_train).isdisjoint(rows_holdout)
    assert sorted(np.concatenate([rows_train, rows_holdout])) == list(range(len(labels)))
    assert np.bincount(holdout.y, minlength=4).tolist() == [10, 5, 3, 2]
    np.testing.assert_array_equal(labels[rows_holdout], holdout.y)
    again_train, again_holdout = split_holdout(data, 0.25, seed=3)
    np.testing.assert_array_equal(again_holdout.x, holdout.x)
    assert not np.array_equal(split_holdout(data, 0.25, seed=4)[1].x, holdout.x)


def test_split_holdout_regression_and_bad_fractions():
    data = load_dataset("diabetes")
    train, holdout = split_holdout(data, 0.2, seed=np.random.default_rng(0))
    assert len(holdout) == round(0.2 * 442) and len(train) + len(holdout) == 442
    for bad in (0, 1, 1.5, -0.1, True, "0.2"):
        with pytest.raises(ValueError, match="holdout_fraction"):
            split_holdout(data, bad, seed=0)
    tiny = indexed_dataset(np.array([0, 1], dtype=np.int64), 2)
    with pytest.raises(ValueError, match="holdout_fraction: .* empty"):
        split_holdout(tiny, 0.1, seed=0)


# --- label noise ([ADS] App. C.2) -------------------------------------------------------


def test_flip_labels_with_p_one_changes_every_label_uniformly_over_other_classes():
    labels = np.full(90_000, 3, dtype=np.int64)
    noisy = flip_labels(labels, 1.0, 10, seed=0)
    assert not np.any(noisy == 3)
    counts = np.bincount(noisy, minlength=10)[[c for c in range(10) if c != 3]]
    chi2 = float(((counts - counts.mean()) ** 2 / counts.mean()).sum())
    assert chi2 < stats.chi2.ppf(1 - 1e-6, df=8)


def test_flip_labels_rate_is_p_and_changed_labels_never_keep_their_class():
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 10, size=200_000)
    noisy = flip_labels(labels, 0.7, 10, seed=2)
    changed = float(np.mean(noisy != labels))
    # Six standard deviations of a Binomial(n, p) share.
    assert abs(changed - 0.7) < 6 * np.sqrt(0.7 * 0.3 / labels.size)
    assert noisy.dtype == labels.dtype and noisy.min() >= 0 and noisy.max() <= 9


def test_flip_labels_is_deterministic_by_seed_and_leaves_input_alone():
    labels = np.arange(1000) % 4
    original = labels.copy()
    first = flip_labels(labels, 0.5, 4, seed=7)
    np.testing.assert_array_equal(first, flip_labels(labels, 0.5, 4, seed=7))
    assert not np.array_equal(first, flip_labels(labels, 0.5, 4, seed=8))
    np.testing.assert_array_equal(labels, original)
    np.testing.assert_array_equal(flip_labels(labels, 0.0, 4, seed=7), labels)


@settings(max_examples=50, deadline=None)
@given(
    num_classes=st.integers(2, 12),
    p=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**32),
    size=st.integers(0, 200),
)
def test_flip_labels_stays_in_range(num_classes, p, seed, size):
    labels = np.random.default_rng(seed).integers(0, num_classes, size=size)
    noisy = flip_labels(labels, p, num_classes, seed=seed)
    assert noisy.shape == labels.shape
    assert np.all((noisy >= 0) & (noisy < num_classes))


def test_flip_labels_rejects_bad_input_by_name():
    labels = np.array([0, 1, 2])
    with pytest.raises(ValueError, match=r"p: expected a number in \[0, 1\]"):
        flip_labels(labels, 1.5, 3, seed=0)
    with pytest.raises(ValueError, match="num_classes: expected an integer ≥ 2"):
        flip_labels(np.zeros(3, dtype=int), 0.5, 1, seed=0)
    with pytest.raises(ValueError, match=r"labels: expected values in \[0, 2\)"):
        flip_labels(labels, 0.5, 2, seed=0)
    with pytest.raises(ValueError, match="labels: expected a 1-D integer array"):
        flip_labels(labels.astype(float), 0.5, 3, seed=0)


# --- Fashion-MNIST as Debian's dataset-fashion-mnist installs it -------------------------------

FASHION = Path(DEFAULT_DATA_PATHS["fashion-mnist"])


@pytest.mark.skipif(not FASHION.is_dir(), reason="needs Debian's dataset-fashion-mnist (.ci/run installs it)")
def test_fashion_mnist_loads_from_the_debian_package_by_default():
    test = load_dataset("fashion-mnist", split="test")
    assert test.x.shape == (10_000, 784) and test.x.dtype == np.float32 and test.name == "fashion-mnist-test"
    assert test.x.min() == 0.0 and test.x.max() == 1.0
    assert np.bincount(test.y).tolist() == [1000] * 10  # the official test split is balanced
    train = load_dataset("fashion-mnist", split="train")
    assert len(train) == 60_000 and np.bincount(train.y).tolist() == [6000] * 10
    explicit = load_dataset("fashion-mnist", data_path=str(FASHION), split="test")
    np.testing.assert_array_equal(explicit.x, test.x)


def test_fashion_mnist_without_the_package_names_it(tmp_path, monkeypatch):
    import simulations.datasets.loaders as data_module

    monkeypatch.setitem(data_module.DEFAULT_DATA_PATHS, "fashion-mnist", str(tmp_path / "absent"))
    with pytest.raises(ValueError, match="data_path: fashion-mnist is read from .*absent.*Debian's package "
                                         "dataset-fashion-mnist.*apt-get install dataset-fashion-mnist"):
        load_dataset("fashion-mnist")
    # Another directory of IDX files is read in its place.
    directory = write_idx_dir(tmp_path / "mine", fake_mnist())
    assert load_dataset("fashion-mnist", data_path=directory).name == "fashion-mnist"


def test_class_balanced_samples_are_balanced_seeded_and_refused_when_a_class_is_short():
    labels = np.repeat(np.arange(4), [10, 20, 30, 40])
    chosen = sample_per_class(labels, 22, seed=1)
    counts = np.bincount(labels[chosen])
    assert len(chosen) == len(set(chosen.tolist())) == 22 and sorted(counts.tolist()) == [5, 5, 6, 6]
    np.testing.assert_array_equal(chosen, sample_per_class(labels, 22, seed=1))
    assert (np.diff(chosen) > 0).all()  # row order kept
    assert not np.array_equal(chosen, sample_per_class(labels, 22, seed=2))
    with pytest.raises(ValueError, match="examples_per_client: a class-balanced sample of 48 examples needs 12 of "
                                         "class 0; the data holds 10"):
        sample_per_class(labels, 48, seed=0, name="examples_per_client")
