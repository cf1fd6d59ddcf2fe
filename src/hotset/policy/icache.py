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

import logging
import random
from bisect import bisect_left
from collections import OrderedDict
from heapq import heapreplace
from itertools import islice

import numpy as np

from hotset.errors import ConfigError
from hotset.ids import (
    BLOCK,
    distinct,
    first_positions,
    index_dtype,
    nonzero_as,
    nonzero_at,
    stable_order,
)
from hotset.policy import icache_kernel
from hotset.policy.base import AccessResult, Feeder, Policy, register_policy
from hotset.policy.compiled_heap import CompiledHeap, frozen
from hotset.policy.keyed_heap import KeyedHeap
from hotset.sampling.draw import SHUFFLE_BLOCK, shuffle_next, subset

SCALE = float(1 << 24)
log = logging.getLogger(__name__)


def h_list_to_fit(
    importance: np.ndarray, sizes, capacity: int, seed: int = 0, ranked=None
) -> np.ndarray:
    """The H-list a cache of ``capacity`` bytes holds (III-A's overhead example: a 20%
    cache, 20% of the samples): the most important samples whose bytes together fit,
    equal importance in a random order (float64 importances closer than ``2**-28``
    relative count as equal: :func:`hotset.ids.stable_order`). ``ranked``: the most
    important ids in order, down (IIS's sort, handed with its percentiles): the run of
    them that fits, where that is this H-list for every seed (:func:`h_list_of_ranked`),
    without a sort here."""
    importance = np.asarray(importance)
    if importance.dtype.kind != "f":  # float32 stays: the same order, half the bytes
        importance = importance.astype(np.float64)
    hot = None if ranked is None else h_list_of_ranked(ranked, importance, sizes, capacity)
    if hot is not None:
        return hot
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
        dtype = index_dtype(n)
        above, ties = nonzero_as(importance > cut, dtype), importance == cut
        m = k - above.size  # >= 1: at most k - 1 ids are more important than the k-th
        count = int(np.count_nonzero(ties))
        if m < count:  # m of the ties at random, without all their positions (most ids)
            at = nonzero_at(ties, subset(count, m, rng), dtype)
        else:
            at = nonzero_as(ties, dtype)
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


def h_list_of_ranked(ranked, importance: np.ndarray, sizes, capacity: int) -> np.ndarray | None:
    """:func:`h_list_to_fit`'s H-list from ``ranked``, the most important ids in order
    (down): the longest run of them whose bytes fit, read a block at a time, without a
    sort of the importances. ``None`` where that is
    not the same H-list whatever :func:`h_list_to_fit`'s random order of equal
    importances: the first id that does not fit ties with another (a smaller one of
    equal importance might fit in its place), or it is ``ranked``'s last before every
    id (what comes next is not known). A ``ranked`` that is not ids in order of
    ``importance`` (down) is refused."""
    n, ranked = importance.size, np.asarray(ranked)
    if ranked.ndim != 1 or ranked.dtype.kind not in "iu" or ranked.size > n or (
        ranked.size and (ranked.min() < 0 or ranked.max() >= n)
    ):
        raise ConfigError(f"the hint 'ranked' must be at most {n} ids in [0, {n})")
    sizes = np.asarray(sizes, np.int64)
    fit, total = ranked.size, 0  # the run that fits: ranked[:fit]
    for lo in range(0, ranked.size, BLOCK):
        sums = np.cumsum(sizes[ranked[lo : lo + BLOCK]]) + total
        took = int(np.searchsorted(sums, capacity, side="right"))
        if took < sums.size:
            fit = lo + took
            break
        total = int(sums[-1])
    seen = importance[ranked[: fit + 2]]  # the run, its first left out and the next
    if (seen[1:] > seen[:-1]).any():
        raise ConfigError("the hint 'ranked' does not list ids by importance, down")
    if fit + 1 >= ranked.size and ranked.size < n:
        return None  # the first left out is the last ranked, or none is: what follows?
    if fit < ranked.size and np.count_nonzero(seen[max(0, fit - 1) : fit + 2] == seen[fit]) > 1:
        return None  # the first left out ties with the one before or after it
    hot = np.zeros(n, bool)
    hot[ranked[:fit]] = True
    return hot


#: L-samples the pool puts in their random place at a time (``_draw_pool_block``)
POOL_BLOCK = SHUFFLE_BLOCK
#: an id's place in ``ICachePolicy._where``
# an id's place (``_where``): not cached; H-cache; L-cache unused / used this epoch
NONE, H, FRESH, USED = icache_kernel.PLACES


