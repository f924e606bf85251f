"""Coalition evaluation scaled out on Ray: a drop-in for a ``TorchModelUtility``.

Valuing a round with many clients means scoring thousands of coalition states. A
:class:`RayParallelUtility` keeps the utility's interface (``U(arrays)``, ``batch``,
``linear``) and splits every large batch of states into contiguous parts, one per
Ray actor; each actor holds a copy of the utility (model template and held-out
data, shipped once) and scores its part on the fast path. Near-tie rows come back
with the scores and are re-scored here on the plain path, so the values equal the
single-process ones exactly (accuracy) or to float rounding (losses).

Works on local workers (``ray.init`` on this machine) or on an existing cluster
(``address="ray://..."`` or ``"auto"``). Inside a running Flower simulation Ray is
already up: the actors join it. Clients are idle while the server values a round, so
the default asks Ray for no CPUs per actor and limits each actor's torch threads
instead (``threads_per_worker``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from fedvalue._checks import check_integer, check_non_negative
from fedvalue.scoring.kernels import usable_cores
from fedvalue.scoring._scoring import FastScores
from fedvalue.scoring.linear import LinearStates
from fedvalue.scoring.torch_utilities import TorchModelUtility


class _Scorer:
    """Ray actor body: one copy of the utility, scoring parts of batches."""

    def __init__(self, utility: TorchModelUtility, threads: int) -> None:
        import torch

        torch.set_num_threads(threads)
        self.utility = utility
        self.basis_key = None
        self.states: LinearStates | None = None

    def linear_scores(self, basis_key: int, basis, coefficients: np.ndarray) -> FastScores:
        if basis_key != self.basis_key:
            self.states, self.basis_key = self.utility.linear(basis), basis_key
        return self.states.scores(coefficients)

    def batch(self, arrays_list) -> list[float]:
        return self.utility.batch(arrays_list)


class RayParallelUtility:
    """``utility`` with its batches of states scored on ``num_workers`` Ray actors.

    Parameters
    ----------
    utility
        The :class:`~fedvalue.scoring.torch_utilities.TorchModelUtility` to scale out.
    num_workers
        Ray actors (each holds a copy of the model template and held-out data).
    address
        Ray cluster to attach to when Ray is not yet running here (``None``: start a
        local one with ``num_workers`` CPUs).
    num_cpus_per_worker
        CPUs Ray reserves per actor (0: share the CPUs of idle simulation clients).
    threads_per_worker
        torch threads per actor.
    min_states
        Batches smaller than this are scored in this process (Ray's round trip
        would cost more than it saves).
    """

    def __init__(
        self,
        utility: TorchModelUtility,
        *,
        num_workers: int = 2,
        address: str | None = None,
        num_cpus_per_worker: float = 0,
        threads_per_worker: int = 1,
        min_states: int = 32,
    ) -> None:

        if not isinstance(utility, TorchModelUtility):
            raise TypeError(f"utility: expected a fedvalue TorchModelUtility; got {type(utility).__name__}.")
        check_integer("num_workers", num_workers)
        check_integer("threads_per_worker", threads_per_worker)
        check_integer("min_states", min_states)
        check_non_negative("num_cpus_per_worker", num_cpus_per_worker)
        self.utility = utility
        self.num_workers = num_workers
        self.address = address
        self.num_cpus_per_worker = num_cpus_per_worker
        self.threads_per_worker = threads_per_worker
        self.min_states = min_states
        self._started_ray = False
        self._workers_list: list | None = None
        self._basis_key = 0

    @property
    def _workers(self) -> list:
        """The actors, started on first use: inside a simulation, Ray is the engine's by then."""
        import ray

        if self._workers_list is None:
            if not ray.is_initialized():
                # "local": a Ray of its own even where RAY_ADDRESS is exported (it would join that cluster).
                options = {"address": self.address} if self.address else {"address": "local",
                                                                            "num_cpus": self.num_workers}
                ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False, **options)
                self._started_ray = True
            actor = ray.remote(num_cpus=self.num_cpus_per_worker)(_Scorer)
            utility_ref = ray.put(self.utility)
            self._workers_list = [actor.remote(utility_ref, self.threads_per_worker) for _ in range(self.num_workers)]
        return self._workers_list

    # The utility's own interface ---------------------------------------------------------

    def __call__(self, arrays: Mapping[str, np.ndarray]) -> float:
        return self.utility(arrays)

    @property
    def supports_linear(self) -> bool:
        return self.utility.supports_linear

    def batch(self, arrays_list: Sequence[Mapping[str, np.ndarray]]) -> list[float]:
        import ray

        if len(arrays_list) < self.min_states:
            return self.utility.batch(arrays_list)
        parts = np.array_split(np.arange(len(arrays_list)), len(self._workers))
        futures = [w.batch.remote([arrays_list[i] for i in part]) for w, part in zip(self._workers, parts)
                   if len(part)]
        return [value for part in ray.get(futures) for value in part]

    def linear(self, basis: Sequence[Mapping[str, np.ndarray]]) -> _ParallelLinearStates:
        self._basis_key += 1
        return _ParallelLinearStates(self, basis, self._basis_key)

    @property
    def differentiable(self) -> bool:
        return self.utility.differentiable

    def gradient(self, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """∇U, in this process (one pass over the held-out data: the actors would not shorten it)."""
        return self.utility.gradient(arrays)

    def hessian_vector_product(self, arrays: Mapping[str, np.ndarray],
                               vector: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """∇²U v, in this process."""
        return self.utility.hessian_vector_product(arrays, vector)

    # Life cycle ---------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the actors (and Ray, when this object started it)."""
        import ray

        if ray.is_initialized():  # a simulation engine may have shut Ray down already
            for worker in self._workers_list or []:
                ray.kill(worker)
        self._workers_list = None
        if self._started_ray and ray.is_initialized():
            ray.shutdown()
        self._started_ray = False

    def __enter__(self) -> RayParallelUtility:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _ParallelLinearStates:
    """:class:`~fedvalue.scoring.torch_utilities.LinearStates` with the scoring split across actors."""

    def __init__(self, parallel: RayParallelUtility, basis, key: int) -> None:
        import ray

        self.parallel = parallel
        self.local = parallel.utility.linear(basis)
        self.key = key
        self.basis_ref = ray.put([dict(b) for b in basis])

    def values(self, coefficients: np.ndarray, materialize=None, progress=None) -> np.ndarray:
        """As :meth:`fedvalue.scoring.linear.LinearStates.values`; ``progress`` is told each actor's rows
        as its part comes back."""
        import ray

        coefficients = np.asarray(coefficients, dtype=np.float64)
        if len(coefficients) < self.parallel.min_states:
            return self.local.values(coefficients, materialize, progress)
        parts = [p for p in np.array_split(np.arange(len(coefficients)), len(self.parallel._workers)) if len(p)]
        futures = [w.linear_scores.remote(self.key, self.basis_ref, coefficients[p])
                   for w, p in zip(self.parallel._workers, parts)]
        scores = FastScores(len(coefficients), self.parallel.utility.num_batches)
        for part, future in zip(parts, futures):
            partial = ray.get(future)
            if progress is not None:
                progress(len(part))
            scores.sums[part] = partial.sums
            for (c, b), near in partial.near.items():
                scores.near[(int(part[c]), b)] = near
        return self.local.resolve(coefficients, scores, materialize)


#: Seconds Ray actors take to start and load torch before they score anything (measured on the
#: 2-core machine: the first simulated round costs about 6 s more than later ones for that reason;
#: chosen, not tuned).
ACTOR_START_S = 5.0


def valuation_workers_advice(utility: TorchModelUtility, *, workers: int, clients_per_round: int, rounds: int,
                             cores: int | None = None) -> str | None:
    """Why ``workers`` Ray actors scoring coalitions would likely cost more than they save, or None.

    The round's coalitions (2^n for exact ADS, n ≤ 25) are timed here on a synthetic round
    (:func:`simulations.runner.budget.seconds_per_evaluation`): T seconds a round in this process.
    The actors can save at most rounds × T × (1 − 1/w) with w = min(workers, cores − 1) actors
    beside the server process, and cost :data:`ACTOR_START_S` to start: when that start-up is
    larger than the most they can save, or no core is free for them (w < 2), they lose.
    """
    from fedvalue.valuation.plan import MAX_EXACT_GROUP_SIZE
    from simulations.runner.budget import seconds_per_evaluation

    cores = usable_cores() if cores is None else cores
    parallel = min(workers, cores - 1)
    if parallel < 2:
        return (f"valuation_workers: {workers} Ray actors will cost more than they save on this machine's {cores} "
                "usable cores (the server process and the actors would share them); leave it at 0")
    if clients_per_round > MAX_EXACT_GROUP_SIZE:
        return None  # sampled estimators: their count is the budget's, not 2^n
    states = 2 ** clients_per_round + clients_per_round + 1
    fixed, per_state = seconds_per_evaluation(utility, clients_per_round)
    in_process = fixed + per_state * states
    saved = rounds * in_process * (1 - 1 / parallel)
    if saved >= ACTOR_START_S:
        return None
    return (f"valuation_workers: {workers} Ray actors will likely cost more than they save: a round's {states} "
            f"coalition states score in about {in_process:.2g} s in this process (timed now), so {rounds} rounds "
            f"save at most {saved:.2g} s, and the actors take about {ACTOR_START_S:g} s to start; leave it at 0")
