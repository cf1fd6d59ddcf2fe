"""Node-local shared store: LMDB in a tmpfs directory (``/dev/shm`` by default).

Every process on the node that opens the same path (DataLoader workers, other jobs)
reads the same memory-mapped pages: no per-worker copy. Writes are serialised by LMDB's
single-writer lock, and the byte budget is kept in the same write transaction as the
entries, so it holds across processes.

A full map (``MapFullError``) or a tmpfs without room for a write (checked before the
write, and any LMDB error of the write itself) is absorbed: the put stores nothing and is
counted in ``failures``. A store made without a path is owned by its process (an
``owner`` file with its pid and start time); ``close(destroy=True)`` removes it, and
``remove_stale_stores`` removes those whose owner is gone (a process killed with -9).

Chosen over Redis-on-loopback for one node by ``benchmarks/store_latency.py`` (batched
reads are served from the page cache with no socket round trip).
"""

from __future__ import annotations

import glob
import logging
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence

import lmdb

from hotset.errors import ConfigError
from hotset.store.base import Store

log = logging.getLogger(__name__)

_USED = b"used_bytes"
_CAPACITY = b"capacity_bytes"
PREFIX = "hotset-store-"
OWNER = "owner"
#: room a write needs on the tmpfs beyond its values (LMDB pages, B-tree, free list)
WRITE_MARGIN = 1 << 20


# One environment per path per process: LMDB forbids opening the same files twice in a
# process, and several SharedStore objects (or unpickled copies) may name one path.
_ENVS: dict[str, tuple[lmdb.Environment, object, object]] = {}


def _close_before_fork() -> None:
    """LMDB environments must not cross a fork: close them in the parent (which reopens
    lazily), so the child starts with none and opens its own."""
    for env, _, _ in _ENVS.values():
        env.close()
    _ENVS.clear()


os.register_at_fork(before=_close_before_fork)


def _environment(
    path: str, map_size: int, create: bool = False
) -> tuple[lmdb.Environment, object, object]:
    """The process's environment at ``path``; ``create``: make the store if missing (its
    maker only: a store its owner removed must not be made again by a reader)."""
    handle = _ENVS.get(path)
    if handle is None:
        if create:
            os.makedirs(path, mode=0o700, exist_ok=True)  # the cached bytes: this user's only
        env = lmdb.open(
            path,
            create=create,
            mode=0o600,
            map_size=map_size,
            max_dbs=2,
            sync=False,
            metasync=False,
            readahead=False,
            max_readers=1024,
        )
        handle = _ENVS[path] = (env, env.open_db(b"data"), env.open_db(b"meta"))
    return handle


def default_shm_dir() -> str | None:
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


