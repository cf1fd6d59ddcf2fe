"""iCACHE's packages (HPCA'23 III-C): which L-samples the next package holds (queued
misses first, then random L-samples), room made for it, and what landed committed."""

from __future__ import annotations

from bisect import bisect_left
from collections import OrderedDict
from itertools import islice

import numpy as np

from hotset.policy import icache_kernel
from hotset.policy.compiled_heap import frozen
from hotset.policy.icache_lists import (
    FRESH,
    NONE,
    POOL_BLOCK,
    USED,
)
from hotset.sampling.draw import shuffle_next


class LPackages:
    """The packages of ``ICachePolicy``: its methods, on the policy's state (a mixin)."""

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

    def l_make_room(self, ids, beside_pins: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Reserve L space for a package of ``ids``: returns the L residents to delete
        from the store first (used ones first, the longest-used first) and the ids that
        fit (all, unless the L-cache shrank since the package was composed; with
        ``beside_pins``, only those that fit beside the residents pinned by plans in
        flight, which cannot go: the package is counted loaded before it is put)."""
        victims, fit = self._reserve(np.asarray(ids, np.int64).tolist(), beside_pins)
        self.loading += 1
        for i in fit:
            self._writing[i] = self._writing.get(i, 0) + 1
        self.used = self.h_used + self.l_used
        return np.array(victims, np.int64), np.array(fit, np.int64)

    def _reserve(self, ids: list[int], beside_pins: bool = False) -> tuple[list[int], list[int]]:
        """Room in the L-cache for the prefix of ``ids`` that fits (``beside_pins``: less
        what pinned residents keep out): (the residents removed for it, that prefix)."""
        sizes, need, fit = self._sizes, 0, []
        for i in ids:
            if need + sizes[i] > self.l_capacity:
                break
            need += sizes[i]
            fit.append(i)
        victims = self._free_l(need)
        while beside_pins and fit and self.l_used + need > self.l_capacity:  # pinned stayed
            need -= sizes[fit.pop()]
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
