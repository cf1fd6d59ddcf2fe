"""LFU: evict the resident accessed least often (counting every access seen, resident or
not); ties go to the resident whose count was set earliest. Residents sit in a keyed heap
by ``count << 40 | tick``."""

from __future__ import annotations

from hotset.policy.base import Policy, register_policy
from hotset.policy.keyed_heap import KeyedHeap

TICK_BITS = 40


@register_policy
class LFUPolicy(Policy):
    name = "lfu"

    def __init__(self, capacity_bytes, sizes, seed: int = 0):
        super().__init__(capacity_bytes, sizes, seed)
        self._freq = [0] * self.num_samples
        self._heap = KeyedHeap.for_ids(self.num_samples)
        self._tick = 0
        self._level = 0  # the current access's (count, tick)

    @property
    def _resident(self):
        return self._heap.live

    def _on_hit(self, p: int, i: int) -> bool:
        f = self._freq[i] + 1
        self._freq[i] = f
        self._tick += 1
        self._level = f << TICK_BITS | self._tick
        if i in self._heap.live:
            self._heap.push(i, self._level)
            return True
        return False

    def _victim(self, p: int, i: int) -> int:
        return self._heap.take()

    def _restore(self, victims: list[int]) -> None:
        self._heap.put_back(victims)

    def _insert(self, p: int, i: int) -> None:
        self._heap.settle()
        self._heap.push(i, self._level)

    def _remove(self, i: int) -> None:
        self._heap.drop(i)
