"""Scripted client behaviours: what a simulated client does to its data and its reply.

A behaviour is applied by the ClientApp (:mod:`clients.app`) around honest local
training::

    x, y = behaviour.transform_training_data(x_train, y_train, rng)
    ... train the received global model on (x, y) ...
    arrays, num_examples = behaviour.transform_reply(global_arrays, trained_arrays, len(x), rng)

Behaviours travel to the Ray workers with the client's data, so they must be
picklable (plain classes with plain attributes).

:func:`flip_labels` is the label noise of [ADS] App. C.2 ("Noisy contributors"):
each label is independently flipped with probability p to a uniformly chosen class in
{0, ..., K-1} \\ {y_true}; input features are left unchanged.

Manipulations (what the books do about each is in tests/strategies/policies/test_manipulation.py):

- :class:`FreeRider`: replies the global model A_{t−1} (or A_{t−1} plus tiny noise);
- :class:`InflatedExampleCount`: trains honestly, claims more examples than it holds;
- :class:`Replicator`: trains on a copy of another client's data, so it submits that
  client's update;
- :class:`SignFlip` and :class:`BoostedUpdate` (both :class:`ScaledUpdate`): reply
  A_{t−1} − (w − A_{t−1}), resp. A_{t−1} + λ (w − A_{t−1}), for the honestly trained w.

A behaviour of one's own is a :class:`ClientBehaviour` subclass; :func:`load_behaviour` builds
it from its ``module:callable`` (as ``fedvalue run attacks --attack module:callable`` does).
"""

from __future__ import annotations


import numpy as np

from fedvalue._checks import check_integer, check_non_negative, check_number, check_unit_interval
from fedvalue.run.run_info import check_reference, import_reference
from clients.seeding import Seed, as_generator, fixed_entropy


def flip_labels(labels: np.ndarray, p: float, num_classes: int, *, seed: Seed) -> np.ndarray:
    """Flip each label with probability ``p`` to a uniformly chosen OTHER class.

    Parameters
    ----------
    labels
        1-D integer labels in ``[0, num_classes)``.
    p
        Flip probability in [0, 1] ([ADS] App. C.2 uses p = 0.7).
    num_classes
        K >= 2.
    seed
        Seed of the flips (see :func:`clients.seeding.as_generator`).

    Returns
    -------
    np.ndarray
        A new array of the same dtype; a flipped label never equals its original, and
        given a flip, each of the K-1 other classes is equally likely.
    """
    labels = np.asarray(labels)
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(
            f"labels: expected a 1-D integer array; got dtype {labels.dtype} with shape {labels.shape}."
        )
    check_integer("num_classes", num_classes, 2, why="a flip needs another class")
    check_unit_interval("p", p)
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(
            f"labels: expected values in [0, {num_classes}); got values in "
            f"[{labels.min()}, {labels.max()}]."
        )
    rng = as_generator(seed)
    flipped = rng.random(labels.size) < p
    # An offset uniform in {1, ..., K-1} taken mod K lands uniformly on the other classes.
    offsets = rng.integers(1, num_classes, size=labels.size)
    noisy = labels.copy()
    noisy[flipped] = (labels[flipped] + offsets[flipped]) % num_classes
    return noisy


