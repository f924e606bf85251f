"""Flat parameter vectors and a seeded random projection for TracIn dot products at large p.

**Random projection** ([RECIP] §4 at large p). With R ∈ ℝ^{k×p}, R_ij i.i.d. N(0, 1/k)
(Gaussian) or ±1/√k (Rademacher), or a count sketch (each column j holds one ±1, at a row
h(j) drawn uniformly: Rx sums the signed coordinates hashed to each row), E[RᵀR] = I, so
(R s_u)·(R g_v) is an unbiased estimate of s_u·g_v with variance

    (‖s_u‖²‖g_v‖² + (s_u·g_v)² − c Σ_i s_ui² g_vi²) / k,   c = 0 (Gaussian), 2 (the others),

at most 2‖s_u‖²‖g_v‖²/k: standard deviation ≈ ‖s_u‖‖g_v‖ √(2/k) (Johnson–Lindenstrauss).
The dense kinds cost O(k·p) a vector, the count sketch O(p) (one pass, a weighted
``bincount``, whose sums do not depend on how many vectors are projected together).
The SAME R is applied to updates and gradients; it is generated from the seed in column
chunks, so memory stays O(k · chunk) (count sketch: O(chunk)) however large p is. For
k ≥ p no projection is done (identity: exact and cheaper).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence

import numpy as np

from fedvalue._checks import check_choice, check_integer

Vector = np.ndarray | Sequence[float] | Mapping[str, np.ndarray]


def flatten(vector: Vector, *, keys: Sequence[str] | None = None, name: str = "vector") -> np.ndarray:
    """One flat float64 vector from an array or a dict of arrays.

    Parameters
    ----------
    vector
        An array (any shape; raveled in C order) or a mapping name -> array, whose arrays
        are raveled and concatenated in the order ``keys``.
    keys
        Key order for a mapping; default ``sorted(vector)``. Pass the model's own order
        (e.g. ``list(state_dict)``) to match vectors flattened elsewhere.
    name
        The parameter's name for error messages.

    Returns
    -------
    numpy.ndarray
        1-D float64 (a copy when the input was not float64 already).

    Raises
    ------
    ValueError
        Keys missing or extra, non-numeric or non-finite entries.
    """
    if isinstance(vector, Mapping):
        order = sorted(vector) if keys is None else list(keys)
        if set(order) != set(vector):
            raise ValueError(
                f"{name}: expected arrays under exactly the keys {order}; got keys {list(vector)} "
                f"(missing {sorted(set(order) - set(vector), key=str)}, extra {sorted(set(vector) - set(order), key=str)})."
            )
        try:
            parts = [np.asarray(vector[k], dtype=np.float64).ravel() for k in order]
        except (TypeError, ValueError) as error:
            raise ValueError(f"{name}: expected numeric arrays; got {error}.") from None
        flat = np.concatenate(parts) if parts else np.zeros(0)
    else:
        try:
            flat = np.asarray(vector, dtype=np.float64).ravel()
        except (TypeError, ValueError) as error:
            raise ValueError(f"{name}: expected a numeric array or a dict of arrays; got {error}.") from None
    if not np.all(np.isfinite(flat)):
        bad = int(np.flatnonzero(~np.isfinite(flat))[0])
        raise ValueError(f"{name}: expected finite numbers; got {flat[bad]!r} at flat position {bad}.")
    return flat


class RandomProjection:
    """A seeded k×p random projection R, applied without holding R in memory.

    R_ij are i.i.d. N(0, 1/k) (``kind="gaussian"``) or ±1/√k with probability 1/2
    (``kind="rademacher"``), or R is a count sketch (``kind="count-sketch"``: column j is
    ±e_{h(j)}, sign and row h(j) uniform); E[RᵀR] = I, so projected dot products are
    unbiased with standard deviation ≈ ‖x‖‖y‖ √(2/k) (module docstring). Columns are
    generated in chunks of ``chunk_size``; chunk j comes from its own child of the seed's
    SeedSequence, so the matrix depends only on (seed, k, kind, chunk_size) and memory is
    O(k · chunk_size) (count sketch: O(chunk_size)) plus, when it fits in
    ``max_cache_bytes``, the cached matrix.

    When k ≥ p the projection is the identity (``output_dim = p``): exact, and a random
    k×p matrix with k ≥ p could only add noise.

    Parameters
    ----------
    dim
        p, the length of the vectors projected.
    k
        Target dimension.
    kind
        ``"gaussian"``, ``"rademacher"`` or ``"count-sketch"``.
    seed
        Non-negative int, SeedSequence, numpy Generator (one draw of entropy is taken
        from it) or None (fresh entropy: not reproducible).
    chunk_size
        Columns per generated block; default ≈ 2^20 / k (8 MiB blocks; count sketch: 2^20
        columns, 16 MiB) (:meth:`default_chunk_size`).
    max_cache_bytes
        Keep the generated blocks when k·p·8 bytes (count sketch: 16·p) is at most this
        (default 128 MiB).
    """

    KINDS = ("gaussian", "rademacher", "count-sketch")

    def __init__(
        self,
        dim: int,
        k: int,
        *,
        kind: str = "gaussian",
        seed: int | np.random.Generator | np.random.SeedSequence | None = None,
        chunk_size: int | None = None,
        max_cache_bytes: int = 1 << 27,
    ) -> None:
        check_integer("dim", dim)
        check_integer("k", k)
        check_choice("kind", kind, self.KINDS)
        if chunk_size is None:
            chunk_size = self.default_chunk_size(k, kind)
        check_integer("chunk_size", chunk_size, none_ok=True)
        if isinstance(seed, np.random.Generator):
            sequence = np.random.SeedSequence(seed.integers(0, 2**63, size=4).tolist())
        elif seed is None or isinstance(seed, np.random.SeedSequence):
            sequence = seed if isinstance(seed, np.random.SeedSequence) else np.random.SeedSequence()
        elif isinstance(seed, numbers.Integral) and not isinstance(seed, bool) and seed >= 0:
            sequence = np.random.SeedSequence(int(seed))
        else:
            raise ValueError(
                f"seed: expected a non-negative int, a numpy Generator, a SeedSequence or None; got {seed!r}."
            )
        self.dim = int(dim)
        self.k = int(k)
        self.kind = kind
        self.chunk_size = int(chunk_size)
        self._entropy = sequence.entropy
        self._spawn_key = tuple(sequence.spawn_key)
        held = self.dim * 16 if kind == "count-sketch" else self.k * self.dim * 8
        self._cache: dict[int, np.ndarray | tuple[np.ndarray, np.ndarray]] | None = (
            {} if held <= max_cache_bytes else None
        )

    @staticmethod
    def default_chunk_size(k: int, kind: str) -> int:
        """Columns per generated block when none is given: 2^20 / k for the dense kinds (blocks
        of 8 MiB), 2^20 for the count sketch (its block is a row index and a sign per column)."""
        return 1 << 20 if kind == "count-sketch" else max(1, (1 << 20) // int(k))

    @property
    def identity(self) -> bool:
        """True when k ≥ p: vectors are returned unchanged."""
        return self.k >= self.dim

    @property
    def output_dim(self) -> int:
        """min(k, p)."""
        return self.dim if self.identity else self.k

    def _block(self, j: int) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        if self._cache is not None and j in self._cache:
            return self._cache[j]
        start = j * self.chunk_size
        width = min(self.chunk_size, self.dim - start)
        rng = np.random.default_rng(np.random.SeedSequence(self._entropy, spawn_key=(*self._spawn_key, j)))
        if self.kind == "count-sketch":  # (row h(j) of each column, its sign)
            rows = rng.integers(0, self.k, size=width)
            block = (rows, rng.integers(0, 2, size=width).astype(np.float64) * 2.0 - 1.0)
            if self._cache is not None:
                self._cache[j] = block
            return block
        if self.kind == "gaussian":
            block = rng.standard_normal((self.k, width))
        else:
            block = rng.integers(0, 2, size=(self.k, width)).astype(np.float64) * 2.0 - 1.0
        block /= math.sqrt(self.k)
        if self._cache is not None:
            self._cache[j] = block
        return block

    def project_many(self, vectors: Sequence[np.ndarray] | np.ndarray) -> np.ndarray:
        """R x for each 1-D vector x of length p (rows of a 2-D array or a list).

        Returns
        -------
        numpy.ndarray
            ``len(vectors) x output_dim``, float64.
        """
        if isinstance(vectors, np.ndarray):
            matrix = np.asarray(vectors, dtype=np.float64)
            rows = list(matrix.reshape(len(matrix), -1)) if len(matrix) else []
        else:
            rows = [np.asarray(v, dtype=np.float64).ravel() for v in vectors]
        for i, row in enumerate(rows):
            if row.shape[0] != self.dim:
                raise ValueError(f"vectors: expected length {self.dim} (the projection's dim); got {row.shape[0]} at {i}.")
        if not rows:
            return np.zeros((0, self.output_dim))
        if self.identity:
            return np.stack(rows)
        out = np.zeros((len(rows), self.k))
        for j in range(math.ceil(self.dim / self.chunk_size)):
            lo, hi = j * self.chunk_size, min(self.dim, (j + 1) * self.chunk_size)
            if self.kind == "count-sketch":  # one vector at a time: the same sums however many are projected
                hashed, signs = self._block(j)
                for i, row in enumerate(rows):
                    out[i] += np.bincount(hashed, weights=row[lo:hi] * signs, minlength=self.k)
            else:
                out += np.stack([row[lo:hi] for row in rows]) @ self._block(j).T
        return out

    def __call__(self, vector: np.ndarray) -> np.ndarray:
        """R x for one vector of length p."""
        return self.project_many([vector])[0]

    def __repr__(self) -> str:
        return f"RandomProjection(dim={self.dim}, k={self.k}, kind={self.kind!r}, chunk_size={self.chunk_size})"


def _project(projection: RandomProjection | None, matrix: np.ndarray, name: str) -> np.ndarray:
    if projection is None:
        return matrix
    if not isinstance(projection, RandomProjection):
        raise TypeError(f"projection: expected a RandomProjection or None; got {type(projection).__name__}.")
    if matrix.shape[1] != projection.dim:
        raise ValueError(
            f"{name}: expected vectors of length {projection.dim} (the projection's dim); got {matrix.shape[1]}."
        )
    return projection.project_many(matrix)
