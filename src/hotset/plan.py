"""BatchPlan and the Planner that joins a sampler and a policy (the control plane).

The planner is the only component that decides admissions and evictions, so it knows
exactly what the store should hold. It runs where the ``batch_sampler`` of a DataLoader
runs (the training process); each plan travels to a worker as the "index" PyTorch hands
to ``Dataset.__getitems__``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from hotset.errors import ConfigError
from hotset.policy.base import Policy
from hotset.sampling.base import Sampler


@dataclass(frozen=True)
class BatchPlan:
    """One batch: the ids to serve in order, which of them to take from the store
    (``hit``), and what the worker must put into / delete from the store afterwards.

    With a substituting policy ``ids`` are the samples served, ``requested`` what the
    sampler drew and ``sub`` marks the positions served by a substitute (a cached sample
    in place of a missed one). ``fetch`` lists ids to read and put that nobody requested.

    From the multi-job service: ``evict_keys`` are entries to delete as the store files
    them (sealed: they may belong to another job's dataset, whose digests it never
    sees), and ``wait_s`` how long a worker waits for a planned hit that another job is
    still fetching (co-operative misses) before reading storage.
    """

    epoch: int
    index: int
    ids: np.ndarray  # int64, the order the batch is served in
    hit: np.ndarray  # bool per id: planned store hit
    admit: np.ndarray  # int64 ids (all among the misses) to put after reading
    evict: np.ndarray  # int64 ids to delete
    sub: np.ndarray | None = None  # bool per id: a substitute for the requested id
    requested: np.ndarray | None = None
    fetch: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    evict_keys: tuple[str, ...] = ()
    wait_s: float = 0.0

    def __len__(self) -> int:
        return int(self.ids.size)

    @classmethod
    def uncached(cls, ids) -> BatchPlan:
        """A plan that reads ``ids`` from storage and leaves the store alone."""
        ids = np.asarray(ids, np.int64)
        empty = np.empty(0, np.int64)
        return cls(-1, -1, ids, np.zeros(ids.size, bool), empty, empty)


class Feeder(Protocol):
    """Fills part of the cache off the batch path (iCACHE's L-cache packages)."""

    def poll(self) -> None:
        """Called after each planned batch (planner lock held): start work if needed."""

    def epoch_started(self) -> None:
        """The sampler's hints for a new epoch were applied (e.g. a new H-list)."""


class Planner:
    """Iterable of :class:`BatchPlan` for the sampler's current epoch; a ``batch_sampler``.

    ``planning_s`` accumulates the time spent deciding (sampler + policy), the control
    plane's whole cost. For a policy that ``needs_future`` the planner hands it this epoch's
    and the next epoch's order at each epoch start, unless ``feed_future=False`` (the
    caller gave it a longer future itself, as the simulator does).

    ``lock`` guards the policy: a feeder thread that changes the cache takes it too.
    """

    def __init__(
        self,
        sampler: Sampler,
        policy: Policy,
        batch_size: int,
        drop_last: bool = False,
        feed_future: bool = True,
        feeder: Feeder | None = None,
    ) -> None:
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
        if policy.num_samples < sampler.num_samples:
            raise ConfigError(
                f"policy covers {policy.num_samples} ids, sampler draws from {sampler.num_samples}"
            )
        if policy.needs_future and not sampler.order_known_ahead:
            raise ConfigError(
                f"policy {policy.name!r} needs the future access order, which sampler "
                f"{sampler.name!r} decides only as training goes; use the uniform sampler"
            )
        if policy.needs_scores:
            board = getattr(sampler, "board", None)
            if board is None:
                raise ConfigError(
                    f"policy {policy.name!r} needs importance scores; sampler {sampler.name!r} "
                    "has none: use an importance sampler such as 'shade'"
                )
            policy.attach_scores(board)
        self.feeder = feeder
        self.lock = threading.RLock()
        self.sampler = sampler
        self.policy = policy
        self.batch_size = int(batch_size)
        self.drop_last = drop_last
        self.feed_future = feed_future
        self.planning_s = 0.0  # deciding plans: sampler draws + policy accesses
        self.feedback_s = 0.0  # scoring feedback: importance + score board + policy re-keying

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def feedback(
        self, ids: np.ndarray, losses: np.ndarray, embeddings: np.ndarray | None = None
    ) -> None:
        """Per-sample losses (and, for graph importance, embeddings) of the ids a batch
        served: to the sampler's scores, then to a policy that keys on them."""
        feedback = getattr(self.sampler, "feedback", None)
        if feedback is None:
            return
        start = time.perf_counter()
        if getattr(self.sampler, "needs_embeddings", False):
            feedback(ids, losses, embeddings)
        else:
            feedback(ids, losses)
        if self.policy.needs_scores:
            with self.lock:
                self.policy.scores_updated(ids)
        self.feedback_s += time.perf_counter() - start

    def __len__(self) -> int:
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __iter__(self) -> Iterator[BatchPlan]:
        if self.policy.needs_feeder and self.feeder is None:
            raise ConfigError(
                f"policy {self.policy.name!r} fills its package cache through a feeder; "
                "build the loader with make_loader (or set planner.feeder)"
            )
        start = time.perf_counter()
        epoch = self.sampler.epoch
        if self.sampler.cache_aware:
            self.sampler.set_cached(self.policy.cached_ids())
        order = self.sampler.epoch_order(epoch)
        hints = self.sampler.cache_hints(epoch)
        if hints:
            with self.lock:
                self.policy.apply_hints(hints)
        if self.feeder is not None:
            self.feeder.epoch_started()
        if self.drop_last:
            order = order[: (order.size // self.batch_size) * self.batch_size]
        if self.policy.needs_future and self.feed_future:
            # The future as far as it is planned: this epoch and the next one.
            ahead = self.sampler.epoch_order(epoch + 1)
            self.policy.set_future(np.concatenate([order, ahead]))
        self.planning_s += time.perf_counter() - start
        for index, lo in enumerate(range(0, order.size, self.batch_size)):
            start = time.perf_counter()
            ids = order[lo : lo + self.batch_size]
            with self.lock:
                hints = self.sampler.take_hints()
                if hints:
                    self.policy.apply_hints(hints)
                r = self.policy.access(ids)
                if self.feeder is not None:
                    self.feeder.poll()
            plan = BatchPlan(
                epoch, index, ids if r.served is None else r.served, r.hits, r.admitted,
                r.evicted, r.substituted, None if r.served is None else ids,
                np.empty(0, np.int64) if r.fetch is None else r.fetch,
            )  # fmt: skip
            self.planning_s += time.perf_counter() - start
            yield plan
