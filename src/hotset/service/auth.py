"""Who may talk to the service over the network: ZeroMQ CURVE (RFC 26), keys in a file only
the service's user can read.

On ``tcp://`` the service encrypts and authenticates every connection: at start it
writes (or reuses) a key file, mode 0600 in the user's private directory, holding its own
key pair and one client key pair; ZeroMQ's ZAP handler admits only the client key. A
client reads the same file, so only the user who runs the service (or whoever that user
gives the file to, e.g. on a shared home directory for other nodes) can connect: any
other connection fails its handshake and is never answered. ``ipc://`` sockets are
protected by their private directory (``address.py``) and need no keys unless asked.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path

import zmq
from zmq.auth.thread import ThreadAuthenticator

from hotset.errors import ConfigError
from hotset.service.address import runtime_dir

KEY_FILE_ENV = "HOTSET_SERVICE_KEY"


@dataclass(frozen=True)
class Keys:
    """Z85-encoded CURVE keys: the service's pair and its one client pair."""

    server_public: bytes
    server_secret: bytes
    client_public: bytes
    client_secret: bytes

    @classmethod
    def generate(cls) -> Keys:
        return cls(*zmq.curve_keypair(), *zmq.curve_keypair())


def uses_curve(address: str, curve: bool | None = None) -> bool:
    """CURVE is on for every transport but ``ipc://`` unless ``curve`` says otherwise."""
    return (not address.startswith("ipc://")) if curve is None else bool(curve)


def default_key_file(address: str) -> Path:
    """``$HOTSET_SERVICE_KEY``, else a file per address in the user's private directory."""
    if os.environ.get(KEY_FILE_ENV):
        return Path(os.environ[KEY_FILE_ENV])
    if address.startswith("tcp://"):  # the port: ``tcp://*:P`` and ``tcp://host:P`` agree
        tag = "tcp-" + address.rsplit(":", 1)[-1]
    else:
        tag = hashlib.blake2b(address.encode(), digest_size=8).hexdigest()
    return runtime_dir() / f"service-{tag}.key"


def client_keys(
    address: str, curve: bool | None, key_file: str | None, wait_s: float = 0.0
) -> Keys | None:
    """The keys a client of ``address`` connects with (None: no CURVE), waiting up to
    ``wait_s`` for a service that is starting to write its key file."""
    if not uses_curve(address, curve):
        return None
    path = Path(key_file) if key_file else default_key_file(address)
    deadline = time.monotonic() + wait_s
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return load_keys(path)


def _check_private(path: Path) -> None:
    st = path.stat()
    if st.st_uid != os.getuid():
        raise ConfigError(f"the key file {path} belongs to uid {st.st_uid}, not to you")
    if st.st_mode & 0o077:
        raise ConfigError(
            f"the key file {path} is readable by others (mode {stat.S_IMODE(st.st_mode):o}): "
            "chmod 600 it, or remove it for the service to write a new one"
        )


def load_keys(path: Path) -> Keys:
    """The keys in ``path`` (checked: owned by this user, mode 0600)."""
    if path.exists():
        _check_private(path)
    try:
        data = json.loads(path.read_text())
        return Keys(*(data[k].encode() for k in Keys.__dataclass_fields__))
    except FileNotFoundError:
        raise ConfigError(
            f"no service key file at {path}: start the service first, or give its file "
            f"(key_file= / ${KEY_FILE_ENV})"
        ) from None
    except PermissionError:
        raise ConfigError(f"cannot read the service key file {path}: not yours") from None
    except (ValueError, KeyError) as exc:
        raise ConfigError(f"the service key file {path} is damaged: {exc}") from None


def server_keys(
    address: str, curve: bool | None, key_file: str | None
) -> tuple[Path | None, Keys | None]:
    """The service's key file and keys (None, None: no CURVE): those in the file, or new
    ones written there (mode 0600)."""
    if not uses_curve(address, curve):
        return None, None
    path = Path(key_file) if key_file else default_key_file(address)
    return path, (load_keys(path) if path.exists() else _write_keys(path))


def _write_keys(path: Path) -> Keys:
    keys = Keys.generate()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({k: v.decode() for k, v in keys.__dict__.items()}, f)
    os.replace(tmp, path)
    return keys


def serve_curve(sock: zmq.Socket, keys: Keys) -> ThreadAuthenticator:
    """Make ``sock`` a CURVE server admitting only the client key (before ``bind``);
    returns the running ZAP handler (stop it with the socket)."""
    auth = ThreadAuthenticator(sock.context)
    auth.start()
    auth.configure_curve_callback("*", credentials_provider=_OnlyKey(keys.client_public))
    sock.curve_secretkey = keys.server_secret
    sock.curve_publickey = keys.server_public
    sock.curve_server = True
    return auth


def connect_curve(sock: zmq.Socket, keys: Keys) -> None:
    """Make ``sock`` a CURVE client of the service (before ``connect``)."""
    sock.curve_secretkey = keys.client_secret
    sock.curve_publickey = keys.client_public
    sock.curve_serverkey = keys.server_public


class _OnlyKey:
    """ZAP credentials: the one client key of the key file."""

    def __init__(self, key: bytes) -> None:
        self.key = key

    def callback(self, domain: str, key: bytes) -> bool:
        return key == self.key
