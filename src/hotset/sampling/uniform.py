"""Uniform sampling: a fresh permutation of all ids each epoch (the papers' baseline), or
i.i.d. draws with replacement (``replacement=True``, as ``RandomSampler``).

``shuffle="shards"`` (hotset's option, named for what it gives up) is the shard-local
shuffle of loaders that stream shards (MosaicML Streaming's ``py1b``): the shards in a
random order, then the samples shuffled only within windows of ``shuffle_block``
consecutive samples of that sequence. A batch then reads from a few shards, so range
requests cover many of its samples at once; but its samples are no longer a uniform
draw: with shards written class by class, a window holds few classes.
"""

from __future__ import annotations

import numpy as np

from hotset.errors import ConfigError
from hotset.sampling.base import Sampler, register_sampler
from hotset.sampling.blocks import block_order

SHUFFLES = (True, False, "shards")


@register_sampler
class UniformSampler(Sampler):
    name = "uniform"
    transient = ("_shard",)  # from the arguments, not learnt

    def __init__(
        self,
        num_samples: int,
        shuffle: bool | str = True,
        replacement: bool = False,
        shuffle_block: int = 2048,
        objects: np.ndarray | None = None,
        **kwargs,
    ) -> None:
        """``objects``: the shard (any int) each sample lives in, for ``"shards"``
        (``make_loader`` gives the storage's; none: each sample its own)."""
        super().__init__(num_samples, **kwargs)
        if shuffle not in SHUFFLES:
            raise ConfigError(f"shuffle must be one of {SHUFFLES}, got {shuffle!r}")
        if shuffle_block < 1:
            raise ConfigError(f"shuffle_block must be >= 1, got {shuffle_block}")
        self.shuffle = shuffle
        self.replacement = replacement
        self.shuffle_block = int(shuffle_block)
        self._shard = None
        if shuffle == "shards" and objects is not None:
            if len(objects) != num_samples:
                raise ConfigError(f"objects: {len(objects)} for {num_samples} samples")
            self._shard = np.unique(np.asarray(objects), return_inverse=True)[1].ravel()

    def global_order(self, epoch: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, epoch])
        if self.replacement:
            return rng.integers(0, self.num_samples, self.num_samples, dtype=np.int64)
        if not self.shuffle:
            return np.arange(self.num_samples, dtype=np.int64)
        if self.shuffle == "shards":
            return self._shard_local(rng)
        return rng.permutation(self.num_samples)

    def _shard_local(self, rng: np.random.Generator) -> np.ndarray:
        """Shards in a random order, then a shuffle within each window of
        ``shuffle_block`` consecutive samples (Streaming's ``py1b``)."""
        n = self.num_samples
        shard = self._shard if self._shard is not None else np.arange(n)
        return block_order(np.arange(n), shard, self.shuffle_block, rng)
