"""The score board: per-sample importance state as numpy arrays over sample ids.

It lives in the training process (where the sampler and planner run), so it is one
board whatever ``num_workers`` is; samplers and policies read it, and the feedback path
is the only writer.
"""

from __future__ import annotations

import numpy as np

from hotset.errors import ConfigError
from hotset.ids import ids_within


class ScoreBoard:
    """``score[i]``: latest importance of sample ``i`` (``initial`` until it gets one);
    ``loss[i]``: its latest per-sample loss; ``updated[i]``: 0 once it has a score, -1
    before (1 B per id; a state saved when it held the feedback step loads alike).
    ``scores=False``: the score is the loss itself (iCACHE's IIS), one array instead of
    two (8 B per id); a never-scored sample's loss is then ``initial``, not NaN, so that a
    policy keyed by scores reads a number. When each score was given (8 B per id) is kept
    only for a reader of ``recent`` that asked for it (``track_recent``)."""

    def __init__(self, num_samples: int, initial: float = 1.0, scores: bool = True) -> None:
        if num_samples <= 0:
            raise ConfigError(f"num_samples must be > 0, got {num_samples}")
        self.num_samples = int(num_samples)
        if scores:
            self.score = np.full(self.num_samples, float(initial))
        self.loss = np.full(self.num_samples, np.nan if scores else float(initial))
        self.updated = np.full(self.num_samples, -1, np.int8)
        self.scores_given = 0  # ids scored over all steps (with repeats)
        self.given_at: np.ndarray | None = None  # scores_given at i's latest (track_recent)

    @property
    def own_scores(self) -> bool:
        """Whether the board keeps scores apart from its losses."""
        return "score" in self.__dict__

    def __getattr__(self, name: str):
        """``score`` of a board without scores of its own: the losses (looked up only
        where ``score`` is not an attribute)."""
        if name == "score" and "loss" in self.__dict__:
            return self.loss
        raise AttributeError(name)

    def update(self, ids: np.ndarray, scores: np.ndarray, losses: np.ndarray) -> None:
        """Record one batch's scores (later entries win for a repeated id)."""
        ids = np.asarray(ids, np.int64)
        if not ids_within(ids, self.num_samples):
            raise ConfigError(f"feedback ids out of range [0, {self.num_samples})")
        if self.own_scores:
            self.score[ids] = scores
        self.loss[ids] = losses
        self.updated[ids] = 0
        if self.given_at is not None:
            self.given_at[ids] = self.scores_given
        self.scores_given += int(ids.size)

    def track_recent(self) -> None:
        """Keep when each score is given, for ``recent`` (scores given before count as
        given at the first step)."""
        if self.given_at is None:
            self.given_at = np.zeros(self.num_samples, np.int64)

    def recent(self, ids: np.ndarray, window: float) -> np.ndarray:
        """Whether each of ``ids`` has a score given among the last ``window`` scores
        (``track_recent`` called before they were given)."""
        if self.given_at is None:
            raise ConfigError("the score board keeps no score's time: call track_recent()")
        return (self.updated[ids] >= 0) & (self.scores_given - self.given_at[ids] < window)

    def fill_unseen(self, value: float) -> None:
        """Give every never-scored sample the score ``value`` (a sampler's prior)."""
        if not self.own_scores:
            raise ConfigError("this score board's scores are its losses: no prior to fill")
        self.score[self.updated < 0] = value

    @property
    def seen(self) -> np.ndarray:
        """Mask of the samples that have a score (SHADE's ghost cache membership)."""
        return self.updated >= 0
