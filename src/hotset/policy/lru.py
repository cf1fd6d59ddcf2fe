"""LRU: evict the least recently used resident (the papers' baseline)."""

from __future__ import annotations

from collections import OrderedDict

from hotset.policy.base import Policy, register_policy


@register_policy
class LRUPolicy(Policy):
    name = "lru"
    #: move a hit to the most-recent end (False gives FIFO)
    refresh_on_hit = True

    def __init__(self, capacity_bytes, sizes, seed: int = 0):
        super().__init__(capacity_bytes, sizes, seed)
        self._order: OrderedDict[int, None] = OrderedDict()

    @property
    def _resident(self):
        return self._order

    def _access(self, ids, hits, admitted, evicted):
        order, sizes, cap, used = self._order, self._sizes, self.capacity_bytes, self.used
        refresh, move, pop = self.refresh_on_hit, order.move_to_end, order.popitem
        for i in ids:
            if i in order:
                if refresh:
                    move(i)
                hits.append(True)
                continue
            hits.append(False)
            s = sizes[i]
            if s > cap:
                continue
            used += s
            while used > cap:
                j = pop(last=False)[0]
                used -= sizes[j]
                evicted.append(j)
            order[i] = None
            admitted.append(i)
        self.used = used
