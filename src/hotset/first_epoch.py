"""A first epoch that streams remote tar shards while it indexes them
(``make_loader(..., first_epoch="stream")``; hotset's option).

Indexing remote shards reads each of them whole before the first batch (about half an
hour for ImageNet's 140 GB over a 100 MB/s link). Streamed instead, as WebDataset reads
an epoch, the first epoch reads the shards in order into a local spool
(``storage/tar_spool.py``) and serves each shard's samples as it lands, its index kept
in the index cache meanwhile; the first batch waits for one shard. When the epoch ends
the index is whole, and the loader the user asked for is made from it
(``make_loader``'s other arguments); every later epoch is that loader's.

The epoch serves every sample once, under the id the indexed loader gives it (the
samples of the shards before it come first), in an order drawn from a shuffle buffer
(``BUFFER`` samples, at most, and half of those seen) with the loader's seed: a
function of the seed and the shards' sample counts only, never of the link's timing.
Its losses (``feedback``) and accuracies reach the system when its loader is made;
embeddings (SpiderCache's graph) wait for the next epoch. Nothing is cached in it.
``len(loader)`` is known once it ends. A state taken during it resumes it from its
start (docs/reliability.md).
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from hotset.checkpoint import to_safe
from hotset.codecs import encode_record
from hotset.errors import SkipLimitError
from hotset.feedback import ArrayLike, IdsLike, as_numpy, checked_shape
from hotset.loader import (
    STREAMED,
    Batch,
    CachedDataset,
    HotsetLoader,
    _pass_through,
    check_streamed,
    shards_id,
)
from hotset.plan import COUNTERS
from hotset.progress import progress
from hotset.stats import EpochStats, LoaderStats
from hotset.storage.tar import chosen_fields
from hotset.storage.tar_spool import ShardSpool, SpooledShard

log = logging.getLogger(__name__)

#: the shuffle buffer's samples at most (WebDataset's examples use 1,000-5,000)
BUFFER = 4096


@dataclass
class SpoolPlan:
    """A streamed batch: its ids and, per id, where its fields lie in the spool: the
    shard's file, the byte range, its members ``(field, offset in the range, size)`` and
    name; ``shards``: its samples of each shard."""

    ids: np.ndarray
    where: dict[int, tuple[str, int, int, tuple, str]]
    fields: tuple
    shards: Counter = field(default_factory=Counter)

    def __len__(self) -> int:
        return int(self.ids.size)


class StreamedPlans:
    """The first epoch's batches (a ``batch_sampler``), drawn from a shuffle buffer that
    each spooled shard fills: after a shard lands, batches are drawn while the buffer
    holds more than half of ``min(BUFFER, samples seen)``; the rest when the last has
    landed. ``wait_s``: the time spent waiting for shards."""

    def __init__(
        self, spool: ShardSpool, batch_size: int, seed: int, drop_last: bool,
        input_field: Any, target_field: Any,
    ) -> None:  # fmt: skip
        self.spool, self.batch_size, self.drop_last = spool, batch_size, drop_last
        self.rng = np.random.default_rng([seed, 0x5F1257])
        self.wanted = (input_field, target_field)
        self.fields: tuple | None = None
        self.shards: dict[int, SpooledShard] = {}
        self.left: dict[int, int] = {}  # samples of each shard not yet served
        self.wait_s = 0.0
        self.landed = 0

    def __iter__(self) -> Iterator[SpoolPlan]:
        pool, seen = np.empty(0, np.int64), 0
        shards = iter(self.spool)
        while True:
            t = time.perf_counter()
            shard = next(shards, None)
            self.wait_s += time.perf_counter() - t
            if shard is None:
                break
            self._land(shard)
            pool = np.concatenate([pool, shard.first_id + np.arange(len(shard))])
            seen += len(shard)
            keep = min(BUFFER, seen) // 2
            while pool.size >= self.batch_size and pool.size > keep:
                pool = yield from self._draw(pool)
        while pool.size >= self.batch_size or (pool.size and not self.drop_last):
            pool = yield from self._draw(pool)

    def _land(self, shard: SpooledShard) -> None:
        self.landed += 1
        if self.fields is None:  # the first shard's fields name the defaults
            self.fields = tuple(chosen_fields(shard.arrays["fields"].tolist(), *self.wanted))
        self.shards[shard.index] = shard

    def _draw(self, pool: np.ndarray):
        pick = self.rng.choice(pool.size, min(self.batch_size, pool.size), replace=False)
        yield self._plan(pool[pick])
        return np.delete(pool, pick)

    def _plan(self, ids: np.ndarray) -> SpoolPlan:
        firsts = np.array(sorted(self.shards))
        starts = np.array([self.shards[s].first_id for s in firsts])
        where, used = {}, Counter()
        for i, s in zip(ids.tolist(), firsts[np.searchsorted(starts, ids, "right") - 1].tolist(),
                        strict=True):  # fmt: skip
            sh = self.shards[s]
            a, j = sh.arrays, i - sh.first_id
            lo, hi = int(a["m_ptr"][j]), int(a["m_ptr"][j + 1])
            members = tuple(
                (str(a["fields"][f]), int(o), int(n))
                for f, o, n in zip(a["m_field"][lo:hi], a["m_off"][lo:hi], a["m_size"][lo:hi],
                                   strict=True)
            )  # fmt: skip
            where[i] = (str(sh.path), int(a["start"][j]), int(a["end"][j]), members,
                        f"{sh.url}#{a['names'][j]}")  # fmt: skip
            used[s] += 1
        return SpoolPlan(ids, where, self.fields, used)

    def served(self, used: Counter) -> None:
        """A batch of these shards' samples came back: a shard all served is released."""
        for s, n in used.items():
            self.left[s] = self.left.get(s, len(self.shards[s])) - n
            if self.left[s] <= 0:
                self.spool.release(s)
                del self.shards[s], self.left[s]


