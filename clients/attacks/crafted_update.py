"""A crafted update in the manner of ACE ([ACE]): the client shapes its update to raise its own
within-round value while keeping close to what it trained, with nothing of the server's.

The server values client a in round t by its Shapley value in v_t(S) = U(A_{t−1} + Agg(S))
([ADS] Remark 4.1). The attacker models that game with what it has:

* U by its own training data: Û(w) = −CE(w; own data) (it never sees the server's held-out set);
* the other m clients as m equal players whose updates are all D̂, the last global step
  A_{t−1} − A_{t−2} (its own honest update in its first round), each with its own weight;

so with j others beside it the state is A_{t−1} + (j D̂ + Δ)/(j + 1) and its surrogate value is

    φ̂(Δ) = (1/(m+1)) Σ_{j=0}^{m} [Û(A_{t−1} + (j D̂ + Δ)/(j + 1)) − Û(A_{t−1} + D̂·[j > 0])].

It maximizes φ̂ by Adam from its honest update Δ_h, projecting after every step onto the ball
‖Δ − Δ_h‖ ≤ β ‖Δ_h‖ (the budget that keeps the global model's accuracy), and claims its true
count. ACE shapes a low-quality client's local model so that the server's contribution
evaluation rates it high while the global model's accuracy is kept; here the evaluation is the
within-round value and the attacker's model of it is fitted on its own data (an adaptation, not
ACE's own objective). The model is any torch module its factory builds (scored by
``torch.func.functional_call``); its data is remembered from training.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from clients.attacks.memory import RoundAware
from fedvalue._checks import check_integer, check_non_negative, check_positive


class CraftedUpdate(RoundAware):
    """An ACE-style crafted update (module docstring).

    Parameters
    ----------
    model_factory
        Builds the model whose ``state_dict`` keys the global arrays carry (picklable).
    others
        m, the number of other clients it expects in a round.
    budget
        β: the crafted update stays within β ‖Δ_h‖ of the honest one.
    steps
        Adam steps.
    step_size
        Adam's learning rate as a multiple of the honest update's root-mean-square entry.
    """

    def __init__(self, model_factory: Callable[[], torch.nn.Module], *, others: int, budget: float = 0.5,
                 steps: int = 50, step_size: float = 0.1) -> None:
        if not callable(model_factory):
            raise TypeError(f"model_factory: expected a callable that builds the model; got {model_factory!r}.")
        self.model_factory = model_factory
        self.others = check_integer("others", others)
        self.budget = check_non_negative("budget", budget)
        self.steps = check_integer("steps", steps, 0)
        self.step_size = check_positive("step_size", step_size)

    def __repr__(self) -> str:
        return (f"CraftedUpdate(others={self.others}, budget={self.budget}, steps={self.steps}, "
                f"step_size={self.step_size})")

    def transform_training_data(self, x, y, rng):
        self._own = (x, y)  # its surrogate of the server's utility
        return x, y

    def transform_reply(self, global_arrays, trained_arrays, num_examples, rng):
        keys = [k for k, v in trained_arrays.items() if v.dtype.kind == "f"]
        start = {k: torch.as_tensor(np.asarray(global_arrays[k], np.float32)) for k in keys}
        honest = {k: torch.as_tensor(trained_arrays[k], dtype=torch.float32) - start[k] for k in keys}
        previous = self.previous_global
        others = honest if previous is None else {
            k: start[k] - torch.as_tensor(np.asarray(previous[k], np.float32)) for k in keys}
        crafted = self._craft(start, honest, others)
        reply = dict(trained_arrays)
        for k in keys:
            reply[k] = (start[k] + crafted[k]).numpy().astype(trained_arrays[k].dtype)
        return reply, num_examples

    def surrogate(self, model, start: dict, delta: dict, others: dict) -> torch.Tensor:
        """φ̂(Δ) on its own data (module docstring), differentiable in ``delta``."""
        x, y = (torch.as_tensor(a) for a in self._own)

        def utility(state: dict) -> torch.Tensor:
            logits = torch.func.functional_call(model, state, (x,))
            return -torch.nn.functional.cross_entropy(logits, y)

        def moved(j: int) -> dict:  # A + (j D̂ + Δ)/(j + 1); buffers (not updated) as they are
            return {k: start[k] + (j * others[k] + delta[k]) / (j + 1) if k in delta else start[k] for k in start}

        alone_before = utility(start)
        with_others = utility({k: start[k] + others[k] if k in others else start[k] for k in start})
        total = utility(moved(0)) - alone_before
        for j in range(1, self.others + 1):
            total = total + utility(moved(j)) - with_others
        return total / (self.others + 1)

    def _craft(self, start: dict, honest: dict, others: dict) -> dict:
        model = self.model_factory()
        start = {**{k: v for k, v in model.state_dict().items() if k not in start}, **start}  # integer buffers too
        delta = {k: honest[k].clone().requires_grad_(True) for k in honest}
        norm = _norm(honest)
        radius = self.budget * norm
        rms = norm / max(sum(v.numel() for v in honest.values()), 1) ** 0.5
        optimizer = torch.optim.Adam(list(delta.values()), lr=self.step_size * rms if rms > 0 else 1e-8)
        for _ in range(self.steps if radius > 0 else 0):
            optimizer.zero_grad()
            (-self.surrogate(model, start, delta, others)).backward()
            optimizer.step()
            with torch.no_grad():
                self.project(delta, honest)
        return {k: v.detach() for k, v in delta.items()}

    def project(self, delta: dict, honest: dict) -> None:
        """Onto ‖Δ − Δ_h‖ ≤ β ‖Δ_h‖, in place (after every Adam step)."""
        radius = self.budget * _norm(honest)
        gap = {k: delta[k] - honest[k] for k in delta}
        distance = _norm(gap)
        if distance > radius:
            for k in delta:
                delta[k].copy_(honest[k] + gap[k] * (radius / distance))


def _norm(arrays: dict) -> float:
    """‖·‖ of the tensors of ``arrays`` as one vector."""
    return float(torch.sqrt(sum((v ** 2).sum() for v in arrays.values())))
