"""A coverage floor for the importance samplers (ours: no paper has one).

SHADE, iCACHE and SpiderCache draw by importance, and none of the three guarantees that
every sample is trained: SHADE with ``r * c >= 1`` can serve its cached samples only,
epoch after epoch, and IIS never keeps the sample of percentile 0. With
``coverage_epochs=K`` every sample is drawn at least once every ``K`` epochs: a sample not
trained (fed back) in the last ``K - 1`` epochs is *due*, and a due sample the draw left
out takes the place of a repeated id (or, when there are too few, of another id that is
not due) in the epoch's list. ``None`` turns the floor off (the papers' behaviour).

A cache that substitutes (iCACHE's L-cache, SpiderCache's Homophily Cache) is told the
due ids with the epoch's hints (``{"due": ids}``) and serves each of them as itself.
"""

from __future__ import annotations

import numpy as np

from hotset.errors import ConfigError
from hotset.ids import index_dtype

#: off by default, as in the papers (``system="shade"`` is SHADE); the ``+`` systems
#: (``shade+``, ``icache+``, ``spider+``) turn it on with ``FLOOR_EPOCHS``
DEFAULT_COVERAGE_EPOCHS: int | None = None
#: the floor of the ``+`` systems: every sample at least once in 4 epochs, so that SHADE's
#: r*c >= 1 freeze ends within a short run (docs/systems.md has the sweep)
FLOOR_EPOCHS = 4


class Coverage:
    """The epoch each sample was last trained in, and the floor's place in each draw."""

    def __init__(self, num_samples: int, epochs: int | None = DEFAULT_COVERAGE_EPOCHS) -> None:
        if epochs is not None and (isinstance(epochs, bool) or int(epochs) != epochs or epochs < 1):
            raise ConfigError(f"coverage_epochs must be an integer >= 1 or None, got {epochs!r}")
        self.epochs = None if epochs is None else int(epochs)
        self.last = np.full(num_samples, -1, np.int32)  # -1: never trained
        self.added = 0  # due ids the floor put into draws

    def trained(self, ids: np.ndarray, epoch: int) -> None:
        """``ids`` were trained (fed back) in ``epoch``."""
        self.last[ids] = np.maximum(self.last[ids], epoch)

    def due(self, epoch: int) -> np.ndarray:
        """The ids ``epoch`` must train for the floor to hold."""
        if self.epochs is None:
            return np.zeros(0, np.int64)
        return np.flatnonzero(self.last <= epoch - self.epochs)

    def ensure(self, order: np.ndarray, epoch: int, rng: np.random.Generator) -> np.ndarray:
        """``order`` with every due id in it, at the places of repeated ids first, then of
        ids that are not due (the list keeps its length; the places a uniform choice)."""
        due = self.due(epoch)
        if not due.size:
            return order
        # one place of each drawn id is its own (whichever the scatter keeps); the others
        # are repeats, taken first (a scatter, not the sort np.unique would make)
        dtype = index_dtype(max(order.size, self.last.size) + 1)
        place = np.arange(order.size, dtype=dtype)
        own = np.full(self.last.size, -1, dtype)
        own[order] = place
        missing = due[own[due] < 0]
        if not missing.size:
            return order
        first = own[order] == place
        places = uniform_subset(rng, np.flatnonzero(~first), missing.size)
        if places.size < missing.size:  # too few repeats: ids that are not due make room
            spare = np.ones(self.last.size, bool)
            spare[due] = False
            others = np.flatnonzero(first & spare[order])
            places = np.concatenate(
                [places, uniform_subset(rng, others, missing.size - places.size)]
            )
        order = order.copy()
        order[places] = rng.permutation(missing)
        self.added += int(missing.size)
        return order

    def counters(self, epoch: int) -> dict:
        trained = self.last >= 0
        return {
            "trained_distinct": int(trained.sum()),
            "oldest_untrained_epochs": int(epoch - self.last.min()) if self.last.size else 0,
            "coverage_added": self.added,
        }


def uniform_subset(rng: np.random.Generator, pool: np.ndarray, m: int) -> np.ndarray:
    """``min(m, len(pool))`` elements of ``pool``, every subset of that size equally likely
    (``rng.choice(pool, m, replace=False)``'s, as a set), without its permutation of the
    pool: each element is taken with probability ``m / len(pool)``, then the few taken
    too many or too few are dropped or added at random (2.6M of 5.2M: 0.13 to 0.04 s)."""
    if m >= pool.size:
        return pool
    taken = rng.random(pool.size) < m / pool.size
    chosen = np.flatnonzero(taken)
    if chosen.size > m:
        chosen = np.delete(chosen, rng.choice(chosen.size, chosen.size - m, replace=False))
    elif chosen.size < m:
        rest = np.flatnonzero(~taken)
        chosen = np.concatenate(
            [chosen, rest[rng.choice(rest.size, m - chosen.size, replace=False)]]
        )
    return pool[chosen]
