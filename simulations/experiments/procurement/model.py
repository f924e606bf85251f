"""The stand-in for the paper's LLMs: a small torch regressor of ratings on profiles.

[ADS] §6.3 fine-tunes LLaMA / Qwen models to rate products; here a one-hidden-layer MLP
over the 12 attribute indicators plays that part, with the same protocol: it is first fit
to a biased rating behaviour, then fine-tuned stage by stage from its current state, and
judged by the part-worths OLS recovers from its predicted ratings (AvgErr). It implements
:class:`fedvalue.analysis.staged_procurement.Learner`: its state is its ``state_dict`` as numpy arrays.

Fine-tuning is deterministic: minibatch order and the initial weights come from a
``torch.Generator`` seeded by the caller, a fresh Adam optimizer per fine-tune (as a
fine-tuning job starts its own optimizer), and torch runs on one thread inside each call
(the caller's setting restored after): the model is tiny, so one thread is also the
fastest on a shared 2-core machine, and it fixes the reduction order (same seed, same bytes).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from fedvalue import Arrays
from simulations.experiments.procurement.conjoint import (
    NUM_ATTRIBUTES,
    NUM_LEVELS,
    average_error,
    one_hot,
    part_worths_ols,
)
from simulations.runner import torch_threads

#: Ratings live in [0, 100]; the network predicts rating / RATING_SCALE.
RATING_SCALE = 100.0


def one_thread():
    """torch on one thread inside the block; the caller's thread count restored after."""
    return torch_threads(1)


@dataclass(frozen=True)
class RatingMLP:
    """Rating regressor 12 → ``hidden`` → 1 (ReLU), trained by minibatch Adam on squared error.

    A dataset is ``(profiles, ratings)``: an (n, 3) array of level indices and n ratings.
    """

    hidden: tuple[int, ...] = (32,)
    epochs: int = 5
    learning_rate: float = 0.01
    batch_size: int = 16

    def num_steps(self, num_examples: int) -> int:
        """Optimizer steps of a fine-tune on ``num_examples``: epochs × ⌈n / batch⌉ (epochs when
        full batch), so with minibatches a coalition of more offers is trained for more steps."""
        if num_examples == 0:
            return 0
        batch = self.batch_size or num_examples
        return self.epochs * -(-num_examples // batch)

    def _module(self) -> torch.nn.Sequential:
        layers: list[torch.nn.Module] = []
        width = NUM_ATTRIBUTES * NUM_LEVELS
        for size in self.hidden:
            layers += [torch.nn.Linear(width, size), torch.nn.ReLU()]
            width = size
        layers.append(torch.nn.Linear(width, 1))
        return torch.nn.Sequential(*layers)

    def initial_state(self, seed: int) -> Arrays:
        """Freshly initialized weights (torch's default init, drawn from a seeded generator)."""
        generator = torch.Generator().manual_seed(int(seed))
        module = self._module()
        with torch.no_grad():
            for parameter in module.parameters():
                bound = 1.0 / np.sqrt(parameter.shape[-1] if parameter.ndim > 1 else len(parameter))
                parameter.uniform_(-bound, bound, generator=generator)
        return _arrays(module)

    def fine_tune(self, state: Mapping[str, np.ndarray], datasets: Sequence[tuple[np.ndarray, np.ndarray]], *,
                  seed: int) -> Arrays:
        """``state`` fine-tuned on the union of ``datasets`` for ``epochs`` epochs (pure)."""
        if len(datasets) == 0:
            return {k: v.copy() for k, v in state.items()}
        profiles = np.concatenate([np.asarray(p) for p, _ in datasets])
        ratings = np.concatenate([np.asarray(r, dtype=np.float64) for _, r in datasets])
        inputs = torch.from_numpy(one_hot(profiles))
        targets = torch.from_numpy((ratings / RATING_SCALE).astype(np.float32)).unsqueeze(1)
        module = self._module()
        module.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in state.items()})
        optimizer = torch.optim.Adam(module.parameters(), lr=self.learning_rate)
        generator = torch.Generator().manual_seed(int(seed))
        batch = self.batch_size or len(inputs)
        with one_thread():
            for _ in range(self.epochs):
                order = torch.randperm(len(inputs), generator=generator)
                for start in range(0, len(inputs), batch):
                    rows = order[start:start + batch]
                    optimizer.zero_grad(set_to_none=True)
                    loss = torch.nn.functional.mse_loss(module(inputs[rows]), targets[rows])
                    loss.backward()
                    optimizer.step()
        return _arrays(module)

    def predict(self, state: Mapping[str, np.ndarray], inputs: np.ndarray) -> np.ndarray:
        """Predicted ratings (float64) of the profiles ``inputs`` ((n, 3) level indices)."""
        module = self._module()
        module.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in state.items()})
        with torch.no_grad(), one_thread():
            output = module(torch.from_numpy(one_hot(inputs)))
        return output.squeeze(1).double().numpy() * RATING_SCALE


def _arrays(module: torch.nn.Module) -> Arrays:
    return {k: v.detach().numpy().copy() for k, v in module.state_dict().items()}


@dataclass(frozen=True)
class NegativeAverageError:
    """U(state) = −AvgErr of the part-worths OLS recovers from the model's ratings of ``profiles``.

    ``profiles`` is the evaluation design (all 64 profiles × 5 ratings, App. C.3);
    ``true_part_worths`` the true generator's (3, 4) part-worths.
    """

    learner: RatingMLP
    profiles: np.ndarray
    true_part_worths: np.ndarray

    def average_error(self, state: Mapping[str, np.ndarray]) -> float:
        estimated = part_worths_ols(self.profiles, self.learner.predict(state, self.profiles))
        return average_error(estimated, self.true_part_worths)

    def __call__(self, state: Mapping[str, np.ndarray]) -> float:
        return -self.average_error(state)
