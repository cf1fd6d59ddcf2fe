"""The data plane: CachedDataset executes BatchPlans in DataLoader workers; HotsetLoader
wraps a standard ``torch.utils.data.DataLoader`` and sums the counters.

PyTorch hands whatever a ``batch_sampler`` yields to ``Dataset.__getitems__``, so a
:class:`~hotset.plan.BatchPlan` reaches the worker with no extra channel, and
``num_workers``, ``pin_memory`` and ``persistent_workers`` keep working.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import hashlib
import inspect
import logging
import os
import time
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, replace
from typing import Any, NamedTuple

import numpy as np
import torch
from pydantic import SkipValidation
from torch.utils.data import DataLoader, Dataset

from hotset.arguments import Int, IntPair, Real, checked
from hotset.checkpoint import from_safe, to_safe
from hotset.codecs import decode_sample, to_tensor
from hotset.collate import collate, split_sample
from hotset.distributed import RankGroup, detect_ranks, node_name
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
from hotset.plan import BatchPlan, Planner, PlanReport, PlanSource
from hotset.plan_process import PlannerProcess
from hotset.policy import POLICIES
from hotset.policy.base import make_policy, policy_class
from hotset.progress import progress
from hotset.sampling.base import make_sampler, sampler_class
from hotset.sampling.blocks import check_order
from hotset.stats import EpochStats, LoaderStats
from hotset.storage.base import Storage
from hotset.storage.decoded import DecodedStorage
from hotset.storage.open import open_storage
from hotset.store import Store, make_store
from hotset.store.base import NamespacedStore
from hotset.store.shared import SharedStore
from hotset.store.tiered import PREFIX as TIERED
from hotset.store.tiered import TieredStore
from hotset.systems import SYSTEMS, resolve_system

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


#: ``counters()``'s keys at the top (the rest are under ``"internal"``)
USER_COUNTERS = (
    "batches", "samples", "accesses", "hits", "exact_hits", "substitute_hits", "misses",
    "late_misses", "hit_ratio", "storage_reads", "storage_bytes", "storage_requests",
    "storage_retries", "storage_wait_s", "store_failures", "corrupt_hits", "skipped",
    "planning_s", "feedback_s", "service_failures", "service_rejoins",
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
        stats.bytes_from_storage += sum(len(v) for v in got.values())
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
        ``prefix``: of the entries' keys (``STAGE``: samples staged by read-ahead).
        ``until``: stop waiting once it holds (after one more look): the writers are done.
        Returns the ids whose entry was wrong."""
        t = time.perf_counter()
        deadline = t + wait_s
        wrong, unpack = [], self.storage.from_entry
        pending = [i for i in ids if i not in got]
        keys = dict(zip(pending, self.keys.take(pending), strict=True))  # one pass, not one a key
        while pending:
            seen = self.arrivals.seen()  # before the look: a write after it wakes the wait
            over = until is not None and until()
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
        """Put the samples read ahead for later batches into the staging area."""
        keys, pack = self.keys, self.storage.to_entry
        items = {STAGE + keys[i]: pack(keys[i], have[i]) for i in ids if i in have}
        _, refused = self.store.put(items) if items else (0, [])
        self.arrivals.landed()
        stats.readahead_staged = len(items) - len(refused)

    def _store_changes(
        self, plan: BatchPlan, got: dict[int, bytes], fetched: dict[int, bytes]
    ) -> list[int]:
        """Step 3: the plan's evictions, then its admissions (and prefetches); returns the
        admitted and fetched ids the store does not hold afterwards."""
        keys = self.keys
        if plan.evicted.size:
            self.store.delete_many([keys[i] for i in plan.evicted.tolist()])
        if plan.evict_keys:
            self.store.delete_store_keys(list(plan.evict_keys))
        wanted = list(dict.fromkeys(plan.admitted.tolist() + list(fetched)))
        have = {**fetched, **got}
        pack = self.storage.to_entry
        items = {keys[i]: pack(keys[i], have[i]) for i in wanted if i in have}
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
        return [i for i in wanted if i not in have or keys[i] in refused]

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
        if not isinstance(plan, BatchPlan):  # a plain batch_sampler: read from storage
            plan = BatchPlan.uncached(plan)
        if plan.merge_gap >= 0:  # the gap the planner's measured latency says
            self.storage.merge_gap = plan.merge_gap
        stats, causes = LoaderStats(), []
        failures0 = self.store.failures
        got: dict[int, bytes] = {}
        # an id this plan admits is read once, from storage, even where a later position
        # of the batch plans it as a hit (sampling with replacement)
        admitted = set(plan.admitted.tolist())
        hit_pos = plan.ids[plan.hits].tolist()
        from_store = [i for i in dict.fromkeys(hit_pos) if i not in admitted]
        wrong = self._read_hits(from_store, got, stats, 0.0)
        # the plan's misses first, and their admissions: another job's (or worker's) plan
        # may be waiting for them while this one waits for its own planned hits
        planned = set(from_store)
        misses = [i for i in dict.fromkeys(plan.ids.tolist()) if i not in planned]
        late = self._staged_landed(plan, misses, got, stats) if plan.staged.size else []
        # one storage call: the misses (less those an earlier plan is reading ahead), the
        # plan's fetches and what it reads ahead for later batches
        coming = set(late)
        need = [i for i in misses if i not in got and i not in coming]
        wanted = dict.fromkeys(need + plan.fetch.tolist() + plan.stage.tolist())
        try:
            read = self._read_storage([i for i in wanted if i not in got], stats, causes)
            got.update((i, read[i]) for i in need if i in read)
            have = {**read, **got}
            t = time.perf_counter()
            if plan.stage.size:  # first: a later batch's worker may be waiting for them
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
        if plan.unstage.size:  # staged entries this batch was the last one for
            self.store.delete_many([STAGE + self.keys[i] for i in plan.unstage.tolist()])
            self.arrivals.landed()  # room freed
        lost = self._store_changes(plan, got, fetched)
        stats.store_s += time.perf_counter() - t
        if plan.wait_s > 0 and any(i not in got for i in from_store):
            before = len(got)
            wrong += self._read_hits(from_store, got, stats, plan.wait_s)
            stats.waited_hits = len(got) - before
        stats.store_failures = self.store.failures - failures0
        stats.refused_puts = len(lost)  # writes that did not land, whatever the reason
        stored = set(from_store) & set(got)
        served_once = stored | (admitted & set(got))  # from the store, or this batch's read
        stats.hits = sum(1 for i in hit_pos if i in served_once)
        if plan.substituted is not None:
            subs = plan.ids[plan.substituted & plan.hits].tolist()
            stats.substitute_hits = sum(1 for i in subs if i in served_once)
        stats.bytes_from_store = sum(len(got[i]) for i in stored)
        stats.late_misses = len(hit_pos) - stats.hits
        stats.misses = len(plan) - len(hit_pos)
        absent = [i for i in from_store if i not in got]
        if absent:  # planned hits that were not there: from storage, counted
            got.update(self._read_storage(absent, stats, causes))

        t = time.perf_counter()
        served, inputs, targets = self._decode_batch(plan.ids.tolist(), got, stats, causes)
        stats.decode_s = time.perf_counter() - t
        if len(plan) and len(plan) - len(served) > self.max_skipped * len(plan):
            raise SkipLimitError(
                f"a batch lost {len(plan) - len(served)} of its {len(plan)} samples "
                f"(more than max_skipped={self.max_skipped:g}); first cause: "
                f"{causes[0] if causes else 'unknown'}"
            )
        served_ids = np.array(served, dtype=np.int64)
        stats.batches, stats.samples = 1, int(served_ids.size)
        report = PlanReport(
            stored=np.array([i for i in dict.fromkeys([*admitted, *fetched]) if i not in lost],
                            np.int64),
            lost=np.array(lost, np.int64),
            absent=np.array(list(dict.fromkeys(absent + wrong)), np.int64),
            causes=causes[:3], requests=stats.storage_requests, wire_bytes=stats.wire_bytes,
            storage_s=stats.storage_wait_s, in_flight_s=stats.in_flight_s,
        )  # fmt: skip
        # Only the inputs travel as a tensor (shared memory, one fd per tensor); the small
        # id and label arrays are pickled inline and become tensors in the loader.
        return {
            "inputs": inputs,
            "targets": targets,
            "ids": served_ids,
            "stats": asdict(stats),
            "report": report,
        }


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
            n += getattr(self.planner, "resumed_batches", lambda: 0)()
        return n

    def __iter__(self) -> Iterator[Batch]:
        self._check_open()
        self._feedback.flush()  # (an epoch left early)
        if self._iterated and not self._epochs_set:
            self._next_epoch()
        self._iterated = True
        if not self._synced:  # a store an earlier job left: adopt what the plan holds
            self.sync_with_store()
        if getattr(self.planner, "readahead", None) is not None:
            self._drop_staged()
        batches = iter(self.dataloader)
        before, start = self.counters(), time.perf_counter()
        try:
            yield from self._epoch(batches)
        except Exception:  # the workers stop now, not when a later collection finds them
            _stop_workers(self.dataloader, batches)
            raise
        finally:  # (an epoch left early counts what it did)
            with contextlib.suppress(Exception):  # never hide the epoch's own error
                self.epoch_stats.append(EpochStats.between(
                    self.epoch, time.perf_counter() - start, before, self.counters()
                ))  # fmt: skip

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
        ranks = getattr(self.planner, "ranks", None)
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
        batch size, system, options, world size, hotset version) is refused, naming them:
        it would skip or repeat samples."""
        state = from_safe(state)
        self._feedback.flush()  # (the saved plan replaces what it changed)
        if self.fits is not None:
            saved = state.get("fits") or {}
            diff = [
                f"{k}: saved {saved.get(k)!r}, this loader {v!r}"
                for k, v in self.fits.items()
                if saved.get(k) != v
            ]
            if diff:
                raise ConfigError(
                    "this state was saved by a loader made differently; make the loader "
                    "with the saved run's arguments (" + "; ".join(diff) + ")"
                )
        self.planner.load_state_dict(state["planner"])
        self._count_from_start = bool(state.get("count_from_epoch_start", False))
        self.set_epoch(int(state["planner"]["epoch"]))
        self.stats = LoaderStats(**state["stats"])
        self._synced = False  # the store may hold what the saved plan does, or not

    def __enter__(self) -> HotsetLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def cache_capacity(
    storage: Storage, cache_fraction: float | None, capacity_bytes: int | None
) -> int:
    """Bytes for a cache given either a fraction of the dataset or a byte count."""
    if (cache_fraction is None) == (capacity_bytes is None):
        raise ConfigError("give exactly one of cache_fraction and capacity_bytes")
    if capacity_bytes is not None:
        if capacity_bytes < 0:
            raise ConfigError(f"capacity_bytes must be >= 0, got {capacity_bytes}")
        return int(capacity_bytes)
    if not 0.0 <= cache_fraction <= 1.0:
        raise ConfigError(f"cache_fraction must be in [0, 1], got {cache_fraction}")
    return int(cache_fraction * storage.manifest.total_bytes)


@checked
def make_loader(
    storage: SkipValidation[Storage | str | os.PathLike[str] | Sequence[str] | Dataset[Any]],
    *,
    batch_size: Int,
    system: str | None = None,
    policy: str | None = None,
    cache_fraction: Real | None = None,
    capacity_bytes: Int | None = None,
    store: str | Store = "shared",
    sampler: str | None = None,
    seed: Int = 0,
    num_replicas: Int = 1,
    rank: Int = 0,
    num_workers: Int = 2,
    decode: Callable[[bytes], Any] | None = None,
    transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
    size: IntPair | None = None,
    mode: str | None = None,
    collate_fn: Callable[..., Any] | None = None,
    format: str | None = None,
    storage_options: dict[str, Any] | None = None,
    input_field: str | list[str] | None = None,
    target_field: str | list[str] | None = None,
    on_error: str = "raise",
    max_skipped: Real = 0.5,
    drop_last: bool = False,
    progress: bool = False,
    policy_options: dict[str, Any] | None = None,
    sampler_options: dict[str, Any] | None = None,
    package_dir: str | os.PathLike[str] | None = None,
    with_ids: bool = True,
    distributed: bool | None = None,
    sync_every: Int = 1,
    readahead_bytes: Int | None = None,
    cache_decoded: bool = False,
    defer_feedback: bool | None = None,
    planner_process: bool = False,
    order: str = "paper",
    block_size: Int = 2048,
    epochs: Int | None = None,
    **dataloader_kwargs: Any,
) -> HotsetLoader:
    """One call from a dataset to a cached loader: store, policy, sampler, planner, loader.

    Args:
        storage: where the samples live: a path or fsspec URL (a ``hotset prepare``
            tree, an ImageFolder, WebDataset ``.tar`` shards, Parquet files, a Hugging
            Face ``save_to_disk`` directory: detected, or named by ``format``), a
            map-style torch ``Dataset`` (``hotset.from_dataset``), or a ``Storage``.
        format: ``files``, ``imagefolder``, ``tar``, ``parquet`` or ``hf``.
        storage_options: fsspec options of the URL (credentials, endpoint, ...): for an
            S3-compatible server, ``{"client_kwargs": {"endpoint_url": ...}}`` (or set
            ``AWS_ENDPOINT_URL``).
        input_field, target_field: for tar shards and tables, the field (column) a
            batch's inputs and targets come from, or a list of them (each then a dict of
            those fields); default: the image field, and a label field where there is one.
        batch_size: samples per batch.
        system: a published system by name, exactly as ``hotset compare --systems``
            measures it (``hotset.SYSTEMS``: ``shade``, ``icache``, ``spider``, or a
            baseline policy under uniform shuffling: ``lru``, ``minio``, ``belady``, ...):
            its sampler, policy and options; ``sampler_options`` / ``policy_options``
            override single options. Or build one from parts:
        policy: the cache policy by name (``hotset.POLICIES``, default ``lru``):
            ``lru``, ``minio``, ``belady``, ``app`` (SHADE's), ``icache``, ``spider``, ...
        cache_fraction: the cache's size as a fraction of the dataset's bytes, or
        capacity_bytes: its size in bytes (give exactly one of the two).
        store: where cached bytes live: ``"shared"`` (LMDB on /dev/shm, shared by the
            workers), ``"memory"`` (this process only: ``num_workers=0``), a
            ``redis://`` URL (each made for this loader and removed by ``close()``), or
            a ``Store`` holding at least the capacity (the caller's to close).
        sampler: what each epoch reads, by name (``hotset.SAMPLERS``, default
            ``uniform``): ``uniform``, ``shade``, ``iis``, ``spider``. ``uniform`` with
            ``sampler_options={"shuffle": "shards", "shuffle_block": 2048}``: a
            shard-local shuffle, as Streaming's (fewer range requests, not a uniform
            draw; hotset's option).
        seed: seeds the sampler's orders and the policy's random choices.
        num_replicas, rank: data-parallel sharding, as ``DistributedSampler``'s; taken
            from ``torch.distributed`` when it is initialised (``distributed``).
        distributed: plan once for all ranks (``hotset.distributed``): every rank draws
            the same global list from every rank's feedback and serves its shard, all
            with equal batch counts, over one store of ``capacity`` bytes (``shared``: one
            LMDB the node's ranks share; a Redis URL across nodes). Default: when
            ``torch.distributed`` is initialised with several ranks.
        sync_every: with ranks, exchange feedback every this many steps.
        readahead_bytes: where samples are ranges of larger objects (tar shards), later
            batches' misses that a batch's range requests can read at no extra request
            are read with it and held in the store until their batch, at most this many
            bytes at once, beside the cache's capacity (``io/readahead.py``; hotset's,
            not a paper's). Default: ``DEFAULT_READAHEAD`` of the dataset's bytes, at
            most 64 MiB (and what a given ``store`` holds beyond the capacity); 0: off.
            Not with ranks (``distributed``).
        cache_decoded: the cache holds samples decoded (arrays), not their encoded
            bytes: a hit costs no image decode, but each sample takes its decoded size
            of the same budget (``cache_fraction`` is of the encoded dataset's bytes;
            ``loader.budget`` shows bytes per sample both ways and how many samples
            fit). Samples must decode to one size (give ``size=``). hotset's option.
        planner_process: plan in a process of its own (``plan_process.py``, Linux),
            one batch ahead of the DataLoader's requests, so that the control plane runs
            beside the training step on another core instead of on the training thread
            (where, under many ranks and a short step, SHADE's and iCACHE's planning of
            the global batch is as long as the step). Plans see feedback a batch later.
            hotset's option.
        defer_feedback: ``feedback`` of a batch whose losses are on a GPU is learnt when
            the next batch's comes (default ``None``: so; ``True``: every batch's, also
            from the CPU; ``False``: each at once, waiting for its step to finish). The
            copy of the losses overlaps the step and the planning of the next batches
            overlaps the GPU's work; the plans made meanwhile see that batch's feedback
            one batch later (hotset's option: the papers feed back each step).
        order: ``"paper"`` (default): each epoch in the order its system draws it;
            ``"blocks"``: the same draw (the same ids, as often) read by blocks of shards,
            as MosaicML Streaming's ``py1b`` shuffle reads a uniform epoch: the shards in
            a random order, the ids shuffled within windows of ``block_size``. A window's
            misses are then a few whole shards, one request each, instead of about one
            request per missed sample; batches mix less (with shards written class by
            class, a batch holds few classes). For tar shards; hotset's option
            (docs/systems.md).
        block_size: ids per shuffle window of ``order="blocks"``; a window's misses should
            fit the read-ahead budget (``loader.budget``).
        epochs: how many epochs the run trains, for a system that schedules over the whole
            run (SpiderCache's elastic cache manager, Eq. 5-8: required there); others
            take it and need it not.
        num_workers: DataLoader worker processes executing the plans.
        decode: bytes -> a sample (default: ``.npy``, any PIL image in its own mode, or
            a record of fields: ``codecs.decode_sample``).
        transform: per-sample input tensor -> tensor, after decoding.
        size: (width, height) every image is resized to as it is decoded (images of
            mixed sizes cannot be stacked otherwise).
        mode: the PIL mode images are converted to (``"RGB"``, ``"L"``); default: their
            own (palette images as RGB).
        collate_fn: the served ``(input, target)`` pairs -> the batch's inputs, or a pair
            of inputs and targets (default: one stacked tensor; dict samples collated as
            torch's ``default_collate`` does).
        on_error: ``"raise"`` on a missing, corrupt or undecodable sample, or ``"skip"``
            it (counted in ``skipped``).
        max_skipped: with ``"skip"``, the share of a batch that may be lost before
            ``SkipLimitError`` (an epoch that serves nothing raises it too).
        drop_last: drop the last incomplete batch of each epoch.
        progress: show each epoch's progress (a tqdm bar on a terminal, else a line on
            stderr every 10 s).
        policy_options: keyword arguments of the policy's constructor.
        sampler_options: keyword arguments of the sampler's constructor (a sampler that
            ``needs_labels``, ``spider``, gets the storage's unless given).
        package_dir: where a policy's feeder writes its files (``icache``'s packages),
            beside the storage (default: a temporary directory removed by ``close()``).
        with_ids: yield ``(inputs, targets, ids)`` (default) or ``(inputs, targets)``
            with the ids in ``loader.last_ids`` (``feedback(losses=...)`` uses them).
        **dataloader_kwargs: passed to ``torch.utils.data.DataLoader`` (``pin_memory``,
            ``persistent_workers``, ``prefetch_factor``, ...); hotset sets the batch
            sampler and collation itself.
    """
    sampler, policy, sampler_options = _parts(system, sampler, policy, sampler_options)
    sampler_options = _run_length(sampler, sampler_options, epochs)
    check_order(order, block_size)
    _check_dataloader(num_workers, dataloader_kwargs)  # before anything is opened
    fields = {"input_field": input_field, "target_field": target_field}
    storage = open_storage(storage, format, storage_options,
                           **{k: v for k, v in fields.items() if v is not None})  # fmt: skip
    capacity = cache_capacity(storage, cache_fraction, capacity_bytes)
    ranks = detect_ranks(distributed)
    readahead = _readahead_bytes(storage, readahead_bytes, ranks, store, capacity)
    storage, decode, budget = _what_is_cached(
        storage, decode, size, mode, cache_decoded, capacity, readahead
    )
    if ranks is not None:
        num_replicas, rank = 1, 0  # the sampler draws the global list; the planner shards
        sampler_options, policy_options = _deterministic(
            sampler, policy, sampler_options, policy_options
        )
    elif num_replicas > 1 and sampler_class(sampler).learns_from_feedback:
        raise ConfigError(
            f"sampler {sampler!r} learns from each rank's feedback: with num_replicas > 1 "
            "initialise torch.distributed so that the ranks plan together"
        )
    owns_store = isinstance(store, str)
    store = _sized_store(store, capacity, readahead, ranks)
    # one dataset's entries: another job's planner on the same store never touches them
    namespace = dataset_namespace(storage.keys)
    store = NamespacedStore(store, namespace)
    release = planner = None
    try:
        if ranks is None or ranks.rank == 0:  # one job: its ranks plan together
            release = store.claim()
        sampler_options = _data_options(sampler, sampler_options, storage)
        plan_with = functools.partial(
            _planner, policy=policy, policy_options=policy_options, sampler=sampler,
            sampler_options=sampler_options, capacity=capacity, seed=seed,
            num_replicas=num_replicas, rank=rank, storage=storage, store=store,
            planner_options={
                "batch_size": batch_size, "drop_last": drop_last,
                "package_dir": None if package_dir is None else os.fspath(package_dir),
                "sync_every": sync_every, "readahead_bytes": readahead, "order": order,
                "block_size": block_size,
            },
        )  # fmt: skip
        dataset = CachedDataset(
            storage, store, decode=decode, transform=transform, on_error=on_error,
            max_skipped=max_skipped, collate_fn=collate_fn,
        )  # fmt: skip
        if planner_process and not store.shared_across_processes:
            raise ConfigError(
                f"planner_process=True: store {type(store.inner).__name__} is private to one "
                "process, and the planner's process reconciles with it (iCACHE's packager "
                "writes to it): use a shared store ('shared' or a Redis URL)"
            )
        planner = PlannerProcess(plan_with, dataset, ranks) if planner_process else plan_with(ranks)
        fits = {
            "hotset": _version(), "dataset": namespace, "samples": len(storage),
            "batch_size": batch_size, "drop_last": drop_last, "seed": seed,
            "sampler": sampler, "sampler_options": _digest(sampler_options),
            "policy": policy, "policy_options": _digest(policy_options),
            "capacity_bytes": capacity, "cache_decoded": bool(cache_decoded),
            "order": order if order == "paper" else f"{order}/{block_size}",
            "world": ranks.world if ranks is not None else num_replicas,
            "rank": None if ranks is not None else rank,  # ranks: one global plan
        }  # fmt: skip
        return HotsetLoader(
            dataset, planner, num_workers=num_workers, progress=progress,
            owns_store=owns_store, release=release, fits=fits, with_ids=with_ids,
            budget=budget, defer_feedback=defer_feedback, **dataloader_kwargs,
        )  # fmt: skip
    except BaseException:
        if planner is not None:
            planner.close()
        _release(store, owns_store, release)  # nothing else ever will
        raise


def _what_is_cached(
    storage: Storage, decode: Callable | None, size, mode, cache_decoded: bool, capacity: int,
    readahead: int,
) -> tuple[Storage, Callable, dict]:  # fmt: skip
    """The storage the cache holds (its samples decoded where ``cache_decoded``), the
    decoder of what it serves, and the budget, in samples both ways (``loader.budget``)."""
    identity = f"{_name(decode)}|{size}|{mode}"  # what makes the decoded form
    if decode is None:
        decode = functools.partial(decode_sample, size=size, mode=mode)
    encoded = float(storage.sizes.mean()) if len(storage) else 0.0
    if cache_decoded:
        storage, decode = DecodedStorage(storage, decode, identity), decode_sample
    cached = float(storage.sizes.mean()) if len(storage) else 0.0
    budget = {
        "capacity_bytes": capacity, "readahead_bytes": readahead,
        "cache_decoded": bool(cache_decoded),
        "encoded_bytes_per_sample": encoded, "cached_bytes_per_sample": cached,
        "samples_in_cache": int(capacity // cached) if cached else 0,
        "samples_in_cache_encoded": int(capacity // encoded) if encoded else 0,
    }  # fmt: skip
    return storage, decode, budget


def _sized_store(store: str | Store, capacity: int, readahead: int, ranks) -> Store:
    """The store a URL names, opened to hold the cache and the read-ahead; a store given
    is checked to hold them."""
    if isinstance(store, str):
        return _open_store(store, capacity + readahead, ranks)
    if store.capacity_bytes < capacity + readahead:
        raise ConfigError(
            f"store holds {store.capacity_bytes} bytes, the policy plans for {capacity}"
            + (f" and read-ahead for {readahead}" if readahead else "")
        )
    return store


def _data_options(sampler: str, options: dict | None, storage: Storage) -> dict:
    """The sampler's options with what it takes from the data: the labels (a sampler
    that ``needs_labels``), each sample's shard (a shard-local shuffle)."""
    options = dict(options or {})
    if sampler_class(sampler).needs_labels:
        options.setdefault("labels", storage.labels)
    if options.get("shuffle") == "shards" and storage.extents is not None:
        options.setdefault("objects", storage.extents[0])  # the shard of each
    return options


def _planner(
    group: RankGroup | None, *, policy: str, policy_options: dict | None, sampler: str,
    sampler_options: dict, capacity: int, seed: int, num_replicas: int, rank: int,
    storage: Storage, store: Store, planner_options: dict,
) -> Planner:  # fmt: skip
    """A planner over a new policy and sampler (in this process, or in the planner's)."""
    pol = make_policy(policy, capacity, sizes=storage.sizes, seed=seed, **(policy_options or {}))
    smp = make_sampler(sampler, len(storage), num_replicas=num_replicas, rank=rank, seed=seed,
                       **sampler_options)  # fmt: skip
    return Planner(smp, pol, storage=storage, store=store, ranks=group, **planner_options)


#: make_loader's own arguments (a typo of one is told apart from a DataLoader's)
MAKE_LOADER_ARGS = list(inspect.signature(make_loader).parameters)[:-1]  # (not **kwargs)


def _run_length(sampler: str, sampler_options: dict | None, epochs: int | None) -> dict | None:
    """``sampler_options`` with the run's length where the sampler schedules over it
    (``total_epochs``, from ``epochs``); refused where it is needed and missing."""
    if not sampler_class(sampler).needs_epochs:
        return sampler_options
    options = dict(sampler_options or {})
    given = options.get("total_epochs")
    if epochs is not None and given is not None and given != epochs:
        raise ConfigError(f"epochs={epochs} and sampler_options total_epochs={given}: give one")
    if epochs is None and given is None:
        raise ConfigError(
            f"sampler {sampler!r} schedules its cache over the whole run (its elastic "
            "manager's horizon): give make_loader epochs=N, the number of epochs you train"
        )
    options["total_epochs"] = given if given is not None else epochs
    return options


def _refuse_planner_args(kwargs: dict) -> None:
    """DataLoader arguments the plan decides: refused, naming the first given."""
    for k in ("batch_size", "shuffle", "sampler", "batch_sampler", "collate_fn", "drop_last"):
        if k in kwargs:
            raise ConfigError(f"{k} is set by hotset's planner; do not pass it to the loader")


def _check_dataloader(num_workers: int, kwargs: dict) -> None:
    """Refuse what ``DataLoader`` would refuse (an unknown argument, ``num_workers < 0``,
    a ``prefetch_factor`` without workers, ...) before a store or a lease is made: torch's
    own checks, on an empty loader."""
    known = set(inspect.signature(DataLoader.__init__).parameters) - {"self", "dataset"}
    unknown = [k for k in kwargs if k not in known]
    if unknown:
        close = difflib.get_close_matches(unknown[0], [*known, *MAKE_LOADER_ARGS], n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise TypeError(f"make_loader() got an unexpected keyword argument {unknown[0]!r}{hint}")
    _refuse_planner_args(kwargs)
    try:
        DataLoader([], batch_sampler=[], num_workers=num_workers, **kwargs)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"make_loader: {exc}") from None


def _parts(system: str | None, sampler: str | None, policy: str | None, sampler_options):
    """The sampler, policy and sampler options ``system`` names (the user's options over
    its own), or the parts given (default: uniform + LRU)."""
    if system is None:
        if policy in SYSTEMS and policy not in POLICIES:
            raise ConfigError(
                f"policy={policy!r} names a system (sampler, policy and options): did you "
                f"mean system={policy!r}? (its policy alone is "
                f"{SYSTEMS[policy].policy!r})"
            )
        return sampler or "uniform", policy or "lru", sampler_options
    if sampler is not None or policy is not None:
        raise ConfigError(
            f"give system={system!r} or sampler=/policy=, not both (system={system!r} is "
            "a sampler and a policy; override its options with sampler_options= / "
            "policy_options=)"
        )
    named = resolve_system(system)
    return named.sampler, named.policy, {**named.sampler_options, **(sampler_options or {})}


#: the default read-ahead budget, as a share of the dataset's bytes (at most 64 MiB)
DEFAULT_READAHEAD = 0.1


def default_readahead_bytes(storage: Storage) -> int:
    """The read-ahead a loader over ``storage`` gets by default (one rank, a store it
    makes): ``DEFAULT_READAHEAD`` of the dataset's bytes, at most 64 MiB; 0 where its
    samples are not ranges of larger objects."""
    if storage.extents is None:
        return 0
    return min(64 << 20, int(DEFAULT_READAHEAD * storage.manifest.total_bytes))


def _readahead_bytes(
    storage: Storage, given: int | None, ranks: RankGroup | None, store, capacity: int
) -> int:
    """The read-ahead budget: 0 where the storage's samples are not ranges of larger
    objects or ranks plan together; the default fitted to a given store's spare bytes."""
    if given is not None and (not isinstance(given, int | np.integer) or given < 0):
        raise ConfigError(f"readahead_bytes must be an int >= 0, got {given!r}")
    if storage.extents is None or ranks is not None:
        return 0
    if given is not None:
        return int(given)
    auto = default_readahead_bytes(storage)
    if not isinstance(store, str):
        auto = min(auto, max(store.capacity_bytes - capacity, 0))
    return auto


def _name(fn: Callable | None) -> str:
    """A decoder by its qualified name (the default: "default")."""
    if fn is None:
        return "default"
    fn = getattr(fn, "func", fn)  # a functools.partial: its function
    return f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', type(fn).__qualname__)}"


def _version() -> str:
    from hotset import __version__

    return __version__


def _digest(options: dict | None) -> str:
    """A digest of a constructor's options (arrays by their bytes) to compare runs by."""
    digest = hashlib.blake2b(digest_size=8)
    for k, v in sorted((options or {}).items()):
        if isinstance(v, np.ndarray):
            text = f"{v.dtype}{v.shape}{hashlib.blake2b(v.tobytes()).hexdigest()}"
        else:  # an object without a value repr (a function) by its type only
            text = type(v).__qualname__ if " at 0x" in repr(v) else repr(v)
        digest.update(f"{k}={text};".encode())
    return digest.hexdigest()


def _deterministic(sampler: str, policy: str, sampler_options, policy_options):
    """Options that make a rank's planning a function of what all ranks exchange:
    iCACHE's packages in the planner's thread, not in background threads (SpiderCache's
    graph scores in the background on one rank, and its scores reach every rank alike in
    the exchange: ``graph_rank``)."""
    sampler_options, policy_options = dict(sampler_options or {}), dict(policy_options or {})
    if "package_threads" in inspect.signature(policy_class(policy)).parameters:
        policy_options.setdefault("package_threads", False)
    return sampler_options, policy_options


def _open_store(spec: str, capacity: int, ranks: RankGroup | None) -> Store:
    """The store ``spec`` names, for this loader (its ``close(destroy=True)`` at the
    loader's close removes only what is its own to remove: a shared LMDB when its last
    user leaves, a Redis namespace the store drew itself). With ranks, rank 0 makes it and the
    others open the same one: ``shared`` only on one node, ``memory`` never; ``shared+`` a
    pooled URL: the pooled tier as the others, and the first rank on each node makes the
    node's LMDB of copies, which its other ranks open."""
    if ranks is None:
        return make_store(spec, capacity)
    if spec.startswith(TIERED):
        nodes = ranks.all_gather(node_name(), call="make_loader's store")
        first = nodes.index(nodes[ranks.rank])  # the node's first rank makes its LMDB
        local = SharedStore(capacity) if first == ranks.rank else None
        paths = ranks.all_gather(local.path if local else None, call="make_loader's store")
        local = local or SharedStore(capacity, path=paths[first])
        pooled = _made_by_rank_0(spec[len(TIERED) :], capacity, ranks)
        return TieredStore(local, pooled, trims=first == ranks.rank)
    hosts = ranks.hosts()
    if spec == "memory" or (spec.startswith("shared") and hosts > 1):
        raise ConfigError(
            f"store={spec!r} cannot be shared by {ranks.world} ranks on {hosts} "
            "host(s): use 'shared' on one node, or a redis:// or redis+cluster:// URL "
            "('shared+' before it for node-local copies in front)"
        )
    return _made_by_rank_0(spec, capacity, ranks)


def _made_by_rank_0(spec: str, capacity: int, ranks: RankGroup) -> Store:
    """Rank 0 makes the store ``spec`` names; the others open the same entries."""
    store = make_store(spec, capacity) if ranks.rank == 0 else None
    same = ranks.broadcast(store.spec if store is not None else None, call="make_loader's store")
    return store if store is not None else make_store(same, capacity)


def dataset_namespace(keys: list[str]) -> str:
    """A prefix for a dataset's store keys: a digest of its manifest's keys."""
    digest = hashlib.blake2b(digest_size=6)
    for k in keys:
        digest.update(k.encode())
    return digest.hexdigest() + ":"
