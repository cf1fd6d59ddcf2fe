"""The service's requests, declared: each header is converted to one of these (msgspec)
and each payload frame checked (kind, dtype, shape, range) before any field is used, so
a malformed or hostile message gets an error reply and changes nothing."""

from __future__ import annotations

from typing import Annotated

import msgspec
import numpy as np

from hotset.service.protocol import Payload, ProtocolError
from hotset.storage.columns import DigestColumn

Count = Annotated[int, msgspec.Meta(ge=0, le=1 << 40)]
Seconds = Annotated[float, msgspec.Meta(ge=0.0, le=1e9)]
Ratio = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]
#: a process id: Linux's pid_max is at most 2**22
Pid = Annotated[int, msgspec.Meta(ge=1, le=1 << 22)]
Text = Annotated[str, msgspec.Meta(max_length=256)]


class Request(msgspec.Struct, tag_field="op", frozen=True, kw_only=True):
    """Every request names the service run it was made for (``instance``) once it has
    registered: a job id of an earlier run is not this run's."""

    instance: Text | None = None


class Hello(Request, tag="hello", frozen=True):
    pass


class Register(Request, tag="register", frozen=True):
    name: Text
    batch_size: Annotated[int, msgspec.Meta(ge=1, le=1 << 20)]
    pid: Pid | None = None
    host: Text = ""
    epoch: Count = 0


class Plan(Request, tag="plan", frozen=True):
    job: Count
    epoch: Count
    done: Count | None = None
    cache: bool = True
    benefit: tuple[Seconds, Seconds, Ratio] | None = None


class Heartbeat(Request, tag="heartbeat", frozen=True):
    job: Count


class Leave(Request, tag="leave", frozen=True):
    job: Count


class Stats(Request, tag="stats", frozen=True):
    pass


class Stop(Request, tag="stop", frozen=True):
    pass


AnyRequest = Hello | Register | Plan | Heartbeat | Leave | Stats | Stop

#: the payload each request may carry: name -> (kind, required)
PAYLOADS: dict[type, dict[str, tuple[str, bool]]] = {
    Register: {"keys": ("keys", True), "sizes": ("sizes", True), "served": ("ids", False)},
    Plan: {"fb_ids": ("ids", False), "fb_losses": ("losses", False), "absent": ("ids", False)},
}


def parse(header: dict, payload: Payload) -> AnyRequest:
    """The request ``header`` declares, its payload checked; ``ProtocolError`` naming the
    field otherwise."""
    try:
        request = msgspec.convert(header, AnyRequest)
    except msgspec.ValidationError as exc:
        raise ProtocolError(f"invalid request: {exc}") from None
    allowed = PAYLOADS.get(type(request), {})
    for name in payload:
        if name not in allowed:
            raise ProtocolError(f"request {header.get('op')!r} carries no {name!r}")
    for name, (kind, required) in allowed.items():
        if name in payload:
            _check(name, kind, payload[name])
        elif required:
            raise ProtocolError(f"request {header.get('op')!r} needs {name!r}")
    if isinstance(request, Register):
        n = len(payload["keys"])
        if len(payload["sizes"]) != n:
            raise ProtocolError(f"{len(payload['sizes'])} sizes for {n} keys")
        served = payload.get("served")
        if served is not None and served.size and (served.min() < 0 or served.max() >= n):
            raise ProtocolError(f"served ids outside 0..{n - 1}")
    fb = [payload.get(k) for k in ("fb_ids", "fb_losses")]
    if isinstance(request, Plan) and (
        (fb[0] is None) != (fb[1] is None) or (fb[0] is not None and len(fb[0]) != len(fb[1]))
    ):
        raise ProtocolError("feedback needs fb_ids and fb_losses of one length")
    return request


def _check(name: str, kind: str, value) -> None:
    if kind == "keys":
        if isinstance(value, DigestColumn) or (
            isinstance(value, list) and all(len(k) <= 256 for k in value)
        ):
            return
        raise ProtocolError(f"{name}: expected content keys")
    if not isinstance(value, np.ndarray) or value.ndim != 1:
        raise ProtocolError(f"{name}: expected a 1-d array")
    if kind in ("sizes", "ids"):
        if value.dtype.kind not in "iu" or (value.size and value.min() < 0):
            raise ProtocolError(f"{name}: expected integers >= 0, got {value.dtype}")
    elif kind == "losses" and (value.dtype.kind != "f" or not np.isfinite(value).all()):
        raise ProtocolError(f"{name}: expected finite floats, got {value.dtype}")