class RandomPool:
    """Ids drawn uniformly at random without replacement while more are added: the
    L residents left to substitute this epoch. ``take(k)`` is ``k`` steps of Fisher-Yates
    over what is left at once (``shuffle_next``), so a batch's substitutes cost a few
    numpy calls, not a step each; ids whose place changed since they were added (used
    as themselves, evicted) are left in and skipped by the caller."""

    def __init__(self, ids: np.ndarray, dtype: type) -> None:
        self.ids = np.array(ids, dtype)
        self.start, self.end = 0, int(self.ids.size)  # what is left: ids[start:end]

    def __len__(self) -> int:
        return self.end - self.start

    def __getstate__(self) -> dict:
        """What is left, alone: the taken prefix and the unused tail (whatever the
        memory held) are not state, and two equal pools save equal bytes."""
        left = self.ids[self.start : self.end].copy()
        return {"ids": left, "start": 0, "end": int(left.size)}

    def __setstate__(self, state: dict) -> None:
        vars(self).update(state)
        _check_queue(self, "substitutes", self.start, self.end)

    def add(self, ids: list[int]) -> None:
        k, left = len(ids), self.ids[self.start : self.end]
        if self.end + k > self.ids.size:  # the taken prefix goes; grown if still short
            if 2 * (left.size + k) > self.ids.size:  # (half of it left free at least)
                self.ids = np.empty(max(64, 2 * (left.size + k)), self.ids.dtype)
            self.ids[: left.size] = left  # (numpy copies overlapping parts safely)
            self.start, self.end = 0, left.size
        self.ids[self.end : self.end + k] = ids
        self.end += k

    def take(self, k: int, rng: np.random.Generator) -> np.ndarray:
        """Up to ``k`` of what is left, a uniform ordered draw; they leave the pool."""
        k = min(k, len(self))
        shuffle_next(self.ids[: self.end], self.start, rng, k)
        out = self.ids[self.start : self.start + k].astype(np.int64)
        self.start += k
        return out


def _saved_ids(state: dict, name: str, n: int, default=()) -> np.ndarray:
    """The ids a saved state holds under ``name`` (any iterable of them), each below ``n``."""
    try:
        out = np.array(list(state.get(name, default)), np.int64)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"a saved iCACHE state's {name} is not ids") from exc
    if out.size and not (out.min() >= 0 and out.max() < n):
        raise ConfigError(f"a saved iCACHE state's {name} holds ids not below {n}")
    return out


def _check_queue(queue, what: str, start, end) -> None:
    """A saved queue of ids (``RandomPool``, ``UseOrder``): 1-D integer ids, ``start``
    and ``end`` ints with ``0 <= start <= end <= len(ids)``."""
    ids = getattr(queue, "ids", None)
    if not (isinstance(ids, np.ndarray) and ids.ndim == 1 and ids.dtype.kind == "i"
            and all(isinstance(v, int) for v in (start, end))
            and 0 <= start <= end <= ids.size):  # fmt: skip
        raise ConfigError(f"a saved L-cache's {what} is not 1-D integer ids with its bounds")


class UseOrder:
    """The L residents used this epoch, the longest-used first (the L-cache's first
    victims): ids appended to an array as they are used, ``at`` holding where each id's
    last entry is; an entry is live while it is its id's last and the id is still
    ``USED`` in ``where`` (an id used again, evicted or loaded again leaves its earlier
    entries dead, skipped by the walk and dropped when the array is compacted)."""

    least = USED  # an entry's id is live in this place or a later one of ``NONE, H, ...``

    def __init__(self, num_ids: int, dtype: type) -> None:
        self.ids = np.zeros(64, dtype)
        self.at = np.full(num_ids, -1, dtype)
        self.head = self.end = 0  # entries before ``head`` are all dead

    def __setstate__(self, state: dict) -> None:
        vars(self).update(state)
        _check_queue(self, "use order", self.head, self.end)
        at = self.at
        if not (isinstance(at, np.ndarray) and at.ndim == 1 and at.dtype.kind == "i"
                and (at >= -1).all() and (at < self.ids.size).all()
                and (self.ids[: self.end] < at.size).all()):  # fmt: skip
            raise ConfigError("a saved L-cache use order's ids or positions are out of range")

    def clear(self) -> None:
        self.head = self.end = 0

    def append(self, ids: np.ndarray, where: np.ndarray) -> None:
        """``ids`` (distinct) were used now, in this order."""
        if self.end + ids.size > self.ids.size:  # only the live entries are kept
            ids_, at = self.ids[self.head : self.end], np.arange(self.head, self.end)
            live = ids_[self.live(ids_, at, where)]
            if 2 * (live.size + ids.size) > self.ids.size:  # half of it left free at least
                self.ids = np.zeros(max(64, 2 * (live.size + ids.size)), self.ids.dtype)
            self.ids[: live.size] = live
            self.at[live] = np.arange(live.size)
            self.head, self.end = 0, live.size
        self.ids[self.end : self.end + ids.size] = ids
        self.at[ids] = np.arange(self.end, self.end + ids.size)
        self.end += ids.size

    def live(self, ids: np.ndarray, at: np.ndarray, where: np.ndarray) -> np.ndarray:
        """Whether the entries ``ids`` at positions ``at`` are live."""
        return (self.at[ids] == at) & (where[ids] >= self.least)

    def in_order(self, where: np.ndarray) -> np.ndarray:
        """The live entries' ids, in order."""
        ids = self.ids[self.head : self.end]
        return ids[self.live(ids, np.arange(self.head, self.end), where)].astype(np.int64)


