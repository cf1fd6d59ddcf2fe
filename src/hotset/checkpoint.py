"""A loader's state in the types ``torch.load(weights_only=True)`` accepts.

torch's default ``weights_only=True`` refuses numpy arrays, ``array.array``, RNG states
and any class, so a checkpoint holding ``loader.state_dict()`` would not load without
``weights_only=False`` (which runs whatever the file names). ``to_safe`` writes the state
as dicts, lists, tuples, scalars, strings and uint8 tensors only, with each non-plain
value as a tagged dict; ``from_safe`` turns the tags back into objects, building only the
classes listed here (a crafted checkpoint cannot name another one).
"""

from __future__ import annotations

import random
from array import array
from collections import OrderedDict, deque
from typing import Any

import numpy as np
import torch

from hotset.errors import ConfigError

TAG = "__hotset__"
_PLAIN = (str, int, float, bool, type(None))
_BIT_GENERATORS = ("PCG64", "PCG64DXSM", "Philox", "SFC64", "MT19937")
_REGISTERED: dict[str, type] = {}


def register_state_class(cls: type) -> type:
    """Let a state hold instances of ``cls`` (a class of your own sampler or policy):
    saved as its ``vars`` (or what its ``__getstate__`` gives), rebuilt without
    ``__init__`` (by its ``__setstate__``, if it has one). Usable as a decorator."""
    _REGISTERED[cls.__name__] = cls
    return cls


def _classes() -> dict[str, type]:
    """The state-holding classes a state may contain (vars saved, rebuilt without
    ``__init__``): hotset's, and those registered."""
    from hotset.importance.elastic import RatioController
    from hotset.importance.graph import GraphImportance
    from hotset.importance.scoreboard import ScoreBoard
    from hotset.policy.compiled_heap import CompiledHeap
    from hotset.policy.icache_lists import LoadOrder, RandomPool, UseOrder
    from hotset.policy.keyed_heap import KeyedHeap
    from hotset.sampling.coverage import Coverage
    from hotset.sampling.draw import ShuffledAsRead

    ours = (KeyedHeap, ScoreBoard, Coverage, RatioController, GraphImportance, ShuffledAsRead,
            RandomPool, UseOrder, LoadOrder, CompiledHeap)  # fmt: skip
    return {**_REGISTERED, **{c.__name__: c for c in ours}}


def _raw(data: bytes | np.ndarray) -> torch.Tensor:
    """Bytes as a uint8 tensor (torch pickles an empty ``bytes`` as a call it refuses)."""
    return torch.from_numpy(np.frombuffer(data, np.uint8).copy())


def to_safe(obj: Any, path: str = "state") -> Any:
    """``obj`` as plain containers, scalars, strings and uint8 tensors (a copy); a value
    of another type raises ``ConfigError`` naming where it is."""
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, _PLAIN):
        return obj
    if isinstance(obj, OrderedDict | deque):  # (a recency order, a CLOCK's ring)
        kind = "ordered" if isinstance(obj, OrderedDict) else "deque"
        items = list(obj.items()) if kind == "ordered" else list(obj)
        return {TAG: kind, "items": to_safe(items, path),
                "maxlen": getattr(obj, "maxlen", None)}  # fmt: skip
    if isinstance(obj, dict):
        for k in obj:
            if not isinstance(k, _PLAIN):
                raise ConfigError(f"{path}: a key of type {type(k).__name__} cannot be saved")
        return {k: to_safe(v, f"{path}.{k}") for k, v in obj.items()}
    if isinstance(obj, list):
        return [to_safe(v, f"{path}[{n}]") for n, v in enumerate(obj)]
    if isinstance(obj, tuple):
        return tuple(to_safe(v, f"{path}[{n}]") for n, v in enumerate(obj))
    if isinstance(obj, bytes):
        return {TAG: "bytes", "data": _raw(obj)}
    if isinstance(obj, set):
        return {TAG: "set", "items": [to_safe(v, f"{path}{{}}") for v in obj]}
    if isinstance(obj, np.ndarray):
        if obj.dtype.hasobject:
            raise ConfigError(f"{path}: an array of Python objects cannot be saved")
        return {TAG: "ndarray", "dtype": obj.dtype.str, "shape": list(obj.shape),
                "data": _raw(np.ascontiguousarray(obj).tobytes())}  # fmt: skip
    if isinstance(obj, array):
        return {TAG: "array", "typecode": obj.typecode, "data": _raw(obj.tobytes())}
    if isinstance(obj, random.Random):
        return {TAG: "random", "state": to_safe(obj.getstate(), path)}
    if isinstance(obj, np.random.Generator):
        bits = obj.bit_generator
        return {TAG: "generator", "bits": type(bits).__name__, "state": to_safe(bits.state)}
    if type(obj).__name__ == "Index" and type(obj).__module__ == "hnswlib":
        return {TAG: "hnswlib", "state": to_safe(obj.__getstate__()[0], f"{path}.index")}
    name = type(obj).__name__
    if _classes().get(name) is type(obj):
        own = type(obj).__getstate__ is not object.__getstate__
        return {TAG: "object", "class": name,
                "vars": to_safe(obj.__getstate__() if own else vars(obj), path)}  # fmt: skip
    raise ConfigError(f"{path}: a {type(obj).__module__}.{name} cannot be saved in a state")


def from_safe(obj: Any) -> Any:
    """The objects ``to_safe`` wrote (a state written before it, with the objects
    themselves, passes through unchanged)."""
    if isinstance(obj, list):
        return [from_safe(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(from_safe(v) for v in obj)
    if not isinstance(obj, dict):
        return obj
    kind = obj.get(TAG)
    if kind is None:
        return {k: from_safe(v) for k, v in obj.items()}
    if kind == "bytes":
        return obj["data"].numpy().tobytes()
    if kind == "set":
        return {from_safe(v) for v in obj["items"]}
    if kind == "ordered":
        return OrderedDict((from_safe(k), from_safe(v)) for k, v in obj["items"])
    if kind == "deque":
        return deque(from_safe(obj["items"]), maxlen=obj["maxlen"])
    if kind == "ndarray":
        data = obj["data"].numpy().view(np.dtype(obj["dtype"]))
        return data.reshape(obj["shape"]).copy()  # writable, not a view of the file
    if kind == "array":
        out = array(obj["typecode"])
        out.frombytes(obj["data"].numpy().tobytes())
        return out
    if kind == "random":
        rng = random.Random()
        rng.setstate(from_safe(obj["state"]))
        return rng
    if kind == "generator" and obj["bits"] in _BIT_GENERATORS:
        bits = getattr(np.random, obj["bits"])()
        bits.state = from_safe(obj["state"])
        return np.random.Generator(bits)
    if kind == "hnswlib":
        import hnswlib

        index = hnswlib.Index.__new__(hnswlib.Index)
        index.__setstate__((from_safe(obj["state"]),))
        return index
    cls = _classes().get(obj.get("class")) if kind == "object" else None
    if cls is None:
        raise ConfigError(f"a saved state names {kind!r} {obj.get('class', '')}: not one "
                          "hotset writes; was this state saved by hotset?")  # fmt: skip
    out = cls.__new__(cls)
    state = from_safe(obj["vars"])
    if not isinstance(state, dict):
        raise ConfigError(f"a saved {cls.__name__} holds a {type(state).__name__}, not its vars")
    if hasattr(out, "__setstate__"):
        out.__setstate__(state)
    else:
        vars(out).update(state)
    return out
