"""The samples a cache-aware sampler (SHADE's repetition) counts as cached when a disk
tier is below the RAM tier (hotset's own: no paper has two tiers). Two tiers, one
policy: the RAM tier holds the policy's choice (APP's most important), the disk tier the
next by the same measure, so the cache the sampler repeats is the RAM tier's residents
and the samples the disk tier holds among the most important that the two tiers'
budgets fit together (``most_important``)."""

from __future__ import annotations

import numpy as np


def most_important(scores: np.ndarray, sizes: np.ndarray, budget: int) -> np.ndarray:
    """The ids of the highest ``scores`` (ties: the lower id first) whose ``sizes`` fit
    ``budget`` bytes together, highest first: the longest such prefix of the ids by
    score."""
    scores, sizes = np.asarray(scores, np.float64), np.asarray(sizes, np.int64)
    n = scores.size
    k = n  # the candidates: enough of the highest to fill the budget (all, if it needs)
    if n and budget < int(sizes.sum()):
        smallest = int(max(1, sizes.min()))
        k = min(n, budget // smallest + 1)
    top = np.argpartition(-scores, k - 1)[:k] if 0 < k < n else np.arange(n)
    top = top[np.lexsort((top, -scores[top]))]  # by score, then id
    fit = int(np.searchsorted(np.cumsum(sizes[top]), budget, side="right"))
    return top[:fit]
