"""A lazy min-heap of sample ids by an integer level: the one heap every ordered policy
(pq/APP, iCACHE's H-cache, Belady, LFU, RefCnt) keeps its residents in.

A key packs the level above the id in one int (``level << bits | id``), so the heap
compares plain ints and equal levels fall to the lower id. ``levels`` holds each
member's current level (-1: not a member) as an int64 (or int32) array over the ids, read and
written per access through a memoryview (``live``): a look-up there costs one random
read of 8 bytes where a dict of the residents costs three, and a batch's ids are looked
up at once with numpy. Re-keying pushes a new entry and leaves the old one stale; an
entry is live while its level is its id's, stale entries are skipped when they reach the
top and dropped all at once when they outnumber the live ones by more than a slack of
1/64 of the ids (one compaction rule for all: a compaction scans every id's level, and
the slack keeps that scan below 0.1 us per stale entry dropped while the heap is small,
at 8.7 MB of stale entries at 14M ids). Levels are >= 0.

A member that a plan in flight pins cannot be evicted, yet plans in flight pin the latest
admissions, which are often the lowest levels: an eviction that popped each pinned one
and pushed it back would pass thousands of them at every admission (32 ranks x 256 with
a DataLoader's prefetch: LFU's epoch took over 15 minutes instead of 9 s). ``hold`` (and
``park`` for the loops that pop entries themselves) keeps such a member's entry out of
the heap, still a member, until ``release`` finds it unpinned, which the policies call
where evictions are next decided (a batch, a shrink): each is passed once. A rebuild of
the heap (a compaction, ``rekey_all``, ``remove``) and a saved copy hold every member's
entry again.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

import numpy as np

from hotset.errors import ConfigError
from hotset.ids import BLOCK
from hotset.policy.base import Policy


class KeyedHeap:
    """Members ``id -> level`` over ids ``0 .. num_ids - 1``, the minimum level (then id)
    on top."""

    def __init__(self, num_ids: int, dtype: type = np.int64, empty: bool = False) -> None:
        """``dtype``: of the levels; ``np.int32`` halves the array where levels fit it.
        ``empty``: the heap never holds a member (a partitioned cache's template): its
        levels are one read-only -1 seen at every id, not an array of ``num_ids``."""
        num_ids = max(1, int(num_ids))
        self.bits = max(1, (num_ids - 1).bit_length())
        self.mask = (1 << self.bits) - 1
        self.heap: list[int] = []
        if empty:
            self.levels = np.broadcast_to(np.array(-1, dtype), (num_ids,))
        else:
            self.levels = np.full(num_ids, -1, dtype)  # id -> its live level, -1: none
        self.live = memoryview(self.levels)  # the same, a Python int per read
        self.count = 0  # members
        self._taken: dict[int, int] = {}  # id -> key, popped for an admission not decided
        self._parked: dict[int, int] = {}  # id -> key, pinned members out of the heap
        self.slack = max(type(self).slack, num_ids >> 6)  # see the module's docstring

    #: stale entries tolerated beyond the live ones before a compaction (at least)
    slack = 1024

    def __getstate__(self) -> dict:
        """Its state without the memoryview (a copy, a checkpoint), the held entries back
        in the heap (no pin outlives a restart)."""
        state = {k: v for k, v in vars(self).items() if k != "live"}
        if self._parked:
            heap = self.heap + list(self._parked.values())
            heapq.heapify(heap)
            state.update(heap=heap, _parked={})
        return state

    def __setstate__(self, state: dict) -> None:
        vars(self).update(state)
        self._parked = {}  # (a saved state holds none)
        keys = state.get("live")
        if isinstance(keys, dict):  # saved before ``levels`` were: id -> key
            if not (isinstance(self.bits, int) and 0 < self.bits <= 40):
                raise ConfigError(f"a saved heap has {self.bits!r} id bits, not 1 to 40")
            self.levels = np.full(1 << self.bits, -1, np.int64)
            try:
                self.levels[list(keys)] = [k >> self.bits for k in keys.values()]
            except (IndexError, TypeError, ValueError) as exc:
                bad = f"a saved heap's members are not ids below 2^{self.bits}"
                raise ConfigError(bad) from exc
            self.count = len(keys)
        levels = getattr(self, "levels", None)
        if not (isinstance(levels, np.ndarray) and levels.ndim == 1
                and levels.dtype in (np.int32, np.int64)):  # fmt: skip
            raise ConfigError("a saved heap's levels are not a 1-D int32 or int64 array")
        self.live = memoryview(self.levels)

    def recast(self, kind: type[KeyedHeap]) -> KeyedHeap:
        """A heap of class ``kind`` with this one's state (one saved before a policy's
        heap was a ``CompiledHeap``)."""
        heap = kind.__new__(kind)
        heap.__setstate__(self.__getstate__())
        return heap

    def key(self, i: int, level: int) -> int:
        return level << self.bits | i

    def push(self, i: int, level: int) -> None:
        """Add ``i`` or re-key it (a level that did not change pushes nothing)."""
        live = self.live
        old = live[i]
        if old != level:
            live[i] = level
            if old < 0:
                self.count += 1
            self._push_one(level << self.bits | i)
            if self.entries() > 2 * self.count + self.slack:
                self.compact()

    def _push_one(self, key: int) -> None:
        """``heappush`` of one key (a ``CompiledHeap`` pushes onto its array)."""
        heapq.heappush(self.heap, key)

    def pop_entry(self) -> int:
        """Pop the top entry as it is (the caller made it current, or wants it stale)."""
        return heapq.heappop(self.heap)

    def rekey(self, ids: np.ndarray, levels: np.ndarray) -> None:
        """Re-key the members among ``ids`` (the others are left out) with ``levels``, at
        once: one gather, one write, a push per level that changed, one compaction."""
        ids, levels = np.asarray(ids, np.int64), np.asarray(levels, np.int64)
        old = self.levels[ids]
        changed = (old >= 0) & (old != levels)
        ids, levels = ids[changed], levels[changed]
        self.levels[ids] = levels
        self._push_all(self._keys(ids, levels))
        self.compact()

    def _push_all(self, keys) -> None:
        """``heappush`` each of ``keys`` in turn (a ``CompiledHeap`` compiles it)."""
        heap, push = self.heap, heapq.heappush
        for k in keys:
            push(heap, k)

    def entries(self) -> int:
        """The heap's entries, stale ones too."""
        return len(self.heap)

    def first(self) -> int | None:
        """The top entry (it may be stale), ``None`` when the heap is empty."""
        return self.heap[0] if self.heap else None

    def _key_array(self, ids: np.ndarray, levels: np.ndarray, ordered: bool = False):
        """``level << bits | id`` of each: an int64 array, or beyond int64 a list of
        Python ints; ``ordered``: ascending, which is a heap (a numpy sort costs less than
        a heapify of the list: 1.4M keys in about 0.6 of the time)."""
        bits, levels = self.bits, levels.astype(np.int64, copy=False)
        if int(levels.max(initial=0)).bit_length() + bits > 62:
            keys = [lv << bits | i for i, lv in zip(ids.tolist(), levels.tolist(), strict=True)]
            return sorted(keys) if ordered else keys
        keys = levels << bits | ids
        return np.sort(keys) if ordered else keys

    def _keys(self, ids: np.ndarray, levels: np.ndarray, ordered: bool = False) -> list[int]:
        """``_key_array``'s keys as Python ints."""
        keys = self._key_array(ids, levels, ordered)
        return keys if isinstance(keys, list) else keys.tolist()

    def members(self) -> np.ndarray:
        """The members' ids, ascending (a block of ids at a time: no mask of them all)."""
        parts = [np.flatnonzero(self.levels[s : s + BLOCK] >= 0) + s
                 for s in range(0, self.levels.size, BLOCK)]  # fmt: skip
        return np.concatenate(parts) if parts else np.empty(0, np.int64)

    def in_order(self) -> np.ndarray:
        """The members' ids in the order ``pop`` gives them: by level, then id."""
        ids = self.members()
        levels = self.levels[ids].astype(np.int64)
        if int(levels.max(initial=0)).bit_length() + self.bits > 62:
            return ids[np.argsort(levels, kind="stable")]  # ids ascending: ties by id
        return np.sort(levels << self.bits | ids) & self.mask

    def remove(self, ids: np.ndarray, rest: np.ndarray | None = None) -> None:
        """Drop the members ``ids`` (distinct) at once; the heap keeps only the others'
        entries (a compaction). ``rest``: the other members in pop order, where the
        caller has them (``in_order()`` less ``ids``): their keys are the heap as they
        come, with no scan and no sort."""
        ids = np.asarray(ids, np.int64)
        self.levels[ids] = -1
        self.count -= int(ids.size)
        if rest is None:
            self._heap_of_members()
        else:
            rest = np.asarray(rest, np.int64)
            self.heap = self._keys(rest, self.levels[rest])  # ascending: a heap
            self._parked.clear()

    def contains(self, ids: np.ndarray) -> np.ndarray:
        """Whether each of ``ids`` is a member."""
        return self.levels[ids] >= 0

    def rekey_all(self, levels: np.ndarray) -> None:
        """Re-key every member at once, ``levels`` in the order ``members()`` lists them
        (most of them changed, e.g. a job's epoch start counted references to all): one
        array write and one sort instead of a push per member."""
        ids, levels = self.members(), np.asarray(levels, np.int64)
        self.levels[ids] = levels
        self.heap = self._keys(ids, levels, ordered=True)
        self._parked.clear()  # (every member's entry is in the heap)

    def add(self, ids: np.ndarray, levels: np.ndarray) -> None:
        """Make ``ids`` (distinct, none a member) members with ``levels``, at once: one
        array write, and the keys sorted into an empty heap or pushed into the others."""
        ids, levels = np.asarray(ids, np.int64), np.asarray(levels, np.int64)
        self.levels[ids] = levels
        self.count += int(ids.size)
        if not self.entries():
            self.heap = self._keys(ids, levels, ordered=True)
            return
        self._push_all(self._keys(ids, levels))
        self.compact()

    def drop(self, i: int) -> None:
        """Remove ``i`` (its entries turn stale)."""
        if self.live[i] >= 0:
            self.live[i] = -1
            self.count -= 1

    def peek(self, level_of: Callable[[int], int] | None = None) -> tuple[int, int] | None:
        """(id, level) of the minimum, or ``None`` when empty. ``level_of``: members'
        levels may have gone up since they were keyed (never down): the top is re-keyed
        with ``level_of(id)`` until one is current, which is then the minimum."""
        heap, live, bits, mask = self.heap, self.live, self.bits, self.mask
        while heap:
            k = heap[0]
            i, level = k & mask, k >> bits
            if live[i] != level:
                heapq.heappop(heap)  # stale entry
                continue
            if level_of is None or (level := level_of(i)) == live[i]:
                return i, level
            live[i] = level
            heapq.heapreplace(heap, level << bits | i)
        return None

    def pop(self) -> int:
        """Remove and return the minimum's id (the heap must not be empty)."""
        i, _ = self.peek()  # type: ignore[misc]
        self.pop_entry()
        self.live[i] = -1
        self.count -= 1
        return i

    # -- victims for one admission: taken, then kept out or put back ----------------------
    def take(self) -> int:
        """Pop the minimum as a victim of the admission being tried; returns its id (-1
        when empty)."""
        if self.peek() is None:
            return -1
        k = heapq.heappop(self.heap)  # the live minimum, after peek's cleaning
        i = k & self.mask
        self.live[i] = -1
        self.count -= 1
        self._taken[i] = k
        return i

    def put_back(self, ids) -> None:
        """These taken ``ids`` are members again (the admission failed)."""
        for i in ids:
            k = self._taken.pop(i)
            self.push(i, k >> self.bits)

    def hold(self, i: int) -> None:
        """Taken ``i`` is pinned: a member again, its entry held out of the heap until
        ``release`` finds it unpinned."""
        k = self._taken.pop(i)
        self.live[i] = k >> self.bits
        self.count += 1
        self.park(k)

    def park(self, key: int) -> None:
        """A pinned member's entry, popped from ``heap`` by the caller's own loop, held
        out of it (still a member) until ``release``."""
        self._parked[key & self.mask] = key

    def release(self, pinned: np.ndarray | None = None) -> None:
        """Put the held entries of members that ``pinned`` (pins per id; ``None``: none)
        no longer pins back into the heap (those of ids gone since are dropped)."""
        parked = self._parked
        if not parked:
            return
        ids = np.fromiter(parked, np.int64, len(parked))
        if pinned is not None:
            ids = ids[pinned[ids] == 0]
        live, bits = self.live, self.bits
        keys = [parked.pop(i) for i in ids.tolist()]
        self._push_all([k for k in keys if live[k & self.mask] == k >> bits])

    def settle(self) -> None:
        """The admission succeeded: the victims taken for it are gone for good."""
        self._taken.clear()

    def compact(self) -> None:
        """Drop the stale entries once they outnumber the live ones by more than the
        slack."""
        if self.entries() > 2 * self.count + self.slack:
            self._heap_of_members()

    def _heap_of_members(self) -> None:
        """The heap made again of the members' keys alone, in order (a scan of the
        levels: about 15 ms at 14M ids)."""
        ids = self.members()
        self.heap = self._keys(ids, self.levels[ids], ordered=True)
        self._parked.clear()

    def __contains__(self, i: int) -> bool:
        return self.live[i] >= 0

    def __len__(self) -> int:
        return self.count


