"""A ``KeyedHeap`` whose entries sit in an int64 array that numba-compiled loops sift
(``heapq``'s own algorithms, so the array is, entry for entry, the list the Python
steps would leave): the priority policy's heap (SHADE's cache), RefCnt's (the
service's) and iCACHE's H-cache's, whose admissions a batch decides in one compiled call
(``policy/priority_kernel.py``, ``refcnt_kernel.py``, ``icache_kernel.py``: each
compiles its loops with ``jit_all``).

A batch's admissions are sequential (each newcomer's victims depend on the ones
before), so numpy cannot decide them at once; in Python each miss of a full cache
costs 2-4 us, and at 32 ranks x 256 a step's 8,192 misses took longer than a ResNet-18
step on a GPU. Copying the list to an array for each batch costs as much as it saves
(about 30 ns per entry each way), so the entries stay in the array: the hot steps
(push, re-key, release, the top's stale entries, a rebuild, the batch's admissions)
work there, and any other step (``KeyedHeap``'s Python loops over ``heap``) sees the
list, made from the array when first asked for (the array is made again from it by
the next compiled step). A saved state holds the list, as ``KeyedHeap``'s does. Where
numba is not installed, or a key does not fit int64, the list and Python's steps serve.
"""

from __future__ import annotations

import numpy as np

from hotset.policy.keyed_heap import KeyedHeap


def siftdown(h, startpos, pos):  # heapq._siftdown
    newitem = h[pos]
    while pos > startpos:
        parentpos = (pos - 1) >> 1
        parent = h[parentpos]
        if newitem < parent:
            h[pos] = parent
            pos = parentpos
            continue
        break
    h[pos] = newitem


def siftup(h, n, pos):  # heapq._siftup over h[:n]
    startpos = pos
    newitem = h[pos]
    childpos = 2 * pos + 1
    while childpos < n:
        rightpos = childpos + 1
        if rightpos < n and not h[childpos] < h[rightpos]:
            childpos = rightpos
        h[pos] = h[childpos]
        pos = childpos
        childpos = 2 * pos + 1
    h[pos] = newitem
    siftdown(h, startpos, pos)


def push(h, n, item):  # heapq.heappush onto h[:n] (room at h[n]); the new length
    h[n] = item
    siftdown(h, 0, n)
    return n + 1


def pop(h, n):  # heapq.heappop's removal from a non-empty h[:n]; the new length
    last = h[n - 1]
    n -= 1
    if n:
        h[0] = last
        siftup(h, n, 0)
    return n


def push_all(h, n, keys):
    """``heappush`` of each of ``keys`` in turn; the new length."""
    for k in keys:
        n = push(h, n, k)
    return n


def drop_stale(h, n, live, bits):
    """Pop stale entries off the top (an entry is live while its level is its id's); the
    new length."""
    mask = (1 << bits) - 1
    while n > 0 and live[h[0] & mask] != h[0] >> bits:
        n = pop(h, n)
    return n


def frozen(a: np.ndarray) -> np.ndarray:
    """``a`` read-only (a view where it is writable). numba compiles a function apart for
    a writable and a read-only array, so the compiled loops take their inputs read-only
    whatever the caller holds (a policy's own sizes, a node's mapped column, a batch
    from a mapped order): compiled once, when a policy is made, not in a batch."""
    if a.flags.writeable:
        a = a.view()
        a.flags.writeable = False
    return a


_loaded: bool | None = None  # None: not tried yet


def njit_all(namespace: dict, names, nogil: bool = False) -> bool:
    """Replace the functions ``names`` of a module's ``namespace`` by numba's compiled
    ones (its code cached on disk; ``nogil``: they release the GIL); whether numba is
    there."""
    try:
        from numba import njit
    except ImportError:  # pragma: no cover - a dependency; Python's steps serve
        return False
    for name in names:
        if not hasattr(namespace[name], "py_func"):  # (compiled already: a load that failed)
            namespace[name] = njit(cache=True, nogil=nogil)(namespace[name])
    return True


def jit_all(namespace: dict, names) -> bool:
    """``njit_all`` for a kernel module's loops, once this module's steps, which they call,
    are compiled; whether they are (a kernel's ``load`` then runs each once)."""
    return compile_steps() and njit_all(namespace, names)


def compile_steps() -> bool:
    """Compile this module's steps with numba, once per process, and run them once:
    importing numba and loading its cached code cost about a second, paid here (a
    policy's construction), not by a batch. Whether they are compiled (not where numba
    is missing)."""
    global _loaded
    if _loaded is None:
        steps = ("siftdown", "siftup", "push", "pop", "push_all", "drop_stale")
        _loaded = njit_all(globals(), steps)
        if not _loaded:
            return False
        h = np.zeros(4, np.int64)  # each called as a Python step is, to compile it now
        push_all(h, 0, np.arange(2, dtype=np.int64))
        pop(h, push(h, 2, 5))
        for dtype in (np.int64, np.int32):  # the levels of SHADE's heap, and iCACHE's
            drop_stale(h, 2, np.zeros(4, dtype), 1)
        _loaded = True
    return _loaded


