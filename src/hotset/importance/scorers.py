"""Per-sample importance scores of a minibatch, by name (SHADE's sampler asks for one:
``sampler_options={"importance": NAME, "importance_options": {...}}``).

A scorer is ``fn(ids, losses, board, **options) -> scores``: ``ids`` the samples a batch
served, ``losses`` their per-sample losses, ``board`` the :class:`ScoreBoard` as it was
before this batch (``board.score[ids]``, ``board.loss[ids]``, ``board.seen[ids]``),
so that a score of a sample's history (a moving average of its loss) reads it there.
A new score is one file of this package that registers its function: every module here
is imported (docs/extending.md).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from hotset.errors import ConfigError

Scorer = Callable[..., np.ndarray]
#: the scorers by name
SCORERS: dict[str, Scorer] = {}


def register_scorer(name: str) -> Callable[[Scorer], Scorer]:
    """Register a scorer under ``name`` (a decorator); a name taken is refused."""

    def register(fn: Scorer) -> Scorer:
        if name in SCORERS:
            raise ConfigError(f"a scorer named {name!r} is registered already")
        SCORERS[name] = fn
        return fn

    return register
