"""Sample codecs: bytes -> uint8 arrays (C x H x W), and arrays -> model-ready tensors.

Decoders return numpy arrays so a batch is stacked and converted to a float tensor once
(per-sample tensor ops cost more than decoding a small image).
"""

from __future__ import annotations

import functools
import io
import json
import math
from typing import Any

import msgspec
import numpy as np
import torch

NPY_MAGIC = b"\x93NUMPY"
RECORD_MAGIC = b"HSR\x01"  # a record (below)


#: PIL modes an image keeps (one or more 8-bit channels); others are made RGB
KEPT_MODES = ("L", "LA", "RGB", "RGBA")


def decode_image(
    data: bytes, size: tuple[int, int] | None = None, mode: str | None = None
) -> np.ndarray:
    """PNG/JPEG/... bytes -> uint8 array C x H x W (PIL), converted to ``mode`` (default:
    the image's own, palette and other modes as RGB) and resized to ``size`` (width,
    height) if given."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        want = mode or (img.mode if img.mode in KEPT_MODES else "RGB")
        if img.mode != want:
            img = img.convert(want)
        if size is not None and img.size != tuple(size):
            img = img.resize(size)
        arr = np.asarray(img, dtype=np.uint8)
    return arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1)


@functools.lru_cache(maxsize=64)
def _npy_header(header: bytes) -> tuple[np.dtype, tuple[int, ...], bool]:
    f = io.BytesIO(header)
    major, _ = np.lib.format.read_magic(f)
    read = (
        np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
    )
    shape, fortran, dtype = read(f)
    if dtype.hasobject:
        raise ValueError("object arrays are not allowed in .npy samples")
    return dtype, shape, fortran


def decode_array(data: bytes) -> np.ndarray:
    """``.npy`` bytes -> array, parsing each distinct header once (samples of a dataset
    share one header, so this is a ``frombuffer``), writable (torch refuses to share a
    read-only buffer)."""
    if data[:6] != NPY_MAGIC:
        raise ValueError("not .npy data (bad magic)")
    if data[6] == 1:
        end = 10 + int.from_bytes(data[8:10], "little")
    else:
        end = 12 + int.from_bytes(data[8:12], "little")
    dtype, shape, fortran = _npy_header(bytes(data[:end]))
    arr = np.frombuffer(data, dtype=dtype, offset=end, count=math.prod(shape))
    return arr.reshape(shape, order="F" if fortran else "C").copy(order="K")


#: WebDataset's field names (the member's extension) and how each is decoded
IMAGE_FIELDS = ("jpg", "jpeg", "png", "ppm", "pgm", "pbm", "bmp", "webp", "tif", "tiff", "gif")
IMAGE_MAGICS = (b"\x89PNG", b"\xff\xd8\xff", b"GIF8", b"II*\x00", b"MM\x00*")
INT_FIELDS = ("cls", "cls2", "class", "label", "index", "target")
TEXT_FIELDS = ("txt", "text")


def decode_field(name: str, value, size=None, mode=None):
    """A record's field by its name, as WebDataset decodes a member by its extension
    (an image also by its magic bytes, as a table's image column): images to arrays,
    ``cls`` to an int, ``json`` parsed, ``txt`` to text, ``npy`` to an
    array; other bytes (and values that are not bytes) as they are."""
    if not isinstance(value, bytes | bytearray | memoryview):
        return value
    ext = name.rsplit(".", 1)[-1].lower()
    if ext in IMAGE_FIELDS or bytes(value[:12]).startswith(IMAGE_MAGICS) or (
        bytes(value[:4]) == b"RIFF" and bytes(value[8:12]) == b"WEBP"
    ):
        return decode_image(bytes(value), size, mode)
    if ext in INT_FIELDS:
        return int(bytes(value).decode().strip())
    if ext in TEXT_FIELDS:
        return bytes(value).decode()
    if ext == "json":
        return json.loads(value)
    if ext == "npy" or bytes(value[:6]) == NPY_MAGIC:
        return decode_array(bytes(value))
    return bytes(value)


def decode_sample(
    data: bytes, size: tuple[int, int] | None = None, mode: str | None = None
):
    """``.npy``, image or record bytes (below), told apart by their magic
    bytes: an array, or for a record its value with each field decoded
    (:func:`decode_field`). ``size`` and ``mode`` apply to images (:func:`decode_image`)."""
    if data[:6] == NPY_MAGIC:
        return decode_array(data)
    if data[:4] == RECORD_MAGIC:
        value = decode_record(data)
        if isinstance(value, dict):
            return {k: decode_field(k, v, size, mode) for k, v in value.items()}
        return value
    return decode_image(data, size, mode)


def to_tensor(x: np.ndarray | torch.Tensor) -> torch.Tensor:
    """An array (or a stacked batch) as a tensor; uint8 pixels become floats in [0, 1]."""
    t = x if isinstance(x, torch.Tensor) else torch.from_numpy(np.array(x, copy=True))
    return t.float().div_(255.0) if t.dtype == torch.uint8 else t


def npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.asarray(array, order="C"), allow_pickle=False)  # keeps 0-d arrays 0-d
    return buf.getvalue()


# Records: samples that are more than one blob (a WebDataset group, a table row, a torch
# Dataset's item) as ``RECORD_MAGIC`` + one msgpack value (msgspec): maps, lists, numbers,
# strings and bytes as msgpack has them, arrays and tensors as an extension holding
# ``.npy`` bytes. Nothing is pickled, so a cache entry can never run code when read back.
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
    return data[:4] == RECORD_MAGIC


def encode_record(value: Any) -> bytes:
    """A sample (a dict of fields, a tuple, an array, ...) as record bytes."""
    return RECORD_MAGIC + _ENCODER.encode(value)


def decode_record(data: bytes) -> Any:
    """The value of record bytes (tuples come back as lists)."""
    if not is_record(data):
        raise ValueError("not a hotset record (bad magic)")
    return _DECODER.decode(memoryview(data)[len(RECORD_MAGIC) :])