class CompiledHeap(KeyedHeap):
    """``KeyedHeap`` with its entries in ``array[:n]`` while compiled steps run; ``heap``
    (the list) is made from them when a Python step asks for it."""

    def __init__(self, num_ids: int, dtype: type = np.int64, empty: bool = False) -> None:
        self._list: list[int] | None = []
        self._array: np.ndarray | None = None
        self._n = 0
        self._scratch = np.empty((3, 0), np.int64)
        super().__init__(num_ids, dtype, empty)
        compile_steps()

    @property
    def heap(self) -> list[int]:  # type: ignore[override]
        if self._list is None:  # the array's entries, as a list from now on
            self._list = self._array[: self._n].tolist()
            self._array = None
        return self._list

    @heap.setter
    def heap(self, entries) -> None:
        if isinstance(entries, np.ndarray) and _loaded:
            self._array, self._n, self._list = entries, int(entries.size), None
        else:
            self._list = entries.tolist() if isinstance(entries, np.ndarray) else list(entries)
            self._array = None

    def entries(self) -> int:
        return self._n if self._list is None else len(self._list)

    def first(self) -> int | None:
        if self._list is None:
            return int(self._array[0]) if self._n else None
        return super().first()

    def array(self, room: int = 0) -> np.ndarray | None:
        """The entries as ``array[:n]`` with room for ``room`` more (``n`` in ``_n``);
        ``None`` where a key does not fit int64 or nothing is compiled."""
        if not _loaded:
            return None
        if self._list is not None:
            entries = np.empty(len(self._list) + room + 64, np.int64)
            try:
                entries[: len(self._list)] = self._list
            except OverflowError:
                return None
            self._array, self._n, self._list = entries, len(self._list), None
        elif self._n + room > self._array.size:
            grown = np.empty(2 * (self._n + room) + 64, np.int64)
            grown[: self._n] = self._array[: self._n]
            self._array = grown
        return self._array

    def scratch(self, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Three int64 buffers of ``size`` for a compiled loop's outputs, kept from call
        to call (a heap of 1.4M entries: not 34 MB allocated and faulted in per batch)."""
        if self._scratch.shape[1] < size:
            self._scratch = np.empty((3, 2 * size), np.int64)
        return self._scratch[0, :size], self._scratch[1, :size], self._scratch[2, :size]

    def _keys(self, ids: np.ndarray, levels: np.ndarray, ordered: bool = False):
        """As ``KeyedHeap._keys``, an int64 array where the keys fit it and the steps
        are compiled (what ``heap`` and ``_push_all`` take as they are)."""
        if not _loaded:
            return super()._keys(ids, levels, ordered)
        return self._key_array(ids, levels, ordered)

    def _push_all(self, keys) -> None:
        """Push ``keys`` in turn: compiled where they fit int64, else Python's."""
        try:
            keys = np.asarray(keys, np.int64)
        except OverflowError:
            h = None
        else:
            h = self.array(keys.size)
        if h is None:
            super()._push_all(keys.tolist() if isinstance(keys, np.ndarray) else keys)
            return
        self._n = push_all(h, self._n, keys)

    def _push_one(self, key: int) -> None:
        if self._list is not None:
            super()._push_one(key)
        else:
            self._n = push(self.array(1), self._n, key)

    def pop_entry(self) -> int:
        if self._list is not None:
            return super().pop_entry()
        key = int(self._array[0])
        self._n = pop(self._array, self._n)
        return key

    def peek(self, level_of=None):
        if level_of is None and self._list is None:
            self._n = drop_stale(self._array, self._n, self.levels, self.bits)
            if not self._n:
                return None
            k = int(self._array[0])
            return k & self.mask, k >> self.bits
        return super().peek(level_of)

    def __getstate__(self) -> dict:
        """``KeyedHeap``'s: the entries as a list (held ones back in it)."""
        state = super().__getstate__()  # (with held entries: ``heap`` with them)
        if "heap" not in state:
            state["heap"] = self._list if self._list is not None else (
                self._array[: self._n].tolist()
            )  # fmt: skip
        for k in ("_list", "_array", "_n", "_scratch"):
            state.pop(k, None)
        return state

    def __setstate__(self, state: dict) -> None:
        state = dict(state)
        self._list, self._array, self._n = list(state.pop("heap", [])), None, 0
        self._scratch = np.empty((3, 0), np.int64)
        super().__setstate__(state)
        compile_steps()