class _Names:
    """``keys[i]`` of the batch at hand (``SpoolStorage``): the sample's name."""

    def __init__(self, storage: SpoolStorage) -> None:
        self.storage = storage

    def __getitem__(self, i: int) -> str:
        return self.storage.where[i][4]


class _NoLabels:
    """A tar sample's label: none (its target is a field)."""

    def __getitem__(self, i: int) -> int:
        return -1


class SpoolStorage:
    """The spooled shards as ``CachedDataset`` reads a storage, one plan at a time: a
    sample's record from its shard's file in the spool (``where``: the plan's)."""

    content_keyed = False
    retries, requests, wire_bytes, in_flight_s = 0, None, None, 0.0
    disk_counts = (0, 0, 0)  # (read from the spool; the disk tier was filled as it landed)

    def __init__(self) -> None:
        self.where: dict[int, tuple] = {}
        self.input_field = self.target_field = None
        self.keys, self.labels = _Names(self), _NoLabels()

    def describe(self, i: int) -> str:
        return self.where[i][4]

    def read_many(self, ids: list[int]) -> list[bytes]:
        out, files = [], {}
        try:
            for i in ids:
                path, lo, hi, members, _ = self.where[i]
                if path not in files:  # each spooled shard opened once a batch
                    files[path] = os.open(path, os.O_RDONLY)
                data = os.pread(files[path], hi - lo, lo)
                out.append(encode_record({name: data[o : o + n] for name, o, n in members}))
        finally:
            for fd in files.values():
                os.close(fd)
        return out

    def read(self, i: int) -> bytes:
        return self.read_many([i])[0]

    def close(self) -> None:
        """Nothing held open (each batch opens and closes its shards)."""


class SpoolDataset(CachedDataset):
    """``CachedDataset`` over the spool, with no store: a plan's samples read from the
    spooled shards, decoded and collated as every batch is."""

    def __init__(self, **options: Any) -> None:
        super().__init__(SpoolStorage(), None, **options)

    def __getitems__(self, plan: SpoolPlan) -> dict:
        storage = self.storage
        storage.where = plan.where
        storage.input_field, storage.target_field = plan.fields
        stats, causes = LoaderStats(), []
        t = time.perf_counter()
        got = self._read_storage(plan.ids.tolist(), stats, causes)
        stats.storage_wait_s = stats.bytes_from_storage = 0  # (the spool's; the link's: its own)
        served, inputs, targets = self._decode_batch(plan.ids.tolist(), got, stats, causes)
        stats.decode_s = time.perf_counter() - t
        if len(plan) - len(served) > self.max_skipped * len(plan):
            raise SkipLimitError(
                f"a batch lost {len(plan) - len(served)} of its {len(plan)} samples (more "
                f"than max_skipped={self.max_skipped:g}); first cause: {causes[0]}"
            )
        stats.batches, stats.samples, stats.misses = 1, len(served), len(plan)
        return {"inputs": inputs, "targets": targets, "ids": np.array(served, np.int64),
                "stats": asdict(stats), "shards": plan.shards}  # fmt: skip


