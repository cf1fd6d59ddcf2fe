"""iCACHE's L-cache (HPCA'23 III-C, Algorithm 1 lines 19-24): residents used or not yet
used this epoch, substitutes drawn from the unused, and victims for the next package."""

from __future__ import annotations

import numpy as np

from hotset.errors import ConfigError
from hotset.ids import (
    distinct,
    first_positions,
)
from hotset.policy import icache_kernel
from hotset.policy.compiled_heap import frozen
from hotset.policy.icache_lists import (
    FRESH,
    NONE,
    USED,
    LoadOrder,
    UseOrder,
)


class LCache:
    """The L-cache of ``ICachePolicy``: its methods, on the policy's state (a mixin)."""

    def _load_order(self, ids: np.ndarray, where: np.ndarray) -> LoadOrder:
        """The L residents ``ids``, in the order they were loaded, as a ``LoadOrder``
        (each once, and each in the L-cache by ``where``)."""
        if np.unique(ids).size != ids.size or not (where[ids] >= FRESH).all():
            raise ConfigError("a saved iCACHE state's _l is not its L residents, once each")
        order = LoadOrder(self.num_samples, self._pool.dtype)
        order.append(ids, where)
        return order

    def l_residents(self) -> np.ndarray:
        """The L-cache's residents (loaded from packages), in the order they were loaded."""
        return self._l.in_order(self._where)

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
