"""The Store interface: where cached bytes live, under a hard byte budget."""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence

from hotset.errors import ConfigError, HotsetError

log = logging.getLogger(__name__)


class Store(ABC):
    """A key -> bytes map that never holds more than ``capacity_bytes`` of values.

    ``put`` refuses (and counts) entries that would exceed the budget rather than
    evicting: only the planner decides evictions. Keys are global sample keys, so an
    existing key already holds the right bytes and a second put of it is a no-op.
    ``failures`` counts backend errors this process absorbed (reads then return ``None``,
    puts store nothing, and the caller falls back to storage): a backend that is down,
    out of memory or out of map space never stops training.
    """

    #: whether DataLoader workers and other processes see the same entries
    shared_across_processes: bool = False

    def __init__(self, capacity_bytes: int) -> None:
        if int(capacity_bytes) < 0:
            raise ConfigError(f"capacity_bytes must be >= 0, got {capacity_bytes}")
        self.capacity_bytes = int(capacity_bytes)
        self.failures = 0
        self.refused = 0

    @abstractmethod
    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """The value of each key, or ``None`` where absent (or the backend is down)."""

    @abstractmethod
    def put(self, items: Mapping[str, bytes]) -> tuple[int, list[str]]:
        """Store what fits in the budget; returns how many new entries were stored, and
        the keys it does not hold afterwards (refused, or lost to a backend failure)."""

    def put_many(self, items: Mapping[str, bytes]) -> int:
        """Store what fits in the budget; returns how many new entries were stored."""
        return self.put(items)[0]

    @abstractmethod
    def delete_many(self, keys: Sequence[str]) -> None:
        """Remove the keys that are present."""

    def delete_store_keys(self, keys: Sequence[str]) -> None:
        """Remove entries named as this store files them (a sealing store files them
        under another name than the sample key; the multi-job service sends those)."""
        self.delete_many(keys)

    @abstractmethod
    def contains(self, key: str) -> bool: ...

    @property
    @abstractmethod
    def used_bytes(self) -> int:
        """Bytes of values currently held (never above ``capacity_bytes``)."""

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def clear(self) -> None:
        """Remove every entry."""

    def list_keys(self, prefix: str = "") -> list[str]:
        """Every key held that starts with ``prefix`` (for reconciling with a planner; not
        for the batch path)."""
        raise ConfigError(f"{type(self).__name__} cannot list its keys")

    def reconcile(self) -> int:
        """Recount the bytes held from the entries themselves (a server may have evicted
        some behind the budget counter's back); returns the corrected ``used_bytes``."""
        return self.used_bytes

    def trim_copies(self) -> int:
        """Drop copies of entries the planned tier no longer holds (a tiered store's
        node-local copies, at an epoch boundary); returns how many."""
        return 0

    def claim(self, namespace: str) -> Callable[[], None]:
        """Reserve ``namespace`` (one job's entries, see ``NamespacedStore``) for the
        caller until it calls the returned release: two jobs planning the same entries
        would undo each other's work, so a store other processes can open refuses a
        second live claim with a ``ConfigError``. Default: nothing to reserve (the store
        is private to this object, or its namespace was drawn for it alone)."""
        return lambda: None

    @property
    def spec(self) -> str | None:
        """What another process passes to ``make_store`` to open these same entries
        (``None``: they are private to this process)."""
        return None

    def close(self, destroy: bool = False) -> None:  # noqa: B027 - optional hook
        """Release handles; ``destroy=True`` also removes the backing data."""

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class StoreWrapper(Store):
    """A store that keeps its entries in ``inner`` under other names (a namespace, sealed
    ids): budget, counters, sharing and lifetime are the inner store's."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner.capacity_bytes)
        self.inner = inner
        self.shared_across_processes = inner.shared_across_processes

    @property
    def failures(self) -> int:  # the backend's counters are the ones that matter
        return self.inner.failures

    @failures.setter
    def failures(self, value: int) -> None:
        pass

    @property
    def refused(self) -> int:
        return self.inner.refused

    @refused.setter
    def refused(self, value: int) -> None:
        pass

    def delete_store_keys(self, keys: Sequence[str]) -> None:
        self.inner.delete_many(keys)  # already the inner store's names

    def claim(self, namespace: str) -> Callable[[], None]:
        return self.inner.claim(namespace)

    @property
    def used_bytes(self) -> int:
        return self.inner.used_bytes

    def reconcile(self) -> int:
        return self.inner.reconcile()

    def trim_copies(self) -> int:
        return self.inner.trim_copies()

    def close(self, destroy: bool = False) -> None:
        self.inner.close(destroy=destroy)


class NamespacedStore(StoreWrapper):
    """Entries under ``prefix + key`` in ``inner``: one dataset's part of a store that
    other datasets (other jobs) may share, so no planner touches another's entries."""

    def __init__(self, inner: Store, prefix: str) -> None:
        super().__init__(inner)
        self.prefix = prefix

    def claim(self, namespace: str = "") -> Callable[[], None]:
        return self.inner.claim(self.prefix + namespace)

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        return self.inner.get_many([self.prefix + k for k in keys])

    def put(self, items: Mapping[str, bytes]) -> tuple[int, list[str]]:
        p, n = self.prefix, len(self.prefix)
        stored, out = self.inner.put({p + k: v for k, v in items.items()})
        return stored, [k[n:] for k in out]

    def delete_many(self, keys: Sequence[str]) -> None:
        self.inner.delete_many([self.prefix + k for k in keys])

    def contains(self, key: str) -> bool:
        return self.inner.contains(self.prefix + key)

    def list_keys(self, prefix: str = "") -> list[str]:
        n = len(self.prefix)
        return [k[n:] for k in self.inner.list_keys(self.prefix + prefix)]

    def __len__(self) -> int:
        return len(self.list_keys())

    def clear(self) -> None:
        self.inner.delete_many([self.prefix + k for k in self.list_keys()])

    def close(self, destroy: bool = False) -> None:
        """``destroy``: this namespace's entries go first (other namespaces of a shared
        store stay; a store down keeps them, logged), then the store's own rule applies."""
        if destroy:
            try:
                self.clear()
            except HotsetError as exc:
                log.info("the entries under %s stay in the store: %s", self.prefix, exc)
        self.inner.close(destroy=destroy)
