"""Datasets, held-out splits and label noise for the simulations (client partitions:
:mod:`simulations.datasets.partitions`).

Everything is local: scikit-learn's embedded datasets ("digits", "breast-cancer",
"diabetes"), Fashion-MNIST as Debian's package ``dataset-fashion-mnist`` installs it
("fashion-mnist", four gzipped IDX files in :data:`DEFAULT_DATA_PATHS`), or MNIST files
the user already has ("mnist"). Nothing is ever downloaded.
Every random function takes ``seed`` (see :func:`clients.seeding.as_generator`) and is
deterministic given it.
"""

from __future__ import annotations

import math
import os
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from clients.behaviours import flip_labels
from clients.seeding import Seed, as_generator
from fedvalue._checks import check_open_unit

__all__ = [
    "DATASETS",
    "Dataset",
    "flip_labels",
    "load_dataset",
    "sample_per_class",
    "split_holdout",
]

DATASETS = ("digits", "breast-cancer", "diabetes", "mnist", "fashion-mnist")
#: Datasets read from IDX files (MNIST's format), with their own train and test splits.
IDX_DATASETS = ("mnist", "fashion-mnist")
SPLITS = ("all", "train", "test")
#: Where a dataset's files are when no path is given, and the Debian package that puts them there.
DEFAULT_DATA_PATHS = {"fashion-mnist": "/usr/share/datasets/fashion-mnist"}
DEBIAN_PACKAGES = {"fashion-mnist": "dataset-fashion-mnist"}
_MNIST_STEMS = {
    ("train", "images"): "train-images",
    ("train", "labels"): "train-labels",
    ("test", "images"): "t10k-images",
    ("test", "labels"): "t10k-labels",
}
_IDX_UBYTE = 0x08
#: Largest data file read, and largest it may unpack to (MNIST's biggest file is 47 MB):
#: a compressed bomb is refused when it passes this, before it fills memory.
MAX_DATA_BYTES = 512 * 1024**2


def _gunzip_capped(raw: bytes, path: Path) -> bytes:
    """gzip ``raw``, refused once it unpacks past :data:`MAX_DATA_BYTES`."""
    inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
    out = bytearray()
    data = raw
    while data and not inflate.eof:
        out += inflate.decompress(data, MAX_DATA_BYTES + 1 - len(out))
        if len(out) > MAX_DATA_BYTES:
            raise ValueError(f"data_path: {str(path)!r} unpacks to more than {MAX_DATA_BYTES} bytes; not a MNIST "
                             "file.")
        data = inflate.unconsumed_tail
    if not inflate.eof:
        raise ValueError(f"data_path: could not read {str(path)!r}: the gzip stream is truncated.")
    return bytes(out)


def _check_npz_size(path: Path) -> None:
    """Refuse an archive whose members unpack past :data:`MAX_DATA_BYTES` (before numpy reads it)."""
    try:
        with zipfile.ZipFile(path) as archive:
            total = sum(member.file_size for member in archive.infolist())
    except (OSError, zipfile.BadZipFile):
        return  # not a zip: np.load says what it is
    if total > MAX_DATA_BYTES:
        raise ValueError(f"data_path: {str(path)!r} unpacks to {total} bytes, more than {MAX_DATA_BYTES}; not a "
                         "MNIST archive.")


@dataclass(frozen=True, eq=False)
class Dataset:
    """Features and labels (or regression targets) of one dataset.

    Attributes
    ----------
    x
        float32 features, N x d.
    y
        int64 labels in ``[0, num_classes)`` for classification; float32 targets for
        regression.
    num_classes
        Number of classes; 0 for regression.
    name
        Where the data came from (``load_dataset``'s name).
    """

    x: np.ndarray
    y: np.ndarray
    num_classes: int
    name: str = field(default="")

    def __post_init__(self) -> None:
        if not isinstance(self.x, np.ndarray) or self.x.ndim != 2 or self.x.dtype != np.float32:
            raise ValueError(
                f"x: expected a 2-D float32 numpy array (N x d); got "
                f"{type(self.x).__name__} {getattr(self.x, 'dtype', '')} {getattr(self.x, 'shape', '')}."
            )
        if isinstance(self.num_classes, bool) or not isinstance(self.num_classes, (int, np.integer)) or self.num_classes < 0 or self.num_classes == 1:
            raise ValueError(f"num_classes: expected 0 (regression) or an int >= 2; got {self.num_classes!r}.")
        expected_dtype = np.int64 if self.num_classes else np.float32
        if not isinstance(self.y, np.ndarray) or self.y.ndim != 1 or self.y.dtype != expected_dtype:
            kind = "int64 labels" if self.num_classes else "float32 targets (num_classes=0)"
            raise ValueError(
                f"y: expected a 1-D numpy array of {kind}; got "
                f"{type(self.y).__name__} {getattr(self.y, 'dtype', '')} {getattr(self.y, 'shape', '')}."
            )
        if len(self.y) != len(self.x):
            raise ValueError(f"y: expected {len(self.x)} entries, one per row of x; got {len(self.y)}.")
        if self.num_classes and len(self.y) and (self.y.min() < 0 or self.y.max() >= self.num_classes):
            raise ValueError(
                f"y: expected labels in [0, {self.num_classes}); got values in [{self.y.min()}, {self.y.max()}]."
            )

    def __len__(self) -> int:
        return len(self.y)

    @property
    def is_classification(self) -> bool:
        return self.num_classes > 0

    def subset(self, indices: np.ndarray) -> Dataset:
        """The rows ``indices`` as a new Dataset (copies)."""
        return Dataset(self.x[indices], self.y[indices], self.num_classes, self.name)


