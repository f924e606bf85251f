"""How the simulation engine runs the clients: :class:`EngineSettings` (CPUs and GPUs per client,
clients training at once, an existing Ray cluster), checked once when made, with the check that
a cluster's address answers; and the settings flat, as the command line and run.json name them
(:func:`flat_fields`). Starting Ray and Flower with them is :mod:`simulations.runner.engine`'s.
"""

from __future__ import annotations

import dataclasses
import socket
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

from fedvalue._checks import check_integer, check_non_negative, check_positive
from fedvalue.scoring.kernels import usable_cores

#: Longest wait for a TCP connection to ``ray_address`` before a run refuses it.
RAY_CONNECT_TIMEOUT_S = 5.0


def check_ray_address(address: str, timeout: float = RAY_CONNECT_TIMEOUT_S) -> None:
    """ValueError unless something accepts a TCP connection at ``address`` (``host:port`` or
    ``ray://host:port``) within ``timeout`` seconds; ``"auto"`` (a local cluster, found by
    Ray itself) is left to Ray. Ray would otherwise retry for minutes."""
    if not isinstance(address, str) or not address:
        raise ValueError(f"ray_address: expected a non-empty address string; got {address!r}.")
    if address == "auto":
        return
    target = address.split("://", 1)[-1]
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"ray_address: expected 'auto', 'host:port' or 'ray://host:port'; got {address!r}.")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as error:
        raise ValueError(f"ray_address: expected a Ray cluster accepting connections at {host}:{port}; nothing "
                         f"answered within {timeout:g} s ({error.strerror or error}). Start the cluster first or "
                         "leave --ray-address out.") from None


def default_max_parallel_clients(num_supernodes: int, num_cpus_per_client: float = 1, *,
                                 server_core: bool = True) -> int:
    """Clients training at once by default: the usable cores minus one for the ServerApp
    (which values each round; ``server_core=False``: no core kept for it), at least 1, at
    most ``num_supernodes``."""
    cores = usable_cores()
    usable = cores - 1 if server_core and cores > 1 else cores
    fitting = int(usable // num_cpus_per_client)
    return max(1, min(num_supernodes, fitting))


@dataclass(frozen=True)
class EngineSettings:
    """How the simulation engine runs the clients, checked once when made.

    Parameters
    ----------
    num_cpus_per_client
        Ray CPUs each client actor holds (> 0).
    num_gpus_per_client
        Ray GPUs each client actor holds (≥ 0; fractions share a GPU). Ray hides the GPUs
        from actors holding none.
    max_parallel_clients
        Clients training at once (local Ray only). None: the usable cores minus one, at
        least 1 (:func:`default_max_parallel_clients`).
    ray_address
        Attach to an existing Ray cluster (e.g. ``"auto"`` or ``"ray://host:10001"``); its
        CPUs / ``num_cpus_per_client`` then set the parallelism. None: a local Ray.
    """

    num_cpus_per_client: float = 1.0
    num_gpus_per_client: float = 0.0
    max_parallel_clients: int | None = None
    ray_address: str | None = None

    def __post_init__(self) -> None:
        check_positive("num_cpus_per_client", self.num_cpus_per_client)
        check_non_negative("num_gpus_per_client", self.num_gpus_per_client)
        check_integer("max_parallel_clients", self.max_parallel_clients, none_ok=True)
        if self.ray_address is not None and (not isinstance(self.ray_address, str) or not self.ray_address):
            raise ValueError(f"ray_address: expected a non-empty address string or None; got {self.ray_address!r}.")
        if self.ray_address is not None and self.max_parallel_clients is not None:
            raise ValueError(
                "max_parallel_clients: cannot be set with ray_address (an existing cluster's CPUs fix the "
                "number of actors); set num_cpus_per_client instead."
            )


class FlatField(NamedTuple):
    """One setting as the command line and run.json name it: a config's own field, or one field of
    its :class:`EngineSettings` (``default``: the config's default for it; ``hint``: its type)."""

    name: str
    default: object
    hint: object


def engine_field(config_cls: type) -> dataclasses.Field | None:
    """The field of a config dataclass holding its :class:`EngineSettings` (None: it has none)."""
    return next((f for f in dataclasses.fields(config_cls) if isinstance(f.default, EngineSettings)), None)


def flat_fields(config_cls: type) -> tuple[FlatField, ...]:
    """A config's settings flat, as its command-line options and its run.json have them: its
    :class:`EngineSettings` field replaced, where it stands, by the engine settings the config names
    in ``ENGINE_KEYS`` (all of them when it names none). A config's own field listed in
    ``ENGINE_KEYS`` is placed there (noisy-clients' ``device`` sits among the engine settings in
    its run.json, whose bytes start a run's hash chain and so cannot move)."""
    hints = {**typing.get_type_hints(EngineSettings), **typing.get_type_hints(config_cls)}
    nested = engine_field(config_cls)
    own = {f.name: FlatField(f.name, f.default, hints[f.name]) for f in dataclasses.fields(config_cls)}
    if nested is None:
        return tuple(own.values())
    keys = engine_keys(config_cls)
    engine = {f.name: FlatField(f.name, getattr(nested.default, f.name), hints[f.name])
              for f in dataclasses.fields(EngineSettings)}
    flat: list[FlatField] = []
    for name, field in own.items():
        if name == nested.name:
            flat.extend(engine.get(key) or own[key] for key in keys)
        elif name not in keys:
            flat.append(field)
    return tuple(flat)


def engine_keys(config_cls: type) -> tuple[str, ...]:
    """The flat names a config writes its engine settings under (its ``ENGINE_KEYS``)."""
    return getattr(config_cls, "ENGINE_KEYS", tuple(f.name for f in dataclasses.fields(EngineSettings)))


def flat_settings(config) -> dict:
    """A config as run.json writes it (:func:`flat_fields`' names and order): ``dataclasses.asdict``
    with the engine settings flat where the engine field stands."""
    settings = dataclasses.asdict(config)
    nested = engine_field(type(config))
    if nested is None:
        return settings
    engine = settings.pop(nested.name)
    return {f.name: engine[f.name] if f.name in engine else settings[f.name] for f in flat_fields(type(config))}


def nest_settings(config_cls: type, flat: Mapping[str, object]) -> dict[str, object]:
    """The keywords of ``config_cls`` from flat settings (names of :func:`flat_fields`): the engine
    settings gathered into its :class:`EngineSettings` (the config's default for one absent), checked
    as that makes them."""
    nested = engine_field(config_cls)
    if nested is None:
        return dict(flat)
    names = {f.name for f in dataclasses.fields(EngineSettings)}
    keywords = {name: value for name, value in flat.items() if name not in names}
    keywords[nested.name] = dataclasses.replace(nested.default, **{n: v for n, v in flat.items() if n in names})
    return keywords


def check_engine_keys(config) -> None:
    """A config's engine settings that its run.json does not record (not in its ``ENGINE_KEYS``)
    must keep the config's default: a resumed or audited run could not know them."""
    nested = engine_field(type(config))
    if nested is None:
        return
    keys = engine_keys(type(config))
    for f in dataclasses.fields(EngineSettings):
        value, default = getattr(getattr(config, nested.name), f.name), getattr(nested.default, f.name)
        if f.name not in keys and value != default:
            raise ValueError(f"{f.name}: this simulation does not take it (its run.json does not record it); "
                             f"expected {default!r}, got {value!r}.")
