"""SHADE's Adaptive Priority-aware Prediction cache (APP, FAST'23 Algorithm 1).

PQ: the cached ids by their latest score; ghost cache: every id that has received a
score (the score board's ``seen``). On a miss: admit while the cache has room (lines
9-10); when full, admit only an id in the ghost cache whose latest score is >= the
minimum cached score, evicting that minimum (lines 12-18); otherwise read from storage
without caching (lines 20, 22). Scores update in place as feedback arrives.
"""

from __future__ import annotations

import numpy as np

from hotset.policy.base import register_policy
from hotset.policy.priority import PriorityPolicy


@register_policy
class APPPolicy(PriorityPolicy):
    name = "app"
    evict_ties = True  # line 16: x >= min_score

    def _may_replace(self, ids: np.ndarray) -> np.ndarray:
        return self.board.updated[ids] >= 0  # line 12: ghost_cache.exist(s)
