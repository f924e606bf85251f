"""Original and synthetic training data for the [ADS] §6.1 simulations.

Images (digits, embedded; MNIST from local files): ``per_class`` originals and
``test_per_class`` test images per class, drawn without overlap, and one augmented copy
of each original by a random affine map ([ADS] App. C.1.2: rotation in ±``rotation``
degrees, shifts in ±``shift`` of the image side, isotropic scale in 1 ± ``scale``),
bilinear, zero outside the image, clipped to the pixel range.

Tabular (breast cancer, embedded): the minority class (malignant) is undersampled to
``imbalance`` × the majority count in training and test, as [ADS] App. C.1.1 does with
Adult, and Borderline-SMOTE (imbalanced-learn; [ADS] §6.1 cites Han et al. 2005) with
``smote_neighbors`` neighbours oversamples it to balance; its new rows are the synthetic group.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from simulations.datasets import load_dataset

IMAGE_DATASETS = ("digits", "mnist")
DATASETS = (*IMAGE_DATASETS, "breast-cancer")


@dataclass(frozen=True)
class OriginalsAndSynthetic:
    """Originals, one synthetic group, and a held-out test set (float64 features)."""

    x_original: np.ndarray
    y_original: np.ndarray
    x_synthetic: np.ndarray
    y_synthetic: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray

    @property
    def x_train(self) -> np.ndarray:
        return np.vstack([self.x_original, self.x_synthetic])

    @property
    def y_train(self) -> np.ndarray:
        return np.concatenate([self.y_original, self.y_synthetic])

    @property
    def num_original(self) -> int:
        return len(self.y_original)


def augment_images(images: np.ndarray, rng: np.random.Generator, *, rotation: float, shift: float,
                   scale: float) -> np.ndarray:
    """One random affine copy of each flattened square image (module docstring)."""
    from scipy import ndimage

    side = math.isqrt(images.shape[1])
    top = float(images.max()) if images.size else 1.0
    center = np.array([(side - 1) / 2.0] * 2)
    out = np.empty_like(images, dtype=np.float64)
    for row, image in enumerate(images):
        angle = math.radians(rng.uniform(-rotation, rotation))
        zoom = rng.uniform(1.0 - scale, 1.0 + scale)
        offset_px = rng.uniform(-shift, shift, size=2) * side
        cos, sin = math.cos(angle), math.sin(angle)
        # affine_transform maps output coordinates o to input M·o + b: the inverse map.
        inverse = np.array([[cos, sin], [-sin, cos]]) / zoom
        offset = center - inverse @ (center + offset_px)
        moved = ndimage.affine_transform(image.reshape(side, side).astype(np.float64), inverse, offset=offset,
                                         order=1, mode="constant", cval=0.0)
        out[row] = np.clip(moved, 0.0, top).ravel()
    return out


def _per_class_indices(y: np.ndarray, counts: dict[int, int], rng: np.random.Generator,
                       exclude: np.ndarray | None = None) -> np.ndarray:
    chosen = []
    available = np.ones(len(y), dtype=bool)
    if exclude is not None:
        available[exclude] = False
    for label, count in counts.items():
        pool = np.flatnonzero((y == label) & available)
        if len(pool) < count:
            raise ValueError(f"train_per_class/test_per_class: class {label} has {len(pool)} examples left; "
                             f"got a request for {count}. Ask for fewer per class.")
        chosen.append(rng.choice(pool, size=count, replace=False))
    return np.sort(np.concatenate(chosen))


def images_with_augmentations(dataset: str, mnist_path: str, per_class: int, test_per_class: int,
                              rng: np.random.Generator, *, rotation: float, shift: float,
                              scale: float) -> OriginalsAndSynthetic:
    """Originals, their augmented copies (same order), and test images."""
    data = load_dataset(dataset, data_path=mnist_path or None)
    x, y = data.x.astype(np.float64), data.y
    classes = range(data.num_classes)
    train = _per_class_indices(y, {c: per_class for c in classes}, rng)
    test = _per_class_indices(y, {c: test_per_class for c in classes}, rng, exclude=train)
    augmented = augment_images(x[train], rng, rotation=rotation, shift=shift, scale=scale)
    return OriginalsAndSynthetic(x[train], y[train], augmented, y[train].copy(), x[test], y[test])


def tabular_with_smote(per_class: int, test_per_class: int, imbalance: float, smote_neighbors: int,
                       rng: np.random.Generator) -> OriginalsAndSynthetic:
    """Breast cancer: imbalanced originals, Borderline-SMOTE minority rows, imbalanced test set."""
    from imblearn.over_sampling import BorderlineSMOTE

    data = load_dataset("breast-cancer")
    x, y = data.x.astype(np.float64), data.y
    counts = np.bincount(y)
    minority, majority = int(np.argmin(counts)), int(np.argmax(counts))
    train_counts = {majority: per_class, minority: max(1, round(imbalance * per_class))}
    test_counts = {majority: test_per_class, minority: max(1, round(imbalance * test_per_class))}
    train = _per_class_indices(y, train_counts, rng)
    test = _per_class_indices(y, test_counts, rng, exclude=train)
    if train_counts[minority] <= smote_neighbors:
        raise ValueError(f"smote_neighbors: expected fewer neighbours than the {train_counts[minority]} minority "
                         f"training examples; got {smote_neighbors}. Raise train_per_class or imbalance.")
    sampler = BorderlineSMOTE(k_neighbors=smote_neighbors, m_neighbors=2 * smote_neighbors,
                              random_state=int(rng.integers(2**31 - 1)))
    x_resampled, y_resampled = sampler.fit_resample(x[train], y[train])
    # imbalanced-learn appends the new rows after the originals.
    synthetic = slice(len(train), len(y_resampled))
    if len(y_resampled) == len(train):
        raise ValueError("imbalance: Borderline-SMOTE found no minority example on the class border, so it made no "
                         "synthetic rows; raise imbalance or train_per_class.")
    return OriginalsAndSynthetic(x[train], y[train], np.asarray(x_resampled[synthetic], dtype=np.float64),
                                 np.asarray(y_resampled[synthetic], dtype=np.int64), x[test], y[test])


def originals_and_synthetic(dataset: str, mnist_path: str, per_class: int, test_per_class: int,
                            rng: np.random.Generator, *, rotation: float, shift: float, scale: float,
                            imbalance: float, smote_neighbors: int) -> OriginalsAndSynthetic:
    """The data of one run of the augmentation simulation."""
    if dataset == "breast-cancer":
        return tabular_with_smote(per_class, test_per_class, imbalance, smote_neighbors, rng)
    return images_with_augmentations(dataset, mnist_path, per_class, test_per_class, rng, rotation=rotation,
                                     shift=shift, scale=scale)
