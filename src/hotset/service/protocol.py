"""The service's messages: a JSON header frame, then one frame per numpy array or list of
strings (content keys), named in the header. One request and one reply per batch."""

from __future__ import annotations

import json

import numpy as np

Payload = dict[str, np.ndarray | list[str]]


def encode(header: dict, payload: Payload | None = None) -> list[bytes]:
    """Frames for ``header`` and ``payload`` (arrays are sent raw, key lists as lines)."""
    specs, frames = [], []
    for name, value in (payload or {}).items():
        if isinstance(value, np.ndarray):
            arr = np.ascontiguousarray(value)
            specs.append([name, "array", arr.dtype.str, list(arr.shape)])
            frames.append(arr.tobytes())
        else:
            specs.append([name, "lines", "", [len(value)]])
            frames.append("\n".join(value).encode())
    return [json.dumps({**header, "frames": specs}).encode(), *frames]


def decode(frames: list[bytes]) -> tuple[dict, Payload]:
    header = json.loads(frames[0])
    payload: Payload = {}
    for (name, kind, dtype, shape), data in zip(header.pop("frames"), frames[1:], strict=True):
        if kind == "array":
            payload[name] = np.frombuffer(data, dtype=np.dtype(dtype)).reshape(shape).copy()
        else:
            payload[name] = data.decode().split("\n") if shape[0] else []
    return header, payload
