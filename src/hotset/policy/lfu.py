"""LFU: evict the resident accessed least often (counting every access seen, resident or
not); ties go to the resident whose count was set earliest. Lazy-deletion min-heap."""

from __future__ import annotations

import heapq

from hotset.policy.base import Policy, register_policy


@register_policy
class LFUPolicy(Policy):
    name = "lfu"

    def __init__(self, capacity_bytes, sizes, seed: int = 0):
        super().__init__(capacity_bytes, sizes, seed)
        self._freq = [0] * self.num_samples
        self._stamp: dict[int, int] = {}  # resident id -> tick of its live heap entry
        self._heap: list[tuple[int, int, int]] = []  # (freq, tick, id)
        self._tick = 0

    @property
    def _resident(self):
        return self._stamp

    def _access(self, ids, hits, admitted, evicted):
        freq, stamp, heap = self._freq, self._stamp, self._heap
        sizes, cap, used, tick = self._sizes, self.capacity_bytes, self.used, self._tick
        push, pop = heapq.heappush, heapq.heappop
        for i in ids:
            f = freq[i] + 1
            freq[i] = f
            tick += 1
            if i in stamp:
                stamp[i] = tick
                push(heap, (f, tick, i))
                hits.append(True)
                continue
            hits.append(False)
            s = sizes[i]
            if s > cap:
                continue
            used += s
            while used > cap:
                _, t, j = pop(heap)
                if stamp.get(j) != t:
                    continue  # stale entry
                del stamp[j]
                used -= sizes[j]
                evicted.append(j)
            stamp[i] = tick
            push(heap, (f, tick, i))
            admitted.append(i)
        self.used, self._tick = used, tick
        if len(heap) > 4 * len(stamp) + 1024:  # drop stale entries
            self._heap = [(freq[j], t, j) for j, t in stamp.items()]
            heapq.heapify(self._heap)
