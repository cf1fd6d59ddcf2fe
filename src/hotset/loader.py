"""The data plane: CachedDataset executes BatchPlans in DataLoader workers; HotsetLoader
wraps a standard ``torch.utils.data.DataLoader`` and sums the counters.

PyTorch hands whatever a ``batch_sampler`` yields to ``Dataset.__getitems__``, so a
:class:`~hotset.plan.BatchPlan` reaches the worker with no extra channel, and
``num_workers``, ``pin_memory`` and ``persistent_workers`` keep working.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import time
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, replace
from typing import Any, NamedTuple

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from hotset.checkpoint import from_safe, to_safe
from hotset.codecs import decode_sample, to_tensor
from hotset.collate import collate, split_sample
from hotset.errors import (
    ConfigError,
    CorruptSampleError,
    HotsetError,
    LoaderClosed,
    SampleError,
    SkipLimitError,
)
from hotset.feedback import ArrayLike, DeferredFeedback, IdsLike, as_numpy
from hotset.io.arrivals import Arrivals
from hotset.io.readahead import STAGE
from hotset.plan import BatchPlan, PlanReport, PlanSource
from hotset.progress import progress
from hotset.stats import EpochStats, LoaderStats
from hotset.storage.base import Storage
from hotset.store import Store

log = logging.getLogger(__name__)

ON_ERROR = ("raise", "skip")


class Batch(NamedTuple):
    """A served batch: ``inputs, targets, ids = batch``; ``ids`` are the samples actually
    served (feed losses back against these, never against the positions drawn).
    ``inputs`` is a tensor, or what dict samples or a ``collate_fn`` collate to;
    ``targets`` is None where the samples have none."""

    inputs: Any
    targets: Any
    ids: torch.Tensor


#: the key of a state taken during a streamed first epoch (``first_epoch.py``)
STREAMED = "streamed_first_epoch"


def shards_id(urls: Sequence[str]) -> str:
    """What names a tar set in a state taken during its streamed first epoch."""
    return hashlib.blake2b("\n".join(urls).encode(), digest_size=8).hexdigest()


def check_streamed(state: dict, urls: Sequence[str]) -> None:
    """Refuse a state taken during another dataset's streamed first epoch, by name."""
    if state.get("shards") != shards_id(urls):
        raise ConfigError(
            "this state was taken during the streamed first epoch of other tar shards "
            f"(dataset: saved {state.get('shards')!r}, this loader {shards_id(urls)!r}): "
            "load it into a loader of the saved run's shards"
        )


#: ``counters()``'s keys at the top (the rest are under ``"internal"``)
USER_COUNTERS = (
    "batches", "samples", "accesses", "hits", "exact_hits", "substitute_hits", "misses",
    "late_misses", "hit_ratio", "storage_reads", "storage_bytes", "storage_requests",
    "storage_retries", "storage_wait_s", "store_failures", "corrupt_hits", "skipped",
    "planning_s", "feedback_s", "service_failures", "service_rejoins", "disk_hits",
    "disk_bytes", "disk_failures",
)  # fmt: skip
#: the longest a batch waits for samples an earlier plan stages for it: a bound for a
#: worker that died (a plan that staged, or failed to, says so at once: ``Arrivals``)
STAGED_WAIT_S = 30.0
#: how often a wait looks at the store again for another job's writes (the service's
#: jobs share a store, not a wake-up); this loader's own workers wake it at once
OTHERS_POLL_S = 0.005


