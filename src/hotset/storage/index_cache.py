"""Indexes of users' datasets, kept in a directory of the user's, never in the source.

An index (an ImageFolder's listing, a tar shard's members) is built once and kept under
``$HOTSET_CACHE_DIR`` (default ``~/.cache/hotset``, or ``$XDG_CACHE_HOME/hotset``), in a
file named by the source's URL and a fingerprint of what it indexes (the listing, or the
shard's size and version): a changed source gets a new index, and the stale one of the
same URL is removed.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from hotset.errors import ConfigError

log = logging.getLogger(__name__)
T = TypeVar("T")


def cache_dir() -> Path:
    """The user's index directory (made 0700 if missing; refused if it is not theirs or
    others can write to it)."""
    base = os.environ.get("HOTSET_CACHE_DIR")
    if not base:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        base = os.path.join(xdg, "hotset")
    from hotset.store.lease import check_own_dir  # (the store package imports lmdb)

    path = Path(base) / "index"
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    check_own_dir(str(path))
    return path


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=12).hexdigest()


def cached_index(kind: str, url: str, fingerprint: str, build: Callable[[], bytes]) -> bytes:
    """The index of ``url`` as it is now (``fingerprint``): read from the cache, or
    ``build()`` and kept (written atomically, readable by this user only)."""
    return cached_path(kind, url, fingerprint, build).read_bytes()


def index_path(kind: str, url: str, fingerprint: str) -> Path:
    """Where the index of ``url`` as it is now (``fingerprint``) is kept, built or not."""
    return cache_dir() / f"{kind}-{_digest(url)}-{_digest(fingerprint)}"


def cached_path(kind: str, url: str, fingerprint: str, build: Callable[[], bytes]) -> Path:
    """As ``cached_index``, the file's path (to map it: every process of the node that
    opens the same source maps the same file)."""
    return cached_file(kind, url, fingerprint, lambda tmp: tmp.write_bytes(build()))


def cached_file(kind: str, url: str, fingerprint: str, write: Callable[[Path], object]) -> Path:
    """As ``cached_path``, the file made by ``write(path)`` (a new empty file, moved into
    place when it returns). One process of the node makes it; another that asks for it
    meanwhile waits for it (a lock file beside it)."""
    path = index_path(kind, url, fingerprint)
    if path.exists():
        return path
    root, prefix = path.parent, f"{kind}-{_digest(url)}-"
    lock = root / f".lock-{path.name}"
    with open(lock, "a") as held:
        try:
            fcntl.flock(held, fcntl.LOCK_EX)
        except OSError:  # a file system without locks (some NFS homes): each makes it
            log.warning("%s: no lock on %s; this process makes the index alone", url, lock)
        if path.exists():  # made while this process waited
            return path
        fd, tmp = tempfile.mkstemp(dir=root, prefix=".tmp-")
        os.close(fd)
        try:
            write(Path(tmp))
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        finally:
            lock.unlink(missing_ok=True)
    for stale in root.glob(f"{prefix}*"):  # the same source, indexed as it was before
        if stale != path:
            stale.unlink(missing_ok=True)
    return path


def cached_mapped(
    kind: str, url: str, fingerprint: str, write: Callable[[Path], object],
    open_: Callable[[Path], T], where: str,
) -> T:  # fmt: skip
    """``open_`` of the file ``cached_file`` makes; one found damaged there (``open_``
    raises ``ConfigError``: hotset's own file, not the user's data) is made again once."""
    path = cached_file(kind, url, fingerprint, write)
    try:
        return open_(path)
    except ConfigError:
        log.warning("%s: the index file %s is damaged; making it again", where, path)
        path.unlink(missing_ok=True)
    return open_(cached_file(kind, url, fingerprint, write))
