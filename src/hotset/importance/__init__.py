"""Importance: per-sample scores fed back from the training loop."""

from hotset.importance.scoreboard import ScoreBoard
from hotset.importance.shade_rank import SCORERS, coarse_importance, rank_importance

__all__ = ["SCORERS", "ScoreBoard", "coarse_importance", "rank_importance"]
