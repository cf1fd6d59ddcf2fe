"""Importance: per-sample scores fed back from the training loop.

Every module of this package is imported here, so a new score is one new file that
registers its function with ``@register_scorer`` (docs/extending.md).
"""

from hotset.importance.scoreboard import ScoreBoard
from hotset.importance.scorers import SCORERS, register_scorer
from hotset.importance.shade_rank import coarse_importance, rank_importance
from hotset.registry import import_submodules

import_submodules(__name__, __path__)

__all__ = ["SCORERS", "ScoreBoard", "coarse_importance", "rank_importance", "register_scorer"]
