"""The server's state at a checkpoint as data: a JSON tree with its arrays beside it.

Resuming a run must never execute code from the run directory, so what the server needs
to continue (the inner strategy's optimizer moments, the sampler's accumulated values, the
claim review's last claims, the pending first-order check) is saved as plain values, not
pickled. :func:`encode` turns a tree of values into JSON-ready data and a dict of arrays;
:func:`decode` turns them back, building nothing but these values:

- ``None``, ``bool``, ``int``, ``str``, ``float`` (non-finite ones tagged), ``bytes``;
- ``list``, ``tuple``, ``dict`` (any encodable hashable keys, insertion order kept),
  ``set``, ``frozenset``;
- numpy arrays (saved exactly, no object dtypes) and numpy scalars;
- :class:`ObjectState`: the attributes of an object by name, with the object's type name,
  applied to an object the caller already holds (never constructed from the name);
- values of extension types (Flower's ``ArrayRecord``, torch tensors: the caller passes
  :class:`Extension` s), each encoded as a tag and plain data.

Decoding checks every node: depth at most :data:`MAX_DEPTH`, nodes at most
:data:`MAX_NODES`, tags known, arrays present; anything else raises ValueError.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

MAX_DEPTH = 64
MAX_NODES = 1_000_000
_TAG = "$"


@dataclass
class ObjectState:
    """An object's state by attribute: ``type_name`` (module and qualified name of its
    class, checked when applied) and ``attributes`` (name -> value)."""

    type_name: str
    attributes: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Extension:
    """How values of ``kind`` are saved: ``tag``, ``to_data`` (value -> encodable value) and
    ``from_data`` (the decoded value -> the value)."""

    kind: type | tuple[type, ...]
    tag: str
    to_data: Callable[[object], object]
    from_data: Callable[[object], object]


class _Encoder:
    def __init__(self, extensions: Sequence[Extension]) -> None:
        self.extensions = list(extensions)
        self.arrays: dict[str, np.ndarray] = {}

    def encode(self, value, where: str):
        if value is None or isinstance(value, (bool, str)):
            return value
        if isinstance(value, int) and not isinstance(value, np.integer):
            return value
        if isinstance(value, float):
            return value if math.isfinite(value) else {_TAG + "float": repr(value)}
        if isinstance(value, np.ndarray):
            if value.dtype.hasobject:
                raise TypeError(f"{where}: an array of Python objects cannot be saved as data.")
            key = f"a{len(self.arrays)}"
            self.arrays[key] = value
            return {_TAG + "array": key}
        if isinstance(value, np.generic):
            if value.dtype.hasobject:
                raise TypeError(f"{where}: a numpy object scalar cannot be saved as data.")
            return {_TAG + "scalar": [value.dtype.str, self.encode(value.item(), where)]}
        if isinstance(value, bytes):
            return {_TAG + "bytes": value.hex()}
        if isinstance(value, ObjectState):
            return {_TAG + "object": value.type_name,
                    "attributes": {name: self.encode(v, f"{where}.{name}") for name, v in value.attributes.items()}}
        for extension in self.extensions:
            if isinstance(value, extension.kind):
                return {_TAG + "ext": extension.tag, "data": self.encode(extension.to_data(value), where)}
        if isinstance(value, (list, tuple, set, frozenset)):
            tag = {list: "list", tuple: "tuple", set: "set", frozenset: "frozenset"}[
                next(kind for kind in (list, tuple, set, frozenset) if isinstance(value, kind))]
            return {_TAG + tag: [self.encode(v, f"{where}[{k}]") for k, v in enumerate(value)]}
        if isinstance(value, Mapping):
            return {_TAG + "dict": [[self.encode(k, f"{where} key"), self.encode(v, f"{where}[{k!r}]")]
                                    for k, v in value.items()]}
        raise TypeError(f"{where}: a {type(value).__module__}.{type(value).__qualname__} cannot be saved as data.")


def encode(value, *, extensions: Sequence[Extension] = (), where: str = "state") -> tuple[object, dict[str, np.ndarray]]:
    """(JSON-ready tree, arrays) of ``value``; TypeError naming the first part that is not data."""
    encoder = _Encoder(extensions)
    return encoder.encode(value, where), encoder.arrays


class _Decoder:
    def __init__(self, arrays: Mapping[str, np.ndarray], extensions: Sequence[Extension]) -> None:
        self.arrays = arrays
        self.extensions = {extension.tag: extension for extension in extensions}
        self.nodes = 0

    def decode(self, node, depth: int):
        self.nodes += 1
        if depth > MAX_DEPTH or self.nodes > MAX_NODES:
            raise ValueError(f"the state nests deeper than {MAX_DEPTH} levels or holds more than {MAX_NODES} values.")
        if node is None or isinstance(node, (bool, str, int, float)):
            return node
        if not isinstance(node, dict) or not any(isinstance(k, str) and k.startswith(_TAG) for k in node):
            raise ValueError(f"a state node is not tagged data: {str(node)[:60]!r}.")
        tag = next(k for k in node if k.startswith(_TAG))[1:]
        body = node[_TAG + tag]
        if tag == "float":
            if body not in ("nan", "inf", "-inf"):
                raise ValueError(f"a non-finite float is {body!r}.")
            return float(body)
        if tag == "array":
            if not isinstance(body, str) or body not in self.arrays:
                raise ValueError(f"the state names an array {str(body)[:40]!r} that was not saved.")
            return self.arrays[body]
        if tag == "scalar":
            if not (isinstance(body, list) and len(body) == 2 and isinstance(body[0], str)):
                raise ValueError("a numpy scalar is not [dtype, value].")
            dtype = np.dtype(body[0])
            if dtype.hasobject:
                raise ValueError("a numpy scalar of object dtype.")
            return dtype.type(self.decode(body[1], depth + 1))
        if tag == "bytes":
            return bytes.fromhex(body)
        if tag == "object":
            attributes = node.get("attributes")
            if not isinstance(body, str) or not isinstance(attributes, dict):
                raise ValueError("an object's state is not {type name, attributes}.")
            return ObjectState(body, {str(k): self.decode(v, depth + 1) for k, v in attributes.items()})
        if tag == "ext":
            if body not in self.extensions:
                raise ValueError(f"the state holds a value of unknown kind {str(body)[:40]!r}.")
            return self.extensions[body].from_data(self.decode(node.get("data"), depth + 1))
        if tag in ("list", "tuple", "set", "frozenset"):
            if not isinstance(body, list):
                raise ValueError(f"a {tag} is not a list.")
            items = [self.decode(v, depth + 1) for v in body]
            return {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}[tag](items)
        if tag == "dict":
            if not isinstance(body, list) or not all(isinstance(p, list) and len(p) == 2 for p in body):
                raise ValueError("a dict is not a list of [key, value] pairs.")
            return {self.decode(k, depth + 1): self.decode(v, depth + 1) for k, v in body}
        raise ValueError(f"unknown state tag {tag[:40]!r}.")


def decode(tree, arrays: Mapping[str, np.ndarray], *, extensions: Sequence[Extension] = ()):
    """The value :func:`encode` saved; ValueError for anything it could not have written."""
    try:
        return _Decoder(arrays, extensions).decode(tree, 0)
    except (TypeError, ValueError, KeyError) as error:
        raise ValueError(f"the saved server state is not data fedvalue wrote ({error})") from None
