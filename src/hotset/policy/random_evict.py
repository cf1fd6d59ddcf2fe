"""Random eviction: evict a uniformly chosen resident (seeded, reproducible)."""

from __future__ import annotations

import random

from hotset.policy.base import Policy, register_policy


@register_policy
class RandomPolicy(Policy):
    name = "random"

    def __init__(self, capacity_bytes, sizes, seed: int = 0):
        super().__init__(capacity_bytes, sizes, seed)
        self._pos: dict[int, int] = {}  # id -> index in _ids (swap-remove in O(1))
        self._ids: list[int] = []
        self._rng = random.Random(seed)

    @property
    def _resident(self):
        return self._pos

    def _access(self, ids, hits, admitted, evicted):
        pos, lst, sizes, cap, used = (
            self._pos,
            self._ids,
            self._sizes,
            self.capacity_bytes,
            self.used,
        )
        rand = self._rng.random
        for i in ids:
            if i in pos:
                hits.append(True)
                continue
            hits.append(False)
            s = sizes[i]
            if s > cap:
                continue
            used += s
            while used > cap:
                k = int(rand() * len(lst))
                j = lst[k]
                last = lst.pop()
                if k < len(lst):
                    lst[k] = last
                    pos[last] = k
                del pos[j]
                used -= sizes[j]
                evicted.append(j)
            pos[i] = len(lst)
            lst.append(i)
            admitted.append(i)
        self.used = used
