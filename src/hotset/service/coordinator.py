"""The multi-job control plane: what every registered job reads next, and what the one
shared cache keeps. No sockets here: the server feeds it requests, tests call it directly.

* Datasets register by content key (the manifest's digests), so jobs on overlapping
  datasets get the same global ids and share cache entries (docs/design.md, "Rules").
* Sampling is one strategy from ``modes.SAMPLING``: JOADER's DSA (``"dsa"``),
  independent shuffles per job (``"isa"``, what jobs do without the service), Quiver's
  substitutable hits (``"quiver"``) or chunks with coordinated eviction (``"chunks"``),
  or iCACHE's importance sampling per job (``"iis"``). Each job keeps a queue of
  sampled-but-not-yet-planned ids per epoch; its sampling may run ahead into the next.
* The policy is shared (RefCnt by default): each job's epoch start adds one reference to
  each of its ids, each planned read consumes one, and a job that leaves (or dies) gives
  back what it had not read. A planned batch stays pinned (never evicted) until the job
  reports it consumed (``done``): plans run ahead of the workers, and another job's
  eviction must not delete a planned hit before it is read.
* Benefit (``benefit.py``): jobs time their first minibatches of an epoch without the
  cache (``plan(cache=False)``: no hit, no admission) and then with it, and report it.
  The allocation (``modes.ALLOCATION``) splits the budget: one ``"shared"`` partition,
  or one per dataset sized by Quiver's benefit-aware split (``"benefit"``); under
  ``"iis"`` the shared cache is iCACHE's H-cache keyed by aggregated importance.
"""

from __future__ import annotations

import hashlib
import socket
import time
from collections.abc import Sequence

import numpy as np

from hotset.errors import ConfigError, UnknownJob
from hotset.ids import first_seen, index_dtype
from hotset.service.benefit import Benefit
from hotset.service.jobs import DatasetShare, IdQueue, Job
from hotset.service.modes import ALLOCATION, SAMPLING
from hotset.service.partitions import PartitionedPolicy
from hotset.storage.columns import DigestColumn, concat, key_column
from hotset.store.lease import alive


class IdSpaceFull(ConfigError):
    """A registration that needs more ids than ``max_samples`` (``needed`` in all): the
    service grows its id space and takes it again (``server.py``)."""

    def __init__(self, message: str, needed: int) -> None:
        super().__init__(message)
        self.needed = int(needed)


