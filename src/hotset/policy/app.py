"""SHADE's Adaptive Priority-aware Prediction cache (APP, FAST'23 Algorithm 1).

PQ: the cached ids by their latest score; ghost cache: every id trained so far (line 2:
"all previously-trained samples"), with its latest score. On a miss: admit while the
cache has room (lines 9-10); when full, admit only an id in the ghost cache whose latest
score is >= the minimum cached score, evicting that minimum (lines 12-18); otherwise read
from storage without caching (lines 20, 22). Scores update in place as feedback arrives.

``ghost_epochs=g`` (ours, not Algorithm 1) bounds the ghost cache to the ids scored within
the last ``g`` epochs' worth of feedback (``g`` x the dataset's size in scored ids), so a
stale score does not displace a cached one.
"""

from __future__ import annotations

import numpy as np

from hotset.errors import ConfigError
from hotset.policy.base import register_policy
from hotset.policy.priority import PriorityPolicy


@register_policy
class APPPolicy(PriorityPolicy):
    name = "app"
    evict_ties = True  # line 16: x >= min_score

    def __init__(
        self, capacity_bytes, sizes, seed: int = 0, ghost_epochs: float | None = None
    ) -> None:
        super().__init__(capacity_bytes, sizes, seed=seed)
        if ghost_epochs is not None and not ghost_epochs > 0:
            raise ConfigError(f"ghost_epochs must be > 0 or None, got {ghost_epochs}")
        self.ghost_epochs = None if ghost_epochs is None else float(ghost_epochs)

    def attach_scores(self, board) -> None:
        super().attach_scores(board)
        if self.ghost_epochs is not None:  # the window needs when each score was given
            board.track_recent()

    def _may_replace(self, ids: np.ndarray) -> np.ndarray:  # line 12: ghost_cache.exist(s)
        if self.ghost_epochs is None:
            return self.board.updated[ids] >= 0
        return self.board.recent(ids, self.ghost_epochs * self.num_samples)
