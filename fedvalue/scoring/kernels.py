"""The numerical platform this process computes on: what decides how its floats round.

torch picks its CPU kernels by the processor's instruction set (``ATEN_CPU_CAPABILITY``
overrides it), matrix products go to a BLAS (MKL in the wheels; ``MKL_CBWR`` and
``MKL_ENABLE_INSTRUCTIONS`` steer its code path), numpy aggregates through its own BLAS,
and products split over threads sum in another order. Two machines that differ in any of
these round float32 training differently: the same seed then gives replies that agree to
about 1e-7 of their size, or, where rounding tips a ReLU over its kink, to about 1e-3 of
their update (docs/faults-and-audit.md, "An audit on another machine"). A run records this
description in run.json so that an auditor can tell whether training can replay bit for
bit on their machine; nothing here is compared for the verdict.
"""

from __future__ import annotations

import os
import platform as _stdlib_platform
import re

import numpy as np

#: Environment variables that change which kernels run or how many threads share a product.
KERNEL_ENVIRONMENT = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "MKL_NUM_THREADS",
                      "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE")


def _cpu_model() -> str:
    """The processor's model name (Linux: /proc/cpuinfo), else what Python's platform says."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return _stdlib_platform.processor() or "unknown"


def _torch_blas() -> str:
    """torch's BLAS and, for MKL, its version, from torch's build configuration."""
    import torch  # here, not at the top: importing strategies loads no torch

    shown = torch.__config__.show()
    blas = re.search(r"BLAS_INFO=(\w+)", shown)
    mkl = re.search(r"Math Kernel Library Version ([^\n]+?)(?:-Product| for |\n|$)", shown)
    name = blas.group(1) if blas else "unknown"
    return f"{name} {mkl.group(1).strip()}" if name == "mkl" and mkl else name


def _numpy_blas() -> str:
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return f"{blas.get('name', 'unknown')} {blas.get('version', '')}".strip()
    except (TypeError, KeyError, AttributeError, ValueError):  # numpy < 1.25 has no dicts mode
        return "unknown"


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity; elsewhere than Linux, all of them)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def kernel_platform() -> dict:
    """This process's numerical platform, as run.json records it.

    Returns
    -------
    dict
        ``cpu`` (model name), ``machine`` (architecture), ``cpu_capability`` (the
        instruction set torch's kernels use: ``DEFAULT``, ``AVX2``, ``AVX512``, ...),
        ``torch_blas`` and ``numpy_blas`` (library and version), ``torch``, ``numpy``
        and ``python`` versions, ``torch_threads`` (intra-op threads of this process),
        ``cpus`` (usable cores) and ``environment`` (the kernel-steering variables of
        :data:`KERNEL_ENVIRONMENT` that are set). Nothing volatile: two runs on one
        machine and environment record the same description.
    """
    import torch  # here, not at the top: importing strategies loads no torch

    return {
        "cpu": _cpu_model(),
        "machine": _stdlib_platform.machine(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch_blas": _torch_blas(),
        "numpy_blas": _numpy_blas(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "python": _stdlib_platform.python_version(),
        "torch_threads": torch.get_num_threads(),
        "cpus": usable_cores(),
        "environment": {name: os.environ[name] for name in KERNEL_ENVIRONMENT if name in os.environ},
    }


def platform_differences(recorded: object, here: dict) -> list[str]:
    """The entries in which a run's recorded platform and this one differ, as
    ``"name: recorded -> here"`` (every entry when none was recorded)."""
    if not isinstance(recorded, dict):
        recorded = {}
    return [f"{name}: {str(recorded.get(name))[:60]} -> {str(value)[:60]}" for name, value in here.items()
            if recorded.get(name) != value]
