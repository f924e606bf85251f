"""What a run needs besides A_t to continue: the server's state as data (no pickle).

A checkpoint saves the inner strategy (FedAdam/FedYogi/FedAdagrad moments ``m_t``,
``v_t``, FedAvgM's momentum, the ``current_arrays`` of the server optimizers, QFedAvg and
the DP wrappers, the adaptive clipping norm, and the wrapped strategy of a DP wrapper), the
sampler (a value-weighted sampler's totals and its flagging rule), the claim review (each
client's last claim), the pending first-order check and the global random state Flower's
randomized strategies draw from. :func:`capture` turns them into data
(:mod:`fedvalue.run.state_codec`); :func:`restore` applies saved data to the objects a resumed
run built afresh from its configuration. Nothing is ever constructed from a saved name,
so resuming executes no code from the run directory.

What is saved of an object:

- an object with ``state_dict()`` and ``load_state_dict(state)`` methods (torch's and
  Opacus' convention; a user's strategy can add them) saves what ``state_dict()``
  returns and is restored by ``load_state_dict``;
- any other object saves every instance attribute that is data (numbers, strings, numpy
  arrays, Flower ArrayRecords, numpy Generators, containers of them) and, recursively,
  the attributes of the objects it holds; functions, methods and classes are its
  configuration and are taken from the object built afresh;
- anything else (a lock, a file, a C object without a state) cannot be saved as data:
  checkpointing is then refused with a message naming the attribute
  (:class:`StateNotCaptured`); give the class ``state_dict``/``load_state_dict`` or run
  with ``checkpoint=False``.

A restored object must be of the class that was saved, attribute by attribute.
"""

from __future__ import annotations

import functools
import random
import types
from collections.abc import Mapping

import sys

import numpy as np
from flwr.app import Array, ArrayRecord

from fedvalue.run.state_codec import Extension, ObjectState, decode, encode

#: Nested objects followed from the top (a strategy inside a DP wrapper inside ...).
MAX_OBJECT_DEPTH = 16
_CONFIGURATION = (types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.BuiltinMethodType,
                  functools.partial, type, types.ModuleType, staticmethod, classmethod)


class StateNotCaptured(TypeError):
    """A part of the server's state that cannot be saved as data."""


def _array_record(record: ArrayRecord) -> dict:
    return {key: array.numpy() for key, array in record.items()}


def _from_array_record(data: object) -> ArrayRecord:
    if not isinstance(data, dict) or not all(isinstance(v, np.ndarray) for v in data.values()):
        raise ValueError("an ArrayRecord is not a dict of arrays.")
    return ArrayRecord({str(key): Array(np.ascontiguousarray(value)) for key, value in data.items()})


def _from_tensor(data: object):
    import torch

    if not isinstance(data, np.ndarray):
        raise ValueError("a tensor is not an array.")
    return torch.from_numpy(np.array(data))


def _extensions(*, decoding: bool = False) -> tuple[Extension, ...]:
    """flwr's ArrayRecord and torch's Tensor as data. Torch's only once torch is loaded (no
    tensor exists before), or to decode a saved state (which may hold tensors)."""
    if decoding:
        import torch  # noqa: F401 - a saved state may hold tensors
    torch = sys.modules.get("torch")
    records = (Extension(ArrayRecord, "flwr.ArrayRecord", _array_record, _from_array_record),)
    if torch is None:
        return records
    return (*records,
            Extension(torch.Tensor, "torch.Tensor", lambda t: t.detach().cpu().numpy().copy(), _from_tensor))


def _type_name(value: object) -> str:
    return f"{type(value).__module__}.{type(value).__qualname__}"


def _is_data(value: object) -> bool:
    torch = sys.modules.get("torch")
    return value is None or isinstance(value, (bool, int, float, str, bytes, np.ndarray, np.generic, ArrayRecord,
                                               *(() if torch is None else (torch.Tensor,))))