class ClientBehaviour:
    """A client's script; the defaults are honest (identity) transforms."""

    def transform_training_data(
        self, x: np.ndarray, y: np.ndarray, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        """The (x, y) the client trains on this round (default: its own data)."""
        return x, y

    def transform_reply(
        self,
        global_arrays: dict[str, np.ndarray],
        trained_arrays: dict[str, np.ndarray],
        num_examples: int,
        rng: np.random.Generator,
    ) -> tuple[dict[str, np.ndarray], int]:
        """The arrays and example count the client sends back (default: what it trained)."""
        return trained_arrays, num_examples

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({fields})"


class HonestClient(ClientBehaviour):
    """Trains on its own data and replies what it trained."""


class LabelNoise(ClientBehaviour):
    """A noisy contributor: each training label flipped with probability ``p``.

    Parameters
    ----------
    p
        Flip probability ([ADS] App. C.2: 0.7).
    num_classes
        Number of classes K; flips go to one of the other K-1 uniformly.
    seed
        ``None``: flips are drawn from the round's generator the ClientApp passes in
        (fresh noise every round). Otherwise the client's noisy labels are fixed once
        by this seed and are the same in every round, as a contributor whose dataset
        is noisy (the paper's reading); e.g. ``seed=[run_seed, partition_id]``.
        A numpy Generator is read once, here.
    """

    def __init__(self, p: float, num_classes: int, *, seed: Seed = None) -> None:
        # Validate now, not in the Ray worker, so a bad config fails where it was written.
        flip_labels(np.zeros(0, dtype=np.int64), p, num_classes, seed=0)
        self.p = float(p)
        self.num_classes = int(num_classes)
        self._entropy = fixed_entropy(seed)

    def transform_training_data(
        self, x: np.ndarray, y: np.ndarray, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        source = rng if self._entropy is None else self._entropy
        return x, flip_labels(y, self.p, self.num_classes, seed=source)


class FreeRider(ClientBehaviour):
    """Sends the global model back, untrained, while claiming its example count.

    Its update is zero (or, with ``noise_std``, a tiny random one), so under FedAvg it
    only dilutes the others' updates: v_t(S ∪ {i}) = U(A_{t−1} + n_S/(n_S + n_i) D_S).

    Parameters
    ----------
    noise_std
        Standard deviation of Gaussian noise added to every floating-point entry of the
        global model, drawn from the round's reply generator (so a run's seed fixes it).
        ``0`` (default) replies the global model exactly; a small value hides the zero
        update from an equality check while the update stays ~0.
    """

    def __init__(self, noise_std: float = 0.0) -> None:
        self.noise_std = check_non_negative("noise_std", noise_std)

    def transform_reply(
        self,
        global_arrays: dict[str, np.ndarray],
        trained_arrays: dict[str, np.ndarray],
        num_examples: int,
        rng: np.random.Generator,
    ) -> tuple[dict[str, np.ndarray], int]:
        reply = {}
        for key, value in global_arrays.items():
            value = np.array(value, copy=True)
            if self.noise_std > 0 and value.dtype.kind == "f":
                value = (value + rng.normal(0.0, self.noise_std, size=value.shape)).astype(value.dtype)
            reply[key] = value
        return reply, num_examples

    def __repr__(self) -> str:
        return "FreeRider()" if self.noise_std == 0 else f"FreeRider(noise_std={self.noise_std!r})"


class InflatedExampleCount(ClientBehaviour):
    """Trains honestly but claims more examples than it holds, to dominate FedAvg.

    FedAvg weighs client i by p_i = n_i / Σ_j n_j with the n_i the clients claim; a claim of
    ``factor`` × its size takes a share near 1 of the step once ``factor`` is large against
    the others' total. (The server's answer is :class:`strategies.intake.claims.ClaimReview`.)

    Parameters
    ----------
    factor
        Claim ``round(factor × n)`` for a client holding n training examples; > 1.
    claimed
        Claim this fixed count instead (an int ≥ 1). Give exactly one of the two.
    """

    def __init__(self, factor: float | None = None, *, claimed: int | None = None) -> None:
        if (factor is None) == (claimed is None):
            raise ValueError(
                f"factor, claimed: expected exactly one of them (a multiplier > 1 or a fixed count); "
                f"got factor={factor!r}, claimed={claimed!r}."
            )
        if factor is not None:
            factor = check_number("factor", factor, low=1.0, low_open=True, why="an inflation")
        if claimed is not None:
            claimed = check_integer("claimed", claimed)
        self.factor = factor
        self.claimed = claimed

    def claim(self, num_examples: int) -> int:
        """The count this client reports for ``num_examples`` real examples."""
        return self.claimed if self.claimed is not None else max(1, int(round(self.factor * num_examples)))

    def transform_reply(
        self,
        global_arrays: dict[str, np.ndarray],
        trained_arrays: dict[str, np.ndarray],
        num_examples: int,
        rng: np.random.Generator,
    ) -> tuple[dict[str, np.ndarray], int]:
        return trained_arrays, self.claim(num_examples)

    def __repr__(self) -> str:
        what = f"factor={self.factor!r}" if self.factor is not None else f"claimed={self.claimed!r}"
        return f"InflatedExampleCount({what})"


class Replicator(ClientBehaviour):
    """Submits another client's update: trains on a copy of that client's training data.

    It claims the source's example count too, so with full-batch local training (the
    default; mini-batch order depends on the partition id) its reply equals the
    source's bit for bit. Two such replies are symmetric players of the round game:
    ADS splits their joint value equally; each is a near-substitute for the other, so
    leave-one-out credits each only with the change from doubling the pair's weight.

    Parameters
    ----------
    x_source, y_source
        The source client's training inputs (N x d) and labels (N), N ≥ 1.
    source_id
        The source's client id, for the record (``repr`` and reports).
    """

    def __init__(self, x_source: np.ndarray, y_source: np.ndarray, *, source_id: int | None = None) -> None:
        x_source, y_source = np.asarray(x_source), np.asarray(y_source)
        if x_source.ndim < 2 or y_source.ndim != 1 or len(x_source) != len(y_source) or len(x_source) == 0:
            raise ValueError(
                f"x_source, y_source: expected N x d inputs and N labels with N >= 1; got shapes "
                f"{x_source.shape} and {y_source.shape}."
            )
        self.source_id = source_id
        self._x = x_source
        self._y = y_source

    def transform_training_data(
        self, x: np.ndarray, y: np.ndarray, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        if x.shape[1:] != self._x.shape[1:]:
            raise ValueError(
                f"x_source: expected inputs shaped like the client's own {x.shape[1:]} per example; got "
                f"{self._x.shape[1:]}."
            )
        return self._x, self._y


class ScaledUpdate(ClientBehaviour):
    """Trains honestly, then replies A_{t−1} + λ (w − A_{t−1}) instead of w.

    Only floating-point entries are scaled (integer buffers such as batch counters are
    replied as trained). The arithmetic is in float64, cast back to each entry's dtype.

    Parameters
    ----------
    scale
        λ, a finite number; λ = −1 flips the update's sign (:class:`SignFlip`), λ > 1
        boosts it (:class:`BoostedUpdate`).
    """

    def __init__(self, scale: float) -> None:
        self.scale = check_number("scale", scale, why="λ in A + λ(w − A)")

    def transform_reply(
        self,
        global_arrays: dict[str, np.ndarray],
        trained_arrays: dict[str, np.ndarray],
        num_examples: int,
        rng: np.random.Generator,
    ) -> tuple[dict[str, np.ndarray], int]:
        reply = {}
        for key, trained in trained_arrays.items():
            if trained.dtype.kind != "f":
                reply[key] = trained
                continue
            start = np.asarray(global_arrays[key], dtype=np.float64)
            reply[key] = (start + self.scale * (trained.astype(np.float64) - start)).astype(trained.dtype)
        return reply, num_examples


class SignFlip(ScaledUpdate):
    """A sign-flipping attacker: replies A_{t−1} − (w − A_{t−1}), its honest update reversed."""

    def __init__(self) -> None:
        super().__init__(-1.0)

    def __repr__(self) -> str:
        return "SignFlip()"


class BoostedUpdate(ScaledUpdate):
    """A boosting (scaled-update) attacker: replies A_{t−1} + λ (w − A_{t−1}) with λ > 1.

    Under FedAvg its update counts λ times, as if it held λ times its data, without a
    false example count.
    """

    def __init__(self, scale: float) -> None:
        super().__init__(scale)
        if not self.scale > 1:
            raise ValueError(f"scale: expected a number > 1 (a boost); got {scale!r}. Use ScaledUpdate for others.")


def is_behaviour_reference(name: object) -> bool:
    """Whether ``name`` reads ``module:callable`` (a behaviour of one's own, :func:`load_behaviour`)."""
    try:
        check_reference(name, "attack")
    except ValueError:
        return False
    return True


def load_behaviour(reference: str) -> ClientBehaviour:
    """The :class:`ClientBehaviour` the ``module:callable`` ``reference`` builds: the callable (a
    ClientBehaviour subclass, or a function) is called with no arguments. The module is imported
    with the working directory first on ``sys.path``; it runs that module's code. ValueError
    naming the reference and what went wrong (not a reference, the module does not import, it
    has no such name, calling it raised, it built no ClientBehaviour)."""
    target = import_reference(reference, "attack", where="run from the directory that holds the module, or install it")
    if isinstance(target, ClientBehaviour):
        return target
    if not callable(target):
        raise ValueError(f"attack {reference!r}: expected a ClientBehaviour or a callable of no arguments building one; "
                         f"got a {type(target).__name__}.")
    try:
        behaviour = target()
    except Exception as error:  # noqa: BLE001 - the user's code: said, not raised through
        raise ValueError(f"attack {reference!r}: calling it raised {type(error).__name__}: {error}") from None
    if not isinstance(behaviour, ClientBehaviour):
        raise ValueError(f"attack {reference!r}: expected it to build a clients.ClientBehaviour (subclass it and "
                         f"override transform_training_data or transform_reply); got a {type(behaviour).__name__}.")
    return behaviour
