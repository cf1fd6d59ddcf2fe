"""Node-local shared store: LMDB in a tmpfs directory (``/dev/shm`` by default).

Every process on the node that opens the same path (DataLoader workers, other jobs)
reads the same memory-mapped pages: no per-worker copy. Writes are serialised by LMDB's
single-writer lock, and the byte budget is kept in the same write transaction as the
entries, so it holds across processes. Chosen over Redis-on-loopback for one node by
``benchmarks/store_latency.py`` (batched reads are served from the page cache with no
socket round trip).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence

import lmdb

from hotset.errors import ConfigError
from hotset.store.base import Store

_USED = b"used_bytes"
_CAPACITY = b"capacity_bytes"


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


def _environment(path: str, map_size: int) -> tuple[lmdb.Environment, object, object]:
    handle = _ENVS.get(path)
    if handle is None:
        os.makedirs(path, exist_ok=True)
        env = lmdb.open(
            path,
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


class SharedStore(Store):
    """LMDB-backed store shared by all processes that open ``path``.

    The environment is opened lazily in each process (LMDB handles must not cross a
    ``fork``), so the object can be handed to DataLoader workers.
    """

    shared_across_processes = True

    def __init__(self, capacity_bytes: int, path: str | None = None) -> None:
        super().__init__(capacity_bytes)
        self.path = path or tempfile.mkdtemp(prefix="hotset-store-", dir=default_shm_dir())
        # Sparse on tmpfs: the map size reserves address space, not memory. LMDB needs
        # room for page overhead and for pages freed while readers still hold them.
        self.map_size = 3 * self.capacity_bytes + (256 << 20)
        self.path = os.path.realpath(self.path)
        env = self._open()
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

    def _open(self) -> lmdb.Environment:
        env, self._data, self._meta = _environment(self.path, self.map_size)
        return env

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        with self._open().begin(db=self._data) as txn:
            return [txn.get(k.encode()) for k in keys]

    def put_many(self, items: Mapping[str, bytes]) -> int:
        stored = 0
        try:
            with self._open().begin(write=True) as txn:
                used = int(txn.get(_USED, db=self._meta))
                for k, v in items.items():
                    kb = k.encode()
                    if txn.get(kb, db=self._data) is not None:
                        continue
                    if used + len(v) > self.capacity_bytes:
                        self.refused += 1
                        continue
                    txn.put(kb, v, db=self._data)
                    used += len(v)
                    stored += 1
                txn.put(_USED, str(used).encode(), db=self._meta)
        except lmdb.MapFullError:
            self.failures += 1
            return 0
        return stored

    def delete_many(self, keys: Sequence[str]) -> None:
        with self._open().begin(write=True) as txn:
            used = int(txn.get(_USED, db=self._meta))
            for k in keys:
                kb = k.encode()
                v = txn.get(kb, db=self._data)
                if v is not None:
                    txn.delete(kb, db=self._data)
                    used -= len(v)
            txn.put(_USED, str(used).encode(), db=self._meta)

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
