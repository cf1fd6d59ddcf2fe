"""Two tiers for jobs across nodes: a node-local LMDB of copies in front of the pooled tier
(a Redis Cluster, or one Redis server) that the plan decides.

The pooled tier is the plan's: every admission lands there under its global budget, its
listing and counters are this store's, and a rank on any node reads what another put.
The local tier holds copies of pooled entries this node read or wrote, up to its own
budget, so a node's repeated reads skip the network. Keys are content digests, so a copy
is never wrong bytes; a copy of an entry the plan has since evicted is dropped when the
node trims its copies to the pooled listing at each epoch boundary (``trim_copies``), and
a full local tier only stops copying.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hotset.errors import StoreUnavailable
from hotset.store.base import Store, StoreWrapper

PREFIX = "shared+"  # shared+redis+cluster://host:port, shared+redis://host:port


class TieredStore(StoreWrapper):
    """``pooled`` (the planned tier) with ``local`` copies in front. ``trims``: this
    process trims the node's copies (the node tier's maker). ``close(destroy=True)``
    removes each tier as its own rules say: the node's LMDB when its last user leaves,
    the pooled namespace if the pooled store drew it."""

    def __init__(self, local: Store, pooled: Store, trims: bool = True) -> None:
        super().__init__(pooled)
        self.local = local
        self.trims = trims
        self.shared_across_processes = (
            local.shared_across_processes and pooled.shared_across_processes
        )
        self.local_hits = 0  # reads the local tier served (this process)

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        got = self.local.get_many(keys)
        far = [k for k, v in zip(keys, got, strict=True) if v is None]
        self.local_hits += len(keys) - len(far)
        if not far:
            return got
        fetched = dict(zip(far, self.inner.get_many(far), strict=True))
        copies = {k: v for k, v in fetched.items() if v is not None}
        if copies:
            self.local.put(copies)
        return [fetched[k] if v is None else v for k, v in zip(keys, got, strict=True)]

    def put(self, items: Mapping[str, bytes]) -> tuple[int, list[str]]:
        stored, refused = self.inner.put(items)
        lost = set(refused)
        self.local.put({k: v for k, v in items.items() if k not in lost})
        return stored, refused

    def delete_many(self, keys: Sequence[str]) -> None:
        self.inner.delete_many(keys)
        self.local.delete_many(keys)

    def contains(self, key: str) -> bool:
        return self.inner.contains(key)

    def __len__(self) -> int:
        return len(self.inner)

    def clear(self) -> None:
        self.inner.clear()
        self.local.clear()

    def list_keys(self, prefix: str = "") -> list[str]:
        return self.inner.list_keys(prefix)

    def trim_copies(self) -> int:
        """Drop the node's copies the pooled tier no longer holds: done by the node tier's
        maker only (its other ranks share that LMDB; each would list the pool again)."""
        if not self.trims:
            return 0
        try:
            keep = set(self.inner.list_keys())
        except StoreUnavailable:
            return 0  # the pooled tier's contents are unknown: keep the copies
        drop = [k for k in self.local.list_keys() if k not in keep]
        self.local.delete_many(drop)
        return len(drop)

    def close(self, destroy: bool = False) -> None:
        self.inner.close(destroy=destroy)
        self.local.close(destroy=destroy)
