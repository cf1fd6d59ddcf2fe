"""The Store interface: where cached bytes live, under a hard byte budget."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence

from hotset.errors import ConfigError


class Store(ABC):
    """A key -> bytes map that never holds more than ``capacity_bytes`` of values.

    ``put_many`` refuses (and counts) entries that would exceed the budget rather than
    evicting: only the planner decides evictions. Keys are global sample keys, so an
    existing key already holds the right bytes and a second put of it is a no-op.
    ``failures`` counts backend errors this process absorbed (reads then return ``None``
    and the caller falls back to storage).
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
    def put_many(self, items: Mapping[str, bytes]) -> int:
        """Store what fits in the budget; returns how many new entries were stored."""

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

    def close(self, destroy: bool = False) -> None:  # noqa: B027 - optional hook
        """Release handles; ``destroy=True`` also removes the backing data."""

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
