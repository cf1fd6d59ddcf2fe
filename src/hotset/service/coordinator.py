"""The multi-job control plane: what every registered job reads next, and what the one
shared cache keeps. No sockets here: the server feeds it requests, tests call it directly.

* Datasets register by content key (the manifest's digests), so jobs on overlapping
  datasets get the same global ids and share cache entries (DESIGN.md, "Rules").
* Sampling is JOADER's DSA (``sampling="dsa"``), independent shuffles per job (``"isa"``,
  what jobs do without the service), or independent shuffles with Quiver's substitutable
  hits (``"quiver"``: a batch looks ``substitution`` batches ahead in the job's order and
  serves the cached candidates first, misses for the rest; the others stay next in line),
  or Quiver's chunks with coordinated eviction (``"chunks"``, see ``chunks.py``), or
  iCACHE's importance sampling per job (``"iis"``: each job's epoch is the subset its own
  losses select, as ``IISSampler``; the jobs send their losses with their plan requests).
* DSA runs in rounds over the jobs whose queue of sampled-but-not-yet-planned ids is
  short: a job far ahead samples alone (JOADER's partial sampling), a slow one keeps up
  to ``lookahead`` batches queued. A job's sampling runs on into its next epoch as soon
  as the current one is sampled (the queue keeps the epochs apart), so jobs in step stay
  in step across epoch boundaries instead of the first one to finish sampling alone.
* The policy is shared (RefCnt by default): each job's epoch start adds one reference to
  each of its ids, each planned read consumes one, and a job that leaves (or dies) gives
  back what it had not read. A planned batch stays pinned (never evicted) until the job
  reports it consumed (``done``): plans run ahead of the workers, and another job's
  eviction must not delete a planned hit before it is read.
* Benefit (``benefit.py``): jobs time their first minibatches of an epoch without the
  cache (``plan(cache=False)``: no hit, no admission) and then with it, and report it.
  ``allocation="benefit"`` gives each dataset its own partition of the cache, sized by
  Quiver's benefit-aware split (``allocation.py``); under ``"iis"`` the shared cache is
  iCACHE's H-cache (``pq`` by default) keyed by the aggregated importance (III-D):
  ``AIV_i = sum_j Ratio_benefit_j * RIV_ij`` over the cache-eligible jobs (ratio above
  ``eligible_ratio``), ``RIV_ij`` the percentile of ``i``'s loss among job ``j``'s
  samples when ``i`` is on its H-list, else 0 (every job weighs 1 while none is eligible).
"""

from __future__ import annotations

import hashlib
import os
import socket
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from hotset.errors import ConfigError
from hotset.importance import ScoreBoard
from hotset.policy.base import POLICIES
from hotset.sampling.dsa import DependentSampling
from hotset.sampling.iis import IISSampler
from hotset.service.allocation import split_budget
from hotset.service.benefit import Benefit
from hotset.service.chunks import ChunkCache
from hotset.service.partitions import PartitionedPolicy

SAMPLING = ("dsa", "isa", "quiver", "chunks", "iis")
ALLOCATION = ("shared", "benefit")


@dataclass
class DatasetShare:
    """A registered dataset (a distinct set of samples) and its partition of the cache."""

    nbytes: int
    part: int
    jobs: set[int] = field(default_factory=set)


