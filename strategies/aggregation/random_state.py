"""The global random state a Flower strategy can draw from, captured and put back: randomized
strategies (DP Gaussian noise, adaptive clipping's noised count) draw from numpy's global
generator, so a round's counterfactual coalitions, its live aggregation, its replay by the audit
and a resumed run all start from the state the round found (common random numbers)."""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RandomState:
    """The global random state a strategy can draw from: numpy's legacy global generator,
    Python's ``random``, torch's CPU generator and (when initialized) its CUDA generators.

    Torch's only once something imported torch (nothing can draw from it before): the Flower
    adapter itself does not import it, so a server without torch does not load it."""

    numpy: tuple
    python: tuple
    torch_cpu: object | None
    torch_cuda: tuple | None

    @classmethod
    def capture(cls) -> RandomState:
        torch = sys.modules.get("torch")
        if torch is None:
            return cls(np.random.get_state(), random.getstate(), None, None)
        cuda = tuple(torch.cuda.get_rng_state_all()) if torch.cuda.is_initialized() else None
        return cls(np.random.get_state(), random.getstate(), torch.get_rng_state(), cuda)

    def restore(self) -> None:
        """Put this state back as the global one."""
        np.random.set_state(self.numpy)
        random.setstate(self.python)
        if self.torch_cpu is None:
            return
        import torch

        torch.set_rng_state(self.torch_cpu)
        if self.torch_cuda is not None:
            torch.cuda.set_rng_state_all(list(self.torch_cuda))

    @contextmanager
    def replayed(self) -> Iterator[None]:
        """Run the block from this state; the state found before it is put back after."""
        found = RandomState.capture()
        self.restore()
        try:
            yield
        finally:
            found.restore()
