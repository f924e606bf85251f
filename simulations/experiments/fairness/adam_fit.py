"""Retraining with the relaxed-DP regularizer as [FAIRINFL] §6.1 trains: Adam at a learning rate of
0.001 for a stated number of epochs, instead of minimizing Eq. 10 exactly.

§6.1: "We used the Adam optimizer with a learning rate of 0.001 to train all the models. We used
γ = 1 for models requiring the regularizer parameter of fairness constraints." The paper gives no
epochs or batch size. Adam stopped after a few epochs is not at the minimizer of Eq. 10, and
where the regularizer at its minimum removes the gap whatever the training rows (SLID at γ = 1),
pruning can only be judged in the regime the paper's figures show: a model still unfair after
random pruning. θ starts from the model's own initialization (training from scratch, as the
paper's pruned models are trained), minibatches are drawn by a seeded ``torch.Generator``.
"""

from __future__ import annotations

import numpy as np
import torch

from fedvalue.utilities import BinaryScoreModel, regularized_objective
from simulations.runner import check_integer, check_number


def fit_regularized_adam(model: BinaryScoreModel, x, y, z, *, gamma: float, epochs: int, learning_rate: float = 1e-3,
                         batch_size: int = 64, seed: int = 0, start: torch.Tensor | None = None) -> torch.Tensor:
    """θ after ``epochs`` epochs of Adam on minibatches of (1/b)Σ ℓ + γ φ̂ ([FAIRINFL] Eq. 10 with
    the relaxed DP of Eq. 14 on each minibatch), from ``start`` (default the model's θ0)."""
    epochs = check_integer("epochs", epochs, 1)
    batch_size = check_integer("batch_size", batch_size, 1)
    learning_rate = check_number("learning_rate", learning_rate, low=0.0, low_open=True)
    x, y, z = np.asarray(x, dtype=np.float64), np.asarray(y), np.asarray(z)
    theta = (model.theta0 if start is None else start).detach().clone().to(torch.float64).requires_grad_(True)
    optimizer = torch.optim.Adam([theta], lr=learning_rate)
    generator = torch.Generator().manual_seed(int(seed))
    for _ in range(epochs):
        for batch in torch.randperm(len(y), generator=generator).split(batch_size):
            rows = batch.numpy()
            if len(np.unique(z[rows])) < 2:
                continue  # φ̂ compares the groups: a one-group minibatch has none
            optimizer.zero_grad()
            regularized_objective(model, x[rows], y[rows], z[rows], gamma=gamma)(theta).backward()
            optimizer.step()
    return theta.detach()
