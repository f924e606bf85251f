"""Checks and round trips shared by the simulations' config dataclasses.

Every simulation checks its whole configuration before anything is written or started;
an error names the field, what was expected and what was got. A configuration saved in
a run's ``run.json`` comes back as the same dataclass (JSON lists become tuples again).
"""

from __future__ import annotations

import dataclasses
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


def saved_config(config_cls: type, saved: Mapping, *, strict: bool = True, source: str = "the saved settings"):
    """``config_cls`` rebuilt from a saved mapping (``run.json``, named ``source`` in errors):
    tuple fields from JSON lists; a field missing from ``saved`` is an error when
    ``strict``, else its default."""
    values = {}
    for field in dataclasses.fields(config_cls):
        if field.name not in saved:
            if strict:
                raise ValueError(f"resume: {source} lacks the setting {field.name!r}; it was not written by this "
                                 "version.")
            continue
        value = saved[field.name]
        values[field.name] = tuple(value) if isinstance(field.default, tuple) else value
    return config_cls(**values)
