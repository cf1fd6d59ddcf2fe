"""How much a job gains from the cache, measured on the job itself.

Quiver (FAST'20, "benefit-aware caching") and iCACHE (HPCA'23 III-D, "cache benefit
estimation") both time the job's own minibatches with and without the cache: the first
``batches`` minibatches of an epoch are read all from storage (the service plans no hit
and no admission), the next ``batches`` as usual, and

* ``ratio = T_cacheless / T_cache`` is iCACHE's ``Ratio_benefit`` (a job is cache-eligible
  above 1.5);
* ``saving`` is the fraction of a minibatch's time a *fully* cached dataset would save,
  ``(1 - T_cache / T_cacheless) / hit`` with ``hit`` the planned hit fraction of the cached
  minibatches (saving grows about linearly with the hits). Quiver's allocation divides the
  budget by it; dividing by the hit ratio keeps a dataset that has little cache now from
  looking as if it could not use more.

A minibatch's time is the interval between two batches reaching the training loop (what
the job sees, prefetching included); the first ``skip`` of each phase are left out (the
pipeline still holds batches of the other phase) and the median is taken.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from hotset.errors import ConfigError

#: below this planned hit fraction the cached phase says too little about the cache
MIN_HIT = 0.05


@dataclass(frozen=True)
class Benefit:
    t_uncached: float  # seconds per minibatch, every sample from storage
    t_cached: float  # seconds per minibatch, with the cache as it is
    hit: float  # planned hit fraction of the cached minibatches

    def __post_init__(self) -> None:
        if not (self.t_uncached > 0 and self.t_cached > 0 and 0.0 <= self.hit <= 1.0):
            raise ConfigError(f"a benefit report needs times > 0 and a hit in [0, 1]: {self}")

    @property
    def ratio(self) -> float:
        """iCACHE's ``Ratio_benefit = T_cacheless / T_cache``."""
        return self.t_uncached / self.t_cached

    def as_dict(self) -> dict:
        """The measurement with its ratio and saving (for stats and reports)."""
        return {**vars(self), "ratio": self.ratio, "saving": self.saving}

    @property
    def conclusive(self) -> bool:
        return self.hit >= MIN_HIT

    @property
    def saving(self) -> float:
        """Fraction of a minibatch's time saved when all of it hits, in [0, 1]."""
        gain = 1.0 - self.t_cached / self.t_uncached
        return float(np.clip(gain / max(self.hit, MIN_HIT), 0.0, 1.0))


class BenefitProbe:
    """The client's side: which phase a batch of the epoch is in, and its timing."""

    def __init__(self, batches: int, every: int = 1, skip: int = 2) -> None:
        """``every``: epochs between measurements once one was conclusive (until then,
        each epoch measures)."""
        if batches < 0 or batches == 1:
            raise ConfigError(f"probe batches must be 0 (off) or >= 2, got {batches}")
        if every < 1:
            raise ConfigError(f"probe every must be >= 1 epoch, got {every}")
        self.batches, self.every = int(batches), int(every)
        self._epoch, self._last = 0, None  # the epoch of the last conclusive measurement
        self.skip = min(int(skip), max(0, self.batches - 2))  # leaves >= 1 step a phase
        self.start_epoch()

    def start_epoch(self, epoch: int = 0) -> bool:
        """A new epoch; returns whether it measures."""
        self._times: list[float] = []  # when each batch reached the training loop
        self._hits: list[float] = []
        self._epoch = epoch
        self._reported = not (
            self.batches and (self._last is None or epoch - self._last >= self.every)
        )
        return not self._reported

    def uncached(self, index: int) -> bool:
        """Whether the epoch's batch ``index`` is read without the cache."""
        return index < self.batches

    def planned(self, hit_fraction: float) -> None:
        """A plan was received (in the order the loader will consume them)."""
        self._hits.append(hit_fraction)

    def consumed(self) -> None:
        if len(self._times) < 2 * self.batches:
            self._times.append(time.perf_counter())

    def report(self) -> Benefit | None:
        """The measurement, once both phases were consumed (then once per epoch)."""
        b = self.batches
        if not b or self._reported or len(self._times) < 2 * b:
            return None
        self._reported = True
        took = np.diff(self._times)  # took[k - 1]: from batch k - 1 to batch k
        benefit = Benefit(
            float(np.median(took[self.skip : b - 1])),
            float(np.median(took[b - 1 + self.skip :])),
            float(np.mean(self._hits[b : 2 * b])),
        )
        if benefit.conclusive:
            self._last = self._epoch
        return benefit
