"""SHADE's importance scores (FAST'23, section 4.2.1).

* Loss decomposition, Eq. 3-5: per-sample cross entropy from the logits the training
  step already computed (:func:`hotset.feedback.per_sample_loss`); the minibatch loss is
  their mean.
* Rank-based importance, Eq. 6: ``rank_i = log(#{k != i : l_i > l_k} + b0)`` within
  each minibatch, so scores of different minibatches and epochs share one range.
* Coarse-grained importance (the paper's ``sh_*`` ablations): every sample of a
  minibatch gets the minibatch's mean loss.
"""

from __future__ import annotations

import numpy as np


def rank_importance(losses: np.ndarray, b0: float = 10.0) -> np.ndarray:
    """Eq. 6 for one minibatch: log of (how many others have a strictly lower loss + b0)."""
    losses = np.asarray(losses, dtype=np.float64)
    lower = np.searchsorted(np.sort(losses), losses, side="left")  # #{k : l_k < l_i}
    return np.log(lower + b0)


def coarse_importance(losses: np.ndarray) -> np.ndarray:
    """Default (coarse-grained) importance: the minibatch mean loss, for every sample."""
    losses = np.asarray(losses, dtype=np.float64)
    return np.full(losses.shape, losses.mean() if losses.size else 0.0)


SCORERS = {"rank": rank_importance, "coarse": coarse_importance}
