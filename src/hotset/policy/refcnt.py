"""RefCnt (JOADER 3.2): evict the element that the fewest jobs will still read.

``refs[i]`` counts the future reads of ``i``: whoever schedules the jobs adds one per
job that will read ``i`` (``add_references`` at each job's epoch start) and takes back
the references of a job that leaves; every access is a read and consumes one. A miss is
admitted by evicting the residents with the lowest counts, as long as each has fewer
references than the newcomer or as many (ties go to the newcomer, the more recent): an
element nobody reads again is never cached, and never displaces one that somebody will.

``pin`` holds ids whose planned reads have not run yet (a multi-job service plans ahead
of its workers): a pinned id is never evicted, so a planned hit is still there when the
worker reads it.
"""

from __future__ import annotations

from heapq import heapify, heappop, heappush, heapreplace

import numpy as np

from hotset.ids import as_ids, distinct, distinct_index, first_positions
from hotset.policy import refcnt_kernel
from hotset.policy.base import AccessResult, register_policy
from hotset.policy.compiled_heap import CompiledHeap, frozen
from hotset.policy.keyed_heap import HeapPolicy

PINNED = 1 << 32  # a pinned resident outranks any reference count


def _current_top(h: list[int], live, refs, pins, bits: int, mask: int) -> None:
    """``RefCntPolicy._top`` on the heap's entries in place: drop stale tops and re-key a
    top whose count or pin went up, until the top is current (then it is the minimum)."""
    while h:
        k = h[0]
        j = k & mask
        keyed, now = k >> bits, refs[j] + PINNED if pins[j] else refs[j]
        if live[j] != keyed:
            heappop(h)
        elif now != keyed:
            live[j] = now
            heapreplace(h, now << bits | j)
        else:
            return


def _first_of_each(ids: np.ndarray) -> np.ndarray:
    """``ids`` with each repeat after the first dropped, in order."""
    return ids if distinct(ids) else ids[first_positions(ids)]


