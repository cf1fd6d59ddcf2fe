"""Uniform sampling: a fresh permutation of all ids each epoch (the papers' baseline), or
i.i.d. draws with replacement (``replacement=True``, as ``RandomSampler``)."""

from __future__ import annotations

import numpy as np

from hotset.sampling.base import Sampler, register_sampler


@register_sampler
class UniformSampler(Sampler):
    name = "uniform"

    def __init__(
        self, num_samples: int, shuffle: bool = True, replacement: bool = False, **kwargs
    ) -> None:
        super().__init__(num_samples, **kwargs)
        self.shuffle = shuffle
        self.replacement = replacement

    def global_order(self, epoch: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, epoch])
        if self.replacement:
            return rng.integers(0, self.num_samples, self.num_samples, dtype=np.int64)
        if not self.shuffle:
            return np.arange(self.num_samples, dtype=np.int64)
        return rng.permutation(self.num_samples)
