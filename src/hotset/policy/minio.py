"""MinIO (CoorDL, VLDB'21): admit the first samples seen until full, never evict.

Under uniform shuffling every sample is read once per epoch, so a cache holding any fixed
fraction f of the dataset hits f of the time; never evicting avoids LRU's thrashing.
"""

from __future__ import annotations

from hotset.policy.base import Policy, register_policy


@register_policy
class MinIOPolicy(Policy):
    name = "minio"

    def __init__(self, capacity_bytes, sizes, seed: int = 0):
        super().__init__(capacity_bytes, sizes, seed)
        self._set: set[int] = set()
        self._order: list[int] = []  # admission order

    @property
    def _resident(self):
        return self._set

    def shrink_to(self, capacity_bytes: int) -> list[int]:
        """Never evicting has no victim order: the most recently admitted go first."""
        self.capacity_bytes = int(capacity_bytes)
        out = []
        while self.used > self.capacity_bytes:
            j = self._order.pop()
            self._set.discard(j)
            self.used -= self._sizes[j]
            out.append(j)
        return out

    def _insert(self, p: int, i: int) -> None:
        self._set.add(i)
        self._order.append(i)
