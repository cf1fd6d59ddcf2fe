"""Priority-queue policy by importance score (SHADE's ``sh_pq`` ablation): a miss is
admitted when the residents it would displace all score lower; the lowest-scored go.

Scores come from the sampler's :class:`~hotset.importance.ScoreBoard` (attached by the
planner); ``scores_updated`` re-keys residents as feedback arrives, through a lazy
min-heap (an entry is live while it carries its id's current key). A key packs the
score, quantised to 2^-24 and floored at 0, above the id in one int, so the heap
compares plain ints and ties of equal scores fall to the lower id.
"""

from __future__ import annotations

import heapq

import numpy as np

from hotset.errors import ConfigError
from hotset.policy.base import Policy, register_policy

SCALE = float(1 << 24)


@register_policy
class PriorityPolicy(Policy):
    name = "pq"
    needs_scores = True
    #: evict residents whose score equals the newcomer's (APP's ``x >= min_score``)
    evict_ties = False

    def __init__(self, capacity_bytes, sizes, seed: int = 0):
        super().__init__(capacity_bytes, sizes, seed)
        self._key: dict[int, int] = {}  # resident id -> its live heap key
        self._heap: list[int] = []
        self._bits = max(1, (self.num_samples - 1).bit_length())
        self.board = None

    @property
    def _resident(self):
        return self._key

    def attach_scores(self, board) -> None:
        """Read priorities from ``board`` (a ScoreBoard over the same ids)."""
        if board.num_samples != self.num_samples:
            raise ConfigError(
                f"score board covers {board.num_samples} ids, the policy {self.num_samples}"
            )
        self.board = board

    def _levels(self, ids: np.ndarray) -> list[int]:
        """Quantised scores of ``ids`` (what the heap orders by)."""
        return (np.maximum(self.board.score[ids], 0.0) * SCALE).astype(np.int64).tolist()

    def scores_updated(self, ids: np.ndarray) -> None:
        """Re-key the residents among ``ids`` with their new scores (the 'adaptive' part)."""
        ids = np.asarray(ids, np.int64)
        key, heap, bits = self._key, self._heap, self._bits
        for i, q in zip(ids.tolist(), self._levels(ids), strict=True):
            if i in key:
                k = q << bits | i
                if k != key[i]:
                    key[i] = k
                    heapq.heappush(heap, k)
        if len(heap) > 2 * len(key) + 1024:
            self._heap = sorted(key.values())  # a sorted list is a heap

    def min_score(self) -> float | None:
        """The lowest (quantised) score among residents (``None`` when empty)."""
        heap, key, mask = self._heap, self._key, (1 << self._bits) - 1
        while heap and key.get(heap[0] & mask) != heap[0]:
            heapq.heappop(heap)  # stale entry
        return (heap[0] >> self._bits) / SCALE if heap else None

    def shrink_to(self, capacity_bytes: int) -> list[int]:
        """Set a smaller capacity, evicting the lowest-scored residents to fit; returns them."""
        self.capacity_bytes = int(capacity_bytes)
        heap, key, mask, out = self._heap, self._key, (1 << self._bits) - 1, []
        while self.used > self.capacity_bytes:
            k = heapq.heappop(heap)
            j = k & mask
            if key.get(j) == k:
                del key[j]
                self.used -= self._sizes[j]
                out.append(j)
        return out

    def _may_replace(self, ids: np.ndarray) -> np.ndarray:
        """Per id, whether a miss on it may displace residents (APP: known samples only)."""
        return np.ones(ids.size, bool)

    def _access(self, ids, hits, admitted, evicted):
        if self.board is None:
            raise ConfigError(
                f"policy {self.name!r} needs importance scores: use an importance "
                "sampler (e.g. 'shade') so the planner can attach its score board"
            )
        key, heap, sizes, cap = self._key, self._heap, self._sizes, self.capacity_bytes
        used, ties, bits = self.used, self.evict_ties, self._bits
        mask = (1 << bits) - 1
        push, pop = heapq.heappush, heapq.heappop
        arr = np.asarray(ids, dtype=np.int64)  # per batch, not per access:
        levels, may_replace = self._levels(arr), self._may_replace(arr).tolist()
        for i, q, may in zip(ids, levels, may_replace, strict=True):
            if i in key:
                hits.append(True)
                continue
            hits.append(False)
            s = sizes[i]
            if s > cap:
                continue
            if used + s > cap:
                if not may:
                    continue
                victims = []
                while used + s > cap:
                    k = heap[0]
                    j = k & mask
                    if key.get(j) != k:
                        pop(heap)  # stale entry
                        continue
                    v = k >> bits
                    if v > q or (v == q and not ties):
                        break  # the newcomer is the least important: do not admit it
                    pop(heap)
                    del key[j]  # at once: a re-keyed id may have a second identical entry
                    victims.append(k)
                    used -= sizes[j]
                if used + s > cap:
                    for k in victims:  # could not make room: put them back
                        key[k & mask] = k
                        push(heap, k)
                        used += sizes[k & mask]
                    continue
                evicted.extend(k & mask for k in victims)
            k = q << bits | i
            key[i] = k
            push(heap, k)
            used += s
            admitted.append(i)
        self.used = used