@dataclass
class Job:
    name: str
    batch_size: int
    pid: int | None = None
    host: str = ""
    unique: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # sorted gids
    local_of: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    gids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # per local id
    dataset: str = ""
    part: int = 0  # its dataset's partition of the cache
    iis: IISSampler | None = None  # its importance sampling (``sampling="iis"``)
    benefit: Benefit | None = None  # the latest measurement
    saving: float | None = None  # the latest conclusive one's ``saving``
    epoch: int = -1  # the epoch being planned
    sampling_epoch: int = -1  # the epoch the sampler fills (DSA runs ahead across epochs)
    queues: dict[int, deque] = field(default_factory=dict)  # epoch -> sampled, not planned
    order: list[int] = field(default_factory=list)  # ISA: this epoch's shuffle, unread part
    inflight: deque = field(default_factory=deque)  # (seq, gids) planned, not yet consumed
    seq: int = 0  # non-empty plans handed out so far
    batches: int = 0
    last_seen: float = 0.0
    reads: int = 0
    hits: int = 0

    def queued(self) -> int:
        return sum(len(q) for q in self.queues.values())

    def local(self, gids: np.ndarray) -> np.ndarray:
        """Local indices of ``gids`` (a key listed twice in a manifest maps to its first)."""
        return self.local_of[np.searchsorted(self.unique, gids)]


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
    ) -> None:
        """``policy``: each partition's policy (default ``refcnt``; ``pq`` by aggregated
        importance under ``iis``). ``probe_batches``: minibatches a job reads without,
        then with, the cache at each epoch start to measure its benefit (default 20 when
        something uses it: ``allocation="benefit"`` or ``"iis"``; 0 otherwise), every
        ``probe_every`` epochs once a measurement was conclusive (default: each epoch
        under ``iis``, as iCACHE; every 4th for the allocation alone)."""
        if sampling not in SAMPLING:
            raise ConfigError(f"sampling must be one of {SAMPLING}, got {sampling!r}")
        if allocation not in ALLOCATION:
            raise ConfigError(f"allocation must be one of {ALLOCATION}, got {allocation!r}")
        if allocation == "benefit" and sampling == "chunks":
            raise ConfigError("allocation='benefit' needs a policy cache, not sampling='chunks'")
        uses_benefit = allocation == "benefit" or sampling == "iis"
        self.probe_batches = (20 if uses_benefit else 0) if probe_batches is None else probe_batches
        if self.probe_batches < 0 or self.probe_batches == 1:
            raise ConfigError(f"probe_batches must be 0 (off) or >= 2, got {probe_batches}")
        self.probe_every = (1 if sampling == "iis" else 4) if probe_every is None else probe_every
        if self.probe_every < 1:
            raise ConfigError(f"probe_every must be >= 1 epoch, got {probe_every}")
        if lookahead < 1:
            raise ConfigError(f"lookahead must be >= 1 batch, got {lookahead}")
        if substitution < 1:
            raise ConfigError(f"substitution must be >= 1 batch, got {substitution}")
        self.substitution = int(substitution)
        self.max_samples = int(max_samples)
        self.sampling = sampling
        self.seed = seed
        self.lookahead = int(lookahead)
        self.job_timeout_s = float(job_timeout_s)
        self.gid_of: dict[str, int] = {}
        self.keys: list[str] = []
        self.capacity_bytes = int(capacity_bytes)
        self.allocation = allocation
        self.eligible_ratio = float(eligible_ratio)
        policy = policy or ("pq" if sampling == "iis" else "refcnt")
        self.policy = PartitionedPolicy(policy, self.max_samples, seed=seed)
        if allocation == "shared":
            self.policy.add_partition(self.capacity_bytes)
        self.importance = None  # AIV, for a policy keyed by importance
        if POLICIES[policy].needs_scores:
            self.importance = ScoreBoard(self.max_samples, initial=0.0)
            self.policy.attach_scores(self.importance)
        self.datasets: dict[str, DatasetShare] = {}
        self.dsa = DependentSampling(self.max_samples, seed=seed) if sampling == "dsa" else None
        self.chunks = ChunkCache(capacity_bytes, seed=seed) if sampling == "chunks" else None
        self._evict_next: list[int] = []  # evictions decided outside a plan, for the next
        self.jobs: dict[int, Job] = {}
        self._next_job = 0
        self.removed: list[tuple[str, str]] = []  # (job name, why)
        self.planning_s = 0.0

    # -- registration ------------------------------------------------------------------
    def register(
        self,
        name: str,
        keys: list[str],
        sizes: np.ndarray,
        batch_size: int,
        pid: int | None = None,
        host: str = "",
    ) -> int:
        """A job on the dataset whose samples have these content ``keys`` and ``sizes``;
        returns its job id. Its epoch 0 starts now: it is sampled with the other jobs
        (and its reads are counted as references) before it asks for its first plan."""
        sizes = np.asarray(sizes, np.int64)
        if len(keys) != sizes.size or not keys:
            raise ConfigError(f"job {name!r}: give one size per key, at least one key")
        if batch_size < 1:
            raise ConfigError(f"job {name!r}: batch_size must be >= 1, got {batch_size}")
        new = [k for k in dict.fromkeys(keys) if k not in self.gid_of]
        if len(self.keys) + len(new) > self.max_samples:
            raise ConfigError(
                f"job {name!r}: the service holds at most {self.max_samples} distinct samples "
                f"(max_samples); {len(self.keys)} are registered, this dataset adds {len(new)}"
            )
        for k in new:
            self.gid_of[k] = len(self.keys)
            self.keys.append(k)
        if self.chunks is not None and new:
            size_of = dict(zip(keys, sizes.tolist(), strict=True))
            self.chunks.add_ids(np.array([size_of[k] for k in new], np.int64))
        gids = np.fromiter((self.gid_of[k] for k in keys), np.int64, len(keys))
        self.policy.set_sizes(gids, sizes)
        unique, first = np.unique(gids, return_index=True)
        job_id = self._next_job
        self._next_job += 1
        job = Job(name, int(batch_size), pid, host, unique, first.astype(np.int64), gids)
        job.last_seen = time.monotonic()
        job.dataset = self._join_dataset(job_id, unique)
        job.part = self.datasets[job.dataset].part
        if self.sampling == "iis":
            job.iis = IISSampler(unique.size, seed=self.seed * 7919 + job_id)
        self.jobs[job_id] = job
        if self.sampling == "dsa":
            self.dsa.add_job(job_id, unique, start=False)
        self._start_epoch(job_id, job, 0)
        self._reallocate()
        return job_id

    def _join_dataset(self, job_id: int, unique: np.ndarray) -> str:
        """The job's dataset (created at its first job, with its own partition of the
        cache under benefit-aware allocation); returns its key."""
        key = hashlib.blake2b(unique.tobytes(), digest_size=16).hexdigest()
        if key not in self.datasets:
            part = self.policy.add_partition(0) if self.allocation == "benefit" else 0
            nbytes = int(self.policy.sizes[unique].sum())
            self.datasets[key] = DatasetShare(nbytes, part)
        self.datasets[key].jobs.add(job_id)
        return key

    def samples_per_epoch(self, job_id: int) -> int:
        return int(self._job(job_id).unique.size)

    def _job(self, job_id: int) -> Job:
        try:
            return self.jobs[job_id]
        except KeyError:
            raise ConfigError(f"unknown job {job_id} (it left, or was removed)") from None

    def seen(self, job_id: int) -> None:
        self._job(job_id).last_seen = time.monotonic()

    # -- epochs and plans --------------------------------------------------------------
    def _release(self, job_id: int, job: Job, leaving: bool = False, before: int = -1) -> None:
        """Give back the references of what the job will not read after all: its queued
        ids of epochs before ``before`` (all, when ``leaving``) and, when leaving or
        restarting, what the sampler had left of its epoch."""
        drop = [e for e in job.queues if leaving or e < before]
        unread = [np.array(job.queues.pop(e), np.int64) for e in drop]
        if leaving or job.sampling_epoch < before:
            if self.sampling == "dsa":
                left = self.dsa.remove_job(job_id) if leaving else self.dsa.end_epoch(job_id)
            else:
                left = np.array(job.order, np.int64)
                job.order = []
            unread.append(left)
        if self.chunks is not None and (leaving or job.sampling_epoch < before):
            self._evict_next += self.chunks.release(job_id)
        if leaving:  # its planned batches will never be read
            self._unpin(job, job.seq)
        if unread:
            self.policy.add_references(np.concatenate(unread), -1)

    def _start_sampling(self, job_id: int, job: Job, epoch: int) -> None:
        """The sampler begins ``epoch`` for the job: its ids are referenced once more."""
        job.sampling_epoch = epoch
        job.queues.setdefault(epoch, deque())
        if self.sampling == "dsa":
            self.dsa.start_epoch(job_id)
        elif self.chunks is not None:
            self._evict_next += self.chunks.start_epoch(job_id, job.unique)
        elif job.iis is not None:
            job.order = job.unique[job.iis.global_order(epoch)].tolist()[::-1]
            self._refresh_importance()
        else:
            rng = np.random.default_rng([self.seed, job_id, epoch])
            job.order = rng.permutation(job.unique).tolist()[::-1]  # popped from the end
        if self.chunks is None:
            self.policy.add_references(job.order if job.iis else job.unique, +1)

    def _start_epoch(self, job_id: int, job: Job, epoch: int) -> None:
        """The job plans ``epoch`` now: earlier epochs' leftovers are given back."""
        self._release(job_id, job, before=epoch)
        job.epoch, job.batches = epoch, 0
        if job.sampling_epoch < epoch:
            self._start_sampling(job_id, job, epoch)

    def _behind(self, job_id: int, job: Job) -> bool:
        """Whether a job takes part in the next round: it has fewer than ``lookahead``
        batches queued (the rest are far enough ahead to wait)."""
        return job.queued() < self.lookahead * job.batch_size

    def _fill(self, job_id: int, job: Job) -> None:
        """Sample until the job has a batch of its epoch queued (or its epoch is all
        sampled)."""
        queue = job.queues.setdefault(job.epoch, deque())
        if self.sampling in ("isa", "iis"):
            while len(queue) < job.batch_size and job.order:
                queue.append(job.order.pop())
            return
        if self.sampling == "quiver":
            self._substitute(job, queue)
            return
        left = self.dsa.left
        while len(queue) < job.batch_size and job.sampling_epoch == job.epoch:
            peers = [j for j, other in self.jobs.items() if j == job_id or self._behind(j, other)]
            for j, e in self.dsa.round(peers).items():
                other = self.jobs[j]
                other.queues[other.sampling_epoch].append(e)
                if left[j] == 0:  # sampled its epoch: run on into the next one
                    self._start_sampling(j, other, other.sampling_epoch + 1)

    def _substitute(self, job: Job, queue: deque) -> None:
        """Quiver's substitutable hits: of the next ``substitution`` batches of the job's
        shuffle, the cached ids first, then the earliest misses; each id still once."""
        need = job.batch_size - len(queue)
        if need <= 0 or not job.order:
            return
        w = min(len(job.order), self.substitution * job.batch_size)
        window = job.order[-w:][::-1]  # reading order
        del job.order[-w:]
        cached = [e for e in window if e in self.policy][:need]
        taken = set(cached)
        fill = [e for e in window if e not in taken][: need - len(cached)]
        taken.update(fill)
        job.order.extend(e for e in reversed(window) if e not in taken)  # next in line
        queue.extend(cached + fill)

    def _unpin(self, job: Job, done: int) -> None:
        """The job's plans before ``done`` (its count of consumed batches) have run."""
        while job.inflight and job.inflight[0][0] < done:
            self.policy.pin(job.inflight.popleft()[1], -1)

    def plan(self, job_id: int, epoch: int, done: int | None = None, cache: bool = True) -> dict:
        """The job's next batch of ``epoch``: global ids, the hit mask, what to admit, and
        the keys to evict (of any job's dataset). An empty batch ends the epoch. ``done``:
        how many of its batches the job has consumed (their reads have run); ``None``:
        all of them (a caller that runs each plan before asking for the next).
        ``cache=False``: the batch is read from storage (no hit, no admission), for
        timing the job without the cache."""
        start = time.perf_counter()
        job = self._job(job_id)
        job.last_seen = time.monotonic()
        self._unpin(job, job.seq if done is None else done)
        if epoch != job.epoch:
            if epoch < job.epoch:
                raise ConfigError(f"job {job.name!r}: epoch {epoch} is before {job.epoch}")
            self._start_epoch(job_id, job, epoch)
        if self.chunks is not None:
            ids, hits, admit, evict = self.chunks.batch(job_id, job.batch_size)
            gids, hit = np.array(ids, np.int64), np.array(hits, bool)
            admitted, evicted = np.array(admit, np.int64), evict
        else:
            self._fill(job_id, job)
            queue = job.queues[epoch]
            gids = np.array([queue.popleft() for _ in range(min(job.batch_size, len(queue)))])
            gids = gids.astype(np.int64)
            if cache:
                r = self.policy.access(gids, job.part)
                hit, admitted, evicted = r.hits, r.admitted, r.evicted.tolist()
            else:  # the reads still happen: they consume their references
                self.policy.add_references(gids, -1)
                hit, admitted, evicted = np.zeros(gids.size, bool), gids[:0], []
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
            "evict_keys": [self.keys[g] for g in evicted],
        }

    # -- what jobs report ----------------------------------------------------------------
    def feedback(self, job_id: int, local_ids: np.ndarray, losses: np.ndarray) -> None:
        """Per-sample losses of the job's trained batches (ids of its manifest): its
        importance values under ``iis`` (ignored otherwise)."""
        job = self._job(job_id)
        if job.iis is None or not np.size(local_ids):
            return
        local_ids = np.asarray(local_ids, np.int64)
        if local_ids.min() < 0 or local_ids.max() >= job.gids.size:
            raise ConfigError(f"job {job.name!r}: feedback ids out of [0, {job.gids.size})")
        job.iis.feedback(np.searchsorted(job.unique, job.gids[local_ids]), losses)

    def report_benefit(self, job_id: int, benefit: Benefit) -> None:
        """The job's measured benefit (``benefit.py``); the cache is re-divided by it. A
        report with too few hits to tell (``Benefit.conclusive``) keeps the job's last
        saving; a job's first report counts only if conclusive (its cache was cold)."""
        job = self._job(job_id)
        if benefit.conclusive or (job.benefit is not None and job.saving is None):
            job.saving = benefit.saving
        job.benefit = benefit
        self._reallocate()
        self._refresh_importance()

    def _reallocate(self) -> None:
        """Quiver's benefit-aware split of the budget across the datasets' partitions."""
        if self.allocation != "benefit":
            return
        shares = list(self.datasets.values())
        sizes = [d.nbytes if d.jobs else 0 for d in shares]  # no job: nothing to keep
        values = []
        for d in shares:
            savings = [self.jobs[j].saving for j in d.jobs]
            values.append(np.nan if None in savings else sum(savings))
        quota = split_budget(self.capacity_bytes, sizes, values)
        for d, q in zip(shares, quota.tolist(), strict=True):
            self._evict_next += self.policy.resize(d.part, q)

    def _refresh_importance(self) -> None:
        """iCACHE's aggregated importance (III-D) of every sample, for the H-cache."""
        if self.importance is None:
            return
        jobs = [j for j in self.jobs.values() if j.iis is not None]
        eligible = [j for j in jobs if j.benefit and j.benefit.ratio > self.eligible_ratio]
        score = self.importance.score
        old = score.copy()
        score[:] = 0.0
        for j in eligible or jobs:
            pct = j.iis.percentiles()
            riv = np.where(pct >= 1.0 - j.iis.h_fraction, pct, 0.0)  # its H-list only
            score[j.unique] += (j.benefit.ratio if eligible else 1.0) * riv
        cached = self.policy.cached_ids()
        self.policy.scores_updated(cached[score[cached] != old[cached]])

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
            gone = job.pid is not None and job.host == here and not _alive(job.pid)
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
        }


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie (killed, not yet reaped by its parent) is gone for our purposes
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True
