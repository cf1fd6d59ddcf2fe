"""iCACHE's lists (HPCA'23 III-B/C): the H-list that fits the cache (which samples are
H-samples), each id's place (``NONE``, ``H``, ``FRESH``, ``USED``), and the L-cache's orders
of use and load and its pool of substitutes; :mod:`hotset.policy.icache` uses them."""

from __future__ import annotations

import logging

import numpy as np

from hotset.errors import ConfigError
from hotset.ids import (
    BLOCK,
    index_dtype,
    nonzero_as,
    nonzero_at,
    stable_order,
)
from hotset.policy import icache_kernel
from hotset.sampling.draw import SHUFFLE_BLOCK, shuffle_next, subset

SCALE = float(1 << 24)
log = logging.getLogger("hotset.policy.icache")  # one logger for its parts


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
    if (
        ranked.ndim != 1
        or ranked.dtype.kind not in "iu"
        or ranked.size > n
        or (ranked.size and (ranked.min() < 0 or ranked.max() >= n))
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