class CachedDataset(Dataset):
    """A map-style dataset over ``storage`` whose ``__getitems__`` executes a BatchPlan
    against ``store``: planned hits from the store (each checked against the sample's
    content digest), misses (and late misses) from storage, then the plan's evictions and
    admissions; it reports what really happened (``PlanReport``) with the batch.

    ``decode`` turns a sample's bytes into an array or a dict of fields (default:
    ``.npy``, any PIL image, or a record of fields); ``collate.py`` takes each sample's
    input and target and makes the batch: one float tensor (uint8 pixels scaled to
    [0, 1]), ``transform`` run per input first, or the user's ``collate_fn``.
    ``on_error="skip"`` drops a
    sample that cannot be read or decoded (counted in ``skipped``); a batch that loses
    more than ``max_skipped`` of its samples raises ``SkipLimitError`` with the cause.

    ``dataset[i]`` alone reads from storage, so the object also works as a plain Dataset.
    """

    def __init__(
        self,
        storage: Storage,
        store: Store,
        decode: Callable[[bytes], np.ndarray | torch.Tensor] = decode_sample,
        transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
        on_error: str = "raise",
        max_skipped: float = 0.5,
        collate_fn: Callable | None = None,
    ) -> None:
        if on_error not in ON_ERROR:
            raise ConfigError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
        if not 0.0 <= max_skipped <= 1.0:
            raise ConfigError(f"max_skipped must be in [0, 1], got {max_skipped}")
        self.storage = storage
        self.store = store
        self.decode = decode
        self.transform = transform
        self.collate_fn = collate_fn
        self.on_error = on_error
        self.max_skipped = float(max_skipped)
        self.keys = storage.keys  # content keys: what a hit is checked against
        self.labels = storage.labels
        self.arrivals = Arrivals()  # wakes a worker waiting for another worker's writes

    def __len__(self) -> int:
        return len(self.storage)

    def _decode(self, i: int, data: bytes) -> tuple:
        """Sample ``i``'s ``(input, target)`` from its bytes."""
        try:
            return split_sample(self.storage, i, self.decode(data), self.labels[i])
        except Exception as exc:  # noqa: BLE001 - any decoder failure names the sample
            raise CorruptSampleError(
                i, self.storage.describe(i), f"cannot decode: {exc}", self.keys[i]
            ) from exc

    def __getitem__(self, i: int) -> tuple:
        i = int(i)
        x, y = self._decode(i, self.storage.read(i))
        x = to_tensor(x) if isinstance(x, np.ndarray) else x
        return (self.transform(x) if self.transform is not None else x), y

    def _skip(self, exc: SampleError, stats: LoaderStats, causes: list[str]) -> None:
        if self.on_error == "raise":
            raise exc
        log.warning("skipping %s", exc)
        stats.skipped += 1
        causes.append(str(exc))

    def _read_storage(
        self, ids: list[int], stats: LoaderStats, causes: list[str]
    ) -> dict[int, bytes]:
        """Read ``ids`` from storage; with ``on_error="skip"``, drop unreadable ones."""
        storage = self.storage
        start, retries, requests = time.perf_counter(), storage.retries, storage.requests
        wire, in_flight = storage.wire_bytes, storage.in_flight_s
        disk = storage.disk_counts
        try:
            got = dict(zip(ids, storage.read_many(ids), strict=True))
        except SampleError:
            if self.on_error == "raise":
                raise
            got = {}
            for i in ids:  # find the bad ones, keep the rest
                try:
                    got[i] = storage.read(i)
                except SampleError as exc:
                    self._skip(exc, stats, causes)
        stats.storage_wait_s += time.perf_counter() - start
        stats.storage_retries += storage.retries - retries
        if requests is not None:
            stats.storage_requests += storage.requests - requests
        if wire is not None:
            stats.wire_bytes += storage.wire_bytes - wire
        stats.in_flight_s += storage.in_flight_s - in_flight
        hits, nbytes, failures = (b - a for a, b in zip(disk, storage.disk_counts, strict=True))
        stats.disk_hits += hits
        stats.disk_bytes += nbytes
        stats.disk_failures += failures
        stats.bytes_from_storage += sum(len(v) for v in got.values()) - nbytes
        return got

    def held(self, ids: np.ndarray) -> np.ndarray:
        """Whether the store holds each of ``ids`` now (the truth a planner reconciles
        with)."""
        values = self.store.get_many([self.keys[i] for i in np.asarray(ids).tolist()])
        return np.array([v is not None for v in values], bool)

    def ids_of(self, keys: list[str]) -> np.ndarray:
        """The ids of this dataset's samples among ``keys`` (others are skipped)."""
        ids = self.keys.positions(keys)
        return ids[ids >= 0]

    # -- executing a plan, step by step ------------------------------------------------
    def _read_hits(
        self,
        ids: list[int],
        got: dict[int, bytes],
        stats: LoaderStats,
        wait_s: float,
        prefix: str = "",
        until: Callable[[], bool] | None = None,
        poll_s: float = OTHERS_POLL_S,
    ) -> list[int]:
        """Step 1 (and 4): the planned hits from the store, each checked against its
        content digest; a wrong entry is counted, deleted and never served. With
        ``wait_s``, wait that long for hits another worker or job is still writing: woken
        as a write of this loader's workers lands (``Arrivals``), looking again every
        ``poll_s`` for another job's (the service's co-operative misses; ``None``: the
        writers are this loader's workers).
        ``prefix``: of the entries' keys (``STAGE``: samples staged by read-ahead, which
        with a disk tier are read from the tier, ``Storage.kept``).
        ``until``: stop waiting once it holds (after one more look): the writers are done.
        Returns the ids whose entry was wrong."""
        t = time.perf_counter()
        deadline = t + wait_s
        wrong, unpack = [], self.storage.from_entry
        pending = [i for i in ids if i not in got]
        keys = dict(zip(pending, self.keys.take(pending), strict=True))  # one pass, not one a key
        on_disk = prefix == STAGE and self.storage.disk_capacity > 0
        if on_disk:  # the tier's bytes, checked by it (a wrong extent is a miss)
            unpack = _as_read
        while pending:
            seen = self.arrivals.seen()  # before the look: a write after it wakes the wait
            over = until is not None and until()
            if on_disk:
                values = self.storage.kept(pending)
            else:
                values = self.store.get_many([prefix + keys[i] for i in pending])
            for i, v in zip(pending, values, strict=True):
                if v is None:
                    continue
                data = unpack(keys[i], v)
                if data is not None:
                    got[i] = data
                else:
                    wrong.append(i)
            if wrong:
                stats.corrupt_hits += len(wrong)
                self.store.delete_many([prefix + keys[i] for i in wrong])
                log.warning(
                    "%d cache entries did not match their sample's digest (first: sample "
                    "%d, key %s): dropped, read from storage", len(wrong), wrong[0],
                    keys[wrong[0]],
                )  # fmt: skip
            pending = [i for i in pending if i not in got and i not in wrong]
            now = time.perf_counter()
            if not pending or over or now >= deadline:
                break
            self.arrivals.wait(seen, min(deadline - now, poll_s or deadline - now))
        stats.store_s += time.perf_counter() - t
        return wrong

    def _staged_landed(
        self, plan: BatchPlan, misses: list[int], got: dict[int, bytes], stats: LoaderStats
    ) -> list[int]:
        """The misses an earlier plan staged for this batch that are in the staging area
        now (into ``got``); returns those still to come (their worker is reading them)."""
        wanted = set(misses)
        staged = [i for i in plan.staged.tolist() if i in wanted]
        self._read_hits(staged, got, stats, 0.0, STAGE)
        stats.readahead_served = sum(1 for i in staged if i in got)
        return [i for i in staged if i not in got]

    def _staged_late(
        self, plan: BatchPlan, late: list[int], got: dict[int, bytes], stats: LoaderStats
    ) -> list[int]:
        """After this batch's own reads: wait (woken as they land) for the staged samples
        still to come, until the plans staging them are done. Returns those that never
        came (read from storage)."""
        if late:
            before = len(got)
            done = functools.partial(self.arrivals.all_finished, plan.staged_by)
            self._read_hits(late, got, stats, STAGED_WAIT_S, STAGE, until=done, poll_s=None)
            stats.readahead_served += len(got) - before
        lost = [i for i in late if i not in got]
        stats.readahead_lost = len(lost)
        return lost

    def _stage(self, ids: list[int], have: dict[int, bytes], stats: LoaderStats) -> None:
        """Put the samples read ahead for later batches into the staging area (with a
        disk tier: the read has put them there)."""
        keys, pack = self.keys, self.storage.to_entry
        staged = sum(1 for i in ids if i in have)
        if not self.storage.disk_capacity:
            items = {STAGE + keys[i]: pack(keys[i], have[i]) for i in ids if i in have}
            staged -= len(self.store.put(items)[1]) if items else 0
        self.arrivals.landed()
        stats.readahead_staged = staged

    def _store_changes(
        self, plan: BatchPlan, got: dict[int, bytes], fetched: dict[int, bytes],
        stats: LoaderStats, causes: list[str],
    ) -> list[int]:  # fmt: skip
        """Step 3: the plan's evictions, then its admissions (and prefetches, and the
        packages it loads: those a resumed plan loads without their bytes are read from
        storage); returns those ids the store does not hold afterwards."""
        keys = self.keys
        if plan.evicted.size:
            evicted = [keys[i] for i in plan.evicted.tolist()]
            self.store.delete_many(evicted)
            self.storage.demoted(evicted)  # the next by the policy's measure: on disk
        if plan.evict_keys:
            self.store.delete_store_keys(list(plan.evict_keys))
        wanted = list(dict.fromkeys(plan.admitted.tolist() + list(fetched)))
        have = {**fetched, **got}
        pack = self.storage.to_entry
        items = {keys[i]: pack(keys[i], have[i]) for i in wanted if i in have}
        # then the packages it loads (iCACHE), as written: rank 0's shard carries them
        items.update((k, e) for i, k, e in plan.package if keys[i] == k)
        unpacked = [i for i in plan.loads.tolist() if keys[i] not in items]
        if unpacked:
            read = self._read_storage([i for i in unpacked if i not in have], stats, causes)
            have.update(read)
            items.update((keys[i], pack(keys[i], have[i])) for i in unpacked if i in have)
        wanted += plan.loads.tolist()
        seen = self.arrivals.seen()
        _, out = self.store.put(items) if items else (0, [])
        if items or plan.evicted.size or plan.evict_keys:
            self.arrivals.landed()
        deadline = time.perf_counter() + plan.wait_s
        while out and time.perf_counter() < deadline:  # earlier plans' deletions to come
            self.arrivals.wait(seen, min(deadline - time.perf_counter(), OTHERS_POLL_S))
            seen = self.arrivals.seen()
            _, out = self.store.put({k: items[k] for k in out})
        refused = set(out)
        return [i for i in wanted if keys[i] not in items or keys[i] in refused]

    def _decode_batch(
        self, ids: list[int], got: dict[int, bytes], stats: LoaderStats, causes: list[str]
    ) -> tuple[list[int], object, object]:
        """Step 5: decode the served samples (an undecodable one is skipped or raised) and
        collate them: ``(served ids, inputs, targets)``."""
        served, samples = [], []
        for i in ids:
            if i not in got:
                continue
            try:
                samples.append(self._decode(i, got[i]))
            except CorruptSampleError as exc:
                self._skip(exc, stats, causes)
                continue
            served.append(i)
        inputs, targets = collate(
            served, samples, self.storage.describe, self.transform, self.collate_fn
        )
        return served, inputs, targets

    def __getitems__(self, plan: BatchPlan) -> dict:
        """Execute ``plan`` (a plain list of ids: read from storage), step by step."""
        if not isinstance(plan, BatchPlan):  # a plain batch_sampler: read from storage
            plan = BatchPlan.uncached(plan)
        if plan.merge_gap >= 0:  # the gap the planner's measured latency says
            self.storage.merge_gap = plan.merge_gap
        run = _Run(plan, self.store.failures)
        run.wrong = self._read_hits(run.from_store, run.got, run.stats, 0.0)  # 1: the hits
        fetched = self._read_plan(run)  # 2: misses, fetches and read-ahead
        lost = self._store_changes(plan, run.got, fetched, run.stats, run.causes)  # 3
        run.stats.store_s += time.perf_counter() - run.read_at
        if plan.wait_s > 0 and any(i not in run.got for i in run.from_store):  # 4: late hits
            before = len(run.got)
            run.wrong += self._read_hits(run.from_store, run.got, run.stats, plan.wait_s)
            run.stats.waited_hits = len(run.got) - before
        absent = self._count(run, lost, self.store.failures)
        if absent:  # planned hits that were not there: from storage, counted
            run.got.update(self._read_storage(absent, run.stats, run.causes))
        t = time.perf_counter()  # 5: decoded and collated
        served, inputs, targets = self._decode_batch(plan.ids.tolist(), run.got, run.stats,
                                                     run.causes)  # fmt: skip
        run.stats.decode_s = time.perf_counter() - t
        if len(plan) and len(plan) - len(served) > self.max_skipped * len(plan):
            raise SkipLimitError(
                f"a batch lost {len(plan) - len(served)} of its {len(plan)} samples "
                f"(more than max_skipped={self.max_skipped:g}); first cause: "
                f"{run.causes[0] if run.causes else 'unknown'}"
            )
        served_ids = np.array(served, dtype=np.int64)
        run.stats.batches, run.stats.samples = 1, int(served_ids.size)
        # Only the inputs travel as a tensor (shared memory, one fd per tensor); the small
        # id and label arrays are pickled inline and become tensors in the loader.
        report = run.report(fetched, lost, absent)
        return {"inputs": inputs, "targets": targets, "ids": served_ids,
                "stats": asdict(run.stats), "report": report}  # fmt: skip

    def _read_plan(self, run: _Run) -> dict[int, bytes]:
        """Step 2: one storage call for the plan's misses (less those an earlier plan is
        reading ahead: its misses first, and their admissions, since another job's or
        worker's plan may wait for them while this one waits for its own planned hits),
        its fetches and what it reads ahead for later batches (staged first: a later
        batch's worker may be waiting for them); then what earlier plans read ahead for
        this one. Returns the fetched samples' bytes."""
        plan, got, stats, causes = run.plan, run.got, run.stats, run.causes
        planned = set(run.from_store)
        misses = [i for i in dict.fromkeys(plan.ids.tolist()) if i not in planned]
        late = self._staged_landed(plan, misses, got, stats) if plan.staged.size else []
        coming = set(late)
        need = [i for i in misses if i not in got and i not in coming]
        wanted = dict.fromkeys(need + plan.fetch.tolist() + plan.stage.tolist())
        try:
            read = self._read_storage([i for i in wanted if i not in got], stats, causes)
            got.update((i, read[i]) for i in need if i in read)
            have = {**read, **got}
            run.read_at = time.perf_counter()  # (the store's time counts from here)
            if plan.stage.size:
                self._stage(plan.stage.tolist(), have, stats)
        finally:
            if plan.stage.size:  # staged or failed: the batches it stages for go on
                self.arrivals.finished(plan.seq)
        fetched = {i: have[i] for i in plan.fetch.tolist() if i in have}
        stats.prefetched = len(fetched)
        if plan.staged.size:  # then wait for what earlier plans read ahead for this one
            lost_staged = self._staged_late(plan, late, got, stats)
            if lost_staged:
                got.update(self._read_storage(lost_staged, stats, causes))
        # staged entries this batch was the last one for (a disk tier keeps its own)
        if plan.unstage.size and not self.storage.disk_capacity:
            self.store.delete_many([STAGE + self.keys[i] for i in plan.unstage.tolist()])
            self.arrivals.landed()  # room freed
        return fetched

    def _count(self, run: _Run, lost: list[int], failures: int) -> list[int]:
        """The batch's hits (a planned hit served from the store, or by this batch's own
        read of what it admits), misses and store failures (``failures``: the store's
        count now); returns the planned hits the store did not hold."""
        plan, got, stats = run.plan, run.got, run.stats
        stats.store_failures = failures - run.failures
        stats.refused_puts = len(lost)  # writes that did not land, whatever the reason
        stored = set(run.from_store) & set(got)
        served_once = stored | (run.admitted & set(got))
        stats.hits = sum(1 for i in run.hit_pos if i in served_once)
        if plan.substituted is not None:
            subs = plan.ids[plan.substituted & plan.hits].tolist()
            stats.substitute_hits = sum(1 for i in subs if i in served_once)
        stats.bytes_from_store = sum(len(got[i]) for i in stored)
        stats.late_misses = len(run.hit_pos) - stats.hits
        stats.misses = len(plan) - len(run.hit_pos)
        return [i for i in run.from_store if i not in got]