def _standardized(values: np.ndarray) -> np.ndarray:
    std = values.std(axis=0)
    # A constant column stays 0 instead of becoming NaN.
    return (values - values.mean(axis=0)) / np.where(std > 0, std, 1.0)


def load_dataset(
    name: str,
    *,
    data_path: str | os.PathLike | None = None,
    split: str = "all",
) -> Dataset:
    """Load one of :data:`DATASETS` from local data.

    Parameters
    ----------
    name
        ``"digits"`` (1,797 8x8 images, 10 classes, pixels / 16),
        ``"breast-cancer"`` (569 x 30, 2 classes, standardized features),
        ``"diabetes"`` (442 x 10 regression, standardized features and target),
        ``"mnist"`` or ``"fashion-mnist"`` (28x28 images flattened to 784, pixels / 255,
        10 classes; 60,000 train and 10,000 test images each).
        Standardization uses the statistics of the whole dataset.
    data_path
        For the IDX datasets only: a directory holding the four IDX files
        (``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``,
        ``t10k-images-idx3-ubyte``, ``t10k-labels-idx1-ubyte``; each may end in
        ``.gz``, and ``.idx3-ubyte`` spellings are accepted), or an ``.npz`` with
        ``x_train, y_train, x_test, y_test`` (uint8 pixels, as Keras's mnist.npz).
        ``None``: :data:`DEFAULT_DATA_PATHS` (Fashion-MNIST: where Debian's package
        ``dataset-fashion-mnist`` installs it); MNIST has no default.
    split
        For the IDX datasets: ``"train"``, ``"test"`` or ``"all"`` (train rows first,
        then test).

    Raises
    ------
    ValueError
        Unknown name; ``data_path`` missing, unreadable or malformed (naming the Debian
        package when its default directory is absent).
    """
    if name not in DATASETS:
        raise ValueError(f"name: expected one of {list(DATASETS)}; got {name!r}.")
    if name not in IDX_DATASETS:
        if data_path is not None:
            raise ValueError(f"data_path: only used with name in {list(IDX_DATASETS)}; got {data_path!r} with "
                             f"name={name!r}.")
        # Imported here: scikit-learn takes seconds to import and only these need it.
        from sklearn import datasets as sk_datasets

        if name == "digits":
            bunch = sk_datasets.load_digits()
            return Dataset((bunch.data / 16.0).astype(np.float32), bunch.target.astype(np.int64), 10, name)
        if name == "breast-cancer":
            bunch = sk_datasets.load_breast_cancer()
            return Dataset(_standardized(bunch.data).astype(np.float32), bunch.target.astype(np.int64), 2, name)
        bunch = sk_datasets.load_diabetes(scaled=False)
        target = _standardized(bunch.target.reshape(-1, 1))[:, 0]
        return Dataset(_standardized(bunch.data).astype(np.float32), target.astype(np.float32), 0, name)
    if split not in SPLITS:
        raise ValueError(f"split: expected one of {list(SPLITS)}; got {split!r}.")
    path = _data_directory(name, data_path)
    splits = ("train", "test") if split == "all" else (split,)
    parts = [_load_mnist_npz(path, part) if path.is_file() else _load_mnist_idx(path, part) for part in splits]
    if len({images.shape[1:] for images, _ in parts}) > 1:
        raise ValueError(
            f"data_path: expected train and test images of the same size in {str(path)!r}; got "
            f"{[images.shape[1:] for images, _ in parts]}."
        )
    x = np.concatenate([images for images, _ in parts])
    y = np.concatenate([labels for _, labels in parts])
    features = (x.reshape(len(x), -1).astype(np.float32) / np.float32(255.0))
    return Dataset(features, y.astype(np.int64), 10, name if split == "all" else f"{name}-{split}")


