"""Marginal influence by removal and retraining, summed into inflows and outflows ([RECIP] Eq. 3).

[RECIP] §2.3.1 defines the influence of a training example z on an inference example
z' = (x', y') by the counterfactual of removing z and retraining,

    Marginal(z, z') = ℓ(M_{Z∖{z}}(x'), y') − ℓ(M_Z(x'), y'),                      (Eq. 3)

positive when z's presence reduced the loss on z'. Summed as TracIn is (Eqs. 1–2), with
Z_u, Z'_u the training and inference examples of individual u:

    I_v = Σ_{z∈Z∖Z_v} Σ_{z'∈Z'_v} Marginal(z, z'),   O_u = Σ_{z∈Z_u} Σ_{z'∈Z'∖Z'_u} Marginal(z, z'),
    self_u = Σ_{z∈Z_u} Σ_{z'∈Z'_u} Marginal(z, z').

A *removal unit* is what is removed before one retraining: a single example (Eq. 3 as
written), or all of an individual's training examples at once, the variant [RECIP] App.
C.2 uses on MovieLens to raise the signal ("we measure the effect of removing all of user
u's examples simultaneously"). Each unit belongs to one individual; :func:`marginal_flows`
sums the loss differences of its retrained model over the inference examples of every
other individual. Retraining is the caller's: :func:`marginal_losses` loops over a
``fit`` and a ``losses`` callable (one model per unit plus the full one), and a simulation
may compute the same array in a batch (``tests/fedvalue/flows/test_marginal.py`` checks both
against closed forms).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fedvalue._checks import check_finite_array, check_integer

__all__ = ["marginal_flows", "marginal_losses"]


def _owners(name: str, values: object, length: int, num_individuals: int) -> np.ndarray:
    array = np.asarray(values)
    if array.shape != (length,) or (length and not np.issubdtype(array.dtype, np.integer)):
        raise ValueError(f"{name}: expected {length} integer individual indices; got {array.dtype} of shape "
                         f"{array.shape}.")
    if length and (array.min() < 0 or array.max() >= num_individuals):
        raise ValueError(f"{name}: expected indices in [0, {num_individuals}); got values in [{array.min()}, "
                         f"{array.max()}].")
    return array.astype(np.int64)


def marginal_flows(
    full_losses: object,
    removed_losses: object,
    unit_owner: object,
    inference_owner: object,
    *,
    num_individuals: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Marginal inflow, outflow and self-influence per individual (module docstring).

    Parameters
    ----------
    full_losses
        ℓ(M_Z, z') per inference example z' (length n').
    removed_losses
        K × n': row k is ℓ(M_{Z∖unit_k}, z') per inference example.
    unit_owner
        The individual of each removal unit (length K).
    inference_owner
        The individual of each inference example (length n').
    num_individuals
        Individuals are 0..num_individuals−1 (those without units or inference examples get 0).

    Returns
    -------
    inflow, outflow, self_influence
        float64 vectors of length ``num_individuals``.
    """
    check_integer("num_individuals", num_individuals)
    full = check_finite_array("full_losses", full_losses, 1, "1-D array (one loss per inference example)")
    removed = check_finite_array("removed_losses", removed_losses, 2, "2-D array (removal units × inference examples)")
    if removed.shape[1] != len(full):
        raise ValueError(f"removed_losses: expected {len(full)} columns, one per inference example; got "
                         f"{removed.shape[1]}.")
    units = _owners("unit_owner", unit_owner, removed.shape[0], num_individuals)
    owners = _owners("inference_owner", inference_owner, len(full), num_individuals)
    marginal = removed - full[None, :]  # Marginal(unit k, z') (Eq. 3)
    # by_owner[k, v] = Σ_{z'∈Z'_v} Marginal(unit k, z'): one column sum per individual.
    by_owner = np.zeros((len(units), num_individuals))
    np.add.at(by_owner.T, owners, marginal.T)
    own = by_owner[np.arange(len(units)), units]
    outflow = np.bincount(units, weights=by_owner.sum(axis=1) - own, minlength=num_individuals)
    self_influence = np.bincount(units, weights=own, minlength=num_individuals)
    # Units of v itself reach v only as self-influence: Σ_{k: owner k = v} by_owner[k, v] = self_v.
    inflow = by_owner.sum(axis=0) - self_influence
    return inflow, outflow, self_influence


def marginal_losses(
    fit: Callable[[np.ndarray], Any],
    losses: Callable[[Any], np.ndarray],
    num_train: int,
    units: Sequence[Sequence[int]],
) -> tuple[np.ndarray, np.ndarray]:
    """ℓ(M_Z, ·) and ℓ(M_{Z∖unit}, ·) on the inference examples, by retraining once per unit.

    Parameters
    ----------
    fit
        ``fit(kept)`` trains on the training rows ``kept`` (sorted indices into 0..num_train−1)
        and returns a model; it must be deterministic (same rows, same model), so that two
        fits differ by the removal alone.
    losses
        ``losses(model)``: the per-example losses on the inference examples (length n').
    num_train
        |Z|.
    units
        The removal units: training-row indices removed together, one retraining each.

    Returns
    -------
    full_losses, removed_losses
        Length n' and len(units) × n', for :func:`marginal_flows`.
    """
    check_integer("num_train", num_train)
    everything = np.arange(num_train)
    full = np.asarray(losses(fit(everything)), dtype=np.float64)
    removed = np.empty((len(units), len(full)))
    for k, unit in enumerate(units):
        drop = np.asarray(unit, dtype=np.int64)
        if drop.size == 0 or drop.min() < 0 or drop.max() >= num_train:
            raise ValueError(f"units: expected non-empty groups of training rows in [0, {num_train}); unit {k} is "
                             f"{list(unit)!r}.")
        removed[k] = losses(fit(np.setdiff1d(everything, drop)))
    return full, removed
