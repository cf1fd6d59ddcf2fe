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
        self._order: dict[int, None] = {}  # residents in admission order

    @property
    def _resident(self):
        return self._order

    def shrink_to(self, capacity_bytes: int) -> list[int]:
        """Never evicting has no victim order: the most recently admitted go first
        (pinned ones stay until their plans have run)."""
        self.capacity_bytes = int(capacity_bytes)
        out = []
        for j in reversed(list(self._order)):
            if self.used <= self.capacity_bytes:
                break
            if not self.pinned[j]:
                del self._order[j]
                self.used -= self._sizes[j]
                out.append(j)
        return out

    def _insert(self, p: int, i: int) -> None:
        self._order[i] = None

    def _remove(self, i: int) -> None:
        del self._order[i]
