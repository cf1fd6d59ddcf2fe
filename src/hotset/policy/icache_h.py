"""iCACHE's H-cache (HPCA'23 III-B, Algorithm 1 lines 4-18): a min-heap by importance,
its shadow heap while a new H-list is re-inserted, and the admissions of a batch."""

from __future__ import annotations

from heapq import heapreplace

import numpy as np

from hotset.policy import icache_kernel
from hotset.policy.compiled_heap import CompiledHeap, frozen
from hotset.policy.icache_lists import (
    NONE,
    H,
)
from hotset.policy.keyed_heap import KeyedHeap


class HCache:
    """The H-cache of ``ICachePolicy``: its methods, on the policy's state (a mixin)."""

    def _shrink_h(self) -> None:
        """Evict the least important unpinned H residents until the H-cache fits its
        capacity (a new split can leave a million to evict), at once: the victims the
        heap's pops would give, pinned residents skipped (they go once their plans
        have run)."""
        if self.h_used <= self.h_capacity:
            return
        order = self.heap.in_order()
        free = np.flatnonzero(self.pinned[order] == 0)  # where the unpinned are in it
        freed = np.cumsum(np.frombuffer(self._sizes, np.int64)[order[free]])
        k = min(free.size, int(np.searchsorted(freed, self.h_used - self.h_capacity)) + 1)
        if not k:
            return  # what is left is pinned: it goes once its plans have run
        victims = order[free[:k]]
        self.h_used -= int(freed[k - 1])
        stays = np.ones(order.size, bool)
        stays[free[:k]] = False
        rest = order[stays]
        self.heap.remove(victims, rest=rest)
        self._where[victims] = NONE
        self._evict_bulk.append(victims)

    def h_residents(self) -> np.ndarray:
        """The H-cache's residents."""
        return np.flatnonzero(self._where == H)

    def rebuild_step(self, budget: int) -> None:
        """``budget`` more residents re-inserted into the shadow heap; swap when all are."""
        if self.shadow is None:
            return
        self._rebuild -= budget
        if self._rebuild <= 0:
            self.heap, self.shadow = self.shadow, None
            self.swaps += 1

    def _src(self) -> KeyedHeap:
        """Where evictions come from: the (read-only, during a rebuild) heap, then the
        shadow once the old heap has nothing left."""
        return self.heap if len(self.heap) or self.shadow is None else self.shadow

    def _evicted(self, i: int) -> None:
        self.heap.drop(i)
        if self.shadow is not None:
            self.shadow.drop(i)
        self._where[i] = NONE
        self._evict_next.append(i)

    def _admit_h(self, i: int) -> bool:
        """Algorithm 1, lines 9-16: admit while there is room, else only by displacing
        residents that are all less important than ``i`` (line 14). Where no rebuild
        runs, a pinned resident met at the top is held out of the heap until its plans
        have run (``KeyedHeap.park``), not popped and pushed back at each admission."""
        s, cap, sizes = self._sizes[i], self.h_capacity, self._sizes
        if s > cap:
            return False
        q = int(self._level[i])
        # during a rebuild a resident can sit in both heaps: pop it once from each, count
        # its bytes once, and put back every popped entry if no room could be made
        popped: list[tuple[KeyedHeap, int, int]] = []
        victims: dict[int, None] = {}
        park = self.shadow is None
        while self.h_used + s > cap:
            src = self._src()
            top = src.peek()
            if top is None or top[1] >= q:
                break
            if park and self.pinned[top[0]]:
                src.park(src.pop_entry())  # (still a member: resident)
                continue
            j = src.pop()
            popped.append((src, j, top[1]))
            if j not in victims and not self.pinned[j]:  # a pinned one is put back
                victims[j] = None
                self.h_used -= sizes[j]
        if self.h_used + s > cap:  # could not make room: put them all back
            self.h_used += sum(sizes[j] for j in victims)
            victims.clear()
        for src, j, level in popped:
            if j not in victims:
                src.push(j, level)
        if self.h_used + s > cap:
            return False
        for j in victims:
            self._evicted(j)
        self._where[i] = H
        self.h_used += s
        (self.heap if self.shadow is None else self.shadow).push(i, q)
        return True

    def _admit_h_in_turn(
        self, ids: np.ndarray, h_pos: np.ndarray, misses: np.ndarray, hits: np.ndarray
    ) -> tuple[np.ndarray, list[int]]:
        """Algorithm 1, lines 7-17, for the batch's H positions ``h_pos`` in turn
        (``misses``: those not resident at the batch's start): a resident is a hit, a hot
        miss goes to ``_admit_h``, a resident evicted before its turn that is not hot is an
        L-miss. Returns the ids admitted and those positions (``turned``); sets ``hits``.
        Up to the first hot miss that ``_admit_h`` would not refuse at once, nothing
        changes: the misses without room, with the least important resident at least as
        important (line 14), are refused together (every miss of a full cache in the
        first epoch, where all ids are H-samples of one importance); after it, such a miss
        is refused in its turn against the least important level then, without a call."""
        i, cap = ids[misses], self.h_capacity
        sizes = np.frombuffer(self._sizes, np.int64)[i]
        refused = sizes > cap - self.h_used
        top = self._least_level()  # -1: none (every level is >= 0)
        refused &= self._level[i] <= top
        act = np.flatnonzero(~refused & (sizes <= cap))
        if not act.size:
            return np.zeros(0, np.int64), []
        take: list[int] = []
        turned: list[int] = []
        rest = h_pos[int(np.searchsorted(h_pos, misses[act[0]])) :]
        if self.shadow is None and self.compiled:
            done = self._compiled_in_turn(ids, rest, hits, top)
            if done is not None:
                return done
        now, is_h = memoryview(self._where), memoryview(self.is_h)
        level, size_of, pins = memoryview(self._level), self._sizes, memoryview(self.pinned)
        heap = self.heap if self.shadow is None else None  # (no rebuild: one heap)
        for p, i in zip(rest.tolist(), ids[rest].tolist(), strict=True):
            if now[i] == H:
                hits[p] = True
            elif is_h[i]:
                hits[p] = False
                s = size_of[i]
                if self.h_used + s > cap:
                    if s > cap or level[i] <= top:
                        continue  # refused at once, as above
                    if heap is not None and top >= 0:  # ``top``: the heap's first (peeked)
                        j = heap.heap[0] & heap.mask
                        if not pins[j] and self.h_used - size_of[j] + s <= cap:
                            self._replace_least(heap, j, i, s)
                            take.append(i)
                            top = self._least_level()
                            continue
                if self._admit_h(i):
                    take.append(i)
                top = self._least_level()
            else:
                hits[p] = False
                turned.append(p)
        return np.array(take, np.int64), turned

    def _compiled_in_turn(self, ids: np.ndarray, rest: np.ndarray, hits: np.ndarray,
                          top: int) -> tuple[np.ndarray, list[int]] | None:  # fmt: skip
        """The loop above compiled (``icache_kernel``) where no rebuild runs: the same
        decisions and heap; ``None`` where it cannot serve (numba missing, or
        ``compiled`` off) and nothing changed."""
        heap = self.heap
        if not (isinstance(heap, CompiledHeap) and icache_kernel.load()):
            return None
        h = heap.array(rest.size + 1)  # (an admission adds one entry at most)
        if h is None:
            return None
        take, turned = np.empty(rest.size, np.int64), np.empty(rest.size, np.int64)
        # entries taken from the heap at most
        evicted, parked, popped = heap.scratch(heap._n + rest.size + 1)
        hot, sizes = frozen(self.is_h), frozen(np.frombuffer(self._sizes, np.int64))
        heap._n, heap.count, self.h_used, nt, nl, ne, npk, rebuilt = icache_kernel.admit_in_turn(
            h, heap._n, heap.levels, heap.count, heap.slack, heap.bits, self._where, hot,
            self._level, sizes, self.pinned, frozen(ids), rest, self.h_capacity, self.h_used,
            top, hits, take, turned, evicted, parked, popped,
        )  # fmt: skip
        if rebuilt:
            heap._parked.clear()  # (a rebuild put every member's entry back)
        for k in parked[:npk].tolist():
            heap.park(k)
        self._evict_next.extend(evicted[:ne].tolist())
        return take[:nt], turned[:nl].tolist()

    def _replace_least(self, heap: KeyedHeap, j: int, i: int, s: int) -> None:
        """``_admit_h(i)`` where the least important resident ``j`` (the heap's first
        entry, current, unpinned, less important than ``i``) alone makes room and no
        rebuild runs: ``i``'s entry takes ``j``'s place at the top (one sift)."""
        q = int(self._level[i])
        heapreplace(heap.heap, q << heap.bits | i)
        self._evicted(j)
        heap.live[i] = q
        heap.count += 1
        self._where[i] = H
        self.h_used += s - self._sizes[j]

    def _least_level(self) -> int:
        """The least important H resident's level (line 14's bar), -1 where none is."""
        least = self._src().peek()
        return -1 if least is None else least[1]

    def _admit_h_all(self, new: np.ndarray) -> bool:
        """The batch's H-misses ``new`` (distinct, none resident) admitted at once where
        all of them fit the H-cache's free room, which is what ``_admit_h`` one by one
        does when it evicts nothing; whether they fit."""
        need = int(np.frombuffer(self._sizes, np.int64)[new].sum())
        if self.h_used + need > self.h_capacity:
            return False
        self._where[new] = H
        self.h_used += need
        (self.heap if self.shadow is None else self.shadow).add(new, self._level[new])
        return True