class LoadOrder(UseOrder):
    """The L residents in the order they were loaded (the unused ones leave the first
    loaded first): a ``UseOrder`` whose entries live while their id is in the L-cache,
    used or not, and ``len`` of them (an array and a position per id, not a dict of
    the residents: at 14M ids its growth was the longest batch)."""

    least = FRESH

    def __init__(self, num_ids: int, dtype: type) -> None:
        super().__init__(num_ids, dtype)
        self.count = 0
        # where the walk for unused residents starts (hotset's): no entry before it is
        # live and unused. A used resident turns unused again only at an epoch start
        # (``rewind``); one loaded again has a new entry at the end.
        self.fresh = 0

    def __len__(self) -> int:
        return self.count

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        if not isinstance(getattr(self, "count", None), int):
            raise ConfigError("a saved L-cache load order has no count of its residents")
        self.rewind()  # (a saved cursor is not trusted: walked again from the head)

    def clear(self) -> None:
        super().clear()
        self.rewind()

    def rewind(self) -> None:
        """The used residents turned unused: the walk for the unused starts at the head."""
        self.fresh = self.head

    def append(self, ids: np.ndarray, where: np.ndarray) -> None:
        """``ids`` (distinct, none in the L-cache before, ``where`` says they are now)
        were loaded now, in this order."""
        end = self.end
        super().append(ids, where)
        if self.end != end + ids.size:  # compacted: the entries moved to the front
            self.rewind()
        self.count += ids.size


