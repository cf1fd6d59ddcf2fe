"""Who may use a shared store's directory, and who removes what.

* **Trust no path another user controls.** A default store lives in the user's own
  directory (``/dev/shm/hotset-UID``, 0700, checked; where another user squatted it, a
  private one of the user's own instead). A named directory must be the user's own and
  writable by nobody else, as every directory above it and every link on the way
  (OpenSSH's ``StrictModes``; sticky ``/tmp`` and ``/dev/shm`` pass); hotset's files in
  it (``data.mdb``, ``lock.mdb``, ``hotset.lock``) must be the user's own regular files
  that nobody else can open. Files are opened with ``O_NOFOLLOW | O_NONBLOCK`` and
  checked with ``fstat``: a symlink, a FIFO or a device is refused, never followed or
  waited on. A store whose directory is replaced under a running job is noticed
  (``shared.py``: its directory's identity and a token in its meta) and not used.
* **Delete only what hotset made.** Every user of a store holds a shared ``flock`` on its
  ``hotset.lock`` while the store is open (the kernel drops it when the process dies, even
  by kill -9). Leaving with ``remove=True``, the last user out (granted the exclusive lock)
  removes hotset's three files, and the directory only if hotset made it (``hotset.lock``
  says so) and nothing else is left in it. Any other user just leaves.
* A directory holding an LMDB environment with no ``hotset.lock`` is not hotset's: refused.
* One job's entries (its namespace) are claimed with an exclusive ``flock`` on a
  ``hotset.claim-*`` file while the job runs: a second live job on them is refused.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import logging
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Callable

from hotset.errors import ConfigError

log = logging.getLogger(__name__)

LOCK = "hotset.lock"
CLAIM = "hotset.claim-"
LMDB_FILES = ("data.mdb", "lock.mdb")
MADE = b"made by hotset"  # the lock file's content when hotset made the directory
STORE_PREFIX = "store-"
_OPEN = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def check_own_dir(path: str, private: bool = False) -> None:
    """Refuse a directory that is a symlink, not this user's, or writable by others
    (``private``: that others can enter at all), or one another user could swap
    (``check_ancestors``)."""
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise ConfigError(f"{path} is not a directory of yours: refusing to keep a cache in it")
    open_to = 0o077 if private else 0o022
    if st.st_mode & open_to:
        raise ConfigError(
            f"{path} is open to other users (mode {st.st_mode & 0o777:o}): they could read "
            f"or replace the cached samples; use a directory only you can "
            f"{'enter' if private else 'write'} (chmod {'700' if private else 'go-w'})"
        )
    check_ancestors(path)


def check_ancestors(path: str) -> None:
    """Refuse ``path`` if another user could replace it: a directory above it, or a link
    on the way to it, that is not root's or this user's, or that others may write to
    (OpenSSH's ``StrictModes`` rule; a sticky directory such as ``/tmp`` or ``/dev/shm``
    is safe: no one may rename or remove another's entries in it)."""
    me, where = os.geteuid(), "/"
    for part in os.path.abspath(path).split(os.sep)[1:]:
        where = os.path.join(where, part)
        try:
            st = os.lstat(where)
        except FileNotFoundError:
            break
        if stat.S_ISLNK(st.st_mode) and st.st_uid not in (0, me):
            on_the_way = f" (on the way to {path})" if where != os.path.abspath(path) else ""
            raise ConfigError(
                f"{where}{on_the_way} is a link user {st.st_uid} owns: they could point it "
                "elsewhere under a running job; use a path without it"
            )
    parent = os.path.dirname(os.path.realpath(path))
    while True:
        st = os.stat(parent)
        sticky = st.st_mode & stat.S_ISVTX
        if st.st_uid not in (0, me) or (st.st_mode & 0o022 and not sticky):
            whose = (
                f"belongs to user {st.st_uid}" if st.st_uid not in (0, me)
                else f"is writable by others (mode {st.st_mode & 0o777:o})"
            )  # fmt: skip
            raise ConfigError(
                f"{parent}, above {path}, {whose}: another user could replace what is "
                "below it under a running job; keep caches in a directory that only you "
                "and root control"
            )
        if parent == "/":
            return
        parent = os.path.dirname(parent)


def check_own_file(path: str, st: os.stat_result) -> None:
    """Refuse a store file that is not a regular file of this user's, or that others can
    open."""
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        raise ConfigError(f"{path} is not a regular file of yours: refusing to use the store")
    if st.st_mode & 0o077:
        raise ConfigError(
            f"{path} can be opened by other users (mode {st.st_mode & 0o777:o}): refusing "
            "to keep cached samples in it"
        )


def check_lmdb_files(path: str) -> None:
    """The LMDB files already in ``path`` (if any) are this user's own and private."""
    for name in LMDB_FILES:
        f = os.path.join(path, name)
        try:
            check_own_file(f, os.lstat(f))
        except FileNotFoundError:
            continue


def own_private_dir(path: str) -> str:
    """``path``, made 0700 if missing and checked (``check_own_dir``, private)."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise ConfigError(f"cannot create the directory {path}: {exc}") from exc
    check_own_dir(path, private=True)
    return path


#: the private directories used instead of refused defaults, in this process
_INSTEAD: dict[str, str] = {}


def private_base(root: str | None = None) -> str:
    """This user's directory for default stores: ``ROOT/hotset-UID`` (``root``: default
    ``/dev/shm``, else the temporary directory), made 0700 and checked. One that another
    user made or opened (squatted) is refused and left alone: a private directory of this
    user's own is used instead (``$XDG_RUNTIME_DIR/hotset-stores``, else a fresh one beside
    it), said once."""
    if root is None:
        shm = os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK)
        root = "/dev/shm" if shm else tempfile.gettempdir()
    preferred = os.path.join(root, f"hotset-{os.geteuid()}")
    try:
        return own_private_dir(preferred)
    except ConfigError as refused:
        instead = _INSTEAD.get(preferred)
        if instead is not None and os.path.isdir(instead):
            return instead
        xdg = os.environ.get("XDG_RUNTIME_DIR")
        try:
            instead = own_private_dir(os.path.join(xdg, "hotset-stores")) if xdg else None
        except ConfigError:
            instead = None
        if instead is None:
            instead = tempfile.mkdtemp(prefix=f"hotset-{os.geteuid()}-", dir=root)
            check_own_dir(instead, private=True)
            atexit.register(_remove_if_empty, instead)
        log.warning("%s; keeping this process's stores in %s instead", refused, instead)
        _INSTEAD[preferred] = instead
        return instead


def _remove_if_empty(path: str) -> None:
    with contextlib.suppress(OSError):
        os.rmdir(path)


def open_lock(path: str, create: bool, name: str = LOCK) -> int:
    """A lock file of the store's, opened without following a link or blocking on a FIFO."""
    fd = os.open(os.path.join(path, name), _OPEN | (os.O_CREAT if create else 0), 0o600)
    try:
        check_own_file(os.path.join(path, name), os.fstat(fd))
    except BaseException:
        os.close(fd)
        raise
    return fd


