"""Sample codecs: bytes -> uint8 arrays (C x H x W), and arrays -> model-ready tensors.

Decoders return numpy arrays so a batch is stacked and converted to a float tensor once
(per-sample tensor ops cost more than decoding a small image).
"""

from __future__ import annotations

import functools
import io
import math

import numpy as np
import torch

NPY_MAGIC = b"\x93NUMPY"


def decode_image(data: bytes, size: tuple[int, int] | None = None, mode: str = "L") -> np.ndarray:
    """PNG/JPEG/... bytes -> uint8 array C x H x W (PIL), converted to ``mode`` and
    resized to ``size`` (width, height) if given."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        img = img.convert(mode)
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
    share one header, so this is a ``frombuffer``)."""
    if data[:6] != NPY_MAGIC:
        raise ValueError("not .npy data (bad magic)")
    if data[6] == 1:
        end = 10 + int.from_bytes(data[8:10], "little")
    else:
        end = 12 + int.from_bytes(data[8:12], "little")
    dtype, shape, fortran = _npy_header(bytes(data[:end]))
    arr = np.frombuffer(data, dtype=dtype, offset=end, count=math.prod(shape))
    return arr.reshape(shape, order="F" if fortran else "C")


def decode_sample(data: bytes, size: tuple[int, int] | None = None, mode: str = "L") -> np.ndarray:
    """``.npy`` or image bytes, told apart by their magic bytes (``size`` and ``mode``
    apply to images, see :func:`decode_image`)."""
    return decode_array(data) if data[:6] == NPY_MAGIC else decode_image(data, size, mode)


def to_tensor(x: np.ndarray | torch.Tensor) -> torch.Tensor:
    """An array (or a stacked batch) as a tensor; uint8 pixels become floats in [0, 1]."""
    t = x if isinstance(x, torch.Tensor) else torch.from_numpy(np.array(x, copy=True))
    return t.float().div_(255.0) if t.dtype == torch.uint8 else t


def npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(array), allow_pickle=False)
    return buf.getvalue()