class _Run:
    """One plan's execution in a worker: the bytes it has (``got``), its counts and the
    causes of samples skipped, and the planned hits it reads from the store
    (``from_store``: an id the plan admits is read once, from storage, even where a later
    position plans it as a hit, sampling with replacement)."""

    def __init__(self, plan: BatchPlan, failures: int) -> None:
        self.plan, self.failures = plan, failures  # (the store's failures before it)
        self.stats, self.causes = LoaderStats(), []
        self.got: dict[int, bytes] = {}
        self.wrong: list[int] = []  # planned hits whose entry was wrong
        self.read_at = 0.0  # when the plan's storage call returned
        self.admitted = set(plan.admitted.tolist())
        self.hit_pos = plan.ids[plan.hits].tolist()
        self.from_store = [i for i in dict.fromkeys(self.hit_pos) if i not in self.admitted]

    def report(self, fetched: dict, lost: list[int], absent: list[int]) -> PlanReport:
        """What the worker did with the plan, for the planner to reconcile."""
        plan, stats = self.plan, self.stats
        written = dict.fromkeys([*self.admitted, *fetched, *plan.loads.tolist()])
        return PlanReport(
            stored=np.array([i for i in written if i not in lost], np.int64),
            lost=np.array(lost, np.int64),
            absent=np.array(list(dict.fromkeys(absent + self.wrong)), np.int64),
            causes=self.causes[:3], requests=stats.storage_requests,
            wire_bytes=stats.wire_bytes, storage_s=stats.storage_wait_s,
            in_flight_s=stats.in_flight_s,
        )  # fmt: skip


