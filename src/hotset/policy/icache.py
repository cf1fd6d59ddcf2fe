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
  yet used this epoch, drawn at random (a batch's substitutes in one uniform draw from
  those left: ``RandomPool``), and its id is queued for the next packages; the feeder
  (package thread) loads packages that ``l_next_package`` composes: queued misses first,
  then random L-samples, preferring those already in package files.
* **A batch at once**: each id's place (not cached, H-cache, L-cache unused or used this
  epoch) is one byte in ``_where``, so a batch is sorted into hits, H-misses and L-misses
  with a gather; only the H-misses (an admission each, in the batch's order) and the
  L-hits are handled one by one, and while the H-cache fills a batch's H-misses that all
  fit are admitted at once (what one by one gives when nothing is evicted).
* **H/L split** (III-A): ``Size_H = Size * f_H / (f_H + f_L)`` from the previous epoch's
  access counts, ``h_share`` (9:1) until then; the L-cache is never below one package
  (plus one sample: a package ends with the sample that crosses ``package_bytes``).
  hotset's (``l_in_flight``): nor below its first share plus the L-samples of the plans
  in flight, where that fits in half the cache. A DataLoader keeps several plans in
  flight, whose L-hits and substitutes stay pinned until they have run, so that the
  paper's L-cache, whose used samples make room for the next package, would evict
  unused ones instead.
* **Package size**: the paper's 1 MB, or less where the cache is small: by default a
  quarter of the L-cache's initial share (at least the largest sample), so that a
  2k-10k-sample dataset does not give the whole cache to one package and leave the
  H-cache empty. A region left empty is warned about.
"""

from __future__ import annotations

import random
from collections import OrderedDict

import numpy as np

from hotset.errors import ConfigError
from hotset.ids import (
    first_positions,
    index_dtype,
    nonzero_as,
)
from hotset.policy import icache_kernel
from hotset.policy.base import AccessResult, Feeder, Policy, register_policy
from hotset.policy.compiled_heap import CompiledHeap
from hotset.policy.icache_h import HCache
from hotset.policy.icache_l import LCache
from hotset.policy.icache_lists import (
    FRESH,
    NONE,
    SCALE,
    USED,
    H,
    LoadOrder,
    RandomPool,
    UseOrder,
    _saved_ids,
    h_list_to_fit,
    log,
)
from hotset.policy.icache_packages import LPackages
from hotset.policy.keyed_heap import KeyedHeap


@register_policy
class ICachePolicy(HCache, LCache, LPackages, Policy):
    name = "icache"
    #: the H-cache's admissions compiled where no rebuild runs and the L-cache's walks for
    #: victims (``icache_kernel``); ``False``: the Python loops, the same decisions (the
    #: tests' reference)
    compiled = True
    #: the L-samples one ``l_load_many`` call looks at (and 256 it may pass over): the
    #: same decisions whatever it is (2048 took 5.4 calls a step at 32 x 256, 8192 3.4)
    load_many_ids = 8192

    def __init__(
        self,
        capacity_bytes,
        sizes,
        seed: int = 0,
        h_share: float = 0.9,
        package_bytes: int | None = None,
        rebuild_per_batch: int = 2048,
        package_threads: bool = True,
        l_in_flight: bool = True,
    ) -> None:
        """``package_threads=False``: packages are made and loaded in the planner's
        thread (reproducible runs; see ``packages.Packager``). ``l_in_flight=False``: the
        paper's split, whatever the plans in flight pin."""
        super().__init__(capacity_bytes, sizes, seed)
        self._max_size = max(1, int(np.max(sizes)))
        self._typical_size = max(1, int(np.mean(self._sizes[:64])))
        self._mean_size: float | None = None  # (the sizes' mean, once asked for)
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
        if not isinstance(l_in_flight, bool):  # ("False" from a command line is true)
            raise ConfigError(f"l_in_flight must be True or False, got {l_in_flight!r}")
        self.l_in_flight = l_in_flight
        self._first_l = self.capacity_bytes - int(self.capacity_bytes * h_share)  # bytes
        self._l_in_flight = 0  # bytes of L residents the plans in flight hold (expected)
        self.is_h = np.ones(self.num_samples, bool)  # no H-list yet: all are H-samples
        self._all_h = True
        # the L-samples, put in a random order as packages take them, and how far they
        # took them (``_pool_ids``)
        self._pool = np.zeros(0, index_dtype(self.num_samples))
        self._pool_rng = np.random.default_rng(seed)
        self._cursor, self._wrapped, self._drawn = 0, False, 0
        self._level = np.full(self.num_samples, 0, np.int32)  # importance, quantised
        self._where = np.zeros(self.num_samples, np.int8)  # NONE, H, FRESH or USED per id
        self.heap = CompiledHeap(self.num_samples, np.int32)
        self.shadow: KeyedHeap | None = None  # the heap after ``_rebuild`` more residents
        self._rebuild = 0  # residents the paper's rebuild has left to re-insert
        self.h_used = 0
        self._l = LoadOrder(self.num_samples, self._pool.dtype)  # L residents, as loaded
        self._l_used = UseOrder(self.num_samples, self._pool.dtype)  # used, in order
        self._fresh = RandomPool([], self._pool.dtype)  # L residents unused this epoch
        self._pick_rng = np.random.default_rng([seed, 1])  # draws the substitutes
        self._queue: OrderedDict[int, None] = OrderedDict()  # missed L ids, for packages
        self._served = np.zeros(self.num_samples, bool)  # L residents served this epoch
        self.l_used = 0  # bytes of L residents plus those reserved for a loading package
        self.loading = 0
        self._writing: dict[int, int] = {}  # ids reserved for packages being loaded
        self.freq_h = self.freq_l = 0  # accesses this epoch (III-A's frequencies)
        self.swaps = 0  # completed shadow-heap swaps
        self._rng = random.Random(seed)
        self._evict_next: list[int] = []  # evicted in the batch, one by one
        self._evict_bulk: list[np.ndarray] = []  # removed at once before it (a new split)
        self._due = np.zeros(0, np.int64)  # ids the coverage floor needs trained as themselves
        self._warned = False
        self.set_split(h_share)
        icache_kernel.load()

    def set_split(self, h_share: float) -> None:
        """H-cache gets ``h_share`` of the capacity, the L-cache the rest, >= one package."""
        self.h_share = float(h_share)
        one_package = self.package_bytes + self._max_size  # the last sample may cross it
        c = self.capacity_bytes
        floor = self._first_l + self._l_in_flight if self._l_in_flight else 0  # (ours)
        self.l_capacity = min(c, max(one_package, c - int(c * h_share), floor))
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
        freed = self._free_l(0)
        if freed:
            self._evict_bulk.append(np.array(freed, np.int64))
        self.used = self.h_used + self.l_used

    def _in_flight_l(self, hot: np.ndarray) -> int:
        """Bytes of the L-samples the plans in flight hold under the H-list ``hot``
        (``l_in_flight``, hotset's): their ids' expected L share, at the mean size; 0
        where the first share beside them would take more than half the cache (the
        batches in flight are too large for the cache: the paper's split then)."""
        if not (self.l_in_flight and self.in_flight_ids):
            return 0
        n = self.num_samples
        share = (n - np.count_nonzero(hot)) / n
        if self._mean_size is None:  # (14M sizes: 17 ms, once, not at each H-list)
            self._mean_size = float(np.frombuffer(self._sizes, np.int64).mean())
        held = int(self.in_flight_ids * share * self._mean_size)
        return held if self._first_l + held <= self.capacity_bytes // 2 else 0

    def load_state_dict(self, state: dict) -> None:
        """A state saved before the places were one array (``_l``: id -> used, the used
        order an ``OrderedDict``, the unused a list, the served a set) is turned into
        this one; a state whose places are not arrays over the ids gets a ConfigError."""
        if "_where" not in state:
            state = self._from_dicts(dict(state))
        n = self.num_samples
        for name, dtype in (("_where", np.int8), ("_served", np.bool_)):
            v = state.get(name)
            if not (isinstance(v, np.ndarray) and v.shape == (n,) and v.dtype == dtype):
                raise ConfigError(f"a saved iCACHE state's {name} is not {n} {dtype.__name__}")
        where = state["_where"]
        if isinstance(state.get("_l"), dict):  # saved when the L residents were a dict
            state = {**state, "_l": self._load_order(_saved_ids(state, "_l", n), where)}
        if not (isinstance(state.get("_l_used"), UseOrder)
                and isinstance(state.get("_fresh"), RandomPool)
                and isinstance(state.get("_l"), LoadOrder)):  # fmt: skip
            raise ConfigError("a saved iCACHE state's L-cache orders are not hotset's")
        if len(state["_l"]) != np.count_nonzero(where >= FRESH):
            raise ConfigError("a saved iCACHE state's _l does not count its L residents")
        _saved_ids(state, "_evict_next", n)  # the evictions the next batch reports
        bulk = state.get("_evict_bulk", [])  # (a state saved before them has none)
        if not (isinstance(bulk, list) and all(
            isinstance(a, np.ndarray) and a.ndim == 1 and a.dtype.kind in "iu" for a in bulk
        )):  # fmt: skip
            raise ConfigError("a saved iCACHE state's _evict_bulk is not arrays of ids")
        _saved_ids({"_evict_bulk": np.concatenate(bulk) if bulk else ()}, "_evict_bulk", n)
        super().load_state_dict(state)
        for name in ("heap", "shadow"):  # saved before they were compiled: the same entries
            heap = getattr(self, name)
            if type(heap) is KeyedHeap:
                setattr(self, name, heap.recast(CompiledHeap))
        self._mean_size = None  # (from the sizes loaded, not a saved value)

    def _from_dicts(self, state: dict) -> dict:
        """The state of an earlier version, its L-cache's dicts and lists made arrays."""
        n, dtype = self.num_samples, self._pool.dtype

        def ids_of(name: str, default=()) -> np.ndarray:
            return _saved_ids(state, name, n, default)

        l_res = state.get("_l", {})
        if not isinstance(l_res, dict):
            raise ConfigError("a saved iCACHE state's _l is not a dict of its L residents")
        where, served = np.zeros(n, np.int8), np.zeros(n, bool)
        where[ids_of("_h", {})] = H  # (the H residents are those ``_where`` says)
        state.pop("_h", None)
        where[ids_of("_l", {})] = FRESH
        where[[i for i, used in l_res.items() if used]] = USED
        served[ids_of("_served")] = True
        used = ids_of("_l_used", {})
        order = UseOrder(n, dtype)
        order.append(used[where[used] == USED], where)
        state.update(
            _where=where, _served=served, _l=self._load_order(ids_of("_l", {}), where),
            _l_used=order,
            _fresh=RandomPool(ids_of("_fresh", []), dtype), _due=np.unique(ids_of("_due")),
        )  # fmt: skip
        return state

    def set_sizes(self, ids, sizes) -> None:
        super().set_sizes(ids, sizes)
        self._max_size = max(self._max_size, int(np.max(sizes, initial=0)))
        self._typical_size = max(1, int(np.mean(self._sizes[:64])))
        self._mean_size = None

    @property
    def _resident(self):
        return self  # ``in`` and ``len`` read ``_where``

    def __contains__(self, i: int) -> bool:
        return self._where[int(i)] != NONE

    def __len__(self) -> int:
        return int(np.count_nonzero(self._where == H)) + len(self._l)

    def cached_ids(self) -> np.ndarray:
        return np.flatnonzero(self._where != NONE)

    def resident_mask(self, ids: np.ndarray) -> np.ndarray:
        return self._where[np.asarray(ids, np.int64)] != NONE

    def discard(self, ids) -> list[int]:
        out = []
        for i in np.asarray(ids, np.int64).tolist():
            if self._where[i] == H:
                self.heap.drop(i)
                if self.shadow is not None:
                    self.shadow.drop(i)
                self._where[i] = NONE
                self.h_used -= self._sizes[i]
                out.append(i)
            elif self._where[i] >= FRESH:
                self._where[i] = NONE  # (its entries in the orders are dead)
                self._l.count -= 1
                self.l_used -= self._sizes[i]
                out.append(i)
        self.used = self.h_used + self.l_used
        return out

    def writing_ids(self) -> np.ndarray:
        return np.fromiter(self._writing, np.int64, len(self._writing))

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

    def apply_hints(self, hints: dict) -> None:
        """A new H-list (``hot`` mask, ``importance`` in [0, 1]) at an epoch start; ``hot``
        ``None``: the most important samples that fit this cache."""
        if "due" in hints:  # the coverage floor: served as themselves this epoch
            self._due = np.unique(np.asarray(hints["due"], np.int64))
        if "hot" not in hints:
            return
        imp = np.asarray(hints["importance"])
        if imp.dtype.kind != "f":  # float32 (IIS's percentiles) stays: quantised alike
            imp = imp.astype(np.float64)
        if hints["hot"] is None and imp.shape == (self.num_samples,):
            hot = h_list_to_fit(imp, self._sizes, self.capacity_bytes, self._rng.getrandbits(32),
                                hints.get("ranked"))  # fmt: skip
        else:
            hot = np.asarray(hints["hot"], bool)
        if hot.shape != (self.num_samples,) or imp.shape != hot.shape:
            raise ConfigError(f"H-list must cover the policy's {self.num_samples} ids")
        split = self.h_share
        if self.freq_h + self.freq_l and not self.is_h.all():
            # III-A: split by the last epoch's access frequencies (once there was an H-list)
            split = self.freq_h / (self.freq_h + self.freq_l)
        self._l_in_flight = self._in_flight_l(hot)
        self.set_split(split)
        self.freq_h = self.freq_l = 0
        self.rebuild_step(self._rebuild)  # finish a rebuild still in progress
        self.is_h = np.ascontiguousarray(hot)  # (read per id through a memoryview)
        self._all_h = bool(hot.all())
        if imp.size and not (imp.min() >= 0.0 and imp.max() <= 1.0):  # (no copy of n
            imp = np.clip(imp, 0.0, 1.0)  # where they are in [0, 1], as IIS's are)
        np.multiply(imp, SCALE, out=self._level, casting="unsafe")
        ids = self.h_residents()
        if ids.size:  # the heap turns read-only; the shadow gets the new values
            self.shadow = CompiledHeap(self.num_samples, np.int32)
            self.shadow.add(ids, self._level[ids])
            self._rebuild = ids.size
        # a new epoch for the L-cache: nothing used yet; queued ids now H are dropped
        l_ids = self.l_residents()
        self._where[l_ids] = FRESH
        self._l.rewind()
        self._l_used.clear()
        self._served[:] = False
        self._fresh = RandomPool(l_ids[~hot[l_ids]], self._pool.dtype)
        self._pool = nonzero_as(~hot, self._pool.dtype)
        self._pool_rng = np.random.default_rng([self.seed, self._rng.getrandbits(32)])
        self._cursor, self._wrapped, self._drawn = 0, False, 0
        self._queue = OrderedDict((i, None) for i in self._queue if not hot[i])

    def access(self, ids) -> AccessResult:
        ids = np.asarray(ids, np.int64)
        self.heap.release(self.pinned)  # (pins change between batches)
        where, hot = self._where[ids], self.is_h[ids]
        served, hits, sub = ids.copy(), where != NONE, np.zeros(ids.size, bool)
        admitted = np.zeros(0, np.int64)
        l_hits = np.flatnonzero(where >= FRESH)
        if l_hits.size:
            self._use(ids[l_hits])
        # H: the residents (an admission earlier in the batch may evict them) and the
        # hot misses, in the batch's order (lines 7-17)
        h_pos = np.flatnonzero((where == H) | (hot & (where == NONE)))
        misses = h_pos[where[h_pos] == NONE]
        turned: list[int] = []  # H residents evicted before their turn, not hot: L-misses
        filled, sizes = False, np.frombuffer(self._sizes, np.int64)
        if misses.size and self.h_used + sizes[ids[misses]].min() <= self.h_capacity:
            first = first_positions(ids[misses])
            filled = self._admit_h_all(ids[misses[first]])
            if filled:
                hits[misses] = True  # a repeat of an admission: a hit
                hits[misses[first]] = False
                admitted = ids[misses[first]]
        if misses.size and not filled:
            admitted, turned = self._admit_h_in_turn(ids, h_pos, misses, hits)
        # L-misses: queued for the next packages (III-C) and substituted (lines 19-24)
        l_miss = np.flatnonzero(~hot & (where == NONE))
        if turned:
            l_miss = np.sort(np.concatenate([l_miss, turned]))
        if self._due.size:  # the coverage floor's: read, not substituted
            l_miss = l_miss[~np.isin(ids[l_miss], self._due)]
        if l_miss.size:
            queue = self._queue  # (``update`` from a dict makes a tuple per id: a young
            for i in ids[l_miss].tolist():  # generation's worth, promoted while alive)
                queue[i] = None
            picked = self._take_fresh(l_miss.size)
            at = l_miss[: picked.size]
            served[at], hits[at], sub[at] = picked, True, True
        freq_h = int(np.count_nonzero(hot))
        self.freq_h += freq_h
        self.freq_l += ids.size - freq_h
        self.rebuild_step(self.rebuild_per_batch)
        self.used = self.h_used + self.l_used
        evicted = self._take_evicted()
        return AccessResult(
            hits=hits,
            admitted=admitted[self._where[admitted] == H] if admitted.size else admitted,
            evicted=evicted[self._where[evicted] == NONE] if evicted.size else evicted,
            served=served,
            substituted=sub,
        )

    def _take_evicted(self) -> np.ndarray:
        """The ids evicted since the last batch, in order, each once: those removed at
        once before it first (a new split: distinct), then the batch's, one by one."""
        evicted = np.fromiter(dict.fromkeys(self._evict_next), np.int64)
        if self._evict_bulk:
            bulk = np.concatenate(self._evict_bulk)
            evicted = np.concatenate([bulk, evicted[~np.isin(evicted, bulk)]])
        self._evict_next, self._evict_bulk = [], []
        return evicted


class InstantPackages:
    """The simulator's feeder: a wanted package is composed and loaded at once."""

    def __init__(self, policy: ICachePolicy) -> None:
        self.policy = policy
        self.packages_loaded = 0

    def poll(self) -> None:
        p = self.policy
        while p.l_wants_package():
            loaded = p.l_load_many() or int(p.l_load_now())
            if not loaded:
                return
            self.packages_loaded += loaded

    def epoch_started(self) -> None:
        self.poll()

    def counters(self) -> dict:
        return {"packages_loaded": self.packages_loaded}

    def close(self) -> None:
        pass