def hold(path: str, name: str, content: bytes = b"") -> int | None:
    """Hold an exclusive lock on the file ``path/name`` (made, with ``content``, if
    missing) for as long as this process keeps the returned descriptor; ``None`` if
    another process holds it."""
    fd = open_lock(path, create=True, name=name)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    if content:
        os.ftruncate(fd, 0)
        os.pwrite(fd, content, 0)
    return fd


def orphans(path: str, prefix: str) -> list[tuple[str, bytes, int]]:
    """The files ``prefix*`` in ``path`` that no process holds (their holder died): each
    with its content and a descriptor holding its lock (the caller closes it)."""
    out = []
    for name in sorted(os.listdir(path)):
        if name.startswith(prefix):
            with contextlib.suppress(OSError, ConfigError):
                fd = hold(path, name)
                if fd is not None:
                    out.append((os.path.join(path, name), os.pread(fd, 4096, 0), fd))
    return out


#: how long a claim waits for a job that died (kill -9) while its DataLoader workers,
#: which hold the claim too, are exiting
DYING_WAIT_S = 30.0


def alive(pid: int) -> bool:
    """Whether process ``pid`` lives on this machine (a zombie, killed and not yet reaped
    by its parent, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def claim(path: str, namespace: str) -> Callable[[], None]:
    """Claim ``namespace`` in the store at ``path`` for this caller; returns the release.
    A namespace another live job holds is refused; one whose job died and whose workers
    still hold it (they exit within seconds) is waited for, up to ``DYING_WAIT_S``."""
    name = CLAIM + hashlib.blake2b(namespace.encode(), digest_size=8).hexdigest()
    me = str(os.getpid()).encode()
    fd = hold(path, name, me)
    deadline = time.monotonic() + DYING_WAIT_S
    while fd is None and time.monotonic() < deadline:
        try:
            with open(os.path.join(path, name), "rb") as f:
                holder = int(f.read(32) or b"0")
        except (OSError, ValueError):
            holder = 0
        if holder and alive(holder):
            break  # a live job: refused at once
        time.sleep(0.1)  # its job is gone: its workers are exiting
        fd = hold(path, name, me)
    if fd is None:
        raise ConfigError(
            f"another job already trains on this dataset over the store {path}: two "
            "planners would evict each other's entries. Give each job a store of its own "
            "(store='shared'), or share one cache between jobs with `hotset serve`"
        )
    return lambda: os.close(fd)


def _same_file(fd: int, path: str) -> bool:
    """Whether ``path`` still names the file open as ``fd`` (not removed or replaced)."""
    try:
        return os.lstat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


class Lease:
    """This process's use of the store in ``path`` (a shared lock on its ``hotset.lock``),
    taken by :meth:`open` or :meth:`fresh`."""

    def __init__(self, path: str, fd: int) -> None:
        self.path, self._fd, self._pid = path, fd, os.getpid()

    @classmethod
    def open(cls, path: str) -> Lease:
        """Use the store at ``path`` (resolved, its ancestors checked: ``shared._resolve``),
        making the directory (mode 0700) if it is missing; an existing one is checked.
        Retries if the last user out removes it meanwhile."""
        for _ in range(10):
            try:
                os.mkdir(path, 0o700)
                made = True
            except FileExistsError:
                made = False
            except FileNotFoundError:
                raise ConfigError(
                    f"store directory {path}: its parent directory does not exist"
                ) from None
            check_own_dir(path)
            foreign = any(os.path.lexists(os.path.join(path, f)) for f in LMDB_FILES)
            if foreign and not os.path.lexists(os.path.join(path, LOCK)):
                raise ConfigError(
                    f"{path} holds an LMDB environment hotset did not make (no {LOCK}): "
                    "refusing to use or remove it; name an empty or new directory"
                )
            fd = open_lock(path, create=True)
            if made:
                os.write(fd, MADE)
            fcntl.flock(fd, fcntl.LOCK_SH)
            if _same_file(fd, os.path.join(path, LOCK)):
                lease = cls(path, fd)
                try:
                    check_lmdb_files(path)
                except BaseException:
                    lease.leave(remove=made)
                    raise
                return lease
            os.close(fd)  # the last user out removed it meanwhile: start again
        raise ConfigError(f"store directory {path} keeps disappearing")

    @classmethod
    def fresh(cls, base: str) -> Lease:
        """A new store directory in ``base``, leased before it gets its final name (so no
        other process's ``remove_unused`` takes it for a leftover)."""
        tmp = tempfile.mkdtemp(prefix=".new-", dir=base)
        fd = open_lock(tmp, create=True)
        os.write(fd, MADE)
        fcntl.flock(fd, fcntl.LOCK_SH)
        path = os.path.join(base, STORE_PREFIX + os.path.basename(tmp)[len(".new-") :])
        os.rename(tmp, path)
        return cls(path, fd)

    @property
    def held(self) -> bool:
        return self._fd is not None and self._pid == os.getpid()

    def leave(self, remove: bool) -> bool:
        """Stop using the store; with ``remove``, remove it if this was its last user.
        Returns whether it was removed."""
        if not self.held:
            return False  # left already, or a forked copy: the lease is its maker's
        fd, self._fd = self._fd, None
        try:
            if not remove:
                return False
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False  # others use it: the last of them removes it
            return _remove(self.path, fd)
        finally:
            os.close(fd)

    def __getstate__(self) -> dict:  # a copy in another process holds no lease
        return {"path": self.path, "_fd": None, "_pid": -1}


def _remove(path: str, fd: int) -> bool:
    """Remove hotset's files in ``path`` (the exclusive lock held on ``fd``), and the
    directory if hotset made it and it is empty then."""
    if not _same_file(fd, os.path.join(path, LOCK)):
        return False  # removed (and maybe made anew by another job) under us: not ours
    os.lseek(fd, 0, os.SEEK_SET)
    made = os.read(fd, len(MADE) + 1) == MADE
    claims = [n for n in os.listdir(path) if n.startswith(CLAIM)]
    for name in (*LMDB_FILES, *claims, LOCK):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(path, name))
    if made:
        try:
            os.rmdir(path)
        except OSError as exc:
            log.warning("left the store directory %s: it holds other files (%s)", path, exc)
    return True