def _data_directory(name: str, data_path: str | os.PathLike | None) -> Path:
    """The IDX directory or .npz of ``name``: ``data_path``, else its default (checked to exist)."""
    if data_path is None or str(data_path) == "":
        default = DEFAULT_DATA_PATHS.get(name)
        if default is None:
            raise ValueError(
                f"data_path: expected a directory of {name} IDX files or an .npz file ({name} is read from local "
                "files, never downloaded); got None."
            )
        if not Path(default).is_dir():
            package = DEBIAN_PACKAGES[name]
            raise ValueError(
                f"data_path: {name} is read from {default}, where Debian's package {package} installs it, but that "
                f"directory does not exist. Install the package (apt-get install {package}) or point data_path "
                "(--data-path) at a directory holding its four IDX files."
            )
        return Path(default)
    path = Path(data_path).expanduser()
    if not path.exists():
        raise ValueError(f"data_path: expected an existing directory or .npz file; {str(path)!r} does not exist.")
    return path


def _check_mnist_arrays(images: np.ndarray, labels: np.ndarray, where: str) -> tuple[np.ndarray, np.ndarray]:
    if images.ndim == 2:
        side = math.isqrt(images.shape[1])
        if side * side != images.shape[1]:
            raise ValueError(f"data_path: expected square images in {where}; got rows of {images.shape[1]} pixels.")
        images = images.reshape(len(images), side, side)
    if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels) or len(images) == 0:
        raise ValueError(
            f"data_path: expected N images (N x H x W) and N labels in {where}; got shapes "
            f"{images.shape} and {labels.shape}."
        )
    if not np.issubdtype(images.dtype, np.integer) or images.min() < 0 or images.max() > 255:
        raise ValueError(
            f"data_path: expected integer pixel values in [0, 255] in {where}; got dtype {images.dtype}."
        )
    if not np.issubdtype(labels.dtype, np.integer) or labels.min() < 0 or labels.max() > 9:
        raise ValueError(f"data_path: expected integer labels 0-9 in {where}; got dtype {labels.dtype}.")
    return images, labels


