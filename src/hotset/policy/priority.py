"""Priority-queue policy by importance score (SHADE's ``sh_pq`` ablation): a miss is
admitted when the residents it would displace all score lower; the lowest-scored go.

Scores come from the sampler's :class:`~hotset.importance.ScoreBoard` (attached by the
planner); ``scores_updated`` re-keys residents as feedback arrives, in a keyed heap whose
level is the score quantised to 2^-24 and floored at 0 (ties of equal scores fall to the
lower id).
"""

from __future__ import annotations

from bisect import insort
from heapq import heappop, heappush, heapreplace

import numpy as np

from hotset.errors import ConfigError
from hotset.ids import distinct, first_positions
from hotset.policy import priority_kernel
from hotset.policy.base import AccessResult, register_policy
from hotset.policy.compiled_heap import CompiledHeap
from hotset.policy.keyed_heap import HeapPolicy

SCALE = float(1 << 24)
_NONE = np.empty(0, np.int64)


def once(ids: np.ndarray) -> np.ndarray:
    """``ids`` with each id at its first place only (most batches repeat none: one
    sort checks it)."""
    return ids if distinct(ids) else ids[first_positions(ids)]


def turn(positions: list[int], p: int, todo: list[int], hit: list[bool]) -> None:
    """A starting resident evicted at ``p`` turns a miss at its positions after ``p``:
    they join the misses to decide, in order (its first eviction only: its positions
    are then taken out of the batch's residents, and a second eviction finds them
    pending already)."""
    for r in positions:
        if r > p:
            insort(todo, r)
            hit[r] = False


