"""SHADE's Adaptive Priority-aware Prediction cache (APP, FAST'23 Algorithm 1).

PQ: the cached ids by their latest score; ghost cache: the ids scored within the last
``ghost_epochs`` epochs' worth of feedback (``ghost_epochs`` x the dataset's size in
scored ids), so a score is trusted only while it is fresh. On a miss: admit while the
cache has room (lines 9-10); when full, admit only an id in the ghost cache whose latest
score is >= the minimum cached score, evicting that minimum (lines 12-18); otherwise read
from storage without caching (lines 20, 22). Scores update in place as feedback arrives.
In epoch 0 every scored id is in the ghost cache; afterwards importance sampling with
replacement leaves about a third of the ids unscored for an epoch, and their stale scores
do not displace cached ones (without the bound, APP admits exactly as PQ does).
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

    def __init__(self, capacity_bytes, sizes, seed: int = 0, ghost_epochs: float = 1.0):
        super().__init__(capacity_bytes, sizes, seed=seed)
        if ghost_epochs <= 0:
            raise ConfigError(f"ghost_epochs must be > 0, got {ghost_epochs}")
        self.ghost_epochs = float(ghost_epochs)

    def _may_replace(self, ids: np.ndarray) -> np.ndarray:  # line 12: ghost_cache.exist(s)
        return self.board.recent(ids, self.ghost_epochs * self.num_samples)
