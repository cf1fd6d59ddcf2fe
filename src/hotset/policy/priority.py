"""Priority-queue policy by importance score (SHADE's ``sh_pq`` ablation): a miss is
admitted when the residents it would displace all score lower; the lowest-scored go.

Scores come from the sampler's :class:`~hotset.importance.ScoreBoard` (attached by the
planner); ``scores_updated`` re-keys residents as feedback arrives, through a lazy
min-heap (an entry is live while it carries its id's current priority).
"""

from __future__ import annotations

import heapq

import numpy as np

from hotset.errors import ConfigError
from hotset.policy.base import Policy, register_policy


@register_policy
class PriorityPolicy(Policy):
    name = "pq"
    needs_scores = True
    #: evict residents whose score equals the newcomer's (APP's ``x >= min_score``)
    evict_ties = False

    def __init__(self, capacity_bytes, sizes, seed: int = 0):
        super().__init__(capacity_bytes, sizes, seed)
        self._prio: dict[int, float] = {}  # resident id -> its priority in the heap
        self._heap: list[tuple[float, int]] = []
        self.board = None

    @property
    def _resident(self):
        return self._prio

    def attach_scores(self, board) -> None:
        """Read priorities from ``board`` (a ScoreBoard over the same ids)."""
        if board.num_samples != self.num_samples:
            raise ConfigError(
                f"score board covers {board.num_samples} ids, the policy {self.num_samples}"
            )
        self.board = board

    def scores_updated(self, ids: np.ndarray) -> None:
        """Re-key the residents among ``ids`` with their new scores (the 'adaptive' part)."""
        prio, heap, score = self._prio, self._heap, self.board.score
        for i in np.asarray(ids, np.int64).tolist():
            if i in prio:
                v = float(score[i])
                if v != prio[i]:
                    prio[i] = v
                    heapq.heappush(heap, (v, i))
        if len(heap) > 4 * len(prio) + 1024:
            self._heap = [(v, j) for j, v in prio.items()]
            heapq.heapify(self._heap)

    def min_score(self) -> float | None:
        """The lowest priority among residents (``None`` when empty)."""
        heap, prio = self._heap, self._prio
        while heap and prio.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)  # stale entry
        return heap[0][0] if heap else None

    def _may_replace(self, i: int) -> bool:
        """Whether a miss on ``i`` may displace residents (APP: only known samples)."""
        return True

    def _access(self, ids, hits, admitted, evicted):
        if self.board is None:
            raise ConfigError(
                f"policy {self.name!r} needs importance scores: use an importance "
                "sampler (e.g. 'shade') so the planner can attach its score board"
            )
        prio, heap, sizes, cap = self._prio, self._heap, self._sizes, self.capacity_bytes
        score, used, ties = self.board.score, self.used, self.evict_ties
        push, pop = heapq.heappush, heapq.heappop
        for i in ids:
            if i in prio:
                hits.append(True)
                continue
            hits.append(False)
            s = sizes[i]
            if s > cap:
                continue
            x = float(score[i])
            if used + s > cap:
                if not self._may_replace(i):
                    continue
                victims = []
                while used + s > cap:
                    v, j = heap[0]
                    if prio.get(j) != v:
                        pop(heap)  # stale entry
                        continue
                    if v > x or (v == x and not ties):
                        break  # the newcomer is the least important: do not admit it
                    pop(heap)
                    victims.append((v, j))
                    used -= sizes[j]
                if used + s > cap:
                    for v, j in victims:  # could not make room: put them back
                        push(heap, (v, j))
                        used += sizes[j]
                    continue
                for _, j in victims:
                    del prio[j]
                    evicted.append(j)
            prio[i] = x
            push(heap, (x, i))
            used += s
            admitted.append(i)
        self.used = used