@register_policy
class PriorityPolicy(HeapPolicy):
    name = "pq"
    needs_scores = True
    #: evict residents whose score equals the newcomer's (APP's ``x >= min_score``)
    evict_ties = False
    #: decide a batch's misses in the compiled loop (``priority_kernel``; False: Python's)
    compiled = True

    heap_class = CompiledHeap  # (its entries in an array: a batch's loop compiled)

    def __init__(self, capacity_bytes, sizes, seed: int = 0):
        super().__init__(capacity_bytes, sizes, seed)
        priority_kernel.load()
        self.board = None
        self._q = np.zeros(0, np.int64)  # the batch's levels, and whether each may replace
        self._may = np.zeros(0, bool)  # (False for a sample larger than the cache)

    def attach_scores(self, board) -> None:
        """Read priorities from ``board`` (a ScoreBoard over the same ids)."""
        if board.num_samples != self.num_samples:
            raise ConfigError(
                f"score board covers {board.num_samples} ids, the policy {self.num_samples}"
            )
        self.board = board

    def _levels(self, ids: np.ndarray) -> np.ndarray:
        """Quantised scores of ``ids`` (what the heap orders by)."""
        return (np.maximum(self.board.score[ids], 0.0) * SCALE).astype(np.int64)

    def scores_updated(self, ids: np.ndarray) -> None:
        """Re-key the residents among ``ids`` with their new scores (the 'adaptive' part)."""
        ids = np.asarray(ids, np.int64)
        self._heap.rekey(ids, self._levels(ids))

    def min_score(self) -> float | None:
        """The lowest (quantised) score among residents (``None`` when empty)."""
        top = self._heap.peek()
        return None if top is None else top[1] / SCALE

    def shrink_to(self, capacity_bytes: int) -> list[int]:
        """Set a smaller capacity, evicting the lowest-scored residents to fit; returns them."""
        self.capacity_bytes = int(capacity_bytes)
        heap = self._heap
        heap.release(self.pinned)
        out = []
        while self.used > self.capacity_bytes:
            j = heap.take()
            if j < 0:
                break  # what is left is pinned: it goes once its plans have run
            if self.pinned[j]:
                heap.hold(j)
                continue
            self.used -= self._sizes[j]
            out.append(j)
        heap.settle()
        return out

    def _may_replace(self, ids: np.ndarray) -> np.ndarray:
        """Per id, whether a miss on it may displace residents (APP: known samples only)."""
        return np.ones(ids.size, bool)

    # -- the miss path -----------------------------------------------------------------
    def _prepare(self, ids: np.ndarray) -> None:
        if self.board is None:
            raise ConfigError(
                f"policy {self.name!r} needs importance scores: use an importance "
                "sampler (e.g. 'shade') so the planner can attach its score board"
            )
        fits = np.frombuffer(self._sizes, np.int64)[ids] <= self.capacity_bytes
        self._q, self._may = self._levels(ids), self._may_replace(ids) & fits
        self._batch = ids

    def _decide(self, arr: np.ndarray) -> AccessResult:
        """Where the batch is decided at once (the cache filling, or the compiled loop),
        in arrays, without the base path's lists: the same result."""
        start = self._heap.levels[arr] >= 0
        admitted: list[int] = []
        filled = self._admit_all(start, np.flatnonzero(~start), admitted)
        if filled is not None:
            return self._result(filled, np.array(admitted, np.int64), _NONE)
        out = self._compiled() if self.compiled else None
        if out is None:
            return super()._decide(arr)
        hit, new, gone = out
        return self._result(hit, once(new), once(gone))

    def _access(
        self, ids: list[int], hits: list[bool], admitted: list[int], evicted: list[int]
    ) -> None:
        """The base miss path (``Policy._access`` with this class's steps, which stay the
        reference) on the batch's misses alone, in one loop: the ids resident when the
        batch starts are hits found at once (one evicted by an earlier miss of the batch
        turns a miss in its turn, once however often it is evicted), the heap handled in
        place (a newcomer for which the least important resident alone makes room takes
        its entry's place: one sift, not a pop and a push). The same decisions without a
        loop turn per hit nor a method call per step; ``_decide`` takes a filling cache
        (``_admit_all``) and the compiled loop first, and this loop where neither serves."""
        heap = self._heap
        start = heap.levels[self._batch] >= 0
        hit = start.tolist()
        todo = np.flatnonzero(~start).tolist()
        sizes, cap, used = self._sizes, self.capacity_bytes, self.used
        qs, may = self._q.tolist(), self._may.tolist()
        live, h, bits, mask, count = heap.live, heap.heap, heap.bits, heap.mask, heap.count
        pins = memoryview(self.pinned) if self._holds[0] else None
        ties = self.evict_ties
        later: dict[int, list[int]] | None = None  # the starting residents' positions
        # ``todo`` grows as it is walked: a starting resident evicted before its turn is
        # put in order among the positions not walked yet (``turn``), and walked there
        for p in todo:
            i = ids[p]
            if live[i] >= 0:  # admitted at an earlier position of the batch
                hit[p] = True
                continue
            s = sizes[i]
            q = qs[p]
            if used + s > cap:
                if not may[p]:
                    continue
                while h and live[(top := h[0]) & mask] != top >> bits:
                    heappop(h)  # stale entry
                if not h:
                    continue  # nothing to evict: not admitted
                v = top >> bits
                if v > q or (v == q and not ties):
                    continue  # the newcomer is the least important: not admitted
                j = top & mask
                if used - sizes[j] + s <= cap and (pins is None or not pins[j]):
                    # the top alone makes the room: the newcomer takes its entry's place
                    heapreplace(h, q << bits | i)
                    live[j] = -1
                    used -= sizes[j]
                    victims = (top,)
                else:  # ``top``: the least important resident, current, below i's level
                    victims, before = [], used
                    while True:
                        heappop(h)
                        j = top & mask
                        if pins is not None and pins[j]:  # a plan in flight reads/writes it:
                            heap.park(top)  # resident, out of the heap till it is released
                        else:
                            live[j] = -1
                            count -= 1
                            victims.append(top)
                            used -= sizes[j]
                            if used + s <= cap:
                                break
                        while h and live[(top := h[0]) & mask] != top >> bits:
                            heappop(h)  # stale entry
                        if not h or (v := top >> bits) > q or (v == q and not ties):
                            break  # the rest is worth more than i
                    if used + s > cap:  # refused: every one taken goes back
                        used = before
                        for top in victims:
                            live[top & mask] = top >> bits
                            heappush(h, top)
                        count += len(victims)
                        continue
                    heappush(h, q << bits | i)
                    count += 1
                for top in victims:
                    j = top & mask
                    evicted.append(j)
                    if later is None:
                        later = self._positions_at_start(start, ids)
                    if j in later:
                        turn(later.pop(j), p, todo, hit)
            else:
                heappush(h, q << bits | i)
                count += 1
            live[i] = q
            used += s
            admitted.append(i)
        self.used = used
        heap.count = count
        heap.compact()
        hits.extend(hit)

    def _compiled(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """The prepared batch through ``_access``'s loop compiled (``priority_kernel``):
        the same decisions and heap; its hits, and the ids it put and removed in order
        (repeats kept); None where it cannot run (numba missing, a key beyond int64)."""
        heap = self._heap
        if not isinstance(heap, CompiledHeap):  # (a template's heap, holding nothing)
            return None
        pins = self.pinned if self._holds[0] else None
        out = priority_kernel.admit(
            heap, np.frombuffer(self._sizes, np.int64), pins, self._batch, self._q, self._may,
            self.capacity_bytes, self.used, self.evict_ties,
        )  # fmt: skip
        if out is None:
            return None
        hit, new, gone, self.used = out
        heap.compact()
        return hit, new, gone

    @staticmethod
    def _positions_at_start(start: np.ndarray, ids: list[int]) -> dict[int, list[int]]:
        """The batch's residents when it starts: id -> its positions in the batch."""
        later: dict[int, list[int]] = {}
        for r in np.flatnonzero(start).tolist():
            later.setdefault(ids[r], []).append(r)
        return later

    def _admit_all(
        self, start: np.ndarray, positions: np.ndarray, admitted: list[int]
    ) -> np.ndarray | None:
        """Where every miss of the batch (at ``positions``) fits the free room (the cache
        is filling), admit them all at once, each at its first position; returns the
        batch's hits (``start``, the residents when it starts, and the misses' repeats),
        or ``None`` where they do not all fit. The base loop admits each such miss the
        same way: nothing is evicted."""
        if not positions.size:
            return start
        ids = self._batch[positions]
        sizes = np.frombuffer(self._sizes, np.int64)[ids]
        if self.used + int(sizes.max()) > self.capacity_bytes:
            return None  # (the cache is full: not even the largest fits)
        first = first_positions(ids)  # the admissions, in the batch's order
        need = int(sizes[first].sum())
        if self.used + need > self.capacity_bytes:
            return None
        hit = start.copy()
        hit[positions] = True  # a miss's repeat after its admission
        hit[positions[first]] = False
        ids = ids[first]
        self._heap.add(ids, self._q[positions[first]])
        self.used += need
        admitted.extend(ids.tolist())
        return hit

    def _victim(self, p: int, i: int) -> int:
        top = self._heap.peek()
        q = int(self._q[p])
        if top is None or not self._may[p]:
            return -1
        v = top[1]
        if v > q or (v == q and not self.evict_ties):
            return -1  # the newcomer is the least important: do not admit it
        return self._heap.take()

    def _level(self, p: int, i: int) -> int:
        return int(self._q[p])
