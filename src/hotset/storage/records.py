"""Samples that are more than one blob, as bytes: a WebDataset group (``jpg`` + ``cls``),
a table row, a torch Dataset's item.

A record is ``MAGIC`` + one msgpack value (msgspec): maps, lists, numbers, strings and
bytes as msgpack has them, arrays and tensors as an extension holding ``.npy`` bytes.
Nothing is pickled, so a cache entry can never run code when it is read back.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec
import numpy as np

from hotset.codecs import RECORD_MAGIC as MAGIC
from hotset.codecs import decode_array, npy_bytes
from hotset.errors import ConfigError

_ARRAY = 1


def _plain(obj: Any) -> Any:
    """What msgpack cannot hold as it is: arrays, tensors, PIL images, numpy scalars."""
    if isinstance(obj, np.ndarray):
        return msgspec.msgpack.Ext(_ARRAY, npy_bytes(obj))
    if isinstance(obj, np.generic):
        return obj.item()
    module = type(obj).__module__
    if module.startswith("torch"):
        return msgspec.msgpack.Ext(_ARRAY, npy_bytes(obj.detach().cpu().numpy()))
    if module.startswith("PIL"):  # C x H x W, as decode_image gives it
        arr = np.asarray(obj)
        return msgspec.msgpack.Ext(_ARRAY, npy_bytes(arr[None] if arr.ndim == 2 else
                                                     arr.transpose(2, 0, 1)))  # fmt: skip
    raise TypeError(
        f"cannot serialise a {type(obj).__qualname__} in a sample (arrays, tensors, PIL "
        "images, numbers, strings, bytes, lists, tuples and dicts can be)"
    )


def _ext(code: int, data: memoryview) -> Any:
    if code != _ARRAY:
        raise ValueError(f"unknown record extension {code}")
    return decode_array(bytes(data))


_ENCODER = msgspec.msgpack.Encoder(enc_hook=_plain)
_DECODER = msgspec.msgpack.Decoder(ext_hook=_ext)


def is_record(data: bytes) -> bool:
    return data[:4] == MAGIC


def encode_record(value: Any) -> bytes:
    """A sample (a dict of fields, a tuple, an array, ...) as record bytes."""
    return MAGIC + _ENCODER.encode(value)


def decode_record(data: bytes) -> Any:
    """The value of record bytes (tuples come back as lists)."""
    if not is_record(data):
        raise ValueError("not a hotset record (bad magic)")
    return _DECODER.decode(memoryview(data)[len(MAGIC) :])


def _length_head(n: int, fixed_below: int) -> int:
    """Bytes of a msgpack length header: 1 below ``fixed_below`` (fixmap, fixstr), then
    the 8-, 16- and 32-bit forms."""
    if n < fixed_below:
        return 1
    return 2 if n < 1 << 8 else 3 if n < 1 << 16 else 5


def record_size(fields: Iterable[tuple[str, int]]) -> int:
    """The exact size of ``encode_record({name: bytes of length n, ...})``, known from an
    index before any payload is read."""
    fields = list(fields)
    n = len(fields)
    size = len(MAGIC) + (1 if n < 16 else 3 if n < 1 << 16 else 5)
    for name, length in fields:
        name_len = len(name.encode())
        size += _length_head(name_len, 32) + name_len + _length_head(length, 0) + length
    return size


Fields = str | tuple[str, ...]


def check_fields(name: str, value: str | Iterable[str] | None, fields: list[str], where: str):
    """``value`` of the argument ``name`` (one field, or several: a tuple) once each of its
    fields is one of ``fields`` (``where`` holds them); None as it is."""
    if value is None or isinstance(value, str):
        wanted: tuple[str, ...] = () if value is None else (value,)
    else:
        wanted = tuple(value)
        if not wanted or not all(isinstance(f, str) for f in wanted):
            raise ConfigError(f"{name}={value!r}: a field's name, or a list of them")
    missing = [f for f in wanted if f not in fields]
    if missing:
        raise ConfigError(f"{name}={value!r}: no field {missing[0]!r}; {where} are {fields}")
    return value if value is None or isinstance(value, str) else wanted