@register_policy
class ICachePolicy(Policy):
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

    # -- sizes -----------------------------------------------------------------------
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

    def _load_order(self, ids: np.ndarray, where: np.ndarray) -> LoadOrder:
        """The L residents ``ids``, in the order they were loaded, as a ``LoadOrder``
        (each once, and each in the L-cache by ``where``)."""
        if np.unique(ids).size != ids.size or not (where[ids] >= FRESH).all():
            raise ConfigError("a saved iCACHE state's _l is not its L residents, once each")
        order = LoadOrder(self.num_samples, self._pool.dtype)
        order.append(ids, where)
        return order

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

    def _free_l(self, need: int) -> list[int]:
        """Remove unpinned L residents, used ones first (the longest-used first), then
        unused ones (the first loaded first), until ``need`` more bytes fit the L-cache;
        returns them."""
        return self._remove_l(*self._l_victims(need))

    def _remove_l(self, victims: np.ndarray, freed: int) -> list[int]:
        """L residents ``victims`` (``freed`` bytes in all) leave; returns them."""
        self.l_used -= freed
        self._where[victims] = NONE  # (their entries in the orders are dead)
        self._l.count -= victims.size
        return victims.tolist()

    def _l_victims(self, need: int) -> tuple[np.ndarray, int]:
        """The residents ``_free_l(need)`` removes, in order, and their bytes, found and
        not removed: of each order's first candidates (``_l_candidates``), the fewest
        whose bytes reach what must go."""
        over = self.l_used + need - self.l_capacity
        out, got = [], 0
        for order, unused in ((self._l_used, False), (self._l, True)):
            if got >= over:
                break
            ids, sizes = self._l_candidates(order, unused, over - got)
            freed = np.cumsum(sizes)
            k = min(ids.size, int(np.searchsorted(freed, over - got)) + 1)
            if k:
                got += int(freed[k - 1])
                out.append(ids[:k])
        return (np.concatenate(out) if out else np.zeros(0, np.int64)), got

    def _l_candidates(self, order: UseOrder, unused: bool, nbytes: int) -> tuple:
        """The first unpinned live entries of ``order`` (``unused``: those unused, of the
        load order), in order, until their bytes reach ``nbytes``: their ids and sizes.
        The dead entries at its front are dropped on the way. Compiled
        (``icache_kernel.candidates``) where it is, and the walk for the unused starts at
        the load order's ``fresh``; else the order is walked from its head a chunk at a
        time, each chunk twice the last (the candidates of the last chunk walked, past
        ``nbytes``, too)."""
        where, pinned = self._where, self.pinned
        sizes = np.frombuffer(self._sizes, np.int64)
        if self.compiled and icache_kernel.load():
            start = max(order.head, order.fresh) if unused else order.head
            out = np.empty(order.end - start, np.int64)
            first, k = icache_kernel.candidates(
                frozen(order.ids), frozen(order.at), start, order.end, frozen(where),
                order.least, unused, frozen(pinned), frozen(sizes), nbytes, out,
            )  # fmt: skip
            if unused:
                order.fresh = int(first)
            else:
                order.head = int(first)
            return out[:k], sizes[out[:k]]
        out, got, at, chunk = [], 0, order.head, 64
        while got < nbytes and at < order.end:
            pos = np.arange(at, min(at + chunk, order.end))
            ids = order.ids[pos]
            live = order.live(ids, pos, where)
            if at == order.head:
                order.head += ids.size if not live.any() else int(np.argmax(live))
            if unused:
                live &= where[ids] == FRESH
            ids = ids[live & (pinned[ids] == 0)].astype(np.int64)
            out.append(ids)
            got += int(sizes[ids].sum())
            at, chunk = at + pos.size, 2 * chunk
        ids = np.concatenate(out) if out else np.zeros(0, np.int64)
        return ids, sizes[ids]

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

    def h_residents(self) -> np.ndarray:
        """The H-cache's residents."""
        return np.flatnonzero(self._where == H)

    def l_residents(self) -> np.ndarray:
        """The L-cache's residents (loaded from packages), in the order they were loaded."""
        return self._l.in_order(self._where)

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
        most = heap._n + rest.size + 1  # entries taken from the heap at most
        take, turned = np.empty(rest.size, np.int64), np.empty(rest.size, np.int64)
        evicted, parked, popped = (np.empty(most, np.int64) for _ in range(3))
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

    # -- accesses --------------------------------------------------------------------
    def _take_fresh(self, k: int) -> np.ndarray:
        """Up to ``k`` distinct L residents not used this epoch that are still
        L-samples, drawn at random (line 23's ``randomly_fetch_from_L_cache``), now used."""
        out, where, is_h = [], self._where, self.is_h
        while k > 0 and len(self._fresh):
            drawn = self._fresh.take(k, self._pick_rng)
            drawn = drawn[(where[drawn] == FRESH) & ~is_h[drawn]]  # others: left since
            if not distinct(drawn):
                drawn = drawn[first_positions(drawn)]  # an id added twice, once
            where[drawn] = USED
            out.append(drawn)
            k -= drawn.size
        picked = np.concatenate(out) if out else np.zeros(0, np.int64)
        self._l_used.append(picked, where)  # victims are the longest-used first
        self._served[picked] = True
        return picked

    def _use(self, ids: np.ndarray) -> None:
        """L residents ``ids`` served as themselves: used, the last used last."""
        ids = ids[np.sort(ids.size - 1 - first_positions(ids[::-1]))]  # each at its last use
        self._where[ids] = USED
        self._l_used.append(ids, self._where)
        self._served[ids] = True

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
        return self.l_fresh() < self._fresh_wanted()

    def _fresh_wanted(self) -> int:
        """Unused L residents below which a package is wanted: half the L-cache's items
        beside those the plans in flight hold."""
        return max(1, (self.l_capacity - self._l_in_flight) // self._typical_size) // 2

    def l_next_package(self, exclude=(), prefer=None) -> np.ndarray:
        """Ids for the next package, >= ``package_bytes`` when there are enough
        L-samples: the queued misses, then random L-samples (from ``prefer``, the ids
        already in package files, first)."""
        return np.array(self._compose(exclude, prefer), np.int64)

    def _compose(self, exclude=(), prefer=None) -> list[int]:
        """``l_next_package``'s ids, as a list."""
        skip = set(exclude)
        out, nbytes, sizes, is_h = [], 0, self._sizes, memoryview(self.is_h)
        where, served = memoryview(self._where), memoryview(self._served)
        limit = min(self.package_bytes, self.l_capacity)
        for i in self._queue:
            if nbytes >= limit:
                break
            if nbytes + sizes[i] > self.l_capacity:
                continue
            if where[i] < FRESH and i not in skip and not is_h[i]:
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
                    taken = where[i] != NONE or served[i]
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
        queue, is_h = self._queue, memoryview(self.is_h)
        where, served = memoryview(self._where), memoryview(self._served)
        loaded, fresh, used = [], [], []
        for i in ids:
            if (ok is None or i in ok) and where[i] == NONE:
                loaded.append(i)
                queue.pop(i, None)
                if served[i]:  # served this epoch already: not a substitute
                    where[i] = USED
                    used.append(i)
                else:
                    where[i] = FRESH
                    if not is_h[i]:
                        fresh.append(i)
            else:
                self.l_used -= self._sizes[i]
        self._l.append(np.array(loaded, np.int64), self._where)
        self._fresh.add(fresh)
        if used:
            self._l_used.append(np.array(used, np.int64), self._where)
        self.used = self.h_used + self.l_used

    def l_load_now(self) -> bool:
        """Compose the next package and load it at once (the simulator's feeder: nothing
        runs between making room and committing, so nothing is reserved); whether there
        was one to load."""
        ids = self._compose()
        if ids:
            self._settle(self._reserve(ids)[1], None)
        return bool(ids)

    def l_load_many(self) -> int:
        """Load at once the packages ``l_load_now`` would load one by one while they
        are wanted and whole from one source: the queue's next misses (when any are
        queued) or else the pool's next L-samples; a package takes them in order until
        its bytes reach ``package_bytes``. Returns how many: 0 where that is not simple
        (a queued id cached or in the H-list, a package that would skip an id too large
        for the L-cache, the pool's end or an L resident in its walk that making room
        for them evicts, or not one whole package), and ``l_load_now`` goes on one by
        one. The same decisions: a package's ids are the ones its walk takes (a queued
        miss served this epoch already is loaded used, and counts for no unused one),
        and the room is made by the walk the steps make in turn: at once where the
        residents from before make it all (the used ones alone where a package has used
        ids, which go first), else the walks of each turn (``_settle_in_turn``)."""
        want = self._fresh_wanted() - len(self._fresh)
        limit = min(self.package_bytes, self.l_capacity)
        if self.loading or want <= 0 or limit <= 0:
            return 0
        queued, most = bool(self._queue), min(want, self.load_many_ids) + 256
        if queued:
            head = np.fromiter(islice(self._queue, most), np.int64)
        else:
            c, pool = self._cursor, self._pool
            end = min(pool.size, c + most)
            while self._drawn < end:
                self._draw_pool_block(self._drawn)
            head = pool[c:end].astype(np.int64)
        ok = (self._where[head] == NONE) & ~self.is_h[head]
        if queued:  # the walk takes every queued id up to the first it may not
            at = np.arange(ok.size if ok.all() else int(np.argmin(ok)))
        else:  # the pool's walk passes over those it may not take, and the served
            at = np.flatnonzero(ok & ~self._served[head])
        served = self._served[head[at]]  # queued misses served already: loaded used
        cum_bytes = np.cumsum(np.frombuffer(self._sizes, np.int64)[head[at]])
        cum = cum_bytes.tolist()
        unused = np.cumsum(~served).tolist()
        ends, base = [0], 0
        while (unused[ends[-1] - 1] if ends[-1] else 0) < want:
            j = bisect_left(cum, base + limit)  # where its bytes reach the limit
            if j >= len(cum) or cum[j] - base > self.l_capacity:
                break
            ends.append(j + 1)
            base = cum[j]
        victims = self._l_victims(base) if len(ends) > 1 else None
        if not queued and victims is not None:  # the pool's walk stops before the first
            # resident the room for them evicts: the steps' walk would take it once gone
            gone = np.isin(head[: int(at[ends[-1] - 1]) + 1], victims[0])
            if gone.any():
                ends = [e for e in ends if not e or at[e - 1] < int(np.argmax(gone))]
                base = cum[ends[-1] - 1] if len(ends) > 1 else 0
                victims = self._l_victims(base)  # (a prefix of those)
        if len(ends) == 1:
            return 0
        ids = head[at[: ends[-1]]]
        if not queued:
            self._cursor = c + int(at[ends[-1] - 1]) + 1
        at_once = self.l_used - victims[1] + base <= self.l_capacity and (
            not served[: ends[-1]].any() or (self._where[victims[0]] == USED).all()
        )
        if at_once:
            self._remove_l(*victims)
            self._settle_walked(ids, base, queued)
        else:
            self._settle_in_turn(ids, [e - 1 for e in ends[1:]], cum_bytes, queued)
        return len(ends) - 1

    def _settle_in_turn(self, ids: np.ndarray, lasts: list[int], cum: np.ndarray,
                        queued: bool) -> None:  # fmt: skip
        """The packages ``ids[.. lasts[0]], ..`` (their ids' bytes summed up in ``cum``)
        loaded one after the other, as ``_free_l`` and ``_settle_walked`` for each in turn
        would: the room for each is made by the walk of its turn (the used residents, the
        earlier packages' after those from before, then the unused ones likewise). The
        walks are made at once, on the orders' first candidates (the room made for all
        the packages at most, and a sample more) and the packages' own ids: compiled
        (``icache_kernel.settle_in_turn``) where they are."""
        over = self.l_used + int(cum[lasts[-1]]) - self.l_capacity + self._max_size
        found = [self._l_candidates(order, unused, over)[0] if over > 0 else ids[:0]
                 for order, unused in ((self._l_used, False), (self._l, True))]  # fmt: skip
        ids = ids[: lasts[-1] + 1]
        if self.compiled and icache_kernel.load():
            s0, s1 = (np.concatenate([f, np.empty(ids.size, np.int64)]) for f in found)
            victims = np.empty(s0.size + s1.size, np.int64)
            nv, freed = icache_kernel.settle_in_turn(
                s0, found[0].size, s1, found[1].size, frozen(ids), frozen(self._served),
                frozen(self.pinned), frozen(np.frombuffer(self._sizes, np.int64)),
                np.array(lasts, np.int64), frozen(cum), self.l_used, self.l_capacity, victims,
            )  # fmt: skip
            victims = victims[:nv]
        else:
            victims, freed = self._walks_in_turn(ids, lasts, cum.tolist(), found)
        self._settle_walked(ids, int(cum[lasts[-1]]), queued)
        self._remove_l(victims, int(freed))
        self.used = self.h_used + self.l_used

    def _walks_in_turn(self, ids: np.ndarray, lasts: list[int], cum: list[int],
                       found: list[np.ndarray]) -> tuple[np.ndarray, int]:  # fmt: skip
        """``_settle_in_turn``'s walks in Python (the compiled loop's reference): the
        victims, in order, and their bytes."""
        cap, sizes = self.l_capacity, self._sizes
        streams = [[f.tolist(), 0] for f in found]  # the used, then the unused; the next
        walked = zip(ids.tolist(), self._served[ids].tolist(), self.pinned[ids].tolist(),
                     strict=True)  # fmt: skip
        used, victims, freed, first = self.l_used, [], 0, 0
        for last in lasts:
            need = cum[last] - (cum[first - 1] if first else 0)
            over, got = used + need - cap, 0
            for stream in streams:
                out, k = stream
                while got < over and k < len(out):
                    victims.append(out[k])
                    got += sizes[out[k]]
                    k += 1
                stream[1] = k
            used += need - got
            freed += got
            for i, served, pins in islice(walked, last + 1 - first):  # they join the walks
                if not pins:
                    streams[0 if served else 1][0].append(i)
            first = last + 1
        return np.array(victims, np.int64), freed

    def _settle_walked(self, ids: np.ndarray, nbytes: int, queued: bool) -> None:
        """``ids`` (none cached or hot; ``queued``: the queue's next ones), ``nbytes`` in
        all, are L residents: unused, or used where served this epoch already
        (``_settle`` at once)."""
        served = self._served[ids]
        self._where[ids] = np.where(served, USED, FRESH)
        self._l.append(ids, self._where)
        if served.any():
            self._fresh.add(ids[~served])
            self._l_used.append(ids[served], self._where)
        else:
            self._fresh.add(ids)
        if queued and 2 * ids.size >= len(self._queue):  # most of it: what is left, anew
            self._queue = OrderedDict.fromkeys(islice(self._queue, ids.size, None))
        elif queued:
            pop = self._queue.popitem
            for _ in range(ids.size):
                pop(last=False)
        self.l_used += nbytes
        self.used = self.h_used + self.l_used


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
