"""Belady's MIN (offline optimum): on a miss with a full cache, evict the resident whose
next use lies furthest in the future, and do not admit a sample whose own next use is
later than every resident's (MIN with bypass, optimal in misses for equal sizes).

It needs the access sequence the sampler has planned: ``set_future(sequence)``; each
access must then follow that sequence.
"""

from __future__ import annotations

import heapq

import numpy as np

from hotset.errors import ConfigError
from hotset.policy.base import Policy, register_policy


def next_use(sequence: np.ndarray, never: int) -> np.ndarray:
    """``out[t]`` = the next position after ``t`` that accesses ``sequence[t]``, or ``never``."""
    sequence = np.asarray(sequence, dtype=np.int64)
    order = np.argsort(sequence, kind="stable")
    ranked = sequence[order]
    out = np.full(sequence.size, never, dtype=np.int64)
    same = ranked[1:] == ranked[:-1]
    out[order[:-1][same]] = order[1:][same]
    return out


@register_policy
class BeladyPolicy(Policy):
    name = "belady"
    needs_future = True

    def __init__(self, capacity_bytes, sizes, seed: int = 0):
        super().__init__(capacity_bytes, sizes, seed)
        self._next_of: dict[int, int] = {}  # resident id -> position of its next use
        self._heap: list[tuple[int, int]] = []  # (-next use, id), lazily deleted
        self._seq: list[int] = []
        self._next: list[int] = []
        self._pos = 0

    @property
    def _resident(self):
        return self._next_of

    def set_future(self, sequence: np.ndarray) -> None:
        seq = np.asarray(sequence, dtype=np.int64)
        never = seq.size + 1
        self._seq, self._next, self._pos = seq.tolist(), next_use(seq, never).tolist(), 0
        resident = np.fromiter(self._next_of, dtype=np.int64, count=len(self._next_of))
        uniq, first = np.unique(seq, return_index=True)
        where = np.searchsorted(uniq, resident)
        found = (where < uniq.size) & (uniq[np.minimum(where, uniq.size - 1)] == resident)
        nxt = np.where(found, first[np.minimum(where, uniq.size - 1)], never)
        self._next_of = dict(zip(resident.tolist(), nxt.tolist(), strict=True))
        self._heap = [(-n, i) for i, n in self._next_of.items()]
        heapq.heapify(self._heap)

    def _access(self, ids, hits, admitted, evicted):
        seq, nxt, pos = self._seq, self._next, self._pos
        if pos + len(ids) > len(seq) or seq[pos : pos + len(ids)] != ids:
            raise ConfigError(
                "belady: the accesses differ from the planned sequence given to set_future "
                f"(at position {pos}); Belady needs the sampler's exact future order"
            )
        next_of, heap, sizes, cap, used = (
            self._next_of,
            self._heap,
            self._sizes,
            self.capacity_bytes,
            self.used,
        )
        push, pop = heapq.heappush, heapq.heappop
        for i in ids:
            n = nxt[pos]
            pos += 1
            if i in next_of:
                next_of[i] = n
                push(heap, (-n, i))
                hits.append(True)
                continue
            hits.append(False)
            s = sizes[i]
            if s > cap:
                continue
            victims = []
            while used + s > cap:
                neg, j = heap[0]
                if next_of.get(j) != -neg:
                    pop(heap)  # stale entry
                    continue
                if -neg <= n:
                    break  # every remaining resident is needed sooner than i
                pop(heap)
                victims.append((neg, j))
                used -= sizes[j]
            if used + s > cap:  # bypass: put the victims back
                for neg, j in victims:
                    push(heap, (neg, j))
                    used += sizes[j]
                continue
            for _, j in victims:
                del next_of[j]
                evicted.append(j)
            next_of[i] = n
            push(heap, (-n, i))
            used += s
            admitted.append(i)
        self.used, self._pos = used, pos
        if len(heap) > 4 * len(next_of) + 1024:
            self._heap = [(-n, j) for j, n in next_of.items()]
            heapq.heapify(self._heap)
