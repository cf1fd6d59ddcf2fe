"""Priority-queue policy by importance score (SHADE's ``sh_pq`` ablation): a miss is
admitted when the residents it would displace all score lower; the lowest-scored go.

Scores come from the sampler's :class:`~hotset.importance.ScoreBoard` (attached by the
planner); ``scores_updated`` re-keys residents as feedback arrives, in a keyed heap whose
level is the score quantised to 2^-24 and floored at 0 (ties of equal scores fall to the
lower id).
"""

from __future__ import annotations

import numpy as np

from hotset.errors import ConfigError
from hotset.policy.base import register_policy
from hotset.policy.keyed_heap import HeapPolicy

SCALE = float(1 << 24)


@register_policy
class PriorityPolicy(HeapPolicy):
    name = "pq"
    needs_scores = True
    #: evict residents whose score equals the newcomer's (APP's ``x >= min_score``)
    evict_ties = False

    def __init__(self, capacity_bytes, sizes, seed: int = 0):
        super().__init__(capacity_bytes, sizes, seed)
        self.board = None
        self._q: list[int] = []  # the batch's levels, and whether each may replace
        self._may: list[bool] = []

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
        out, held = [], []
        while self.used > self.capacity_bytes:
            j = self._heap.take()
            if j < 0:
                break  # what is left is pinned: it goes once its plans have run
            if self.pinned[j]:
                held.append(j)
                continue
            self.used -= self._sizes[j]
            out.append(j)
        self._heap.put_back(held)
        self._heap.settle()
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
        self._q, self._may = self._levels(ids).tolist(), self._may_replace(ids).tolist()

    def _victim(self, p: int, i: int) -> int:
        top = self._heap.peek()
        q = self._q[p]
        if top is None or not self._may[p]:
            return -1
        v = top[1]
        if v > q or (v == q and not self.evict_ties):
            return -1  # the newcomer is the least important: do not admit it
        return self._heap.take()

    def _level(self, p: int, i: int) -> int:
        return self._q[p]
