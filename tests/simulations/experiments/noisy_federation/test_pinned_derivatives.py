"""The noisy-federation utility wrapper and RayParallelUtility hand the expansion methods the wrapped
TorchModelUtility's own derivatives (computed in this process: no Ray actor is started), so a noisy-federation run
or audit can take ``AdsSettings(method="second-order")``."""

from __future__ import annotations

import numpy as np
import torch

from fedvalue.scoring.torch_utilities import TorchModelUtility
from fedvalue.valuation.taylor import check_expandable
from simulations.experiments.noisy_federation.noisy_federation import PinnedThreads
from simulations.runner.parallel import RayParallelUtility


def test_the_wrappers_forward_the_derivatives_of_the_utility_they_wrap():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(40, 4)).astype(np.float32), rng.integers(0, 3, 40)
    inner = TorchModelUtility(model, x, y, metric="neg_loss")
    arrays = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    vector = {k: rng.normal(size=v.shape) for k, v in arrays.items()}
    for wrapper in (PinnedThreads(inner), RayParallelUtility(inner, num_workers=1)):
        check_expandable(wrapper, "second-order")
        assert wrapper.differentiable
        for k, g in wrapper.gradient(arrays).items():
            assert g.tolist() == inner.gradient(arrays)[k].tolist()
        for k, h in wrapper.hessian_vector_product(arrays, vector).items():
            assert h.tolist() == inner.hessian_vector_product(arrays, vector)[k].tolist()
    assert not PinnedThreads(TorchModelUtility(model, x, y)).differentiable  # accuracy
