"""In-process store: a dict under a lock. Private to one process."""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence

from hotset.errors import ConfigError
from hotset.store.base import Store


class MemoryStore(Store):
    """Fastest store, for ``num_workers=0`` and the simulator; each process has its own."""

    shared_across_processes = False

    def __init__(self, capacity_bytes: int) -> None:
        super().__init__(capacity_bytes)
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        if self.capacity_bytes > ram:
            raise ConfigError(
                f"capacity_bytes={self.capacity_bytes} is more than this machine's memory "
                f"({ram} bytes): use a smaller cache_fraction or capacity_bytes"
            )
        self._data: dict[str, bytes] = {}
        self._used = 0
        self._lock = threading.Lock()

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        get = self._data.get
        return [get(k) for k in keys]

    def put(self, items: Mapping[str, bytes]) -> tuple[int, list[str]]:
        stored, out = 0, []
        with self._lock:
            for k, v in items.items():
                if k in self._data:
                    continue
                if self._used + len(v) > self.capacity_bytes:
                    self.refused += 1
                    out.append(k)
                    continue
                self._data[k] = bytes(v)
                self._used += len(v)
                stored += 1
        return stored, out

    def list_keys(self, prefix: str = "") -> list[str]:
        with self._lock:
            return [k for k in self._data if k.startswith(prefix)]

    def delete_many(self, keys: Sequence[str]) -> None:
        with self._lock:
            for k in keys:
                v = self._data.pop(k, None)
                if v is not None:
                    self._used -= len(v)

    def contains(self, key: str) -> bool:
        return key in self._data

    @property
    def used_bytes(self) -> int:
        return self._used

    def __len__(self) -> int:
        return len(self._data)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self._used = 0

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        del state["_lock"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
