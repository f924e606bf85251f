"""Checks and round trips shared by the simulations' config dataclasses.

Every simulation checks its whole configuration before anything is written or started;
an error names the field, what was expected and what was got. A configuration saved in
a run's ``run.json`` comes back as the same dataclass (JSON lists become tuples again).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from fedvalue._checks import check_integer, check_number


def check_integers(config: object, names: Iterable[str], *, minimum: int = 1) -> None:
    """Each field in ``names`` is an int ≥ ``minimum`` (bools refused)."""
    for name in names:
        check_integer(name, getattr(config, name), minimum)


def check_numbers(config: object, names: Iterable[str], *, zero_ok: bool = False) -> None:
    """Each field in ``names`` is a finite number > 0 (≥ 0 with ``zero_ok``; bools refused)."""
    for name in names:
        check_number(name, getattr(config, name), low=0.0, low_open=not zero_ok)


def check_devices(device: object, num_gpus_per_client: float, *, ray_address: str | None = None) -> None:
    """``device`` is a torch device this machine has (``"cpu"``, ``"cuda"``, ``"cuda:1"``, ...), and
    GPUs per client are asked for only where there are GPUs (Ray would wait for them forever);
    on an existing Ray cluster (``ray_address``) the cluster's GPUs count, not this machine's. A CUDA
    ``device`` trains the clients on the GPU too (:func:`clients_device`), which needs GPU shares."""
    import torch

    try:
        parsed = torch.device(device) if isinstance(device, str) else None
    except RuntimeError:
        parsed = None
    if parsed is None:
        raise ValueError(f"device: expected a torch device such as 'cpu', 'cuda' or 'cuda:0'; got {device!r}.")
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if parsed.type == "cuda" and (parsed.index or 0) >= visible:
        raise ValueError(f"device: {device!r} asked for, but this machine has {visible} CUDA device(s); use 'cpu'.")
    if parsed.type not in ("cpu", "cuda"):
        raise ValueError(f"device: expected 'cpu' or a CUDA device; got {device!r}.")
    if num_gpus_per_client > 0 and not ray_address and visible == 0:
        raise ValueError(f"num_gpus_per_client: {num_gpus_per_client} GPUs per client asked for, but this machine "
                         "has no CUDA device (Ray would wait for one forever); use 0.")
    check_gpu_shares(device, num_gpus_per_client)


def check_gpu_shares(device: str, num_gpus_per_client: float, *, name: str = "num_gpus_per_client",
                     subject: str = "", instead: str = "use device 'cpu'") -> None:
    """Clients training on a CUDA ``device`` hold Ray GPU shares: Ray sets ``CUDA_VISIBLE_DEVICES=''`` for a client
    holding none, so it would see no GPU. ValueError naming ``name`` otherwise (``subject``: who trains there, said
    first; ``instead``: the other way out)."""
    import torch

    if torch.device(device).type == "cuda" and num_gpus_per_client == 0:
        subject = subject or f"device {device!r} trains the clients on the GPU too, which needs"
        raise ValueError(f"{name}: {subject} Ray GPU shares (Ray hides the GPUs from a client holding none); got 0. "
                         f"Give a share, e.g. 0.1 (ten clients share a GPU), or {instead}.")


#: The one utility the round game's expansions can differentiate (accuracy's gradient is zero).
DIFFERENTIABLE_UTILITY = "neg_loss"


def fixed_second_order_asked(fixed_second_order: object, utility: str, remedy: str) -> bool:
    """Whether a run asks for the fixed-weight game's second-order book (``fixed_second_order``: true or false),
    refused (ValueError naming it, ``remedy`` at the end) without the differentiable utility it expands."""
    if not isinstance(fixed_second_order, bool):
        raise ValueError(f"fixed_second_order: expected true or false; got {fixed_second_order!r}.")
    if fixed_second_order and utility != DIFFERENTIABLE_UTILITY:
        raise ValueError(f"fixed_second_order: expected utility={DIFFERENTIABLE_UTILITY!r}, the differentiable "
                         f"utility the second-order expansion of the fixed-weight round game needs; got "
                         f"utility={utility!r}. {remedy}")
    return fixed_second_order


def clients_device(device: str) -> str:
    """The device the clients of a run on ``device`` train on: ``"cuda"`` for a CUDA device (in a Ray worker
    the GPU of its share is its cuda:0, whatever the server's index), else ``"cpu"``."""
    import torch

    return "cuda" if torch.device(device).type == "cuda" else "cpu"


def saved_config(config_cls: type, saved: Mapping, *, strict: bool = True, source: str = "the saved settings"):
    """``config_cls`` rebuilt from a saved mapping (``run.json``, named ``source`` in errors):
    tuple fields from JSON lists; a field missing from ``saved`` is an error when
    ``strict``, else its default. A field the config lists in ``OPTIONAL_KEYS`` is its default
    when missing, even when ``strict``: a run that does not use it does not write it. The engine
    settings are read flat, as run.json has them (:func:`~simulations.runner.engine_settings.flat_fields`)."""
    from simulations.runner.engine_settings import flat_fields, nest_settings

    optional = getattr(config_cls, "OPTIONAL_KEYS", ())
    values = {}
    for field in flat_fields(config_cls):
        if field.name not in saved:
            if strict and field.name not in optional:
                raise ValueError(f"resume: {source} lacks the setting {field.name!r}; it was not written by this "
                                 "version.")
            continue
        value = saved[field.name]
        if field.default is None and (value == "" or value == 0) and not isinstance(value, bool):
            value = None  # a run written when an empty string or zero stood for "none"
        values[field.name] = tuple(value) if isinstance(field.default, tuple) else value
    return config_cls(**nest_settings(config_cls, values))


def saved_run_config(run_dir: str) -> dict | None:
    """The configuration in ``run_dir``/run.json (None when there is none; ValueError when it
    is not a JSON object or not a regular file), read through :mod:`fedvalue.run.rundir`."""
    from fedvalue.run.run_info import read_run_config
    from fedvalue.run.rundir import RunDir
    from fedvalue.schema import RUN_CONFIG_FILE

    try:
        run = RunDir(run_dir)
    except FileNotFoundError:
        return None
    with run:
        return read_run_config(run) if run.exists(RUN_CONFIG_FILE) else None


