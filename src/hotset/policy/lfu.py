"""LFU: evict the resident accessed least often (counting every access seen, resident or
not); ties go to the resident whose count was set earliest. Residents sit in a keyed heap
by ``count << 40 | tick``."""

from __future__ import annotations

from hotset.policy.base import register_policy
from hotset.policy.keyed_heap import HeapPolicy

TICK_BITS = 40


@register_policy
class LFUPolicy(HeapPolicy):
    name = "lfu"

    def __init__(self, capacity_bytes, sizes, seed: int = 0):
        super().__init__(capacity_bytes, sizes, seed)
        self._freq = [0] * self.num_samples
        self._tick = 0
        self._count = 0  # the current access's (count, tick)

    def _on_hit(self, p: int, i: int) -> bool:
        f = self._freq[i] + 1
        self._freq[i] = f
        self._tick += 1
        self._count = f << TICK_BITS | self._tick
        if i in self._heap:
            self._heap.push(i, self._count)
            return True
        return False

    def _victim(self, p: int, i: int) -> int:
        return self._heap.take()

    def _level(self, p: int, i: int) -> int:
        return self._count
