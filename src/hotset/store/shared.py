"""Node-local shared store: LMDB in a tmpfs directory (``/dev/shm`` by default).

Every process on the node that opens the same path (DataLoader workers, other jobs)
reads the same memory-mapped pages: no per-worker copy. Writes are serialised by LMDB's
single-writer lock, and the byte budget is kept in the same write transaction as the
entries, so it holds across processes.

A full map (``MapFullError``) or a tmpfs without room for a write (checked before the
write, and any LMDB error of the write itself) is absorbed: the put stores nothing and is
counted in ``failures``; so is a store whose directory was removed under it (a tmpfs
cleanup): reads miss, listings raise ``StoreUnavailable``. A capacity the filesystem
cannot hold is refused before anything is made.

Where the files live and who removes them is ``lease.py``'s: a default store is made in
the user's private ``/dev/shm/hotset-UID``; a named one (``path=``) is checked and shared
by every process that opens it; ``close(destroy=True)`` removes hotset's files only when
the last user leaves, and ``lease.remove_unused`` removes default stores whose users were
killed.

Chosen over Redis-on-loopback for one node by ``benchmarks/store_latency.py`` (batched
reads are served from the page cache with no socket round trip).
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

import lmdb

from hotset.errors import ConfigError, StoreUnavailable
from hotset.store import lease
from hotset.store.base import Store

log = logging.getLogger(__name__)

_USED = b"used_bytes"
_CAPACITY = b"capacity_bytes"
_TOKEN = b"token"  # drawn when the store is made: a store made anew at the path differs
#: room a write needs on the tmpfs beyond its values (LMDB pages, B-tree, free list)
WRITE_MARGIN = 1 << 20


# One environment per path per process: LMDB forbids opening the same files twice in a
# process, and several SharedStore objects (or unpickled copies) may name one path.
_ENVS: dict[str, tuple[lmdb.Environment, object, object]] = {}
#: the SharedStore objects of this process that hold a lease on each path: the last to
#: close closes the environment (its map and file descriptors)
_HOLDERS: Counter[str] = Counter()


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
    """The process's environment at ``path``; ``create``: make the LMDB files if missing
    (a user holding the lease only: a removed store is never made again by a reader)."""
    handle = _ENVS.get(path)
    if handle is None:
        env = lmdb.open(
            path,
            create=create,
            mode=0o600,
            map_size=map_size,
            max_dbs=2,
            sync=False,
            metasync=False,
            readahead=False,
            writemap=True,  # (puts and deletes write the map in place: 3x cheaper than copies)
            max_readers=1024,
        )
        handle = _ENVS[path] = (env, env.open_db(b"data"), env.open_db(b"meta"))
    return handle


class StoreReplaced(lmdb.Error):
    """The store's directory was removed or replaced since this job opened it: the job
    reads from storage (each use counted in ``failures``), never from another store."""


def _dir_id(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _resolve(path: str) -> str:
    """``path`` with its links resolved, once no link on the way is another user's and
    no directory above it is one another user could swap (``lease.check_ancestors``)."""
    lease.check_ancestors(path)
    return os.path.realpath(path)


class SharedStore(Store):
    """LMDB-backed store shared by all processes that open ``path``.

    ``path=None``: a fresh store in the user's private directory, removed by ``close``.
    ``path``: a named store, made if missing, shared by every process that opens it; the
    last of them to ``close(destroy=True)`` removes hotset's files (and the directory if
    hotset made it). ``join``: open a store another process made and keeps (the multi-job
    service's): never make it, never remove it.

    The environment is opened lazily in each process (LMDB handles must not cross a
    ``fork``), so the object can be handed to DataLoader workers.
    """

    shared_across_processes = True

    def __init__(self, capacity_bytes: int, path: str | None = None, *, join: bool = False):
        super().__init__(capacity_bytes)
        # Sparse on tmpfs: the map size reserves address space, not memory. LMDB needs
        # room for page overhead and for pages freed while readers still hold them.
        self.map_size = 3 * self.capacity_bytes + (256 << 20)
        self.lease: lease.Lease | None = None
        # what the store was when this job opened it (its directory, the token in its
        # meta): each process checks both as it opens the environment
        self._dir_id: tuple[int, int] | None = None
        self.token: bytes | None = None
        self._warned = False
        if path is None:
            base = lease.private_base()
            self._check_capacity(base)
            lease.remove_unused(base)
            self.lease = lease.Lease.fresh(base)
            self.path = self.lease.path
        else:
            self.path = _resolve(path)
            if join:
                lease.check_own_dir(self.path)
                lease.check_lmdb_files(self.path)
            else:
                exists = os.path.isdir(self.path)
                self._check_capacity(self.path if exists else os.path.dirname(self.path))
                self.lease = lease.Lease.open(self.path)
        if self.lease is not None:
            _HOLDERS[self.path] += 1
        try:
            self._init_meta(create=not join)
        except BaseException:
            self.close(destroy=True)
            raise
        self._dir_id = _dir_id(self.path)

    @property
    def spec(self) -> str:
        return f"shared://{self.path}"

    def claim(self, namespace: str) -> Callable[[], None]:
        return lease.claim(self.path, namespace)

    def _check_capacity(self, directory: str) -> None:
        """Refuse, before anything is made, a capacity the filesystem cannot hold."""
        try:
            st = os.statvfs(directory)
        except OSError:
            return  # no such directory: opening the store says so, naming it
        if self.capacity_bytes > st.f_blocks * st.f_frsize:
            raise ConfigError(
                f"capacity_bytes={self.capacity_bytes} is more than the filesystem of "
                f"{directory} holds ({st.f_blocks * st.f_frsize} bytes): use a smaller "
                "cache_fraction or capacity_bytes, or a Redis store"
            )

    def _init_meta(self, create: bool) -> None:
        try:
            env = self._open(create=create)
        except (MemoryError, lmdb.Error) as exc:
            raise ConfigError(
                f"cannot open the shared store at {self.path} with capacity_bytes="
                f"{self.capacity_bytes}: {exc}"
            ) from exc
        with env.begin(write=create, db=self._meta) as txn:
            stored = txn.get(_CAPACITY)
            if stored is not None and int(stored) != self.capacity_bytes:
                raise ConfigError(
                    f"shared store at {self.path} has capacity_bytes={int(stored)}, "
                    f"asked for {self.capacity_bytes}"
                )
            if create:
                txn.put(_CAPACITY, str(self.capacity_bytes).encode())
                if txn.get(_USED) is None:
                    txn.put(_USED, b"0")
                if txn.get(_TOKEN) is None:
                    txn.put(_TOKEN, os.urandom(16))
            self.token = txn.get(_TOKEN)

    def _open(self, create: bool = False) -> lmdb.Environment:
        fresh = self.path not in _ENVS  # (first use in this process, or after a fork)
        if fresh and self._dir_id is not None and (
            _dir_id(self.path) != self._dir_id
            or not os.path.exists(os.path.join(self.path, lease.LMDB_FILES[0]))
        ):  # (never open, and so make, LMDB files in a directory that is not the store)
            self._replaced()
        env, self._data, self._meta = _environment(self.path, self.map_size, create)
        if fresh and self.token is not None:
            with env.begin(db=self._meta) as txn:
                same = txn.get(_TOKEN) == self.token
            if not same:
                _ENVS.pop(self.path)
                env.close()
                self._replaced()
        return env

    def _replaced(self) -> None:
        if not self._warned:
            self._warned = True
            log.warning(
                "shared store %s was removed or replaced since this job opened it: "
                "training goes on from storage (counted in store_failures)", self.path,
            )  # fmt: skip
        raise StoreReplaced(f"shared store {self.path} is not the one this job opened")

    def _txn(self, fn, fallback, write: bool = False, buffers: bool = False):
        """``fn(txn)`` in a transaction (``buffers``: its gets return views into the map,
        valid within it, not copies); an LMDB error (map full, no space left, the store
        removed under this process) is counted and ``fallback`` returned."""
        try:
            with self._open().begin(write=write, buffers=buffers) as txn:
                return fn(txn)
        except lmdb.Error as exc:
            self.failures += 1
            log.debug("shared store %s: %s", self.path, exc)
            return fallback

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        def read(txn):
            return [txn.get(k.encode(), db=self._data) for k in keys]

        return self._txn(read, [None] * len(keys))

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

        def write(txn):
            stored, out = 0, []
            used = int(bytes(txn.get(_USED, db=self._meta)))
            for k, v in items.items():
                kb = k.encode()
                if txn.get(kb, db=self._data) is not None:
                    continue
                if used + len(v) > self.capacity_bytes:
                    out.append(k)
                    continue
                txn.put(kb, v, db=self._data)
                used += len(v)
                stored += 1
            txn.put(_USED, str(used).encode(), db=self._meta)
            return stored, out

        stored, out = self._txn(write, (0, None), write=True, buffers=True)
        if out is None:  # the transaction stored nothing
            return 0, list(items)
        self.refused += len(out)
        return stored, out

    def list_keys(self, prefix: str = "") -> list[str]:
        start = prefix.encode()

        def listing(txn):
            out, cursor = [], txn.cursor(db=self._data)
            if cursor.set_range(start):  # keys are sorted: the prefix's run only
                for k in cursor.iternext(values=False):
                    if not k.startswith(start):
                        break
                    out.append(bytes(k).decode())
            return out

        keys = self._txn(listing, None)
        if keys is None:  # unknown, not empty: a planner must not forget what it holds
            raise StoreUnavailable(f"shared store {self.path} cannot be read: cannot list it")
        return keys

    def reconcile(self) -> int:
        def recount(txn):
            used = sum(len(v) for _, v in txn.cursor(db=self._data))
            txn.put(_USED, str(used).encode(), db=self._meta)
            return used

        return self._txn(recount, 0, write=True)

    def delete_many(self, keys: Sequence[str]) -> None:
        def delete(txn):
            used = int(bytes(txn.get(_USED, db=self._meta)))
            for k in keys:
                kb = k.encode()
                v = txn.get(kb, db=self._data)
                if v is not None:
                    txn.delete(kb, db=self._data)
                    used -= len(v)
            txn.put(_USED, str(used).encode(), db=self._meta)

        # (views: a value's length is read, never its bytes copied)
        self._txn(delete, None, write=True, buffers=True)  # failed: reconciled at epoch end

    def contains(self, key: str) -> bool:
        return self._txn(lambda txn: txn.get(key.encode(), db=self._data) is not None, False)

    @property
    def used_bytes(self) -> int:
        return self._txn(lambda txn: int(txn.get(_USED, db=self._meta)), 0)

    def __len__(self) -> int:
        return self._txn(lambda txn: txn.stat(self._data)["entries"], 0)

    def clear(self) -> None:
        def clear(txn):
            txn.drop(self._data, delete=False)
            txn.put(_USED, b"0", db=self._meta)

        self._txn(clear, None, write=True)

    def close(self, destroy: bool = False) -> None:
        """Stop using the store; ``destroy``: remove it if this is its last user (only
        hotset's files, and the directory if hotset made it). A joined store is left
        alone."""
        if self.lease is None or not self.lease.held:
            return
        self.lease.leave(remove=destroy)
        _HOLDERS[self.path] -= 1
        if _HOLDERS[self.path] <= 0:
            del _HOLDERS[self.path]
            handle = _ENVS.pop(self.path, None)
            if handle is not None:
                handle[0].close()

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.pop("_data", None)
        state.pop("_meta", None)
        return state
