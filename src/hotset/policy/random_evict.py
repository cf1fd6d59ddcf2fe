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

    def _victim(self, p: int, i: int) -> int:
        """A uniformly chosen resident, removed by swapping the last one into its slot."""
        if not self._ids:
            return -1
        j = self._ids[int(self._rng.random() * len(self._ids))]
        self._remove(j)
        return j

    def _remove(self, j: int) -> None:
        pos, lst = self._pos, self._ids
        k = pos.pop(j)
        last = lst.pop()
        if k < len(lst):
            lst[k] = last
            pos[last] = k

    def _insert(self, p: int, i: int) -> None:
        self._pos[i] = len(self._ids)
        self._ids.append(i)

    def _restore(self, victims: list[int]) -> None:
        for j in victims:
            self._insert(-1, j)