def _start_time(pid: int) -> str | None:
    """The process's start time (clock ticks since boot), or ``None`` if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else fields[19]


def _owner_alive(path: str) -> bool:
    try:
        with open(os.path.join(path, OWNER)) as f:
            pid, start = f.read().split()
    except (OSError, ValueError):
        return True  # not ours to judge
    return _start_time(int(pid)) == start


def remove_stale_stores(directory: str | None = None) -> list[str]:
    """Remove the stores in ``directory`` (default: /dev/shm) whose owning process is
    gone; returns their paths."""
    directory = directory or default_shm_dir() or tempfile.gettempdir()
    gone = [p for p in glob.glob(os.path.join(directory, PREFIX + "*")) if not _owner_alive(p)]
    for path in gone:
        shutil.rmtree(path, ignore_errors=True)
        log.info("removed the stale store %s (its process is gone)", path)
    return gone


class SharedStore(Store):
    """LMDB-backed store shared by all processes that open ``path``.

    The environment is opened lazily in each process (LMDB handles must not cross a
    ``fork``), so the object can be handed to DataLoader workers.
    """

    shared_across_processes = True

    def __init__(self, capacity_bytes: int, path: str | None = None) -> None:
        super().__init__(capacity_bytes)
        self.owned = path is None
        if self.owned:
            remove_stale_stores()
            path = tempfile.mkdtemp(prefix=PREFIX, dir=default_shm_dir())
            with open(os.path.join(path, OWNER), "w") as f:
                f.write(f"{os.getpid()} {_start_time(os.getpid())}")
        self.path = path
        # Sparse on tmpfs: the map size reserves address space, not memory. LMDB needs
        # room for page overhead and for pages freed while readers still hold them.
        self.map_size = 3 * self.capacity_bytes + (256 << 20)
        self.path = os.path.realpath(self.path)
        env = self._open(create=True)
        with env.begin(write=True, db=self._meta) as txn:
            stored = txn.get(_CAPACITY)
            if stored is not None and int(stored) != self.capacity_bytes:
                raise ConfigError(
                    f"shared store at {self.path} has capacity_bytes={int(stored)}, "
                    f"asked for {self.capacity_bytes}"
                )
            txn.put(_CAPACITY, str(self.capacity_bytes).encode())
            if txn.get(_USED) is None:
                txn.put(_USED, b"0")

    def _open(self, create: bool = False) -> lmdb.Environment:
        env, self._data, self._meta = _environment(self.path, self.map_size, create)
        return env

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        try:
            with self._open().begin(db=self._data) as txn:
                return [txn.get(k.encode()) for k in keys]
        except lmdb.Error:  # the store is gone (its service stopped): misses, counted
            self.failures += 1
            return [None] * len(keys)

    def _room_on_disk(self, nbytes: int) -> bool:
        try:
            st = os.statvfs(self.path)
        except OSError:  # the store is gone
            return False
        return st.f_bavail * st.f_frsize >= nbytes + WRITE_MARGIN

    def put(self, items: Mapping[str, bytes]) -> tuple[int, list[str]]:
        if not items:
            return 0, []
        if not self._room_on_disk(sum(len(v) for v in items.values())):
            self.failures += 1  # the tmpfs is full: writing would raise SIGBUS
            return 0, list(items)
        stored, out = 0, []
        try:
            with self._open().begin(write=True) as txn:
                used = int(txn.get(_USED, db=self._meta))
                for k, v in items.items():
                    kb = k.encode()
                    if txn.get(kb, db=self._data) is not None:
                        continue
                    if used + len(v) > self.capacity_bytes:
                        self.refused += 1
                        out.append(k)
                        continue
                    txn.put(kb, v, db=self._data)
                    used += len(v)
                    stored += 1
                txn.put(_USED, str(used).encode(), db=self._meta)
        except lmdb.Error:  # map full, no space left: the transaction stored nothing
            self.failures += 1
            return 0, list(items)
        return stored, out

    def list_keys(self, prefix: str = "") -> list[str]:
        start, out = prefix.encode(), []
        with self._open().begin(db=self._data) as txn:
            cursor = txn.cursor()
            if cursor.set_range(start):  # keys are sorted: the prefix's run only
                for k in cursor.iternext(values=False):
                    if not k.startswith(start):
                        break
                    out.append(bytes(k).decode())
        return out

    def reconcile(self) -> int:
        with self._open().begin(write=True) as txn:
            used = sum(len(v) for _, v in txn.cursor(db=self._data))
            txn.put(_USED, str(used).encode(), db=self._meta)
        return used

    def delete_many(self, keys: Sequence[str]) -> None:
        try:
            with self._open().begin(write=True) as txn:
                used = int(txn.get(_USED, db=self._meta))
                for k in keys:
                    kb = k.encode()
                    v = txn.get(kb, db=self._data)
                    if v is not None:
                        txn.delete(kb, db=self._data)
                        used -= len(v)
                txn.put(_USED, str(used).encode(), db=self._meta)
        except lmdb.Error:  # no room even to delete: the planner reconciles at epoch end
            self.failures += 1

    def contains(self, key: str) -> bool:
        with self._open().begin(db=self._data) as txn:
            return txn.get(key.encode()) is not None

    @property
    def used_bytes(self) -> int:
        with self._open().begin(db=self._meta) as txn:
            return int(txn.get(_USED))

    def __len__(self) -> int:
        with self._open().begin(db=self._data) as txn:
            return txn.stat(self._data)["entries"]

    def clear(self) -> None:
        with self._open().begin(write=True) as txn:
            txn.drop(self._data, delete=False)
            txn.put(_USED, b"0", db=self._meta)

    def close(self, destroy: bool = False) -> None:
        if destroy:
            handle = _ENVS.pop(self.path, None)
            if handle is not None:
                handle[0].close()
            shutil.rmtree(self.path, ignore_errors=True)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.pop("_data", None)
        state.pop("_meta", None)
        return state