def _state_of(value: object, where: str, depth: int):
    """``value`` as savable data: plain values as they are, objects as ObjectState."""
    if _is_data(value):
        return value
    if isinstance(value, (list, tuple, set, frozenset)):
        return type(value)(_state_of(v, f"{where}[{k}]", depth) for k, v in enumerate(value))
    if isinstance(value, Mapping):
        return {k: _state_of(v, f"{where}[{k!r}]", depth) for k, v in value.items()}
    if depth >= MAX_OBJECT_DEPTH:
        raise StateNotCaptured(f"{where}: objects nest deeper than {MAX_OBJECT_DEPTH} levels.")
    if isinstance(value, np.random.Generator):
        return ObjectState(_type_name(value), {"bit_generator": value.bit_generator.state})
    if isinstance(value, random.Random):
        return ObjectState(_type_name(value), {"state": value.getstate()})
    if callable(getattr(value, "state_dict", None)) and callable(getattr(value, "load_state_dict", None)):
        return ObjectState(_type_name(value), {"state_dict": _state_of(value.state_dict(), f"{where}.state_dict()",
                                                                       depth + 1)})
    attributes = getattr(value, "__dict__", None)
    if not isinstance(attributes, dict) or isinstance(value, _CONFIGURATION):
        raise StateNotCaptured(
            f"{where}: a {_type_name(value)} cannot be saved as data for resume. Give its class state_dict() and "
            "load_state_dict(state), or run with checkpoint=False.")
    return ObjectState(_type_name(value), {
        name: _state_of(v, f"{where}.{name}", depth + 1)
        for name, v in attributes.items() if not isinstance(v, _CONFIGURATION)
    })


def capture(parts: Mapping[str, object]) -> tuple[object, dict[str, np.ndarray]]:
    """The named parts of the server's state as (JSON-ready tree, arrays).

    Raises
    ------
    StateNotCaptured
        A part holds something that is not data (message names it).
    """
    state = {name: _state_of(value, name, 0) for name, value in parts.items()}
    try:
        return encode(state, extensions=_extensions())
    except TypeError as error:
        raise StateNotCaptured(f"{error} Give its class state_dict() and load_state_dict(state), or run with "
                               "checkpoint=False.") from None


def load(tree: object, arrays: Mapping[str, np.ndarray]) -> dict:
    """The saved parts (plain values and ObjectStates); ValueError for anything else."""
    state = decode(tree, arrays, extensions=_extensions(decoding=True))
    if not isinstance(state, dict):
        raise ValueError("the saved server state is not a mapping of its parts.")
    return state


def apply(target: object, saved: object, where: str) -> object:
    """``target`` (the object built afresh) with ``saved`` applied; plain values are returned
    as saved. ValueError when the saved state does not fit the object (:func:`check`, run
    once on the whole tree before anything is changed)."""
    check(target, saved, where)
    return _apply(target, saved, where)


def _apply(target: object, saved: object, where: str) -> object:
    """:func:`apply` of a tree :func:`check` has already passed."""
    if not isinstance(saved, ObjectState):
        return saved
    if isinstance(target, np.random.Generator):
        target.bit_generator.state = saved.attributes["bit_generator"]
    elif isinstance(target, random.Random):
        target.setstate(saved.attributes["state"])
    elif "state_dict" in saved.attributes:
        target.load_state_dict(saved.attributes["state_dict"])
    else:
        current = vars(target)
        for name, value in saved.attributes.items():
            if isinstance(value, ObjectState):
                _apply(current.get(name), value, f"{where}.{name}")
            else:
                setattr(target, name, value)
    return target


def check(target: object, saved: object, where: str) -> None:
    """ValueError unless :func:`apply` can take ``saved`` into ``target`` (the same classes,
    object by object); changes nothing."""
    if not isinstance(saved, ObjectState):
        return
    if target is None or _type_name(target) != saved.type_name:
        raise ValueError(f"{where}: the checkpoint saved a {saved.type_name[-80:]}; the resumed run has a "
                         f"{_type_name(target) if target is not None else 'None'} there.")
    if "state_dict" in saved.attributes or isinstance(target, (np.random.Generator, random.Random)):
        return
    current = vars(target)
    for name, value in saved.attributes.items():
        if not name.isidentifier() or name.startswith("__") or callable(getattr(type(target), name, None)):
            raise ValueError(f"{where}: the checkpoint sets {name[:40]!r}, which is no data attribute.")
        check(current.get(name), value, f"{where}.{name}")
