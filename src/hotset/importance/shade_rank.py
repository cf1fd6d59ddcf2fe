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

from hotset.errors import ConfigError
from hotset.importance.scorers import register_scorer


def rank_importance(losses: np.ndarray, b0: float = 10.0) -> np.ndarray:
    """Eq. 6 for one minibatch: log of (how many others have a strictly lower loss + b0)."""
    losses = np.asarray(losses, dtype=np.float64)
    lower = np.searchsorted(np.sort(losses), losses, side="left")  # #{k : l_k < l_i}
    return np.log(lower + b0)


def coarse_importance(losses: np.ndarray) -> np.ndarray:
    """Default (coarse-grained) importance: the minibatch mean loss, for every sample."""
    losses = np.asarray(losses, dtype=np.float64)
    return np.full(losses.shape, losses.mean() if losses.size else 0.0)


@register_scorer("rank")
def rank_scores(ids: np.ndarray, losses: np.ndarray, board, b0: float = 10.0) -> np.ndarray:
    """SHADE's fine-grained importance (Eq. 6)."""
    if b0 <= 1.0:
        raise ConfigError(f"b0 must be > 1 so that log(rank + b0) > 0, got {b0}")
    return rank_importance(losses, b0)


@register_scorer("coarse")
def coarse_scores(ids: np.ndarray, losses: np.ndarray, board) -> np.ndarray:
    """The minibatch mean loss for each sample (the ``sh_*`` ablations)."""
    return coarse_importance(losses)
