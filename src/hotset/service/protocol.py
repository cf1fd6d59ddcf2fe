"""The service's messages: a JSON header frame, then one frame per numpy array, column of
packed digests (content keys, 16 raw bytes each) or list of strings, named in the header.
One request and one reply per batch."""

from __future__ import annotations

import json
from typing import Annotated, Literal

import msgspec
import numpy as np

from hotset.errors import HotsetError
from hotset.storage.columns import DigestColumn


class ProtocolError(HotsetError):
    """A message that is not one of the service's (answered with an error, nothing kept)."""


Payload = dict[str, np.ndarray | DigestColumn | list[str]]


def encode(header: dict, payload: Payload | None = None) -> list[bytes]:
    """Frames for ``header`` and ``payload`` (arrays and digests are sent raw, other
    string lists as lines)."""
    specs, frames = [], []
    for name, value in (payload or {}).items():
        if isinstance(value, np.ndarray):
            arr = np.ascontiguousarray(value)
            specs.append([name, "array", arr.dtype.str, list(arr.shape)])
            frames.append(arr.tobytes())
        elif isinstance(value, DigestColumn):
            specs.append([name, "digests", "", [len(value)]])
            frames.append(value.raw.tobytes())
        else:
            specs.append([name, "lines", "", [len(value)]])
            frames.append("\n".join(value).encode())
    return [json.dumps({**header, "frames": specs}).encode(), *frames]


#: a request's header (JSON) is small: larger is refused before it is parsed
MAX_HEADER_BYTES = 64 << 10
#: one payload frame's description: name, kind, dtype, shape
FrameSpec = tuple[
    Annotated[str, msgspec.Meta(max_length=64)],
    Literal["array", "digests", "lines"],
    Annotated[str, msgspec.Meta(max_length=16)],
    Annotated[list[Annotated[int, msgspec.Meta(ge=0, le=1 << 40)]], msgspec.Meta(max_length=4)],
]


def decode(frames: list[bytes]) -> tuple[dict, Payload]:
    """The header and payload of ``frames``; a malformed message raises ``ProtocolError``
    (naming what is wrong) before anything is allocated for it."""
    if len(frames[0]) > MAX_HEADER_BYTES:
        raise ProtocolError(f"message header over {MAX_HEADER_BYTES} bytes: refused")
    try:
        header = json.loads(frames[0])
    except (ValueError, RecursionError) as exc:  # (RecursionError: nested too deep)
        raise ProtocolError(f"malformed message header: {str(exc)[:200]}") from None
    if not isinstance(header, dict):
        raise ProtocolError(f"malformed message header: a JSON {type(header).__name__}")
    try:
        specs = msgspec.convert(header.pop("frames", None), list[FrameSpec])
    except msgspec.ValidationError as exc:
        raise ProtocolError(f"malformed frame list: {exc}") from None
    if len(specs) != len(frames) - 1:
        raise ProtocolError(f"the header names {len(specs)} frames, {len(frames) - 1} came")
    payload: Payload = {}
    for spec, data in zip(specs, frames[1:], strict=True):
        try:
            name, kind, dtype, shape = spec
            if kind == "array":
                dt = np.dtype(dtype)
                if dt.hasobject or int(np.prod(shape)) * dt.itemsize != len(data):
                    raise ValueError(f"{len(data)} bytes do not hold {dtype} {shape}")
                payload[name] = np.frombuffer(data, dtype=dt).reshape(shape).copy()
            elif kind == "digests":
                if int(shape[0]) * 16 != len(data):
                    raise ValueError(f"{len(data)} bytes do not hold {shape[0]} digests")
                payload[name] = DigestColumn.of_raw(np.frombuffer(data, np.uint8).copy())
            elif kind == "lines":
                lines = data.decode().split("\n") if shape[0] else []
                if len(lines) != shape[0]:
                    raise ValueError(f"{len(lines)} lines, the header says {shape[0]}")
                payload[name] = lines
            else:
                raise ValueError(f"unknown frame kind {kind!r}")
        except (ValueError, TypeError) as exc:
            raise ProtocolError(f"malformed frame {spec!r}: {exc}") from None
    return header, payload