class StreamedStart(HotsetLoader):
    """The loader ``make_loader(..., first_epoch="stream")`` gives for remote tar shards
    not yet indexed: its first epoch streams them (``StreamedPlans`` over ``spool``), then
    ``make()`` makes the loader asked for, from the index the epoch kept, and every call
    goes to it. ``options``: the first epoch's batch and decoding
    (``batch_size``, ``seed``, ``drop_last``, ``input_field``, ``target_field``, and
    ``CachedDataset``'s), ``loader``: the DataLoader's arguments."""

    def __init__(
        self, spool: ShardSpool, make: Callable[[], HotsetLoader], *, options: dict,
        loader: dict, with_ids: bool = True, progress: bool = False,
    ) -> None:  # fmt: skip
        # (HotsetLoader's parts are made after the epoch, by ``make``)
        self._spool, self._make, self._options, self._loader_args = spool, make, options, loader
        self._inner: HotsetLoader | None = None
        self._streamed = self._closed = self._epochs_set = False
        self.with_ids, self.progress = with_ids, progress
        self._first_stats, self._first_epochs = LoaderStats(), []
        self.last_ids: torch.Tensor | None = None
        self._epoch = 0
        self._losses: list[tuple[np.ndarray, np.ndarray]] = []
        self._accuracies: list[float] = []
        self._told_embeddings = False

    def __getattr__(self, name: str) -> Any:
        inner = self.__dict__.get("_inner")
        if inner is None or name.startswith("__"):
            raise AttributeError(
                f"{name!r}: the loader is made when the streamed first epoch ends "
                "(make_loader(first_epoch='stream'))"
            )
        return getattr(inner, name)

    @property
    def stats(self) -> LoaderStats:
        """The run's counters: the streamed epoch's, then the loader's (which adds them)."""
        return self._first_stats if self._inner is None else self._inner.stats

    @property
    def epoch_stats(self) -> list[EpochStats]:
        """Each epoch's counters, the streamed one first (``HotsetLoader.epoch_stats``)."""
        return self._first_epochs if self._inner is None else self._inner.epoch_stats

    @property
    def epoch(self) -> int:
        return self._inner.epoch if self._inner is not None else self._epoch

    @property
    def wants_embeddings(self) -> bool:
        return self._inner is not None and self._inner.wants_embeddings

    def loader(self) -> HotsetLoader:
        """The loader asked for (made now if the first epoch has not ended: the shards it
        did not stream are then indexed as ``first_epoch="index"`` does)."""
        if self._inner is None:
            self._check_open()
            self._spool.close()
            inner = self._make()
            inner.stats.add(asdict(self._first_stats))
            inner.epoch_stats[:0] = self._first_epochs
            for ids, losses in self._losses:  # the first epoch's, in their order
                inner.planner.feedback(ids, losses)
            for accuracy in self._accuracies:
                inner.planner.report_accuracy(accuracy)
            self._losses, self._accuracies = [], []
            if self._epochs_set:
                inner.set_epoch(self._epoch)
            else:  # its next iteration is the next epoch
                inner._iterated = True
            self._inner = inner
        return self._inner

    def set_epoch(self, epoch: int) -> None:
        self._check_open()
        self._epochs_set = True
        self._epoch = int(epoch)
        if self._inner is not None or self._streamed or epoch != 0:
            self.loader().set_epoch(epoch)

    def __len__(self) -> int:
        if self._inner is None and not self._streamed:
            raise TypeError(
                "len(loader) is known when the streamed first epoch has indexed the shards "
                "(make_loader(first_epoch='stream')); give first_epoch='index' where it is "
                "needed before"
            )
        return len(self.loader())

    def __iter__(self) -> Iterator[Batch]:
        self._check_open()
        if self._inner is None and not self._streamed and self._epoch == 0:
            return self._stream()
        return iter(self.loader())

    def _stream(self) -> Iterator[Batch]:
        self._streamed = True
        o = self._options
        plans = StreamedPlans(self._spool, o["batch_size"], o["seed"], o["drop_last"],
                              o["input_field"], o["target_field"])  # fmt: skip
        dataset = SpoolDataset(**{k: o[k] for k in (
            "decode", "transform", "on_error", "max_skipped", "collate_fn")})  # fmt: skip
        batches = DataLoader(dataset, batch_sampler=plans, collate_fn=_pass_through,
                             **self._loader_args)  # fmt: skip
        start, served = time.perf_counter(), 0
        try:
            bar = progress(batches, None, "epoch 0 (streamed)", "batches", enabled=self.progress)
            for raw in bar:
                plans.served(raw["shards"])
                self.stats.add(raw["stats"])
                served += int(raw["ids"].size)
                self.last_ids = torch.from_numpy(raw["ids"])
                targets = raw["targets"]
                if isinstance(targets, np.ndarray):
                    targets = torch.from_numpy(targets)
                batch = Batch(raw["inputs"], targets, self.last_ids)
                yield batch if self.with_ids else batch[:2]
        finally:
            s = self.stats
            s.storage_requests += self._spool.requests
            s.wire_bytes += self._spool.bytes
            s.bytes_from_storage += self._spool.bytes
            s.storage_retries += self._spool.retries
            s.storage_wait_s += plans.wait_s
            self.epoch_stats.append(EpochStats.between(
                0, time.perf_counter() - start, {}, self._counters(),
            ))  # fmt: skip
            complete = plans.landed == len(self._spool.urls)
        if complete:
            self.loader()  # the index is whole: the loader asked for, now
        if not served:
            raise SkipLimitError("the streamed first epoch served no sample")

    def feedback(
        self, ids: IdsLike | None = None, losses: ArrayLike | None = None,
        embeddings: ArrayLike | None = None,
    ) -> None:  # fmt: skip
        if self._inner is not None:
            return self._inner.feedback(ids, losses, embeddings)
        if ids is None:
            ids = self.last_ids
        if ids is None or losses is None:
            return HotsetLoader.feedback(self, ids, losses)  # (its errors)
        checked_shape(losses, len(ids))
        if embeddings is not None and not self._told_embeddings:
            self._told_embeddings = True
            log.info("the streamed first epoch's embeddings are not kept: the graph "
                     "learns from the next epoch's")  # fmt: skip
        self._losses.append((as_numpy(ids).astype(np.int64).copy(),
                             as_numpy(losses).astype(np.float32).copy()))  # fmt: skip

    def report_accuracy(self, accuracy: float) -> None:
        if self._inner is not None:
            return self._inner.report_accuracy(accuracy)
        self._accuracies.append(float(accuracy))

    def _counters(self) -> dict[str, Any]:
        out = self.stats.as_dict()
        out.update(dict.fromkeys(COUNTERS, 0))
        out["storage_reads"], out["storage_bytes"] = out["storage_requests"], out["wire_bytes"]
        return out

    def counters(self) -> dict[str, Any]:
        if self._inner is not None:
            return self._inner.counters()
        return HotsetLoader.counters(self)

    def _all_counters(self) -> dict[str, Any]:
        return self._counters()

    def state_dict(self, trained: int | None = None) -> dict[str, Any]:
        if self._inner is not None or self._epoch != 0:
            return self.loader().state_dict(trained)
        return to_safe({STREAMED: True, "shards": shards_id(self._spool.urls)})

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get(STREAMED):
            check_streamed(state, self._spool.urls)
        if state.get(STREAMED) and self._inner is None:
            log.warning("a state taken during the streamed first epoch: it starts again")
            self._streamed = False
            self._first_stats = LoaderStats()
            self._first_epochs, self._losses, self._accuracies = [], [], []
            return
        self.loader().load_state_dict(state)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._spool.close()
        if self._inner is not None:
            self._inner.close()
