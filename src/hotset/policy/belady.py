"""Belady's MIN (offline optimum): on a miss with a full cache, evict the resident whose
next use lies furthest in the future, and do not admit a sample whose own next use is
later than every resident's (MIN with bypass, optimal in misses for equal sizes).

It needs the access sequence the sampler has planned: ``set_future(sequence)``; each
access must then follow that sequence.
"""

from __future__ import annotations

import numpy as np

from hotset.errors import ConfigError
from hotset.policy.base import register_policy
from hotset.policy.keyed_heap import HeapPolicy, KeyedHeap


def next_use(sequence: np.ndarray, never: int) -> np.ndarray:
    """``out[t]`` = the next position after ``t`` that accesses ``sequence[t]``, or ``never``."""
    sequence = np.asarray(sequence, dtype=np.int64)
    order = np.argsort(sequence, kind="stable")
    ranked = sequence[order]
    out = np.full(sequence.size, never, dtype=np.int64)
    same = ranked[1:] == ranked[:-1]
    out[order[:-1][same]] = order[1:][same]
    return out


FAR = 1 << 40  # heap level = FAR - next use: the furthest next use on top


@register_policy
class BeladyPolicy(HeapPolicy):
    name = "belady"
    needs_future = True

    def __init__(self, capacity_bytes, sizes, seed: int = 0):
        super().__init__(capacity_bytes, sizes, seed)
        self._seq: list[int] = []
        self._next: list[int] = []
        self._pos = 0

    def set_future(self, sequence: np.ndarray) -> None:
        seq = np.asarray(sequence, dtype=np.int64)
        never = seq.size + 1
        self._seq, self._next, self._pos = seq.tolist(), next_use(seq, never).tolist(), 0
        resident = self._heap.members()
        uniq, first = np.unique(seq, return_index=True)
        where = np.searchsorted(uniq, resident)
        found = (where < uniq.size) & (uniq[np.minimum(where, uniq.size - 1)] == resident)
        nxt = np.where(found, first[np.minimum(where, uniq.size - 1)], never)
        self._heap = KeyedHeap(self.num_samples)
        for i, n in zip(resident.tolist(), nxt.tolist(), strict=True):
            self._heap.push(i, FAR - n)

    def _prepare(self, ids: np.ndarray) -> None:
        seq, pos, n = self._seq, self._pos, ids.size
        if pos + n > len(seq) or seq[pos : pos + n] != ids.tolist():
            raise ConfigError(
                "belady: the accesses differ from the planned sequence given to set_future "
                f"(at position {pos}); Belady needs the sampler's exact future order"
            )

    def _level(self, p: int, i: int) -> int:
        return FAR - self._next[self._pos + p]  # its next use from here

    def _on_hit(self, p: int, i: int) -> bool:
        if i in self._heap:
            self._heap.push(i, self._level(p, i))
            return True
        return False

    def _victim(self, p: int, i: int) -> int:
        top = self._heap.peek()
        if top is None or FAR - top[1] <= self._next[self._pos + p]:
            return -1  # every remaining resident is needed sooner than i: bypass
        return self._heap.take()

    def _access(self, ids, hits, admitted, evicted):
        super()._access(ids, hits, admitted, evicted)
        self._pos += len(ids)
