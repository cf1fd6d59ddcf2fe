"""iCACHE's importance-informed cache (HPCA'23 section III-B/C): an H-cache for the
samples of the H-list and an L-cache of packaged L-samples served by substitution.

* **H-cache** (Algorithm 1, lines 4-18): a min-heap by importance value; a missed
  H-sample is admitted while there is room, else only if its importance exceeds the
  top's, which is evicted.
* **Shadow heap** (III-B, last paragraph): when a new H-list arrives the heap becomes
  read-only and keeps serving evictions, new admissions go into a shadow heap with the
  new values, and the resident ids are re-inserted into the shadow ``rebuild_per_batch``
  per batch, off the critical path; once complete the shadow becomes the heap. Here the
  shadow gets every resident at once (one heapify: cheaper than the pushes it spares)
  and swaps after as many batches as the re-insertion would take: the old heap serves
  the same evictions for as long, and the shadow holds what it would hold whenever it
  is used (it serves evictions only once the old heap is empty, when every resident it
  lacked has left).
* **L-cache** (lines 19-24, III-C): a missed L-sample is served by a cached L-sample not
  yet used this epoch and its id is queued for the next packages; the feeder (package
  thread) loads packages that ``l_next_package`` composes: queued misses first, then
  random L-samples, preferring those already in package files.
* **H/L split** (III-A): ``Size_H = Size * f_H / (f_H + f_L)`` from the previous epoch's
  access counts, ``h_share`` (9:1) until then; the L-cache is never below one package
  (plus one sample: a package ends with the sample that crosses ``package_bytes``).
* **Package size**: the paper's 1 MB, or less where the cache is small: by default a
  quarter of the L-cache's initial share (at least the largest sample), so that a
  2k-10k-sample dataset does not give the whole cache to one package and leave the
  H-cache empty. A region left empty is warned about.
"""

from __future__ import annotations

import logging
import random
from collections import ChainMap, OrderedDict

import numpy as np

from hotset.errors import ConfigError
from hotset.ids import index_dtype, stable_order
from hotset.policy.base import AccessResult, Feeder, Policy, register_policy
from hotset.policy.keyed_heap import KeyedHeap
from hotset.sampling.draw import SHUFFLE_BLOCK, shuffle_next

SCALE = float(1 << 24)
log = logging.getLogger(__name__)


def h_list_to_fit(importance: np.ndarray, sizes, capacity: int, seed: int = 0) -> np.ndarray:
    """The H-list a cache of ``capacity`` bytes holds (III-A's overhead example: a 20%
    cache, 20% of the samples): the most important samples whose bytes together fit,
    equal importance in a random order (float64 importances closer than ``2**-28``
    relative count as equal: :func:`hotset.ids.stable_order`)."""
    importance = np.asarray(importance)
    if importance.dtype.kind != "f":  # float32 stays: the same order, half the bytes
        importance = importance.astype(np.float64)
    sizes = np.asarray(sizes, np.int64)
    n = importance.size
    rng = np.random.default_rng(seed)
    hot = np.zeros(n, bool)
    # order only the ids that can be in it (k: what fits, with a margin): those more
    # important than the k-th, and a random share of those as important as it (a
    # partition, not a sort: at the start most ids tie, unscored); all ids when they do
    # not fill the capacity
    k = int(1.25 * capacity / max(1.0, float(sizes.mean()))) + 1 if n else 0
    ids = None
    if k < n:
        cut = np.partition(importance, n - k)[n - k]
        above, at = np.flatnonzero(importance > cut), np.flatnonzero(importance == cut)
        m = k - above.size  # >= 1: at most k - 1 ids are more important than the k-th
        if m < at.size:
            at = at[rng.choice(at.size, m, replace=False)]
        ids = np.concatenate([above, at])
        if sizes[ids].sum() <= capacity:
            ids = None
    if ids is None:
        ids = np.arange(n)
    # by importance, down, ties in a random order: a random permutation sorted stably
    ids = ids[rng.permutation(ids.size)]
    order = ids[stable_order(-importance[ids])]
    hot[order[np.cumsum(sizes[order]) <= capacity]] = True
    return hot


