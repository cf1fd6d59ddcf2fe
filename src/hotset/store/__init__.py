"""Where cached bytes live: in-process, node-local shared (LMDB on tmpfs), Redis, Redis
Cluster."""

from __future__ import annotations

from hotset.errors import ConfigError
from hotset.store.base import Store
from hotset.store.memory import MemoryStore
from hotset.store.redis_cluster import SCHEME, RedisClusterStore
from hotset.store.redis_store import RedisStore
from hotset.store.sealed import SealedStore
from hotset.store.shared import SharedStore
from hotset.store.tiered import PREFIX as TIERED
from hotset.store.tiered import TieredStore

STORE_KINDS = (
    "memory",
    "shared",
    "shared:///path/on/tmpfs",
    "redis://host:port/db",
    "redis+cluster://host:port",
    "unix:///sock",
    "shared+redis+cluster://host:port",
)


def make_store(spec: str, capacity_bytes: int, **options) -> Store:
    """A store from a short spec: ``memory``, ``shared`` (a fresh LMDB dir in /dev/shm),
    ``shared:///dev/shm/name`` (a named one several processes open), a Redis URL, or
    ``shared+`` and a Redis URL (node-local copies in front of it: ``tiered.py``)."""
    if spec.startswith(TIERED):
        pooled = make_store(spec[len(TIERED) :], capacity_bytes, **options)
        return TieredStore(SharedStore(capacity_bytes), pooled)
    if spec == "memory":
        return MemoryStore(capacity_bytes)
    if spec == "shared":
        return SharedStore(capacity_bytes, **options)
    if spec.startswith("shared://"):
        return SharedStore(capacity_bytes, path=spec[len("shared://") :], **options)
    if spec.startswith(SCHEME):
        return RedisClusterStore(capacity_bytes, url=spec, **options)
    if spec.startswith(("redis://", "rediss://", "unix://")):
        return RedisStore(capacity_bytes, url=spec, **options)
    raise ConfigError(f"unknown store {spec!r}; use one of: {', '.join(STORE_KINDS)}")


__all__ = [
    "MemoryStore",
    "RedisClusterStore",
    "RedisStore",
    "SealedStore",
    "SharedStore",
    "Store",
    "TieredStore",
    "make_store",
]
