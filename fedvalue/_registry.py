"""A registry of named plug-ins, in the order they were registered: the round's book kinds
(:mod:`fedvalue.rounds.kinds.registry`) and the strategy's hooks beside them (:mod:`strategies.hooks.registry`)
are two of them, so that registering, replacing and removing a plug-in read and fail the same way
(Opacus's ``register_accountant``/``create_accountant``: one error naming what is registered)."""

from __future__ import annotations

from collections.abc import Callable


class Registry(dict):
    """name -> factory, in registration order; ``what`` names a plug-in in the errors ("round book kind")
    and ``signature`` what its factory must be ("RoundContext -> RoundBook | None")."""

    def __init__(self, what: str, signature: str, plugins: dict[str, Callable] | None = None) -> None:
        super().__init__(plugins or {})
        self.what, self.signature = what, signature

    def register(self, name: str, factory: Callable, *, replace: bool = False) -> None:
        """Register ``factory`` as ``name`` (after every plug-in registered before it); ValueError for a
        name that is no identifier or is taken (unless ``replace``), TypeError for a factory that is not
        callable."""
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"name: expected a {self.what}'s name (an identifier); got {name!r}.")
        if not callable(factory):
            raise TypeError(f"factory: expected a callable {self.signature}; got {type(factory).__name__}.")
        if name in self and not replace:
            raise ValueError(f"name: a {self.what} {name!r} is registered already; pass replace=True to replace it.")
        self[name] = factory

    def named(self, name: str) -> Callable:
        """The factory registered as ``name``; ValueError naming the registered ones for any other."""
        if name not in self:
            raise ValueError(f"name: expected a registered {self.what}, one of {list(self)}; got {name!r}.")
        return self[name]

    def unregister(self, name: str) -> None:
        """Remove ``name`` (ValueError naming the registered ones for an unknown name)."""
        self.named(name)
        del self[name]