@register_policy
class RefCntPolicy(HeapPolicy):
    """Residents in a ``KeyedHeap`` (a ``CompiledHeap``, for the compiled loops) by their
    count of references (plus ``PINNED`` while pinned), so an eviction costs O(log n). A
    key that goes down (a read, a job that leaves, a pin released) re-keys the residents
    concerned at once, in every partition sharing the counts, and so does a job's epoch
    start (a reference to every resident: one sort); one that goes up for a few (a pin)
    is re-keyed when it reaches the top (``KeyedHeap.peek`` with the current key): a
    resident's key in the heap is never above its count, so the top, once checked, is
    the minimum, ties to the lower id as before. A batch of distinct ids is decided
    without the loop's step per read where it can (``_access_at_once``: numpy up to its
    first eviction, then its victims checked to be any order's, or the loop with its
    newcomers in a heap of their own)."""

    name = "refcnt"
    heap_class = CompiledHeap
    #: the merge and the checked victims compiled (``refcnt_kernel``); ``False``: the
    #: Python loops below, the same decisions (the tests' reference)
    compiled = True

    def __init__(self, capacity_bytes, sizes, seed: int = 0, refs=None, family=None):
        """``refs``: an array to share with other RefCnt policies (one count of future
        reads for several partitions of one cache); ``family``: the list of them."""
        super().__init__(capacity_bytes, sizes, seed)
        self.refs = np.full(self.num_samples, 0, np.int64) if refs is None else refs
        self._family: list[RefCntPolicy] = [] if family is None else family
        self._family.append(self)
        # ``_checked`` failed this many times in a row (capped), and the batches it then
        # sits out (the merge decides them: the same decisions, without a wasted try)
        self._failed = self._pause = 0
        refcnt_kernel.load()

    def new_partition(self, capacity_bytes: int, sizes: np.ndarray) -> RefCntPolicy:
        """A partition sharing this one's counts of references and pins."""
        part = RefCntPolicy(capacity_bytes, sizes, self.seed, refs=self.refs, family=self._family)
        self.share_pins(part)
        return part

    def state_dict(self) -> dict:
        """As every policy's, less the list of its partitions (each saves its own)."""
        state = super().state_dict()
        del state["_family"]
        return state

    def load_state_dict(self, state: dict) -> None:
        """As every policy's; the counts go into the array its partitions share."""
        refs = self.refs
        super().load_state_dict(state)
        refs[:] = self.refs
        self.refs = refs

    def _keys(self, ids: np.ndarray) -> np.ndarray:
        """``_key`` of each of ``ids``, in numpy."""
        return self.refs[ids] + np.where(self.pinned[ids] > 0, PINNED, 0)

    def _key(self, i: int) -> int:
        return int(self.refs[i]) + (PINNED if self.pinned[i] else 0)

    def _rekey(self, ids: np.ndarray) -> None:
        """Every family member re-keys its residents among ``ids`` whose keys went down
        (repeats allowed: a key that did not change pushes nothing)."""
        for member in self._family:
            heap = member._heap
            if not heap.count:
                continue
            if ids.size >= heap.count:  # most residents: all of them at once
                heap.rekey_all(member._keys(heap.members()))
            else:
                heap.rekey(ids, member._keys(ids))

    def _top(self) -> tuple[int, int] | None:
        """(id, key) of the resident with the lowest key, re-keying on the way those whose
        count or pin went up since they were keyed; ``None`` when empty."""
        return self._heap.peek(self._key)

    def add_references(self, ids, delta: int = 1) -> None:
        """``delta`` future reads of each of ``ids`` (negative: a job left), a repeated id
        once per repeat. Ids ascending and distinct (a job's epoch) without ``np.add.at``
        (14M ids: a range's slice, else one gather and one write)."""
        ids = as_ids(ids)
        index = distinct_index(ids, None)
        if index is None:
            np.add.at(self.refs, ids, int(delta))
        else:
            self.refs[index] += int(delta)
        if delta < 0:
            np.maximum(self.refs, 0, out=self.refs)
            self._rekey(ids)
        elif delta > 0 and any(
            ids.size >= m._heap.count > self.num_samples >> 7 for m in self._family
        ):  # a job's epoch over a cache of many: a scan and a sort of its residents now,
            self._rekey(ids)  # not a re-key of each at the top later (0.5 us each)

    def pin(self, ids, delta: int = 1) -> None:
        super().pin(ids, delta)
        if delta < 0:
            self._rekey(np.asarray(ids, np.int64))

    def shrink_to(self, capacity_bytes: int) -> list[int]:
        """Evict the unpinned residents with the fewest references until the rest fit (a
        pinned one stays: it is evicted by a later admission once its read has run)."""
        self.capacity_bytes = int(capacity_bytes)
        out = []
        while self.used > self.capacity_bytes:
            top = self._top()
            if top is None or top[1] >= PINNED:
                break
            j = self._heap.pop()
            self.used -= self._sizes[j]
            out.append(j)
        return out

    def access(self, ids) -> AccessResult:
        """The base loop's decisions (``Policy._access`` with this class's steps, which stay
        the reference): a batch of distinct ids at once where it can be
        (``_access_at_once``); otherwise (repeats, a single id) ``_merge`` reads each id in
        its turn and admits straight into the residents' heap."""
        ids = np.asarray(ids, np.int64)
        at_once = self._access_at_once(ids)
        if at_once is not None:
            return at_once
        every = np.ones(ids.size, bool)  # each read in its turn, as a hit is
        return self._merge(ids, every, ids, ids, ids[:0], 0, apart=False)

    def _access_at_once(self, ids: np.ndarray) -> AccessResult | None:
        """The loop's decisions for a batch of distinct ids, or ``None`` (the loop then
        decides). Each read consumes a reference and the misses worth caching are
        admitted in order; the reads before the batch's first eviction (all of them,
        where every newcomer fits the free room) at once in numpy, the rest by
        ``_checked`` where it holds, else by ``_merge``."""
        heap = self._heap
        if ids.size < 2 or heap.bits + PINNED.bit_length() > 62 or heap._taken:
            return None
        if not distinct(ids):
            return None
        r = np.maximum(self.refs[ids] - 1, 0)  # counts after this read
        level = r + np.where(self.pinned[ids] > 0, PINNED, 0)
        hit = heap.levels[ids] >= 0
        sizes = np.frombuffer(self._sizes, np.int64)
        at = np.flatnonzero(~hit & (r > 0) & (sizes[ids] <= self.capacity_bytes))  # newcomers
        need = self.used - self.capacity_bytes + np.cumsum(sizes[ids[at]])  # to free by each
        evicts = np.flatnonzero(need > 0)
        first = at[evicts[0]] if evicts.size else ids.size  # the first eviction's position
        early = hit.copy()
        early[first:] = False
        self.refs[ids[~hit | early]] = r[~hit | early]  # the later hits read in their turn
        heap.rekey(ids[early], level[early])
        later = hit & ~early
        victims = ids[:0]
        if evicts.size:  # with hits after the first eviction, the victims may be checked
            victims = self._try_checked(ids, level, r, at, need, later) if later.any() else None
            if victims is None:
                return self._merge(ids, hit, level, r, at[: evicts[0]], first)
            self.refs[ids[later]] = r[later]
            heap.rekey(ids[later], level[later])
        heap.count -= victims.size
        heap.add(ids[at], level[at])
        self.used += int(sizes[ids[at]].sum() - sizes[victims].sum())
        return AccessResult(hits=hit, admitted=ids[at], evicted=victims)

    def _try_checked(self, ids, level, count, at, need, later) -> np.ndarray | None:
        """``_checked``, tried again after 1, 3, 7, ... 63 batches once it failed that many
        times in a row (jobs out of step, one joined mid-epoch: most tries fail, at a
        fifth of the batch's time each)."""
        if self._pause > 0:
            self._pause -= 1
            return None
        victims = self._checked(ids, level, count, at, need, later)
        self._failed = 0 if victims is not None else min(self._failed + 1, 6)
        self._pause = (1 << self._failed) - 1
        return victims

    def _checked(self, ids, level, count, at, need, later) -> np.ndarray | None:
        """The victims of the batch's newcomers ``at`` (``need``: the bytes to free by each)
        where the order of its reads cannot change them, taken; else ``None``, nothing
        taken. They are the residents' lowest keys in pop order, as many as each
        admission needs, if each victim's count is no higher than its newcomer's (ties to
        the newcomer) and every key the batch makes after the first eviction (its
        ``later`` hits', its newcomers') stays above the last victim's: no such hit or
        newcomer is then a victim, whatever the order. Not tried where one of those keys
        is below the heap's top already (the last victim's is not)."""
        heap = self._heap
        made = later.copy()
        made[at] = True
        lowest = int(np.min(level[made] << heap.bits | ids[made]))
        top = heap.first()
        if top is None or lowest <= top:
            return None
        keys = self._lowest(int(need[-1]), int(count[at].max()))
        if keys is None:
            return None
        found = np.asarray(keys, np.int64)
        freed = np.cumsum(np.frombuffer(self._sizes, np.int64)[found & heap.mask])
        taken = np.where(need > 0, np.searchsorted(freed, need) + 1, 0)  # victims by then
        by = np.searchsorted(taken, np.arange(found.size), side="right")  # their newcomer
        if lowest > found[-1] and not (found >> heap.bits > count[at][by]).any():
            return found & heap.mask
        self._put_back(keys)
        return None

    def _array(self, room: int) -> np.ndarray | None:
        """The residents' heap as its array, with room for ``room`` more entries, where the
        compiled loops serve (``refcnt_kernel``); else ``None`` (Python's: numba missing,
        keys beyond int64, a template's heap, or ``compiled`` off)."""
        heap = self._heap
        if not (self.compiled and isinstance(heap, CompiledHeap) and refcnt_kernel.load()):
            return None
        return heap.array(room) if heap.bits + PINNED.bit_length() <= 62 else None

    def _lowest(self, need: int, most: int):
        """Pop the residents with the lowest keys (each re-keyed first where its count or
        pin went up) until they free ``need`` bytes, their keys in pop order; ``None``
        (nothing popped) where the heap runs out first or a key above ``most`` comes
        before."""
        heap, sizes = self._heap, self._sizes
        h = self._array(0)
        if h is not None:
            out = np.empty(heap._n, np.int64)
            heap._n, taken = refcnt_kernel.lowest(
                h, heap._n, heap.levels, self.refs, self.pinned, heap.bits,
                frozen(np.frombuffer(sizes, np.int64)), need, most, out,
            )  # fmt: skip
            return None if taken < 0 else out[:taken]
        refs, pins = memoryview(self.refs), memoryview(self.pinned)
        h, live, bits, mask = heap.heap, heap.live, heap.bits, heap.mask
        keys: list[int] = []
        freed = 0
        while freed < need:
            _current_top(h, live, refs, pins, bits, mask)
            if not h or h[0] >> bits > most:
                self._put_back(keys)
                return None
            k = heappop(h)
            live[k & mask] = -1
            keys.append(k)
            freed += sizes[k & mask]
        return keys

    def _put_back(self, keys) -> None:
        """Victims popped by ``_lowest`` are residents again, with their keys."""
        heap = self._heap
        h = self._array(len(keys))
        if h is not None:
            heap._n = refcnt_kernel.put_back(h, heap._n, heap.levels, heap.bits, keys)
            return
        for k in keys:
            heap.live[k & heap.mask] = k >> heap.bits
            heappush(heap.heap, k)

    def _merge(self, ids, hit, level, count, fit, first, apart: bool = True) -> AccessResult:
        """The base loop in one loop from position ``first`` on, the batch's earlier reads
        done (its newcomers ``fit`` admitted, its hits re-keyed): compiled
        (``refcnt_kernel.merge``) where it can be, else ``_merge_steps``. A read marked
        ``hit`` consumes its reference in its turn and is a miss there if no longer
        resident; the others' ``level`` and ``count`` (after the read) were consumed
        before. An eviction takes the residents' top (made current: stale entries
        dropped, a count or pin gone up re-keyed) if its level is no higher than the
        newcomer's count (ties to the newcomer; a pinned one never goes); an admission
        that cannot free enough puts its victims back. ``apart`` (distinct ids): this
        batch's newcomers wait in a heap of their own (``mine``), not pushed into the
        residents' (a newcomer is often the next one's victim: 120,000 of 135,000
        evictions in a window of Quiver's at 1.28M ids), each eviction taking the lower
        of the two tops; the newcomers left join the residents' heap at the end. The
        victims' keys go to one list in the order they leave (``gone``: ``~key`` for a
        resident's), which is both the evicted ids and what an admission puts back.
        ``apart``, the admitted are read off the positions at the end (a newcomer or a
        hit evicted before its turn that is resident now was admitted, in turn); with
        repeats (not apart) they are listed."""
        heap, bits, mask = self._heap, self._heap.bits, self._heap.mask
        all_sizes = np.frombuffer(self._sizes, np.int64)
        used = self.used + int(all_sizes[ids[fit]].sum())
        end = 1 << 62  # above this batch's keys: ``mine``'s last entry, never taken
        # the reads that may change something (not a newcomer larger than the cache)
        tail = np.arange(first, ids.size)
        tail_sizes = all_sizes[ids[tail]]
        may = hit[tail] | ((count[tail] > 0) & (tail_sizes <= self.capacity_bytes))
        tail, tail_sizes = tail[may], tail_sizes[may]
        at = ids[tail]
        reads = (tail, at, level[tail] << bits | at, count[tail], hit[tail], tail_sizes)
        mine = np.append(level[fit] << bits | ids[fit], end)  # the newcomers kept apart
        h = self._array(tail.size + 1)  # (a read pushes one entry at most)
        if h is None:
            used, residents, mine, gone, turned, admitted = self._merge_steps(
                used, mine.tolist(), end, *(r.tolist() for r in reads), apart=apart
            )  # fmt: skip
        else:
            room = mine.size + tail.size  # the newcomers' heap at most
            mine = np.concatenate([mine, np.empty(tail.size, np.int64)])
            gone = np.empty(heap._n + room, np.int64)
            turned, admitted = np.empty(tail.size, np.int64), np.empty(tail.size, np.int64)
            heap._n, m, used, residents, ng, nt, na = refcnt_kernel.merge(
                h, heap._n, heap.levels, self.refs, self.pinned, bits, frozen(all_sizes),
                self.capacity_bytes, used, mine, fit.size + 1, end, *reads, apart,
                gone, turned, admitted,
            )  # fmt: skip
            mine, gone, turned, admitted = mine[:m], gone[:ng], turned[:nt], admitted[:na]
        heap.count -= residents
        kept = np.asarray(mine, np.int64)
        kept = kept[kept != end]
        heap.add(kept & mask, kept >> bits)
        self.used = used
        hits = hit.copy()
        hits[turned] = False
        if apart:  # distinct ids: a newcomer or turned hit resident now was admitted
            tried = np.sort(np.concatenate([tail[~hit[tail]], np.asarray(turned, np.int64)]))
            admitted = ids[np.concatenate([fit, tried])]  # in turn
        else:
            admitted = _first_of_each(np.asarray(admitted, np.int64))
        if bits + PINNED.bit_length() > 62:  # keys beyond int64: one at a time
            gone = np.array([(~t if t < 0 else t) & mask for t in gone], np.int64)
        else:
            gone = np.asarray(gone, np.int64)
            gone = np.where(gone < 0, ~gone, gone) & mask
        evicted = gone[heap.levels[gone] < 0]  # (once each: one may go, come back, go)
        return AccessResult(
            hits=hits,
            admitted=admitted[heap.levels[admitted] >= 0],
            evicted=_first_of_each(evicted),
        )

    def _merge_steps(self, used, mine, end, tail, at, keys, counts, hit, tail_sizes,
                     apart):  # fmt: skip
        """``_merge``'s loop in Python (counts and pins read through memoryviews, the
        heaps' entries handled in place), as ``refcnt_kernel.merge`` runs it: the reads'
        columns as lists; returns (the used bytes, the victims popped from the
        residents' heap less the newcomers pushed into it, ``mine``, the victims' keys in
        turn, the hits turned misses, the admitted where not ``apart``)."""
        sizes, cap, heap = self._sizes, self.capacity_bytes, self._heap
        h, live, bits, mask = heap.heap, heap.live, heap.bits, heap.mask
        refs, pins = memoryview(self.refs), memoryview(self.pinned)
        heapify(mine)
        admitted: list[int] = []
        gone: list[int] = []  # the victims' keys in turn, ~key for a resident
        turned: list[int] = []  # the hits evicted before their turn: misses
        residents = 0  # victims popped from the residents' heap, less newcomers pushed in
        for p, i, k, r, was_hit, s in zip(tail, at, keys, counts, hit, tail_sizes, strict=True):
            if was_hit:
                was = live[i]
                r = refs[i]
                if r > 0:
                    r -= 1  # this read consumes one reference, in its turn
                    refs[i] = r
                lv = r + PINNED if pins[i] else r
                if was >= 0:
                    if was != lv:
                        live[i] = lv
                        heappush(h, lv << bits | i)
                    continue
                turned.append(p)
                if r <= 0 or s > cap:
                    continue
                k = lv << bits | i
            if used + s > cap:
                mark = len(gone)
                while True:  # the lower of the two tops, while it is worth no more than i
                    b = mine[0]
                    if h and h[0] < b:
                        t = h[0]
                        j, key = t & mask, t >> bits
                        if live[j] != key or (refs[j] + PINNED if pins[j] else refs[j]) != key:
                            _current_top(h, live, refs, pins, bits, mask)
                            continue  # (stale, or its count went up: looked at again)
                        if key > r:
                            break
                        heappop(h)
                        live[j] = -1
                        residents += 1
                        gone.append(~t)
                    elif b == end or b >> bits > r:
                        break
                    else:
                        j = b & mask
                        heappop(mine)
                        gone.append(b)
                    used -= sizes[j]
                    if used + s <= cap:
                        break
                if used + s > cap:  # the rest is worth more than i: what it took goes back
                    for t in gone[mark:]:
                        if t < 0:
                            t = ~t
                            live[t & mask] = t >> bits
                            heappush(h, t)
                            residents -= 1
                        else:
                            heappush(mine, t)
                        used += sizes[t & mask]
                    del gone[mark:]
                    continue
            used += s
            if apart:
                heappush(mine, k)
            else:
                live[i] = k >> bits
                heappush(h, k)
                residents -= 1
                admitted.append(i)
        return used, residents, mine, gone, turned, admitted

    def _on_hit(self, p: int, i: int) -> bool:
        refs = self.refs
        refs[i] = refs[i] - 1 if refs[i] > 0 else 0  # this read consumes one reference
        if i in self._heap:
            self._heap.push(i, self._key(i))
            return True
        return False

    def _wants(self, p: int, i: int) -> bool:
        return self.refs[i] > 0  # nobody reads it again: never cached

    def _victim(self, p: int, i: int) -> int:
        """The unpinned resident with the fewest references, if it has no more than the
        newcomer (ties go to the newcomer, the more recent)."""
        top = self._top()
        if top is None or top[1] > self.refs[i]:  # a pinned top outranks every count
            return -1
        return self._heap.take()

    def _level(self, p: int, i: int) -> int:
        return self._key(i)
