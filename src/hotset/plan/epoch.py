"""An epoch's order at its start: drawn by the sampler once it is told what the cache
holds, read by blocks of shards where asked (``order="blocks"``), padded or cut to whole
ranks' batches, and handed to a policy that needs the future."""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

from hotset.errors import ConfigError
from hotset.importance.tiers import most_important
from hotset.policy.base import Policy
from hotset.sampling.base import Sampler
from hotset.sampling.blocks import block_order, check_order, epoch_rng
from hotset.sampling.draw import ShuffledAsRead


class EpochOrder:
    """The orders of ``sampler``'s epochs for global batches of ``step`` ids over
    ``world`` ranks. ``objects``: each id's shard, for ``order="blocks"`` (blocks of
    ``block_size`` ids); ``disk``: the storage whose disk tier a cache-aware sampler
    counts as cache too (None: the RAM tier alone); ``whole``: the order is needed whole
    at the epoch's start (read-ahead plans over it), not shuffled as it is read."""

    def __init__(
        self, sampler: Sampler, policy: Policy, lock: threading.RLock, step: int, world: int,
        drop_last: bool, feed_future: bool, order: str, block_size: int, storage,
        disk, whole: bool,
    ) -> None:  # fmt: skip
        check_order(order, block_size)
        self.sampler, self.policy, self.lock = sampler, policy, lock
        self.step, self.world, self.drop_last = step, world, drop_last
        self.needs_future = policy.needs_future and feed_future
        self.block_size, self.disk = int(block_size), disk
        self.objects = None
        self._mask: np.ndarray | None = None
        if order == "blocks":
            if storage is None or storage.extents is None:
                raise ConfigError(
                    "order='blocks' reads an epoch shard by shard: it needs samples that are "
                    "ranges of larger objects (tar shards), and this storage keeps a file "
                    "per sample"
                )
            self.objects = np.asarray(storage.extents[0])
        self.whole = whole or self.needs_future or self.objects is not None

    def cached_for_sampler(self) -> np.ndarray:
        """What a cache-aware sampler is told the cache holds, as a mask of every id: the
        policy's residents, and with a disk tier the samples it holds among the most
        important that both tiers' budgets fit (``importance/tiers.py``). The mask is
        this object's, written again at each epoch's start."""
        if self._mask is None:  # kept: a new array of 100M ids is its page faults
            self._mask = np.empty(self.sampler.num_samples, bool)
        cached = self.policy.cached_mask(self._mask)
        board = self.sampler.board
        if self.disk is None or board is None or self.sampler.cache_tiers != "both":
            return cached
        budget = self.policy.capacity_bytes + self.disk.disk_capacity
        top = most_important(board.score, self.disk.sizes, budget)
        cached[top[self.disk.on_disk(top)]] = True
        return cached

    def start(self, epoch: int, feeder) -> tuple[np.ndarray, Callable[[int], object] | None, int]:
        """The epoch's order, with the cache told what the sampler knows at its start;
        where the sampler shuffles the order as it is read (``order_as_read``), what
        makes it final up to a position (``None``: final); and the ids that pad it to
        whole ranks (by wrapping, as DistributedSampler)."""
        sampler = self.sampler
        if sampler.cache_aware:
            sampler.set_cached_mask(self.cached_for_sampler())
        ready = None
        if sampler.num_replicas > 1:
            order = self.arranged(sampler.epoch_order(epoch), epoch)
        else:
            order = sampler.order_as_read(epoch)
            if isinstance(order, ShuffledAsRead):
                if self.whole or (not self.drop_last and order.size % self.world):
                    order = order.whole()  # each reads the whole epoch now
                else:
                    order, ready = order.ids, order.ready
            order = self.arranged(order, epoch)
        hints = sampler.cache_hints(epoch)
        if hints:
            with self.lock:
                self.policy.apply_hints(hints)
        if feeder is not None:
            feeder.epoch_started()
        if self.drop_last:
            order = order[: (order.size // self.step) * self.step]  # a view: still shuffled
        pad = 0 if self.drop_last else -order.size % self.world
        if pad:
            order = np.concatenate([order, np.resize(order, pad)])
        if self.needs_future:
            self.set_future(order, epoch)
        return order, ready, pad

    def set_future(self, rest: np.ndarray, epoch: int) -> None:
        """The future as far as it is planned: ``rest`` of this epoch, then the next."""
        ahead = self.arranged(self.sampler.epoch_order(epoch + 1), epoch + 1)
        self.policy.set_future(np.concatenate([rest, ahead]))

    def arranged(self, order: np.ndarray, epoch: int) -> np.ndarray:
        """``order`` as the sampler drew it, or read by blocks of shards."""
        if self.objects is None:
            return order
        rng = epoch_rng(self.sampler.seed, epoch)
        return block_order(order, self.objects, self.block_size, rng)