def _as_read(_key: str, data: bytes) -> bytes:
    """A disk tier's sample as it is (the tier checked it against its digest)."""
    return data


def _pass_through(batch: dict) -> dict:
    return batch


def _stop_workers(loader: DataLoader, batches: Iterator) -> None:
    """Stop the worker processes of the DataLoader iterator ``batches`` after an error,
    as its ``__del__`` would (torch's ``_shutdown_workers``): the error's traceback
    keeps the iterator alive, and its clean-up run later by a garbage collection, in the
    middle of other work, waited 5 s for each worker and then killed it (leaving its
    ``pymp-*`` directory in /tmp). Persistent workers are made again next epoch."""
    stop = getattr(batches, "_shutdown_workers", None)
    if stop is not None:
        stop()
        if getattr(loader, "_iterator", None) is batches:
            loader._iterator = None


def _release(store: Store, owns_store: bool, release: Callable[[], None] | None) -> None:
    """A clean close: the store it opened is closed, the job's entries with it (others may
    go on using a named store; a crash leaves them for a resumed job)."""
    if owns_store:
        store.close(destroy=True)
    if release is not None:
        release()


class HotsetLoader:
    """A DataLoader over a :class:`~hotset.plan.PlanSource`: iterate it as usual,
    ``set_epoch`` it as a DistributedSampler, read ``stats`` (or ``counters()``) for what
    happened.

    Batches are ``Batch(inputs, targets, ids)``; with ``with_ids=False`` plain ``(inputs,
    targets)`` pairs (for loops and frameworks that unpack two), the ids then in
    ``last_ids`` and ``feedback(losses=...)`` using them. A loader whose ``set_epoch`` is
    never called (frameworks that do not) advances its epoch by one at each iteration after
    the first, with a warning the first time, instead of repeating one order.

    Each batch's report goes back to the planner as the batch reaches the training loop;
    at the start and end of each epoch a planner that owns its cache is reconciled with
    the store's contents (entries nobody plans for are deleted). ``owns_store``: the
    store was opened for this loader, and ``close()`` (or the interpreter's exit) closes it
    and removes what of it is this loader's to remove. ``release``: called at close too
    (the loader's claim on its entries). ``fits``: what a saved state must match to be
    loaded (``make_loader``'s arguments that shape the plan). ``budget``: the cache's
    bytes, read-ahead's, and bytes per sample as cached and as encoded.
    """

    def __init__(
        self,
        dataset: CachedDataset,
        planner: PlanSource,
        *,
        num_workers: int = 2,
        progress: bool = False,
        desc: str = "",
        owns_store: bool = False,
        release: Callable[[], None] | None = None,
        fits: dict | None = None,
        with_ids: bool = True,
        budget: dict | None = None,
        defer_feedback: bool | None = None,
        **dataloader_kwargs,
    ) -> None:
        if num_workers > 0 and not dataset.store.shared_across_processes:
            raise ConfigError(
                f"store {type(dataset.store).__name__} is private to one process; with "
                f"num_workers={num_workers} use a shared store ('shared' or a Redis URL)"
            )
        _refuse_planner_args(dataloader_kwargs)
        self.dataset = dataset
        self.planner = planner
        self._feedback = DeferredFeedback(planner.feedback, defer_feedback)
        self.progress = progress
        self.desc = desc
        self.stats = LoaderStats()
        #: one ``EpochStats`` per epoch iterated, in order: each epoch's counters
        self.epoch_stats: list[EpochStats] = []
        self.with_ids = with_ids
        self.fits = fits
        self.budget = budget or {}
        self.last_ids: torch.Tensor | None = None  # the ids of the batch yielded last
        self.epoch = 0
        self._epochs_set = False  # whether set_epoch was ever called (or a state loaded)
        self._iterated = False
        self._count_from_start = False  # a loaded state: len counts the resumed epoch whole
        self._warned_store = False
        self._synced = False
        self._drift: tuple = ()  # what suggested the store's budget counter moved unseen
        self._closed = False
        if dataloader_kwargs.get("pin_memory") and not torch.cuda.is_available():
            # torch's DataLoader warns and goes on; so do we (the targets too stay unpinned)
            warnings.warn(
                "pin_memory=True but no accelerator is found: memory will not be pinned",
                stacklevel=3,
            )
            dataloader_kwargs["pin_memory"] = False
        self.dataloader = DataLoader(
            dataset,
            batch_sampler=planner,
            num_workers=num_workers,
            collate_fn=_pass_through,
            **dataloader_kwargs,
        )
        # (after the DataLoader: a loader that failed to be made is its maker's to release)
        self._release = weakref.finalize(self, _release, dataset.store, owns_store, release)

    @property
    def sampler(self) -> HotsetLoader:
        """This loader, where frameworks look for a DataLoader's sampler to call its
        ``set_epoch`` (Lightning's fit loop does, each epoch)."""
        return self

    def set_epoch(self, epoch: int) -> None:
        self._check_open()
        self._feedback.flush()
        self._epochs_set = True
        self.epoch = int(epoch)
        self.planner.set_epoch(epoch)

    def _next_epoch(self) -> None:
        """A new iteration of a loader whose ``set_epoch`` is never called."""
        if self.epoch == 0:
            log.warning(
                "set_epoch was never called: hotset advances the epoch at each iteration "
                "(call loader.set_epoch(epoch) to choose)"
            )
        self.epoch += 1
        self.planner.set_epoch(self.epoch)

    def __len__(self) -> int:
        """The epoch's batches; after a mid-epoch ``load_state_dict``, those left of it
        (or, for a trainer that counts a resumed epoch from its start, as Lightning does,
        all of them: a state saved with ``count_from_epoch_start``)."""
        n = len(self.planner)
        if self._count_from_start:
            n += self.planner.resumed_batches()
        return n

    def __iter__(self) -> Iterator[Batch]:
        self._check_open()
        self._feedback.flush()  # (an epoch left early)
        if self._iterated and not self._epochs_set:
            self._next_epoch()
        self._iterated = True
        if not self._synced:  # a store an earlier job left: adopt what the plan holds
            self.sync_with_store()
        if self.planner.readahead is not None:
            self._drop_staged()
        batches = iter(self.dataloader)
        before, start = self.counters(), time.perf_counter()
        try:
            yield from self._epoch(batches)
        except Exception:  # the workers stop now, not when a later collection finds them
            _stop_workers(self.dataloader, batches)
            raise
        finally:  # (an epoch left early counts what it did)
            try:  # noqa: SIM105 - (not contextlib: an iterator abandoned until the exit
                # runs this after the modules are gone)
                self.epoch_stats.append(EpochStats.between(
                    self.epoch, time.perf_counter() - start, before, self.counters()
                ))  # fmt: skip
            except Exception:  # noqa: BLE001, SIM105 - never hide the epoch's own error
                pass

    def _epoch(self, batches: Iterator[dict]) -> Iterator[Batch]:
        """The epoch's batches from the DataLoader's ``batches``, each plan's report
        consumed as it arrives."""
        bar = progress(batches, len(self), self.desc or f"epoch {self.epoch}", "batches",
                       enabled=self.progress)  # fmt: skip
        pin = self.dataloader.pin_memory
        served, causes = 0, []
        for n, raw in enumerate(bar):
            report: PlanReport = raw["report"]
            if report.absent.size:  # a slow worker's write, or gone for good?
                report = replace(report, absent=report.absent[~self.dataset.held(report.absent)])
            self.planner.batch_consumed(report)
            causes += report.causes
            served += int(raw["ids"].size)
            self.stats.add(raw["stats"])
            if self.stats.store_failures and not self._warned_store:
                self._warned_store = True
                log.warning(
                    "cache store %s failed; reading from storage meanwhile (counted in "
                    "store_failures / late_misses)",
                    type(self.dataset.store).__name__,
                )
            if self.progress and n % 20 == 0:
                bar.set_postfix(hit=f"{self.stats.hit_ratio:.3f}", late=self.stats.late_misses)
            targets = raw["targets"]
            if isinstance(targets, np.ndarray):
                targets = torch.from_numpy(targets)
            if pin and isinstance(targets, torch.Tensor):
                targets = targets.pin_memory()
            self.last_ids = torch.from_numpy(raw["ids"])
            batch = Batch(raw["inputs"], targets, self.last_ids)
            yield batch if self.with_ids else batch[:2]
        self._feedback.flush()  # the last batch's, before the epoch's end
        self.sync_with_store()
        if not served and len(self):
            raise SkipLimitError(
                f"the epoch served no sample; first cause: {causes[0] if causes else 'unknown'}"
            )

    def sync_with_store(self) -> None:
        """Reconcile a planner that owns its cache with what the store holds now: it
        forgets what the store lacks, and entries it does not hold are deleted. With
        ranks: once every rank got here, rank 0 lists the store for all of them and
        alone deletes and recounts."""
        self._synced = True
        self.planner.flush()  # the ranks' last reports: the policy's picture, then the store's
        if not self.planner.owns_cache:
            return
        ranks = self.planner.ranks
        if ranks is not None:
            ranks.barrier()  # every rank's writes of the epoch have landed
        listed = self.planner.reconcile_store(self.dataset)
        if listed and (ranks is None or ranks.rank == 0):
            self._recount()
        self.dataset.store.trim_copies()  # each node drops copies the plan let go

    def _drop_staged(self) -> None:
        """Delete what read-ahead left staged (an abandoned epoch, a staging that came
        after its batch had given up waiting): nothing is staged between epochs."""
        try:
            stale = self.dataset.store.list_keys(STAGE)
        except HotsetError as exc:
            log.debug("cannot list the staging area: %s", exc)
            return
        if stale:
            self.dataset.store.delete_many(stale)

    def _recount(self) -> None:
        """Recount the store's budget when something may have moved it unseen."""
        s, c = self.stats, self.planner.counters()
        drift = (s.store_failures, s.refused_puts, s.late_misses, c["phantoms"], c["sync_fixes"])
        if drift != self._drift:
            self._drift = drift
            self.dataset.store.reconcile()

    @property
    def wants_embeddings(self) -> bool:
        """Whether ``feedback`` needs the batch's embeddings (graph importance)."""
        return self.planner.wants_embeddings

    def feedback(
        self, ids: IdsLike | None = None, losses: ArrayLike | None = None,
        embeddings: ArrayLike | None = None,
    ) -> None:  # fmt: skip
        """Hand back the per-sample losses of a batch, against the ``ids`` it served
        (tensors or arrays; default: the batch yielded last): importance samplers and
        score-keyed policies use them. SpiderCache also needs ``embeddings`` (one row per
        id, from the model's feature layer); see ``wants_embeddings``. Losses on a GPU are
        learnt when the next batch's feedback comes (``make_loader``'s
        ``defer_feedback``): this call does not wait for the step to finish."""
        if losses is None:
            raise ConfigError("feedback: give the batch's per-sample losses")
        if ids is None:
            if self.last_ids is None:
                raise ConfigError("feedback: no batch was served yet; give ids=")
            ids = self.last_ids
        self._feedback.put(as_numpy(ids).astype(np.int64), losses, embeddings)

    def log_to(self, writer: Any, step: int | None = None) -> None:
        """Write the counters users watch (hit ratio, storage reads and bytes, late
        misses, planning and storage-wait seconds, ...) to a TensorBoard
        ``SummaryWriter`` at ``step`` (default: the epoch); see :mod:`hotset.metrics`."""
        from hotset.metrics import log_to

        log_to(writer, self.counters(), self.epoch if step is None else step)

    def report_accuracy(self, accuracy: float) -> None:
        """Validation accuracy after an epoch, for samplers that watch it (SHADE's guard)."""
        self._feedback.flush()
        self.planner.report_accuracy(float(accuracy))

    def counters(self) -> dict[str, Any]:
        """What the loader did, summed over the run (each epoch's apart: ``epoch_stats``):
        the counters a user watches (``USER_COUNTERS``, described in ``LoaderStats``) and,
        under ``"internal"``, hotset's own (read-ahead, the bytes range requests moved,
        the planner's bookkeeping, a system's own figures)."""
        out = self._all_counters()
        user: dict[str, Any] = {k: out.pop(k) for k in USER_COUNTERS if k in out}
        user["internal"] = out
        return user

    def _all_counters(self) -> dict[str, Any]:
        """The data plane's counters (``LoaderStats``) with the control plane's, flat."""
        out = self.stats.as_dict()
        out.update(self.planner.counters())
        out["storage_retries"] += self.dataset.storage.index_retries
        # every request the storage served: planned and late misses, prefetches, the
        # packaging thread's sample reads and the packages loaded from their file
        out["storage_reads"] = (
            out["misses"] + out["late_misses"] + out["prefetched"]
            + out.get("package_storage_reads", 0) + out.get("package_file_reads", 0)
            - out["disk_hits"]
        )  # fmt: skip
        out["storage_bytes"] = (
            out["bytes_from_storage"] + out.get("package_storage_bytes", 0)
            + out.get("package_file_bytes", 0)
        )  # fmt: skip
        return out

    def _check_open(self) -> None:
        if self._closed:
            raise LoaderClosed(
                "this loader is closed (its store and planner are gone): make a new one "
                "with make_loader, or iterate it before close()"
            )

    def close(self) -> None:
        """Stop background threads (iCACHE's packager, SpiderCache's graph worker), leave
        the multi-job service, and remove a store made for this loader."""
        if self._closed:
            return
        self._closed = True
        self.planner.close()
        self.dataset.storage.close()
        self._release()

    def state_dict(self, trained: int | None = None) -> dict[str, Any]:
        """Where training stands (as torch's stateful loaders): save it with the model's
        checkpoint; ``load_state_dict`` in a loader made with the same arguments serves
        exactly the rest of the epoch, then goes on as the saved run would have. Taken at
        any point (before the first batch, between batches, after the last, after
        ``set_epoch``, after an abandoned epoch). ``trained``: the batches of this epoch
        trained on, where fewer than were served (a trainer that fetches ahead)."""
        self._feedback.flush()
        return to_safe({
            "planner": self.planner.state_dict(trained),
            "stats": asdict(self.stats),
            "fits": self.fits,
        })  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``; one saved by a loader of other arguments (dataset,
        batch size, system, options, hotset version) is refused, naming them: it would skip
        or repeat samples. A job of another number of ranks (torch.distributed, or one
        process) loads it: the rest of the saved epoch is served once across its ranks
        (``plan.state.recut``; docs/reliability.md). A state that is not one (edited,
        forged, of another program) is a ``ConfigError`` saying so. On another number of
        ranks, a per-rank batch that keeps the saved global batch (``batch_size`` x ranks)
        is taken too: the rest is served in the saved job's global batches."""
        try:
            state = from_safe(state)
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            raise ConfigError(f"this state cannot be loaded ({type(exc).__name__}: {exc})") from exc
        self._feedback.flush()  # (the saved plan replaces what it changed)
        if state.get(STREAMED):  # taken during a streamed first epoch: it starts again
            check_streamed(state, self.dataset.storage.sources)
            log.warning("a state taken during the streamed first epoch: epoch 0 starts again")
            self.set_epoch(0)
            return
        if self.fits is not None:
            saved = state.get("fits") or {}
            # one global plan (ranks, or one process) carries over to any number of ranks,
            # with the same per-rank batch or the same global batch
            elastic = set()
            if _global(saved) and _global(self.fits):
                elastic = {"world", "rank"}
                if _global_batch(saved) == _global_batch(self.fits):
                    elastic.add("batch_size")
            diff = [
                f"{k}: saved {saved.get(k)!r}, this loader {v!r}"
                for k, v in self.fits.items()
                if saved.get(k) != v and k not in elastic
            ]
            if diff:
                hint, g = "", _global_batch(saved)
                if elastic and g is not None and any(d.startswith("batch_size") for d in diff):
                    m = self.fits.get("world") or 1
                    hint = f"; the saved global batch of {g} " + (
                        f"is batch_size={g // m} on {m} ranks" if g % m == 0
                        else f"does not divide over {m} ranks"
                    )  # fmt: skip
                raise ConfigError(
                    "this state was saved by a loader made differently; make the loader "
                    "with the saved run's arguments (" + "; ".join(diff) + ")" + hint
                )
        try:
            self.planner.load_state_dict(state["planner"])
            self._count_from_start = bool(state.get("count_from_epoch_start", False))
            self.set_epoch(int(state["planner"]["epoch"]))
            self.stats = LoaderStats(**state["stats"])
        except (TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
            raise ConfigError(
                f"this state cannot be loaded ({type(exc).__name__}: {exc}): was it edited, "
                "or saved by another program?"
            ) from exc
        self._synced = False  # the store may hold what the saved plan does, or not

    def __enter__(self) -> HotsetLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

def _global(fits: dict) -> bool:
    """Whether a loader of ``fits`` plans the job's global list: its ranks together
    (torch.distributed), or one process alone; not one replica of several planning its
    own part (``num_replicas`` without torch.distributed)."""
    return fits.get("rank") is None or fits.get("world") == 1


def _global_batch(fits: dict) -> int | None:
    """The global batch of a loader of ``fits``: its ranks' batches together."""
    b = fits.get("batch_size")
    return None if b is None else b * (fits.get("world") or 1)


def _refuse_planner_args(kwargs: dict) -> None:
    """DataLoader arguments the plan decides: refused, naming the first given."""
    for k in ("batch_size", "shuffle", "sampler", "batch_sampler", "collate_fn", "drop_last"):
        if k in kwargs:
            raise ConfigError(f"{k} is set by hotset's planner; do not pass it to the loader")