class HeapPolicy(Policy):
    """A policy whose residents sit in one ``KeyedHeap`` (``_heap``), the lowest level
    evicted first: the miss path's bookkeeping is shared, a subclass gives ``_level(p,
    i)`` (the level of the access at batch position ``p``) and when to stop evicting."""

    #: the residents' heap (``CompiledHeap`` for the priority policy and RefCnt)
    heap_class: type[KeyedHeap] = KeyedHeap

    def __init__(self, capacity_bytes, sizes, seed: int = 0):
        super().__init__(capacity_bytes, sizes, seed)
        self._heap = self.heap_class(self.num_samples)

    @property
    def _resident(self):
        return self._heap

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        heap, kind = self._heap, self.heap_class
        if kind is not KeyedHeap and type(heap) is KeyedHeap and heap.levels.flags.writeable:
            self._heap = heap.recast(kind)  # saved before it was a ``heap_class``

    def hold_nothing(self) -> None:
        super().hold_nothing()
        self._heap = KeyedHeap(self.num_samples, self._heap.levels.dtype, empty=True)

    def resident_mask(self, ids: np.ndarray) -> np.ndarray:
        return self._heap.contains(ids)

    def cached_ids(self) -> np.ndarray:
        return self._heap.members()

    def cached_mask(self, out: np.ndarray) -> np.ndarray:
        levels = self._heap.levels
        if levels.size != out.size:
            return super().cached_mask(out)
        return np.greater_equal(levels, 0, out=out)  # one pass, no list of the residents

    def _level(self, p: int, i: int) -> int:
        raise TypeError(f"{type(self).__name__} must give _level")

    def access(self, ids):
        self._heap.release(self.pinned)  # (pins change between batches)
        return super().access(ids)

    def _restore(self, victims: list[int]) -> None:
        self._heap.put_back(victims)

    def _park(self, j: int) -> None:
        self._heap.hold(j)

    def _remove(self, i: int) -> None:
        self._heap.drop(i)

    def _insert(self, p: int, i: int) -> None:
        heap = self._heap
        if heap._taken:
            heap.settle()
        heap.push(i, self._level(p, i))
