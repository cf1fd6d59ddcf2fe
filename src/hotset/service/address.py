"""Where the service listens: by default a socket in a directory only its user can enter
(``$XDG_RUNTIME_DIR/hotset``, else ``/tmp/hotset-UID``, mode 0700), so no other local
user can take the address while the service is down or answer in its place; a client
refuses an ``ipc://`` socket that another user owns."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import zmq

from hotset.errors import ConfigError
from hotset.service.protocol import encode


def runtime_dir() -> Path:
    """The user's private directory for the service's socket, created 0700 and checked:
    a directory another user owns, or that others may enter, is refused."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    path = Path(base, "hotset") if base else Path(f"/tmp/hotset-{os.getuid()}")
    try:
        path.mkdir(mode=0o700, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create the service directory {path}: {exc}") from exc
    st = path.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise ConfigError(f"{path} is not a directory of yours: refusing to use it")
    if st.st_mode & 0o077:
        raise ConfigError(f"{path} is open to other users (mode {st.st_mode & 0o777:o})")
    return path


def default_address() -> str:
    return f"ipc://{runtime_dir() / 'service.sock'}"


def check_ipc_owner(address: str) -> None:
    """For an ``ipc://`` address: the socket must exist and be this user's own."""
    if not address.startswith("ipc://"):
        return
    path = Path(address[len("ipc://") :])
    try:
        st = path.lstat()
    except FileNotFoundError:
        raise ConfigError(f"no hotset service at {address} (no socket)") from None
    if st.st_uid != os.getuid():
        raise ConfigError(
            f"the socket {path} belongs to uid {st.st_uid}, not to you: refusing to talk to "
            "a service another user runs"
        )


def refuse_live(
    address: str, ctx: zmq.Context, timeout_ms: int = 300, secure=lambda sock: None
) -> None:
    """Raise if a service already answers on ``address`` (a second ``hotset serve`` must
    not silently take over an ``ipc://`` socket); ``secure`` sets up the probe's socket
    (CURVE keys) before it connects."""
    if address.startswith("ipc://") and not Path(address[len("ipc://") :]).exists():
        return
    sock = ctx.socket(zmq.REQ)
    secure(sock)
    for opt, v in ((zmq.RCVTIMEO, timeout_ms), (zmq.SNDTIMEO, timeout_ms), (zmq.LINGER, 0)):
        sock.setsockopt(opt, v)
    try:
        sock.connect(address)
        sock.send_multipart(encode({"op": "hello"}))
        sock.recv_multipart()
    except zmq.ZMQError:
        return  # nobody answered: a stale socket, or a free port
    finally:
        sock.close(0)
    raise ConfigError(f"a hotset service already answers on {address}: stop it first")
