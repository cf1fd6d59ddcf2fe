"""Where the service listens: by default a socket in a directory only its user can enter
(``$XDG_RUNTIME_DIR/hotset``, else ``/tmp/hotset-UID``, mode 0700), so no other local
user can take the address while the service is down or answer in its place; a client
refuses an ``ipc://`` socket that another user owns; a running service holds a lock
beside its socket, so a second one never takes the address over."""

from __future__ import annotations

import fcntl
import logging
import os
from pathlib import Path

from hotset.errors import ConfigError
from hotset.store.lease import check_own_file, own_private_dir

log = logging.getLogger("hotset")


def runtime_dir() -> Path:
    """The user's private directory for the service's socket, created 0700 and checked
    (``lease.check_own_dir``). One another user made or opened (squatted), or could swap,
    is refused and left alone: ``~/.cache/hotset/run`` is used instead (the same in every
    process, so that clients find the service), said once."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    path = Path(base, "hotset") if base else Path(f"/tmp/hotset-{os.getuid()}")
    try:
        return Path(own_private_dir(str(path)))
    except ConfigError as refused:
        instead = Path(os.path.expanduser("~"), ".cache", "hotset", "run")
        instead.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        got = Path(own_private_dir(str(instead)))
        if str(path) not in _WARNED:
            _WARNED.add(str(path))
            log.warning("%s; the service's socket is kept in %s instead", refused, got)
        return got


_WARNED: set[str] = set()


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


def hold_address(address: str) -> int | None:
    """Hold the lock that says a service runs on the ``ipc://`` ``address`` (an ``flock``
    on ``SOCKET.lock`` beside the socket, kept for the service's lifetime and dropped by
    the kernel when it dies, even by kill -9); returns its descriptor. A second service
    is refused however busy the first is (a liveness probe that waits for an answer
    would take a busy service for a dead one). ``tcp://``: binding the port decides."""
    if not address.startswith("ipc://"):
        return None
    path = address[len("ipc://") :] + ".lock"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
    except OSError as exc:
        raise ConfigError(f"cannot open the service lock {path}: {exc}") from exc
    try:
        check_own_file(path, os.fstat(fd))
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ConfigError(
            f"a hotset service already runs on {address} (it holds {path}): stop it first"
        ) from None
    except BaseException:
        os.close(fd)
        raise
    return fd