def _load_mnist_npz(path: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    x_key, y_key = f"x_{split}", f"y_{split}"
    unreadable = (
        f"data_path: expected a readable .npz archive with x_train, y_train, x_test, y_test (or a "
        f"directory of IDX files); could not read {str(path)!r}"
    )
    _check_npz_size(path)
    try:
        archive = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as error:
        raise ValueError(f"{unreadable}: {error}") from error
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise ValueError(f"{unreadable}: it holds a single array, not an archive.")
    with archive:
        missing = [key for key in (x_key, y_key) if key not in archive.files]
        if missing:
            raise ValueError(
                f"data_path: expected keys x_train, y_train, x_test, y_test in {str(path)!r}; "
                f"missing {missing} (has {archive.files})."
            )
        try:
            images, labels = archive[x_key], archive[y_key]
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as error:
            raise ValueError(f"{unreadable}: {error}") from error
    return _check_mnist_arrays(images, labels, repr(str(path)))


def _find_idx_file(directory: Path, split: str, kind: str) -> Path:
    stem = _MNIST_STEMS[(split, kind)]
    suffix = "idx3-ubyte" if kind == "images" else "idx1-ubyte"
    candidates = [f"{stem}{sep}{suffix}{gz}" for sep in ("-", ".") for gz in ("", ".gz")]
    for candidate in candidates:
        if (directory / candidate).is_file():
            return directory / candidate
    raise ValueError(
        f"data_path: expected the IDX file {candidates[0]} (or .gz) in {str(directory)!r}; not found. "
        "Point data_path at the directory holding the four IDX files, or at an .npz."
    )


def _read_idx(path: Path, expected_ndim: int) -> np.ndarray:
    """An IDX file (big-endian header: 0, 0, dtype code, ndim; ndim int32 sizes; data)."""
    try:
        if path.stat().st_size > MAX_DATA_BYTES:
            raise ValueError(f"data_path: {str(path)!r} holds more than {MAX_DATA_BYTES} bytes; not a MNIST file.")
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":  # gzip magic, whatever the file is called
            raw = _gunzip_capped(raw, path)
    except (OSError, EOFError, zlib.error) as error:
        raise ValueError(f"data_path: could not read {str(path)!r}: {error}") from error
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise ValueError(f"data_path: {str(path)!r} is not an IDX file (bad magic number).")
    dtype_code, ndim = raw[2], raw[3]
    if dtype_code != _IDX_UBYTE or ndim != expected_ndim:
        raise ValueError(
            f"data_path: expected an unsigned-byte IDX file with {expected_ndim} dimensions in "
            f"{str(path)!r}; got type code {dtype_code:#04x} with {ndim} dimensions."
        )
    header_size = 4 + 4 * ndim
    if len(raw) < header_size:
        raise ValueError(f"data_path: {str(path)!r} is truncated (incomplete header).")
    shape = tuple(int(v) for v in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    payload = len(raw) - header_size
    if payload != math.prod(shape):
        raise ValueError(
            f"data_path: {str(path)!r} declares shape {shape} ({math.prod(shape)} bytes) but holds "
            f"{payload} bytes of data."
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header_size).reshape(shape)


def _load_mnist_idx(directory: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    images_path = _find_idx_file(directory, split, "images")
    labels_path = _find_idx_file(directory, split, "labels")
    images = _read_idx(images_path, 3)
    labels = _read_idx(labels_path, 1)
    return _check_mnist_arrays(images, labels, f"{str(images_path)!r} and {str(labels_path)!r}")


def split_holdout(dataset: Dataset, holdout_fraction: float, *, seed: Seed) -> tuple[Dataset, Dataset]:
    """Split ``dataset`` into (train, holdout), stratified by class for classification.

    Each class c with n_c examples gives ``round(holdout_fraction * n_c)`` examples to
    the holdout (regression: ``round(holdout_fraction * N)`` overall), chosen
    uniformly at random. Both parts keep the original row order.

    Raises
    ------
    ValueError
        If ``holdout_fraction`` is not in (0, 1) or either part would be empty.
    """
    if not isinstance(dataset, Dataset):
        raise TypeError(f"dataset: expected a simulations.datasets.loaders.Dataset; got {type(dataset).__name__}.")
    fraction = check_open_unit("holdout_fraction", holdout_fraction)
    rng = as_generator(seed)
    num_examples = len(dataset)
    if dataset.is_classification:
        groups = [np.flatnonzero(dataset.y == c) for c in range(dataset.num_classes)]
    else:
        groups = [np.arange(num_examples)]
    holdout_mask = np.zeros(num_examples, dtype=bool)
    for members in groups:
        chosen = rng.permutation(members)[: int(round(fraction * len(members)))]
        holdout_mask[chosen] = True
    if holdout_mask.all() or not holdout_mask.any():
        raise ValueError(
            f"holdout_fraction: {fraction} leaves an empty {'train' if holdout_mask.all() else 'holdout'} "
            f"part of the {num_examples} examples; choose a fraction nearer 0.5."
        )
    return dataset.subset(np.flatnonzero(~holdout_mask)), dataset.subset(np.flatnonzero(holdout_mask))


def sample_per_class(labels: np.ndarray, total: int, *, seed: Seed, name: str = "total") -> np.ndarray:
    """Indices of a class-balanced sample of ``total`` rows without replacement, in row order.

    Each of the C classes present gives ⌊total / C⌋ rows, and the remainder one more row
    each from classes drawn at random ([ADS] App. C.2: 3,600 images, 360 per class).
    ``name`` is the setting the error names when a class has too few rows.
    """
    labels = np.asarray(labels)
    classes = np.unique(labels)
    if isinstance(total, bool) or not isinstance(total, (int, np.integer)) or total < 1:
        raise ValueError(f"{name}: expected a positive number of examples; got {total!r}.")
    rng = as_generator(seed)
    counts = np.full(len(classes), int(total) // len(classes))
    counts[rng.choice(len(classes), int(total) % len(classes), replace=False)] += 1
    chosen = []
    for label, count in zip(classes, counts):
        members = np.flatnonzero(labels == label)
        if count > len(members):
            raise ValueError(
                f"{name}: a class-balanced sample of {total} examples needs {count} of class {label}; the data "
                f"holds {len(members)}. Ask for at most {len(members) * len(classes)} examples."
            )
        chosen.append(rng.choice(members, size=count, replace=False))
    return np.sort(np.concatenate(chosen))