class JobCoordinator:
    """Jobs, their sampling and the shared cache policy, over global ids ``0 .. max_samples-1``."""

    def __init__(
        self,
        capacity_bytes: int,
        max_samples: int = 1 << 21,
        policy: str | None = None,
        sampling: str = "dsa",
        seed: int = 0,
        lookahead: int = 4,
        job_timeout_s: float = 10.0,
        substitution: int = 4,
        allocation: str = "shared",
        probe_batches: int | None = None,
        probe_every: int | None = None,
        eligible_ratio: float = 1.5,
        next_epoch: bool = True,
    ) -> None:
        """``policy``: each partition's policy (default: the sampling mode's, ``refcnt``;
        ``pq`` by aggregated importance under ``iis``). ``probe_batches``: minibatches a
        job reads without, then with, the cache at each epoch start to measure its
        benefit (default 20 when something uses it: ``allocation="benefit"`` or
        ``"iis"``; 0 otherwise), every ``probe_every`` epochs once a measurement was
        conclusive (default: each epoch under ``iis``, as iCACHE; every 4th otherwise).
        ``next_epoch``: each job also holds one reference to each of its ids for the
        epoch after those sampled (it will read them again unless it leaves), so a job
        alone keeps what it cached for its own next epoch (MinIO's hit ratio), and an
        id several jobs will read outranks one only a single job will."""
        if sampling not in SAMPLING:
            raise ConfigError(f"sampling must be one of {tuple(SAMPLING)}, got {sampling!r}")
        if allocation not in ALLOCATION:
            raise ConfigError(f"allocation must be one of {tuple(ALLOCATION)}, got {allocation!r}")
        mode, alloc = SAMPLING[sampling], ALLOCATION[allocation]
        uses_benefit = alloc.measures_benefit or mode.measures_benefit
        self.probe_batches = (20 if uses_benefit else 0) if probe_batches is None else probe_batches
        if self.probe_batches < 0 or self.probe_batches == 1:
            raise ConfigError(f"probe_batches must be 0 (off) or >= 2, got {probe_batches}")
        self.probe_every = mode.probe_every if probe_every is None else probe_every
        if self.probe_every < 1:
            raise ConfigError(f"probe_every must be >= 1 epoch, got {probe_every}")
        if lookahead < 1:
            raise ConfigError(f"lookahead must be >= 1 batch, got {lookahead}")
        if substitution < 1:
            raise ConfigError(f"substitution must be >= 1 batch, got {substitution}")
        self.substitution = int(substitution)
        self.max_samples = int(max_samples)
        #: the dtype of the jobs' id columns: int32 while the ids fit
        self.id_dtype = index_dtype(self.max_samples)
        self.seed = seed
        self.lookahead = int(lookahead)
        self.job_timeout_s = float(job_timeout_s)
        # the distinct content keys, a global id each (its position), packed (16 B a key)
        self.keys: Sequence[str] = DigestColumn()
        self.capacity_bytes = int(capacity_bytes)
        self.eligible_ratio = float(eligible_ratio)
        self.next_epoch = bool(next_epoch)
        self.policy = PartitionedPolicy(policy or mode.default_policy, self.max_samples, seed)
        self.datasets: dict[str, DatasetShare] = {}
        self.jobs: dict[int, Job] = {}
        self._evict_next: list[int] = []  # evictions decided outside a plan, for the next
        self.mode = mode(self)
        self.allocation = alloc(self)
        self._next_job = 0
        self.removed: list[tuple[str, str]] = []  # (job name, why)
        self.planning_s = 0.0
        self.phantoms = 0  # residents forgotten: a job found them absent from the store

    def evict_later(self, ids) -> None:
        """Evictions decided outside a plan: they go out with the next one."""
        self._evict_next += list(ids)

    # -- registration ------------------------------------------------------------------
    def register(
        self,
        name: str,
        keys: Sequence[str],
        sizes: np.ndarray,
        batch_size: int,
        pid: int | None = None,
        host: str = "",
        epoch: int = 0,
        served: np.ndarray | None = None,
    ) -> int:
        """A job on the dataset whose samples have these content ``keys`` and ``sizes``;
        returns its job id. Its ``epoch`` (0 for a new job) starts now: it is sampled
        with the other jobs (and its reads are counted as references) before it asks for
        its first plan. A job registering again (the service restarted, or it timed out)
        gives the epoch it was in and the local ids it ``served`` of it: they are not
        planned again."""
        sizes = np.asarray(sizes, np.int64)
        if len(keys) != sizes.size or not keys:
            raise ConfigError(f"job {name!r}: give one size per key, at least one key")
        if batch_size < 1:
            raise ConfigError(f"job {name!r}: batch_size must be >= 1, got {batch_size}")
        served = np.zeros(0, np.int64) if served is None else np.asarray(served, np.int64)
        if epoch < 0 or (served.size and (served.min() < 0 or served.max() >= sizes.size)):
            raise ConfigError(f"job {name!r}: epoch {epoch} < 0, or served ids out of range")
        limit = self.mode.max_jobs
        if limit is not None and len(self.jobs) >= limit:  # refused before anything changes
            raise ConfigError(
                f"job {name!r} refused: --sampling {self.mode.name} samples at most {limit} "
                f"jobs together and {len(self.jobs)} are registered; the others go on"
            )
        keys, known = key_column(keys), len(self.keys)
        gids = self.keys.positions(keys) if known else None  # the first: every key new
        unknown = None if gids is None else np.flatnonzero(gids < 0)
        all_new = unknown is None or unknown.size == len(keys)
        fresh = keys if all_new else keys.take(unknown)
        first, number = fresh.numbered()  # one sort: each new key's first position
        new = first if all_new else unknown[first]
        if known + new.size > self.max_samples:
            raise IdSpaceFull(
                f"job {name!r}: the service holds at most {self.max_samples} distinct samples "
                f"(max_samples); {known} are registered, this dataset adds {new.size}",
                known + new.size,
            )
        if new.size:  # numbered in order of first sight
            if all_new:
                gids = number + known
            else:
                gids[unknown] = known + number
            self.keys = concat(self.keys, keys if new.size == len(keys) else keys.take(new))
            self.mode.add_ids(sizes[new])
        self.policy.set_sizes(gids, sizes)
        gids = gids.astype(self.id_dtype)  # a job's columns: 12 B per id in int32
        unique, first = first_seen(gids, len(self.keys))
        job_id = self._next_job
        self._next_job += 1
        job = Job(name, int(batch_size), pid, host, unique.astype(self.id_dtype), first, gids)
        job.last_seen = time.monotonic()
        if served.size:
            job.resumed_epoch, job.served = int(epoch), np.unique(gids[served])
        job.dataset = self._join_dataset(job_id, unique)
        job.part = self.datasets[job.dataset].part
        self.jobs[job_id] = job
        self.mode.add_job(job_id, job)
        if self.next_epoch:
            self.policy.add_references(unique, +1)  # its reads after the sampled epochs
        self._start_epoch(job_id, job, int(epoch))
        self._reallocate()
        return job_id

    def _join_dataset(self, job_id: int, unique: np.ndarray) -> str:
        """The job's dataset (created at its first job, with the partition the allocation
        gives it); returns its key."""
        digest = hashlib.blake2b(digest_size=16)  # of the ids as int64, a block at a time
        for start in range(0, unique.size, 1 << 20):
            digest.update(unique[start : start + (1 << 20)].astype(np.int64))
        key = digest.hexdigest()
        if key not in self.datasets:
            nbytes = int(self.policy.sizes[unique].sum())
            self.datasets[key] = DatasetShare(nbytes, self.allocation.new_dataset())
        self.datasets[key].jobs.add(job_id)
        return key

    def samples_per_epoch(self, job_id: int) -> int:
        return int(self._job(job_id).unique.size)

    def _job(self, job_id: int) -> Job:
        try:
            return self.jobs[job_id]
        except KeyError:
            raise UnknownJob(f"unknown job {job_id} (it left, or was removed)") from None

    def seen(self, job_id: int) -> None:
        self._job(job_id).last_seen = time.monotonic()

    def unread(self, job_id: int) -> int:
        """Reads the job has ahead in the epochs sampled so far: queued, not planned, and
        not yet sampled (what its references count)."""
        return self.jobs[job_id].queued() + self.mode.left(job_id)

    # -- epochs and plans --------------------------------------------------------------
    def _release(self, job_id: int, job: Job, leaving: bool = False, before: int = -1) -> None:
        """Give back the references of what the job will not read after all: its queued
        ids of epochs before ``before`` (all, when ``leaving``) and, when leaving or
        restarting, what the sampler had left of its epoch."""
        drop = [e for e in job.queues if leaving or e < before]
        unread = [job.queues.pop(e).take(None) for e in drop]
        if leaving or job.sampling_epoch < before:
            unread.append(self.mode.release(job_id, job, leaving))
        if leaving:  # its planned batches will never be read, nor its next epoch
            self._unpin(job, job.seq)
            if self.next_epoch:
                unread.append(job.unique)
        if unread:
            self.policy.add_references(np.concatenate(unread), -1)

    def start_sampling(self, job_id: int, job: Job, epoch: int) -> None:
        """The sampler begins ``epoch`` for the job: its ids are referenced once more."""
        job.sampling_epoch = epoch
        job.queues.setdefault(epoch, IdQueue())
        self.policy.add_references(self.mode.start_epoch(job_id, job, epoch), +1)

    def _start_epoch(self, job_id: int, job: Job, epoch: int) -> None:
        """The job plans ``epoch`` now: earlier epochs' leftovers are given back."""
        self._release(job_id, job, before=epoch)
        job.epoch, job.batches = epoch, 0
        if job.sampling_epoch < epoch:
            self.start_sampling(job_id, job, epoch)

    def _unpin(self, job: Job, done: int) -> None:
        """The job's plans before ``done`` (its count of consumed batches) have run."""
        while job.inflight and job.inflight[0][0] < done:
            self.policy.pin(job.inflight.popleft()[1], -1)

    def plan(
        self, job_id: int, epoch: int, done: int | None = None, cache: bool = True,
        absent: np.ndarray | None = None,
    ) -> dict:  # fmt: skip
        """The job's next batch of ``epoch``: global ids, the hit mask, what to admit, and
        the keys to evict (of any job's dataset). An empty batch ends the epoch. ``done``:
        how many of its batches the job has consumed (their reads have run); ``None``:
        all of them (a caller that runs each plan before asking for the next).
        ``cache=False``: the batch is read from storage (no hit, no admission), for
        timing the job without the cache. ``absent``: the job's local ids whose planned
        hits the store did not hold (gone, or dropped as corrupt): forgotten where no
        plan in flight still reads or writes them."""
        start = time.perf_counter()
        job = self._job(job_id)
        job.last_seen = time.monotonic()
        self._unpin(job, job.seq if done is None else done)
        if absent is not None and absent.size:
            self._forget(job, absent)
        if epoch != job.epoch:
            if epoch < job.epoch:
                raise ConfigError(f"job {job.name!r}: epoch {epoch} is before {job.epoch}")
            self._start_epoch(job_id, job, epoch)
        gids, hit, admitted, evicted = self.mode.batch(job_id, job, cache)
        evicted, self._evict_next = self._evict_next + evicted, []
        if gids.size:
            self.policy.pin(gids, +1)
            job.inflight.append((job.seq, gids))
            job.seq += 1
            job.batches += 1
        job.reads += gids.size
        job.hits += int(hit.sum())
        self.planning_s += time.perf_counter() - start
        return {
            "epoch": epoch,
            "index": job.batches - 1,
            "gids": gids,
            "hit": hit,
            "admit": admitted,
            "evict_keys": list(self.keys.take(evicted)),
        }

    def _forget(self, job: Job, local_ids: np.ndarray) -> None:
        if local_ids.max() >= job.gids.size:
            raise ConfigError(f"job {job.name!r}: absent ids out of [0, {job.gids.size})")
        gids = job.gids[np.asarray(local_ids, np.int64)]
        free = gids[self.policy.template.pinned[gids] == 0]
        self.phantoms += len(self.policy.discard(free))

    # -- what jobs report ----------------------------------------------------------------
    def feedback(self, job_id: int, local_ids: np.ndarray, losses: np.ndarray) -> None:
        """Per-sample losses of the job's trained batches (ids of its manifest), for a
        mode that samples by them (``iis``; ignored otherwise)."""
        job = self._job(job_id)
        if not self.mode.wants_losses or not np.size(local_ids):
            return
        local_ids = np.asarray(local_ids, np.int64)
        if local_ids.min() < 0 or local_ids.max() >= job.gids.size:
            raise ConfigError(f"job {job.name!r}: feedback ids out of [0, {job.gids.size})")
        self.mode.feedback(job_id, np.searchsorted(job.unique, job.gids[local_ids]), losses)

    def report_benefit(self, job_id: int, benefit: Benefit) -> None:
        """The job's measured benefit (``benefit.py``); the cache is re-divided by it. A
        report with too few hits to tell (``Benefit.conclusive``) keeps the job's last
        saving; a job's first report counts only if conclusive (its cache was cold)."""
        job = self._job(job_id)
        if benefit.conclusive or (job.benefit is not None and job.saving is None):
            job.saving = benefit.saving
        job.benefit = benefit
        self._reallocate()
        self.mode.benefit_reported()

    def _reallocate(self) -> None:
        self.evict_later(self.allocation.reallocate())

    # -- leaving -------------------------------------------------------------------------
    def leave(self, job_id: int, why: str = "left") -> None:
        job = self._job(job_id)
        self._release(job_id, job, leaving=True)
        del self.jobs[job_id]
        self.datasets[job.dataset].jobs.discard(job_id)
        self.removed.append((job.name, why))
        self._reallocate()

    def reap(self, now: float | None = None) -> list[int]:
        """Remove jobs silent for longer than ``job_timeout_s``, or whose process on this
        host is gone; returns their ids."""
        now = time.monotonic() if now is None else now
        here = socket.gethostname()
        dead = []
        for job_id, job in list(self.jobs.items()):
            gone = job.pid is not None and job.host == here and not alive(job.pid)
            if gone or now - job.last_seen > self.job_timeout_s:
                self.leave(job_id, "process gone" if gone else "timed out")
                dead.append(job_id)
        return dead

    def stats(self) -> dict:
        return {
            "jobs": {
                str(j): {
                    "name": job.name,
                    "epoch": job.epoch,
                    "reads": job.reads,
                    "hits": job.hits,
                    "benefit": None if job.benefit is None else job.benefit.ratio,
                    "saving": job.saving,  # the last conclusive one
                    "partition": job.part,
                    "measured": None if job.benefit is None else job.benefit.as_dict(),
                }
                for j, job in self.jobs.items()
            },
            "partition_bytes": self.policy.capacities(),
            "removed": [list(r) for r in self.removed],
            "registered_samples": len(self.keys),
            "cached": len(self.policy),
            "cached_bytes": self.policy.used,
            "planning_s": self.planning_s,
            "phantoms": self.phantoms,
        }