def remove_unused(base: str) -> list[str]:
    """Remove the stores in ``base`` (this user's private directory) that no process uses
    (their users were killed); returns their paths."""
    gone = []
    for name in os.listdir(base):
        path = os.path.join(base, name)
        if not name.startswith(STORE_PREFIX) or not os.path.isdir(path):
            continue
        try:
            fd = open_lock(path, create=False)
        except (OSError, ConfigError):
            continue  # not a store of ours: leave it alone
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue  # in use
        try:
            if _remove(path, fd):
                gone.append(path)
                log.info("removed the store %s (no process uses it)", path)
        finally:
            os.close(fd)
    return gone


def private_temp_dir(prefix: str) -> tuple[str, int]:
    """A fresh directory ``PREFIX*`` of this process's, in the user's private directory
    under the temporary one (``private_base``: never a directory another user could swap),
    held by an exclusive lock on its ``hotset.lock`` while the process lives; returns its
    path and the lock's descriptor (closing it releases the directory). Those a killed
    process left (their lock free) are removed first."""
    base = private_base(tempfile.gettempdir())
    for name in os.listdir(base):
        path = os.path.join(base, name)
        if not name.startswith(prefix) or not os.path.isdir(path):
            continue
        try:
            fd = hold(path, LOCK)
        except (OSError, ConfigError):
            continue  # not one of ours: left alone
        if fd is not None:  # nobody holds it: its process was killed
            shutil.rmtree(path, ignore_errors=True)
            os.close(fd)
            log.info("removed %s (its process is gone)", path)
    made = tempfile.mkdtemp(prefix="." + prefix, dir=base)  # (hidden until held)
    fd = hold(made, LOCK)
    final = os.path.join(base, prefix + os.path.basename(made)[len(prefix) + 1 :])
    os.rename(made, final)
    return final, fd


def create_private_file(path: str | os.PathLike[str]) -> int:
    """A new file, 0600, opened for writing: never one that exists, nor a link."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                   0o600)  # fmt: skip
