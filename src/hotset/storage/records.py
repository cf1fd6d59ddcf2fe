"""Samples that are more than one blob, as bytes (the record format itself, encoding and
decoding, is in :mod:`hotset.codecs`): their exact size from an index, and the fields a
loader is asked for.
"""

from __future__ import annotations

from collections.abc import Iterable

from hotset.codecs import RECORD_MAGIC as MAGIC
from hotset.codecs import decode_record, encode_record, is_record
from hotset.errors import ConfigError

__all__ = ["check_fields", "decode_record", "encode_record", "is_record", "record_size"]

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
