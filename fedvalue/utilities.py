"""The torch model utility's public face: everything public in
:mod:`fedvalue.scoring.torch_utilities`. Code inside fedvalue imports that module, not this one.
"""

from fedvalue.scoring.torch_utilities import (  # noqa: F401
    TorchModelUtility,
    UTILITY_METRICS,
)

__all__ = [
    "TorchModelUtility",
    "UTILITY_METRICS",
]
