"""Files of numpy columns that every process of a node maps read-only (a manifest's, a tar
set's index): ``MAGIC`` and the header's length, a JSON header naming each column's
dtype, shape and offset, then each column at a 64-byte boundary."""

from __future__ import annotations

import json
import mmap
import os
import struct
from pathlib import Path

import numpy as np

from hotset.errors import ConfigError

MAGIC = b"HOTSETC1"

#: a column's dtype and shape
Spec = tuple[np.dtype | type, tuple[int, ...]]


def _layout(columns: dict[str, Spec], header: dict) -> tuple[bytes, int]:
    """The header's bytes (``header`` and each column's place) and the file's size."""
    places, offset = {}, 0
    for k, (dtype, shape) in columns.items():
        dtype = np.dtype(dtype)
        places[k] = [dtype.str, [int(d) for d in shape], offset]
        offset += -(-dtype.itemsize * int(np.prod(shape)) // 64) * 64
    head = json.dumps({**header, "columns": places}).encode()
    return head, _start(len(head)) + offset


def _start(head_size: int) -> int:
    return -(-(16 + head_size) // 64) * 64


def _views(buf, header: dict, start: int) -> dict[str, np.ndarray]:
    out = {}
    for k, (dtype, shape, offset) in header["columns"].items():
        count = int(np.prod(shape))
        out[k] = np.frombuffer(buf, np.dtype(dtype), count, start + offset).reshape(shape)
    return out


def _head(head: bytes) -> bytes:
    """The file's first bytes: ``MAGIC``, the header's length, the header."""
    return MAGIC + struct.pack("<Q", len(head)) + head


def new_buffer(columns: dict[str, Spec], header: dict) -> tuple[bytearray, dict[str, np.ndarray]]:
    """A file's bytes in memory, and its columns to fill (writable views into them)."""
    head, size = _layout(columns, header)
    buf = bytearray(size)
    buf[: 16 + len(head)] = _head(head)
    return buf, _views(buf, json.loads(head), _start(len(head)))


class Writer:
    """A new file at ``path`` (it exists, empty) of ``columns``, written a piece at a time
    (``put``): each piece goes to its place with ``pwrite``, and no copy of the
    columns is held in memory."""

    def __init__(self, path: Path, columns: dict[str, Spec], header: dict) -> None:
        head, size = _layout(columns, header)
        self._places, self._start = json.loads(head)["columns"], _start(len(head))
        self._file = open(path, "r+b")  # noqa: SIM115 - closed by ``close``
        self._file.truncate(size)
        os.pwrite(self._file.fileno(), _head(head), 0)

    def put(self, name: str, at: int, values) -> None:
        """``values`` into column ``name`` from its row ``at`` on."""
        dtype, shape, offset = self._places[name]
        row = np.dtype(dtype).itemsize * int(np.prod(shape[1:]))
        data = memoryview(np.ascontiguousarray(values, np.dtype(dtype)).reshape(-1).view(np.uint8))
        at = self._start + offset + at * row
        while data:  # (a write may take part of it)
            done = os.pwrite(self._file.fileno(), data, at)
            data, at = data[done:], at + done

    def close(self) -> None:
        self._file.close()


def read(buf) -> tuple[dict, dict[str, np.ndarray]]:
    """The header and the columns of a file's bytes (or its map): ``ValueError`` where
    they are not such a file."""
    if buf[:8] != MAGIC:
        raise ValueError("no header")
    size = struct.unpack("<Q", buf[8:16])[0]
    header = json.loads(buf[16 : 16 + size])
    return header, _views(buf, header, _start(size))


def map_file(path: str | Path, fmt: str, what: str) -> tuple[dict, dict[str, np.ndarray]]:
    """``read`` of the file at ``path``, mapped read-only (the processes of a node that map
    it share its pages); ``ConfigError`` naming it as not ``what`` where it is not such a
    file of format ``fmt``."""
    try:
        with open(path, "rb") as f:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        header, columns = read(buf)
        if header.get("format") != fmt:
            raise ValueError(f"format {header.get('format')!r}")
    except (ValueError, KeyError, TypeError, struct.error) as exc:
        raise ConfigError(f"{path} is not {what} ({exc})") from exc
    return header, columns