#: L-samples the pool puts in their random place at a time (``_draw_pool_block``)
POOL_BLOCK = SHUFFLE_BLOCK


@register_policy
class ICachePolicy(Policy):
    name = "icache"

    def __init__(
        self,
        capacity_bytes,
        sizes,
        seed: int = 0,
        h_share: float = 0.9,
        package_bytes: int | None = None,
        rebuild_per_batch: int = 2048,
        package_threads: bool = True,
    ) -> None:
        """``package_threads=False``: packages are made and loaded in the planner's
        thread (reproducible runs; see ``packages.Packager``)."""
        super().__init__(capacity_bytes, sizes, seed)
        self._max_size = max(1, int(np.max(sizes)))
        self._typical_size = max(1, int(np.mean(self._sizes[:64])))
        if not 0.0 <= h_share <= 1.0:
            raise ConfigError(f"h_share must be in [0, 1], got {h_share}")
        if package_bytes is None:  # 1 MB, or a quarter of the L-cache's first share
            l_share = int(self.capacity_bytes * (1.0 - h_share)) // 4
            package_bytes = max(self._max_size, min(1 << 20, l_share))
        if package_bytes < 1:
            raise ConfigError(f"package_bytes must be >= 1, got {package_bytes}")
        self.package_bytes = int(package_bytes)
        self.rebuild_per_batch = int(rebuild_per_batch)
        self.package_threads = bool(package_threads)
        self.is_h = np.ones(self.num_samples, bool)  # no H-list yet: all are H-samples
        self._all_h = True
        # the L-samples, put in a random order as packages take them, and how far they
        # took them (``_pool_ids``)
        self._pool = np.zeros(0, index_dtype(self.num_samples))
        self._pool_rng = np.random.default_rng(seed)
        self._cursor, self._wrapped, self._drawn = 0, False, 0
        # the same as bytes (0/1): fast to index per access, 1 B per id (a list: 8 B)
        self._hot: bytes = self.is_h.tobytes()
        self._level = np.full(self.num_samples, 0, np.int32)  # importance, quantised
        self._h: dict[int, None] = {}  # H-cache residents
        self.heap = KeyedHeap(self.num_samples, np.int32)
        self.shadow: KeyedHeap | None = None  # the heap after ``_rebuild`` more residents
        self._rebuild = 0  # residents the paper's rebuild has left to re-insert
        self.h_used = 0
        self._l: dict[int, bool] = {}  # L-cache residents -> used this epoch
        # those used, the longest-used first: an OrderedDict, whose walk from the front
        # does not pass the entries deleted there (a dict's does, until it resizes)
        self._l_used: OrderedDict[int, None] = OrderedDict()
        self._fresh: list[int] = []  # L residents unused this epoch (lazily cleaned)
        self._queue: OrderedDict[int, None] = OrderedDict()  # missed L ids, for packages
        self._served: set[int] = set()  # L residents served this epoch
        self.l_used = 0  # bytes of L residents plus those reserved for a loading package
        self.loading = 0
        self._writing: dict[int, int] = {}  # ids reserved for packages being loaded
        self.freq_h = self.freq_l = 0  # accesses this epoch (III-A's frequencies)
        self.swaps = 0  # completed shadow-heap swaps
        self._rng = random.Random(seed)
        self._evict_next: list[int] = []
        self._due: set[int] = set()  # ids the coverage floor needs trained as themselves
        self._warned = False
        self.set_split(h_share)

    # -- sizes -----------------------------------------------------------------------
    def set_split(self, h_share: float) -> None:
        """H-cache gets ``h_share`` of the capacity, the L-cache the rest, >= one package."""
        self.h_share = float(h_share)
        one_package = self.package_bytes + self._max_size  # the last sample may cross it
        self.l_capacity = min(
            self.capacity_bytes,
            max(one_package, self.capacity_bytes - int(self.capacity_bytes * h_share)),
        )
        self.h_capacity = self.capacity_bytes - self.l_capacity
        if self.capacity_bytes and h_share > 0 and self.h_capacity <= 0 and not self._warned:
            self._warned = True
            log.warning(
                "icache: the H-cache is empty (%d bytes of cache, packages of %d bytes "
                "fill the L-cache): pass a smaller package_bytes",
                self.capacity_bytes, self.package_bytes,
            )  # fmt: skip
        self.rebuild_step(self._rebuild)  # a rebuild in progress ends: one heap to shrink
        self._shrink_h()
        self._evict_next += self._free_l(0)
        self.used = self.h_used + self.l_used

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
        # the heap holds every H resident (a rebuild has ended): the rest are the H-cache,
        # made anew (a million deletions from the dict cost 0.5 s)
        self._h = dict.fromkeys(rest.tolist())
        self._evict_next += victims.tolist()

    def set_sizes(self, ids, sizes) -> None:
        super().set_sizes(ids, sizes)
        self._max_size = max(self._max_size, int(np.max(sizes, initial=0)))
        self._typical_size = max(1, int(np.mean(self._sizes[:64])))

    def _free_l(self, need: int) -> list[int]:
        """Remove unpinned L residents, used ones first (the longest-used first), until
        ``need`` more bytes fit the L-cache; returns them."""
        out, sizes, l_res, cap = [], self._sizes, self._l, self.l_capacity
        pinned = memoryview(self.pinned)
        for order in (self._l_used, l_res):  # walks stop at the first ids that make room
            if self.l_used + need <= cap:
                break  # (a walk of ``l_res`` from its start passes what it deleted)
            for i in order:
                if not pinned[i] and (order is self._l_used or not l_res[i]):
                    self.l_used -= sizes[i]
                    out.append(i)
                    if self.l_used + need <= cap:
                        break
            for i in out:
                l_res.pop(i, None)
                self._l_used.pop(i, None)
        return out

    @property
    def _resident(self):
        return ChainMap(self._h, self._l)

    def discard(self, ids) -> list[int]:
        out = []
        for i in np.asarray(ids, np.int64).tolist():
            if i in self._h:
                self.heap.drop(i)
                if self.shadow is not None:
                    self.shadow.drop(i)
                del self._h[i]
                self.h_used -= self._sizes[i]
                out.append(i)
            elif i in self._l:
                del self._l[i]
                self._l_used.pop(i, None)
                self.l_used -= self._sizes[i]
                out.append(i)
        self.used = self.h_used + self.l_used
        return out

    def writing_ids(self) -> np.ndarray:
        return np.fromiter(self._writing, np.int64, len(self._writing))

    def h_residents(self) -> np.ndarray:
        """The H-cache's residents."""
        return np.fromiter(self._h, np.int64, len(self._h))

    def l_residents(self) -> np.ndarray:
        """The L-cache's residents (loaded from packages)."""
        return np.fromiter(self._l, np.int64, len(self._l))

    def make_feeder(
        self, lock, storage=None, store=None, directory=None, deleting=None, ranks=None
    ) -> Feeder:
        """The package threads over ``storage`` and ``store`` (``packages.Packager``), or
        with no bytes (the simulator) packages loaded the moment they are wanted."""
        if storage is None or store is None:
            return InstantPackages(self)
        from hotset.packages import Packager  # the data plane: bytes, files, the store

        return Packager(
            storage, store, self, lock, directory, threads=self.package_threads,
            deleting=deleting, ranks=ranks,
        )  # fmt: skip

    # -- H-list ----------------------------------------------------------------------
    def apply_hints(self, hints: dict) -> None:
        """A new H-list (``hot`` mask, ``importance`` in [0, 1]) at an epoch start; ``hot``
        ``None``: the most important samples that fit this cache."""
        if "due" in hints:  # the coverage floor: served as themselves this epoch
            self._due = set(np.asarray(hints["due"], np.int64).tolist())
        if "hot" not in hints:
            return
        imp = np.asarray(hints["importance"])
        if imp.dtype.kind != "f":  # float32 (IIS's percentiles) stays: quantised alike
            imp = imp.astype(np.float64)
        if hints["hot"] is None and imp.shape == (self.num_samples,):
            hot = h_list_to_fit(imp, self._sizes, self.capacity_bytes, self._rng.getrandbits(32))
        else:
            hot = np.asarray(hints["hot"], bool)
        if hot.shape != (self.num_samples,) or imp.shape != hot.shape:
            raise ConfigError(f"H-list must cover the policy's {self.num_samples} ids")
        if self.freq_h + self.freq_l and not self.is_h.all():
            # III-A: split by the last epoch's access frequencies (once there was an H-list)
            self.set_split(self.freq_h / (self.freq_h + self.freq_l))
        self.freq_h = self.freq_l = 0
        self.rebuild_step(self._rebuild)  # finish a rebuild still in progress
        self.is_h = hot
        self._all_h = bool(hot.all())
        self._hot = hot.tobytes()
        np.multiply(np.clip(imp, 0.0, 1.0), SCALE, out=self._level, casting="unsafe")
        if self._h:  # the heap turns read-only; the shadow gets the new values
            ids = np.fromiter(self._h, np.int64, len(self._h))
            self.shadow = KeyedHeap(self.num_samples, np.int32)
            self.shadow.add(ids, self._level[ids])
            self._rebuild = ids.size
        # a new epoch for the L-cache: nothing used yet; queued ids now H are dropped
        for i in self._l:
            self._l[i] = False
        self._l_used.clear()
        self._served = set()
        self._fresh = [i for i in self._l if not hot[i]]
        self._rng.shuffle(self._fresh)
        self._pool = np.flatnonzero(~hot).astype(self._pool.dtype)
        self._pool_rng = np.random.default_rng([self.seed, self._rng.getrandbits(32)])
        self._cursor, self._wrapped, self._drawn = 0, False, 0
        self._queue = OrderedDict((i, None) for i in self._queue if not hot[i])

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
        del self._h[i]
        self._evict_next.append(i)

    def _admit_h(self, i: int) -> bool:
        """Algorithm 1, lines 9-16: admit while there is room, else only by displacing
        residents that are all less important than ``i`` (line 14)."""
        s, cap, sizes = self._sizes[i], self.h_capacity, self._sizes
        if s > cap:
            return False
        q = int(self._level[i])
        # during a rebuild a resident can sit in both heaps: pop it once from each, count
        # its bytes once, and put back every popped entry if no room could be made
        popped: list[tuple[KeyedHeap, int, int]] = []
        victims: dict[int, None] = {}
        while self.h_used + s > cap:
            src = self._src()
            top = src.peek()
            if top is None or top[1] >= q:
                break
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
        self._h[i] = None
        self.h_used += s
        (self.heap if self.shadow is None else self.shadow).push(i, q)
        return True

    # -- accesses --------------------------------------------------------------------
    def _pop_fresh(self) -> int | None:
        """A random L-cache resident not used this epoch that is still an L-sample."""
        fresh, l_res, is_h, below = self._fresh, self._l, self._hot, self._rng.getrandbits
        while fresh:
            n = len(fresh)  # k: ``randrange(n)``'s draw (rejection from ``getrandbits``)
            k, bits = n, n.bit_length()
            while k >= n:
                k = below(bits)
            fresh[k], fresh[-1] = fresh[-1], fresh[k]
            j = fresh.pop()
            if l_res.get(j) is False and not is_h[j]:
                del l_res[j]
                l_res[j] = True  # to the end, as in ``_l_used``
                self._l_used[j] = None  # victims are the longest-used first
                self._served.add(j)
                return j
        return None

    def access(self, ids) -> AccessResult:
        ids_list = np.asarray(ids, np.int64).tolist()
        served, hits, sub, admitted = [], [], [], []
        h, l_res, is_h = self._h, self._l, self._hot
        freq_h = 0
        for i in ids_list:
            hot = is_h[i]
            freq_h += hot
            if i in h or i in l_res:
                served.append(i)
                hits.append(True)
                sub.append(False)
                if i in l_res:
                    del l_res[i]
                    l_res[i] = True
                    self._l_used.pop(i, None)  # to the end: the longest-used go first
                    self._l_used[i] = None
                    self._served.add(i)
                continue
            if hot:  # H-miss: read, maybe admit (lines 7-17)
                served.append(i)
                hits.append(False)
                sub.append(False)
                if self._admit_h(i):
                    admitted.append(i)
                continue
            if i in self._due:  # the coverage floor's: read, not substituted
                served.append(i)
                hits.append(False)
                sub.append(False)
                continue
            self._queue[i] = None  # L-miss: queued for the next packages (III-C)
            j = self._pop_fresh()
            served.append(i if j is None else j)
            hits.append(j is not None)
            sub.append(j is not None)
        self.freq_h += freq_h
        self.freq_l += len(ids_list) - freq_h
        self.rebuild_step(self.rebuild_per_batch)
        self.used = self.h_used + self.l_used
        evicted = [i for i in dict.fromkeys(self._evict_next) if i not in h and i not in l_res]
        self._evict_next = []
        return AccessResult(
            hits=np.array(hits, bool),
            admitted=np.array([i for i in dict.fromkeys(admitted) if i in h], np.int64),
            evicted=np.array(evicted, np.int64),
            served=np.array(served, np.int64),
            substituted=np.array(sub, bool),
        )

    # -- L-cache packages (the feeder's side) ------------------------------------------
    def l_fresh(self) -> int:
        """How many L residents are left to serve as substitutes this epoch (an upper
        bound: entries are cleaned lazily)."""
        return len(self._fresh)

    def l_wants_package(self) -> bool:
        """Whether a package should be loaded now: less than half the L-cache is left
        unused and no load is in flight."""
        if self.loading or (self._all_h and not self._queue):
            return False
        l_items = max(1, self.l_capacity // self._typical_size)
        return self.l_fresh() < l_items // 2

    def l_next_package(self, exclude=(), prefer=None) -> np.ndarray:
        """Ids for the next package, >= ``package_bytes`` when there are enough
        L-samples: the queued misses, then random L-samples (from ``prefer``, the ids
        already in package files, first)."""
        return np.array(self._compose(exclude, prefer), np.int64)

    def _compose(self, exclude=(), prefer=None) -> list[int]:
        """``l_next_package``'s ids, as a list."""
        skip = set(exclude)
        out, nbytes, sizes, is_h, l_res = [], 0, self._sizes, self._hot, self._l
        limit = min(self.package_bytes, self.l_capacity)
        for i in self._queue:
            if nbytes >= limit:
                break
            if nbytes + sizes[i] > self.l_capacity:
                continue
            if i not in l_res and i not in skip and not is_h[i]:
                out.append(i)
                nbytes += sizes[i]
                skip.add(i)
        if nbytes < limit:
            pools = []
            if prefer is not None:  # (a generator costs 20-50 us: made only for this)
                rng = np.random.default_rng([self.seed, self.loading, len(self._l), nbytes])
                pools.append(rng.permutation(np.asarray(prefer, np.int64)))
            pools.append(self._pool_ids())
            for pool in pools:
                for i in pool:  # stop right after the last taken: the walk goes on from there
                    if nbytes + sizes[i] > self.l_capacity or is_h[i]:
                        continue
                    taken = i in self._l or i in self._h or i in self._served
                    if not taken and i not in skip:
                        out.append(i)
                        nbytes += sizes[i]
                        skip.add(i)
                        if nbytes >= limit:
                            break
                if nbytes >= limit:
                    break
        return out

    def _pool_ids(self):
        """The H-list's L-samples in a random order drawn once per H-list, from where the
        last package stopped: a package costs what it looks at, not a scan of all ids.
        The order is walked at most twice per H-list (the second time for L-samples that
        were cached, and have left, the first time). The first walk draws it block by
        block as it goes (``_draw_pool_block``), so an epoch start does not shuffle all
        the L-samples (12.6M at 14M ids: 0.6 s)."""
        pool = self._pool
        while pool.size:
            c = self._cursor
            if c >= pool.size:
                if self._wrapped:
                    return
                self._wrapped, self._cursor = True, 0
                continue
            if c >= self._drawn:
                self._draw_pool_block(c)
            self._cursor = c + 1
            yield int(pool[c])

    def _draw_pool_block(self, c: int) -> None:
        """The pool's next ``POOL_BLOCK`` in their random place (``shuffle_next``)."""
        self._drawn = shuffle_next(self._pool, c, self._pool_rng, POOL_BLOCK)

    def l_make_room(self, ids) -> tuple[np.ndarray, np.ndarray]:
        """Reserve L space for a package of ``ids``: returns the L residents to delete
        from the store first (used ones first, the longest-used first) and the ids that
        fit (all, unless the L-cache shrank since the package was composed)."""
        victims, fit = self._reserve(np.asarray(ids, np.int64).tolist())
        self.loading += 1
        for i in fit:
            self._writing[i] = self._writing.get(i, 0) + 1
        self.used = self.h_used + self.l_used
        return np.array(victims, np.int64), np.array(fit, np.int64)

    def _reserve(self, ids: list[int]) -> tuple[list[int], list[int]]:
        """Room in the L-cache for the prefix of ``ids`` that fits: (the residents removed
        for it, that prefix)."""
        sizes, need, fit = self._sizes, 0, []
        for i in ids:
            if need + sizes[i] > self.l_capacity:
                break
            need += sizes[i]
            fit.append(i)
        victims = self._free_l(need)
        self.l_used += need
        return victims, fit

    def l_commit(self, ids, loaded=None) -> None:
        """The package is in the store: ``loaded`` lists the ids that made it (default:
        all); the reservation of the others is released."""
        self.loading -= 1
        ids = np.asarray(ids, np.int64).tolist()
        for i in ids:
            if self._writing.get(i, 0) <= 1:
                self._writing.pop(i, None)
            else:
                self._writing[i] -= 1
        self._settle(ids, None if loaded is None else np.asarray(loaded, np.int64).tolist())

    def _settle(self, ids: list[int], loaded: list[int] | None) -> None:
        """The reserved ``ids`` that were ``loaded`` (``None``: all) are L residents; the
        others' bytes are released."""
        ok = None if loaded is None else set(loaded)
        l_res, h, served, queue, is_h = self._l, self._h, self._served, self._queue, self._hot
        for i in ids:
            if (ok is None or i in ok) and i not in l_res and i not in h:
                used = i in served  # served this epoch already: not a substitute
                l_res[i] = used
                if used:
                    self._l_used[i] = None
                queue.pop(i, None)
                if not used and not is_h[i]:
                    self._fresh.append(i)
            else:
                self.l_used -= self._sizes[i]
        self.used = self.h_used + self.l_used

    def l_load_now(self) -> bool:
        """Compose the next package and load it at once (the simulator's feeder: nothing
        runs between making room and committing, so nothing is reserved); whether there
        was one to load."""
        ids = self._compose()
        if ids:
            self._settle(self._reserve(ids)[1], None)
        return bool(ids)


class InstantPackages:
    """The simulator's feeder: a wanted package is composed and loaded at once."""

    def __init__(self, policy: ICachePolicy) -> None:
        self.policy = policy
        self.packages_loaded = 0

    def poll(self) -> None:
        p = self.policy
        while p.l_wants_package() and p.l_load_now():
            self.packages_loaded += 1

    def epoch_started(self) -> None:
        self.poll()

    def counters(self) -> dict:
        return {"packages_loaded": self.packages_loaded}

    def close(self) -> None:
        pass
