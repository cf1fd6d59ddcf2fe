"""LRU: evict the least recently used resident (the papers' baseline).

Vectorised per batch on numpy: residents are a boolean array, recency a time-stamped
queue with lazy invalidation (an entry is live while its id is resident and its stamp is
the id's latest). A batch is applied at once when its evictions are the minimal prefix of
live entries *older than the batch* covering the bytes it admits, and none of those
victims is accessed in the batch; then the outcome equals the sequential one, because
eviction always takes the oldest live entry and the bytes needed only grow through the
batch. Otherwise the batch is split in halves; a single access never conflicts, so the
recursion is exact (property-tested against a textbook LRU).
"""

from __future__ import annotations

import numpy as np

from hotset.ids import first_positions
from hotset.policy.base import AccessResult, Policy, register_policy

_EMPTY = np.empty(0, np.int64)


def _unique_in_order(ids: np.ndarray) -> np.ndarray:
    return ids[first_positions(ids)]


@register_policy
class LRUPolicy(Policy):
    name = "lru"
    #: move a hit to the most-recent end (False gives FIFO)
    refresh_on_hit = True

    def __init__(self, capacity_bytes, sizes, seed: int = 0):
        super().__init__(capacity_bytes, sizes, seed)
        self._size = np.asarray(self._sizes, np.int64)
        self._in = np.full(self.num_samples, False)
        self._stamp = np.full(self.num_samples, -1, np.int64)
        self._q_id = np.zeros(1024, np.int64)  # (zeros: a saved state holds no stray bytes)
        self._q_t = np.zeros(1024, np.int64)
        self._head = self._tail = self._clock = 0
        self._count = 0
        self._scratch = np.full(self.num_samples, 0, np.int64)  # per-batch marks
        self._evictable = self._split = 0  # (what a failed batch leaves to its split)

    def set_sizes(self, ids, sizes) -> None:
        super().set_sizes(ids, sizes)
        self._size = np.asarray(self._sizes, np.int64)  # a view: a shared column is copied

    # -- the recency queue -------------------------------------------------------------
    def _live(self, lo: int, hi: int) -> np.ndarray:
        ids = self._q_id[lo:hi]
        return self._in[ids] & (self._stamp[ids] == self._q_t[lo:hi])

    def _push(self, ids: np.ndarray) -> None:
        """Append distinct ``ids`` as the most recent, in order."""
        k = ids.size
        if self._tail + k > self._q_id.size:
            keep = self._live(self._head, self._tail)
            live_ids, live_t = (
                self._q_id[self._head : self._tail][keep],
                self._q_t[self._head : self._tail][keep],
            )
            size = max(1024, 2 * (live_ids.size + k))
            self._q_id, self._q_t = np.zeros(size, np.int64), np.zeros(size, np.int64)
            self._q_id[: live_ids.size], self._q_t[: live_ids.size] = live_ids, live_t
            self._head, self._tail = 0, live_ids.size
        times = np.arange(self._clock, self._clock + k, dtype=np.int64)
        self._q_id[self._tail : self._tail + k] = ids
        self._q_t[self._tail : self._tail + k] = times
        self._stamp[ids] = times
        self._tail += k
        self._clock += k

    def _oldest(self, need: int) -> tuple[np.ndarray, int] | None:
        """The minimal prefix of unpinned live entries whose sizes reach ``need`` bytes,
        and the queue head after it (not past a pinned entry, which stays queued);
        ``None`` if they do not reach it."""
        pos, freed, parts, stop = self._head, 0, [], None
        chunk = 256
        while pos < self._tail:
            hi = min(self._tail, pos + chunk)
            live = self._live(pos, hi)
            held = live & (self.pinned[self._q_id[pos:hi]] > 0)
            if stop is None and held.any():
                stop = pos + int(np.argmax(held))
            where = np.flatnonzero(live & ~held)
            ids = self._q_id[pos:hi][where]
            if ids.size:
                cum = np.cumsum(self._size[ids]) + freed
                if cum[-1] >= need:
                    k = int(np.searchsorted(cum, need))
                    parts.append(ids[: k + 1])
                    head = pos + int(where[k]) + 1
                    return np.concatenate(parts), head if stop is None else min(stop, head)
                parts.append(ids)
                freed = int(cum[-1])
            pos, chunk = hi, chunk * 2
        self._evictable = freed  # all there is: less than ``need``
        return None

    def _stuck(self, sizes: np.ndarray) -> bool:
        """After ``_oldest`` failed: no admission of ``sizes`` fits without an eviction
        and no resident can be evicted (each pinned): every access of the batch in turn
        is read, not admitted."""
        return (self._evictable == 0 and sizes.size > 0
                and self.used + int(sizes.min()) > self.capacity_bytes)  # fmt: skip

    def shrink_to(self, capacity_bytes: int) -> list[int]:
        """Evict the least recently used residents until they fit ``capacity_bytes``."""
        self.capacity_bytes = int(capacity_bytes)
        if self.used <= self.capacity_bytes:
            return []
        found = self._oldest(self.used - self.capacity_bytes)
        if found is None:  # pinned ones stay until their plans have run
            order = self.recency_order()
            victims = order[self.pinned[order] == 0]
        else:
            victims, self._head = found
        self._in[victims] = False
        self.used -= int(self._size[victims].sum())
        self._count -= victims.size
        return victims.tolist()

    # -- accesses ----------------------------------------------------------------------
    def _groups(self, ids: np.ndarray):
        """Distinct ids of the batch with the first/last position and the group of each
        access. No sort when the batch has no repeats (every shuffled epoch)."""
        pos = np.arange(ids.size)
        self._scratch[ids] = pos
        if (self._scratch[ids] == pos).all():  # a repeated id would lose one of its writes
            return ids, pos, pos, pos
        order = np.argsort(ids, kind="stable")
        ranked = ids[order]
        start = np.flatnonzero(np.r_[True, ranked[1:] != ranked[:-1]])
        end = np.r_[start[1:], ids.size] - 1
        inverse = np.empty(ids.size, np.int64)
        inverse[order] = np.cumsum(np.r_[True, ranked[1:] != ranked[:-1]]) - 1
        return ranked[start], order[start], order[end], inverse

    def _try_batch(self, ids: np.ndarray):
        """Apply ``ids`` at once if that equals the sequential outcome, else ``None``."""
        uniq, first, last, inverse = self._groups(ids)
        was_in = self._in[uniq]
        admit = ~was_in & (self._size[uniq] <= self.capacity_bytes)
        admitted = uniq[admit][np.argsort(first[admit], kind="stable")]
        add = int(self._size[admitted].sum())
        need = self.used + add - self.capacity_bytes
        victims, head = _EMPTY, self._head
        found = self._oldest(need) if need > 0 else None
        if need > 0 and found is None:
            if ids.size > 1 and not self._stuck(self._size[admitted]):
                # split where the admissions stop fitting in the room there is to make
                sizes = np.zeros(ids.size, np.int64)
                sizes[first[admit]] = self._size[uniq[admit]]
                room = self.capacity_bytes - self.used + self._evictable
                fit = int(np.searchsorted(np.cumsum(sizes), room, side="right"))
                self._split = min(max(fit, 1), ids.size - 1)
                return None
            # one access, or none of the batch's could be admitted in turn (no room, and
            # what they would displace is pinned by plans in flight): read, not admitted
            admit[:] = False
            admitted, add = admitted[:0], 0
        elif need > 0:
            victims, head = found
            self._scratch[victims] = -1
            self._scratch[uniq] = 0
            if (self._scratch[victims] == 0).any():  # a victim is accessed in the batch
                return None
        self._head = head
        self._in[victims] = False
        self._in[admitted] = True
        self.used += add - int(self._size[victims].sum())
        self._count += admitted.size - victims.size
        if self.refresh_on_hit:
            order = uniq[np.argsort(last, kind="stable")]
            self._push(order[self._in[order]])  # hits and admissions, by last access
        else:
            self._push(admitted)
        is_first = np.zeros(ids.size, bool)
        is_first[first] = True
        hits = was_in[inverse] | (~is_first & admit[inverse])
        return hits, admitted, victims

    def _run(self, ids: np.ndarray, hits: list, admitted: list, evicted: list) -> None:
        self._split = ids.size // 2  # (a victim accessed in the batch: halves)
        done = self._try_batch(ids)
        if done is None:
            mid = self._split
            self._run(ids[:mid], hits, admitted, evicted)
            self._run(ids[mid:], hits, admitted, evicted)
            return
        hits.append(done[0])
        admitted.append(done[1])
        evicted.append(done[2])

    def access(self, ids) -> AccessResult:
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size == 0:
            return AccessResult(np.zeros(0, bool), _EMPTY, _EMPTY)
        hits, admitted, evicted = [], [], []
        self._run(ids, hits, admitted, evicted)
        if len(hits) == 1:  # applied whole: admissions and victims are already net
            return AccessResult(hits[0], admitted[0], evicted[0])
        adm = np.concatenate(admitted)
        ev = np.concatenate(evicted)
        return AccessResult(
            hits=np.concatenate(hits),
            admitted=_unique_in_order(adm[self._in[adm]]),
            evicted=_unique_in_order(ev[~self._in[ev]]),
        )

    def _access(self, ids, hits, admitted, evicted):  # pragma: no cover - access() overrides
        raise AssertionError("LRUPolicy.access is vectorised")

    @property
    def _resident(self):
        return set(self.cached_ids().tolist())

    def _remove(self, i: int) -> None:
        self._in[i] = False  # its queue entry turns stale
        self._count -= 1

    def __contains__(self, i: int) -> bool:
        return bool(self._in[int(i)])

    def __len__(self) -> int:
        return self._count

    def recency_order(self) -> np.ndarray:
        """Resident ids from least to most recently used (FIFO: oldest admitted first)."""
        keep = self._live(self._head, self._tail)
        return self._q_id[self._head : self._tail][keep]

    def cached_ids(self) -> np.ndarray:
        return self.recency_order()
