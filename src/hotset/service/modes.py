"""The service's sampling modes and allocations: one strategy object each, looked up by
name in ``SAMPLING`` and ``ALLOCATION`` (as mature data loaders register shuffles), so
the :class:`~hotset.service.coordinator.JobCoordinator` runs any of them unbranched.

A sampling mode decides which ids each job reads next and in which order; the
coordinator keeps what every mode shares (jobs, their queues of sampled ids per epoch,
references, pins, the shared policy). An allocation decides how the cache's bytes are
split over the registered datasets.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar, Protocol

import numpy as np

from hotset.errors import ConfigError
from hotset.importance import ScoreBoard
from hotset.policy.icache_lists import h_list_to_fit
from hotset.sampling.draw import shuffle_next
from hotset.sampling.dsa import MAX_JOBS, DependentSampling
from hotset.sampling.iis import IISSampler
from hotset.service.allocation import split_budget
from hotset.service.chunks import ChunkCache
from hotset.service.jobs import DatasetShare, IdQueue, Job

_NONE = np.zeros(0, np.int64)


class Coordinator(Protocol):
    """What a mode uses of the :class:`~hotset.service.coordinator.JobCoordinator` that
    runs it."""

    capacity_bytes: int
    datasets: dict[str, DatasetShare]
    eligible_ratio: float
    jobs: dict[int, Job]
    lookahead: int
    max_samples: int
    mode: SamplingMode
    policy: Any
    seed: int
    substitution: int

    def evict_later(self, ids: Any) -> None: ...

    def start_sampling(self, job_id: int, job: Job, epoch: int) -> None: ...


class SamplingMode(ABC):
    """Base: the shared policy serves each batch of ids the mode samples. A subclass
    implements ``start_epoch`` (the job's order for an epoch), ``fill`` (queue the next
    batch), ``left`` and ``release`` (docs/extending.md)."""

    name: ClassVar[str]
    #: the partitions' policy unless the service is given one
    default_policy: ClassVar[str] = "refcnt"
    #: whether jobs send their losses with their plan requests
    wants_losses: ClassVar[bool] = False
    #: whether jobs measure their benefit by default, and how often once conclusive
    measures_benefit: ClassVar[bool] = False
    probe_every: ClassVar[int] = 4
    #: whether the shared policy decides what is cached (chunks decide themselves)
    uses_policy: ClassVar[bool] = True
    #: how many jobs can sample together (None: no limit)
    max_jobs: ClassVar[int | None] = None

    def __init__(self, co: Coordinator) -> None:
        self.co = co

    def add_ids(self, sizes: np.ndarray) -> None:  # noqa: B027 - optional hook
        """New global ids (in order) with their byte sizes."""

    def add_job(self, job_id: int, job: Job) -> None:  # noqa: B027 - optional hook
        """A job registered (before its epoch 0 starts)."""

    @abstractmethod
    def start_epoch(self, job_id: int, job: Job, epoch: int) -> np.ndarray:
        """The sampler begins ``epoch`` for the job; returns the ids it will read (each
        gets one reference): all of ``job.unique``, or of its subset for the epoch,
        less what ``job.keep`` drops (read before the job re-registered)."""

    def fill(self, job_id: int, job: Job, queue: IdQueue) -> None:  # noqa: B027 - optional
        """Sample until ``queue`` holds a batch (or the job's epoch is all sampled)."""

    @abstractmethod
    def left(self, job_id: int) -> int:
        """Ids of the job's sampling epoch not yet sampled."""

    @abstractmethod
    def release(self, job_id: int, job: Job, leaving: bool) -> np.ndarray:
        """The job stops its sampling epoch (it moved on, or is ``leaving``): returns
        the ids it will not read after all (their references are given back)."""

    def batch(self, job_id: int, job: Job, cache: bool):
        """The job's next batch: (gids, hit mask, admitted ids, evicted ids)."""
        queue = job.queues.setdefault(job.epoch, IdQueue())
        self.fill(job_id, job, queue)
        gids = queue.take(job.batch_size)
        policy = self.co.policy
        if not cache:  # the reads still happen: they consume their references
            policy.add_references(gids, -1)
            return gids, np.zeros(gids.size, bool), gids[:0], []
        r = policy.access(gids, job.part)
        return gids, r.hits, r.admitted, r.evicted.tolist()

    def feedback(  # noqa: B027 - optional hook
        self, job_id: int, ids: np.ndarray, losses: np.ndarray
    ) -> None:
        """Losses of the job's trained samples (indices into its sorted ``unique``)."""

    def benefit_reported(self) -> None:  # noqa: B027 - optional hook
        """A job reported a new measured benefit."""


class IndependentSampling(SamplingMode):
    """``isa``: an independent shuffle per job and epoch (what jobs do alone)."""

    name = "isa"

    def __init__(self, co: Coordinator) -> None:
        super().__init__(co)
        self.orders: dict[int, Unsampled] = {}  # job -> its epoch's ids not yet sampled

    def _order(self, job_id: int, job: Job, epoch: int) -> np.ndarray:
        """The job's ids of ``epoch`` in reading order, or as a set ``_shuffle`` orders."""
        return job.unique

    def _shuffle(self, job_id: int, epoch: int) -> np.random.Generator | None:
        """The generator of the job's shuffle of ``epoch`` (drawn as it is read), or
        ``None``: ``_order`` is the order."""
        return np.random.default_rng([self.co.seed, job_id, epoch])

    def start_epoch(self, job_id: int, job: Job, epoch: int) -> np.ndarray:
        order = job.keep(epoch, self._order(job_id, job, epoch))
        self.orders[job_id] = Unsampled(order, self._shuffle(job_id, epoch))
        return order

    def fill(self, job_id: int, job: Job, queue: IdQueue) -> None:
        queue.extend(self.orders[job_id].take(job.batch_size - len(queue)).copy())

    def left(self, job_id: int) -> int:
        return len(self.orders[job_id]) if job_id in self.orders else 0

    def release(self, job_id: int, job: Job, leaving: bool) -> np.ndarray:
        gone = self.orders.pop(job_id, None)
        if not leaving:
            self.orders[job_id] = Unsampled(np.zeros(0, np.int64))
        return gone.rest().copy() if gone is not None else np.zeros(0, np.int64)


class SubstitutableHits(IndependentSampling):
    """``quiver``: independent shuffles with Quiver's substitutable hits: a batch looks
    ``substitution`` batches ahead in the job's order and serves the cached candidates
    first, misses for the rest; the others stay next in line."""

    name = "quiver"

    def fill(self, job_id: int, job: Job, queue: IdQueue) -> None:
        order = self.orders[job_id]
        need = job.batch_size - len(queue)
        if need <= 0 or not len(order):
            return
        window = order.take(self.co.substitution * job.batch_size)
        held = self.co.policy.cached_mask(window)
        cached = np.flatnonzero(held)[:need]
        rest = np.flatnonzero(~held)[: need - cached.size]
        left = np.ones(window.size, bool)
        left[cached] = left[rest] = False
        queue.extend(window[np.concatenate([cached, rest])])
        order.put_back(window[left])  # the others: next in line, in order


class Unsampled:
    """A job's epoch order not yet sampled, in reading order: ``ids[pos:]`` of one numpy
    array (no Python object per id). With ``rng``, a uniform shuffle of ``ids`` drawn
    block by block as ids are taken (``shuffle_next``), so that an epoch start does not
    permute 14M ids."""

    __slots__ = ("drawn", "ids", "pos", "rng")

    def __init__(self, ids: np.ndarray, rng: np.random.Generator | None = None) -> None:
        self.ids = np.array(ids)  # its own copy (of the job's id dtype): put_back writes
        self.pos = 0
        self.rng = rng
        self.drawn = 0 if rng is not None else self.ids.size  # ids[:drawn] are in order

    def __len__(self) -> int:
        return self.ids.size - self.pos

    def rest(self) -> np.ndarray:
        return self.ids[self.pos :]

    def take(self, n: int) -> np.ndarray:
        """The next ``n`` ids (fewer at the end), consumed: a view, valid until the next
        ``put_back``."""
        end = min(self.ids.size, self.pos + max(0, n))
        while self.drawn < end:
            self.drawn = shuffle_next(self.ids, self.drawn, self.rng)
        out = self.ids[self.pos : end]
        self.pos = end
        return out

    def put_back(self, kept: np.ndarray) -> None:
        """``kept`` (a copy, of the ids last taken) are next in line again, in order."""
        self.pos -= kept.size
        self.ids[self.pos : self.pos + kept.size] = kept


class ImportanceSampling(IndependentSampling):
    """``iis``: iCACHE's importance sampling per job (its epoch is the subset its own
    losses select, as ``IISSampler``), and the shared H-cache keyed by the aggregated
    importance (III-D): ``AIV_i = sum_j Ratio_benefit_j * RIV_ij`` over the
    cache-eligible jobs (ratio above ``eligible_ratio``), ``RIV_ij`` the percentile of
    ``i``'s loss among job ``j``'s samples when ``i`` is on its H-list, else 0 (every job
    weighs 1 while none is eligible)."""

    name = "iis"
    default_policy = "pq"
    wants_losses = True
    measures_benefit = True
    probe_every = 1  # as iCACHE: each epoch

    def __init__(self, co: Coordinator) -> None:
        super().__init__(co)
        self.samplers: dict[int, IISSampler] = {}
        self.importance: ScoreBoard | None = None  # AIV, for a policy keyed by it
        if co.policy.needs_scores:
            self.importance = ScoreBoard(co.max_samples, initial=0.0)
            co.policy.attach_scores(self.importance)

    def add_job(self, job_id: int, job: Job) -> None:
        self.samplers[job_id] = IISSampler(job.unique.size, seed=self.co.seed * 7919 + job_id)

    def _order(self, job_id: int, job: Job, epoch: int) -> np.ndarray:
        order = job.unique[self.samplers[job_id].global_order(epoch)]
        self.refresh_importance()
        return order

    def _shuffle(self, job_id: int, epoch: int) -> None:
        return None  # IIS's order, as drawn

    def release(self, job_id: int, job: Job, leaving: bool) -> np.ndarray:
        if leaving:
            self.samplers.pop(job_id, None)
        return super().release(job_id, job, leaving)

    def feedback(self, job_id: int, ids: np.ndarray, losses: np.ndarray) -> None:
        self.samplers[job_id].feedback(ids, losses)

    def benefit_reported(self) -> None:
        self.refresh_importance()

    def refresh_importance(self) -> None:
        """iCACHE's aggregated importance (III-D) of every sample, for the H-cache."""
        if self.importance is None:
            return
        co = self.co
        jobs = [(co.jobs[j], s) for j, s in self.samplers.items() if j in co.jobs]
        eligible = [(j, s) for j, s in jobs if j.benefit and j.benefit.ratio > co.eligible_ratio]
        score = self.importance.score
        old = score.copy()
        score[:] = 0.0
        for job, sampler in eligible or jobs:
            pct = sampler.percentiles()
            if sampler.h_fraction is None:  # its H-list only: what fits the cache
                hot = h_list_to_fit(pct, co.policy.sizes[job.unique], co.capacity_bytes)
            else:
                hot = pct >= 1.0 - sampler.h_fraction
            riv = np.where(hot, pct, 0.0)
            score[job.unique] += (job.benefit.ratio if eligible else 1.0) * riv
        cached = co.policy.cached_ids()
        co.policy.scores_updated(cached[score[cached] != old[cached]])


class DependentSamplingMode(SamplingMode):
    """``dsa``: JOADER's dependent sampling, in rounds over the jobs whose queue of
    sampled-but-not-yet-planned ids is short: a job far ahead samples alone (partial
    sampling), a slow one keeps up to ``lookahead`` batches queued. A job's sampling runs
    on into its next epoch as soon as the current one is sampled (the queues keep the
    epochs apart), so jobs in step stay in step across epoch boundaries."""

    name = "dsa"
    max_jobs = MAX_JOBS  # one bit per job in the need masks

    def __init__(self, co: Coordinator) -> None:
        super().__init__(co)
        self.dsa = DependentSampling(co.max_samples, seed=co.seed)

    def add_job(self, job_id: int, job: Job) -> None:
        self.dsa.add_job(job_id, job.unique, start=False)

    def start_epoch(self, job_id: int, job: Job, epoch: int) -> np.ndarray:
        ids = job.keep(epoch, job.unique)
        self.dsa.start_epoch(job_id, ids)
        return ids

    def _room(self, job: Job) -> int:
        """Rounds a job takes part in before it has ``lookahead`` batches queued (the
        jobs that far ahead wait)."""
        return self.co.lookahead * job.batch_size - job.queued()

    def fill(self, job_id: int, job: Job, queue: IdQueue) -> None:
        jobs, left = self.co.jobs, self.dsa.left
        while len(queue) < job.batch_size and job.sampling_epoch == job.epoch:
            if not left.get(job_id):  # an epoch resumed with nothing left to read
                self.co.start_sampling(job_id, job, job.sampling_epoch + 1)
                break
            room = {j: self._room(other) for j, other in jobs.items()}
            peers = [j for j in jobs if j == job_id or room[j] > 0]
            # rounds over the same peers, as many as one at a time would make: until
            # this batch is queued or a peer has its look-ahead queued (it stops taking
            # part); ``rounds`` stops where a peer's epoch is all sampled
            n = min([job.batch_size - len(queue)] + [room[j] for j in peers if j != job_id])
            picks = self.dsa.picks(peers, n)
            for j, elements in picks.items():
                jobs[j].queues[jobs[j].sampling_epoch].extend(elements)
            for j in picks:
                if left[j] == 0:  # sampled its epoch: run on into the next one
                    self.co.start_sampling(j, jobs[j], jobs[j].sampling_epoch + 1)

    def left(self, job_id: int) -> int:
        return self.dsa.left.get(job_id, 0)

    def release(self, job_id: int, job: Job, leaving: bool) -> np.ndarray:
        return self.dsa.remove_job(job_id) if leaving else self.dsa.end_epoch(job_id)


class CoordinatedChunks(SamplingMode):
    """``chunks``: Quiver's chunks with coordinated eviction (``chunks.py``); the chunk
    cache decides what is cached, not the shared policy, and counts no references."""

    name = "chunks"
    uses_policy = False

    def __init__(self, co: Coordinator) -> None:
        super().__init__(co)
        self.chunks = ChunkCache(co.capacity_bytes, seed=co.seed)

    def add_ids(self, sizes: np.ndarray) -> None:
        self.chunks.add_ids(sizes)

    def start_epoch(self, job_id: int, job: Job, epoch: int) -> np.ndarray:
        self.co.evict_later(self.chunks.start_epoch(job_id, job.keep(epoch, job.unique)))
        return _NONE

    def left(self, job_id: int) -> int:
        return sum(len(v) for v in self.chunks.unread.get(job_id, {}).values())

    def release(self, job_id: int, job: Job, leaving: bool) -> np.ndarray:
        self.co.evict_later(self.chunks.release(job_id))
        return _NONE

    def batch(self, job_id: int, job: Job, cache: bool):
        ids, hits, admit, evict = self.chunks.batch(job_id, job.batch_size)
        return np.array(ids, np.int64), np.array(hits, bool), np.array(admit, np.int64), evict


SAMPLING: dict[str, type[SamplingMode]] = {
    m.name: m
    for m in (
        DependentSamplingMode,
        IndependentSampling,
        SubstitutableHits,
        CoordinatedChunks,
        ImportanceSampling,
    )
}


class SharedAllocation:
    """``shared``: one partition, the whole budget, for every dataset."""

    name: ClassVar[str] = "shared"
    #: whether jobs measure their benefit by default (the split needs it)
    measures_benefit: ClassVar[bool] = False

    def __init__(self, co: Coordinator) -> None:
        self.co = co
        co.policy.add_partition(co.capacity_bytes)

    def new_dataset(self) -> int:
        """The partition of a newly registered dataset."""
        return 0

    def reallocate(self) -> list[int]:
        """Re-divide the budget after jobs joined, left or measured; returns evictions."""
        return []


class BenefitAllocation(SharedAllocation):
    """``benefit``: a partition per dataset, sized by Quiver's benefit-aware split
    (``allocation.py``) of what its jobs measured."""

    name = "benefit"
    measures_benefit = True

    def __init__(self, co: Coordinator) -> None:
        if not co.mode.uses_policy:
            raise ConfigError(
                f"allocation='benefit' needs a policy cache, not sampling={co.mode.name!r}"
            )
        self.co = co

    def new_dataset(self) -> int:
        return self.co.policy.add_partition(0)

    def reallocate(self) -> list[int]:
        co = self.co
        shares: list[DatasetShare] = list(co.datasets.values())
        sizes = [d.nbytes if d.jobs else 0 for d in shares]  # no job: nothing to keep
        values = []
        for d in shares:
            savings = [co.jobs[j].saving for j in d.jobs]
            values.append(np.nan if None in savings else sum(savings))
        quota = split_budget(co.capacity_bytes, sizes, values)
        evicted: list[int] = []
        for d, q in zip(shares, quota.tolist(), strict=True):
            evicted += co.policy.resize(d.part, q)
        return evicted


ALLOCATION: dict[str, type[SharedAllocation]] = {
    a.name: a for a in (SharedAllocation, BenefitAllocation)
}
