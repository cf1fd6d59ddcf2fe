"""The data plane: CachedDataset executes BatchPlans in DataLoader workers; HotsetLoader
wraps a standard ``torch.utils.data.DataLoader`` and sums the counters.

PyTorch hands whatever a ``batch_sampler`` yields to ``Dataset.__getitems__``, so a
:class:`~hotset.plan.BatchPlan` reaches the worker with no extra channel, and
``num_workers``, ``pin_memory`` and ``persistent_workers`` keep working.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from typing import NamedTuple

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

from hotset.codecs import decode_sample, to_tensor
from hotset.errors import ConfigError, CorruptSampleError, SampleError
from hotset.feedback import as_numpy
from hotset.plan import BatchPlan, Planner, PlanSource
from hotset.policy.base import make_policy
from hotset.sampling.base import make_sampler, sampler_class
from hotset.stats import LoaderStats
from hotset.storage.base import Storage
from hotset.store import Store, make_store

log = logging.getLogger(__name__)

ON_ERROR = ("raise", "skip")


class Batch(NamedTuple):
    """A served batch: ``inputs, targets, ids = batch``; ``ids`` are the samples actually
    served (feed losses back against these, never against the positions drawn)."""

    inputs: torch.Tensor
    targets: torch.Tensor
    ids: torch.Tensor


class CachedDataset(Dataset):
    """A map-style dataset over ``storage`` whose ``__getitems__`` executes a BatchPlan
    against ``store``: planned hits from the store, misses (and late misses) from storage,
    then the plan's evictions and admissions.

    ``decode`` turns a sample's bytes into an array (default: ``.npy`` or any PIL image);
    a batch is stacked and made a float tensor once (uint8 pixels scaled to [0, 1]).
    ``transform``, if given, runs per sample on that tensor.

    ``dataset[i]`` alone reads from storage, so the object also works as a plain Dataset.
    """

    def __init__(
        self,
        storage: Storage,
        store: Store,
        decode: Callable[[bytes], np.ndarray | torch.Tensor] = decode_sample,
        transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
        on_error: str = "raise",
    ) -> None:
        if on_error not in ON_ERROR:
            raise ConfigError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
        self.storage = storage
        self.store = store
        self.decode = decode
        self.transform = transform
        self.on_error = on_error
        self.keys = storage.keys
        self.labels = storage.labels

    def __len__(self) -> int:
        return len(self.storage)

    def _decode(self, i: int, data: bytes) -> np.ndarray | torch.Tensor:
        try:
            return self.decode(data)
        except Exception as exc:  # noqa: BLE001 - any decoder failure names the sample
            raise CorruptSampleError(
                i, self.storage.describe(i), f"cannot decode: {exc}", self.keys[i]
            ) from exc

    def _inputs(self, ids: list[int], got: dict[int, bytes]) -> torch.Tensor:
        samples = [self._decode(i, got[i]) for i in ids]
        if not samples:
            return torch.empty(0)
        if self.transform is not None:
            return torch.stack([self.transform(to_tensor(x)) for x in samples])
        if isinstance(samples[0], torch.Tensor):
            return to_tensor(torch.stack(samples))
        return to_tensor(np.stack(samples))

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        i = int(i)
        x = to_tensor(self._decode(i, self.storage.read(i)))
        return (self.transform(x) if self.transform is not None else x), int(self.labels[i])

    def _read_storage(self, ids: list[int], stats: LoaderStats) -> dict[int, bytes]:
        """Read ``ids`` from storage; with ``on_error="skip"``, drop unreadable ones."""
        start = time.perf_counter()
        try:
            got = dict(zip(ids, self.storage.read_many(ids), strict=True))
        except SampleError:
            if self.on_error == "raise":
                raise
            got = {}
            for i in ids:  # find the bad ones, keep the rest
                try:
                    got[i] = self.storage.read(i)
                except SampleError as exc:
                    log.warning("skipping %s", exc)
                    stats.skipped += 1
        stats.storage_wait_s += time.perf_counter() - start
        stats.bytes_from_storage += sum(len(v) for v in got.values())
        return got

    def _wait_for_peers(self, hit_ids: list[int], got: dict[int, bytes], wait_s: float) -> int:
        """Poll the store for planned hits another job is still fetching, up to
        ``wait_s``; returns how many arrived."""
        deadline = time.perf_counter() + wait_s
        pending = [i for i in dict.fromkeys(hit_ids) if i not in got]
        arrived = 0
        while pending and time.perf_counter() < deadline:
            time.sleep(0.002)
            values = self.store.get_many([self.keys[i] for i in pending])
            for i, v in zip(pending, values, strict=True):
                if v is not None:
                    got[i] = v
                    arrived += 1
            pending = [i for i in pending if i not in got]
        return arrived

    # -- executing a plan, step by step ------------------------------------------------
    def _read_hits(self, hit_ids: list[int], got: dict[int, bytes], stats: LoaderStats) -> None:
        """Step 1: the planned hits from the store (absent ones stay missing for now)."""
        t = time.perf_counter()
        keys = self.keys
        for i, v in zip(hit_ids, self.store.get_many([keys[i] for i in hit_ids]), strict=True):
            if v is not None:
                got[i] = v
        stats.store_s += time.perf_counter() - t

    def _read_misses(
        self, plan: BatchPlan, planned_hits: set[int], got: dict[int, bytes], stats: LoaderStats
    ) -> dict[int, bytes]:
        """Step 2: the plan's misses, and its prefetches (returned apart), from storage."""
        misses = [i for i in dict.fromkeys(plan.ids.tolist()) if i not in planned_hits]
        if misses:
            got.update(self._read_storage(misses, stats))
        if not plan.fetch.size:
            return {}
        fetched = self._read_storage(plan.fetch.tolist(), stats)
        stats.prefetched = len(fetched)
        return fetched

    def _apply_store_changes(
        self, plan: BatchPlan, got: dict[int, bytes], fetched: dict[int, bytes]
    ) -> None:
        """Step 3: the plan's evictions, then its admissions (and prefetches)."""
        keys = self.keys
        if plan.evicted.size:
            self.store.delete_many([keys[i] for i in plan.evicted.tolist()])
        if plan.evict_keys:
            self.store.delete_store_keys(list(plan.evict_keys))
        admit = {keys[i]: got[i] for i in plan.admitted.tolist() if i in got}
        admit.update((keys[i], v) for i, v in fetched.items())
        if admit:
            self.store.put_many(admit)

    def _count_hits(
        self, plan: BatchPlan, hit_ids: list[int], got: dict[int, bytes], stats: LoaderStats
    ) -> None:
        """Per position: a batch may serve one id several times (sampling with
        replacement, or one substitute for several requests)."""
        planned_hits = set(hit_ids)
        stats.hits = sum(1 for i in hit_ids if i in got)
        if plan.substituted is not None:
            subs = plan.ids[plan.substituted & plan.hits].tolist()
            stats.substitute_hits = sum(1 for i in subs if i in got)
        stats.bytes_from_store = sum(len(got[i]) for i in planned_hits if i in got)
        stats.late_misses = len(hit_ids) - stats.hits
        stats.misses = len(plan) - len(hit_ids)

    def __getitems__(self, plan: BatchPlan) -> dict:
        if not isinstance(plan, BatchPlan):  # a plain batch_sampler: read from storage
            plan = BatchPlan.uncached(plan)
        stats = LoaderStats()
        failures0, refused0 = self.store.failures, self.store.refused
        got: dict[int, bytes] = {}
        hit_ids = plan.ids[plan.hits].tolist()
        planned_hits = set(hit_ids)
        self._read_hits(hit_ids, got, stats)
        # the plan's misses first, and their admissions: another job's worker may be
        # waiting for them while this one waits for its own planned hits
        fetched = self._read_misses(plan, planned_hits, got, stats)
        t = time.perf_counter()
        self._apply_store_changes(plan, got, fetched)
        if plan.wait_s > 0 and any(i not in got for i in planned_hits):
            stats.waited_hits = self._wait_for_peers(hit_ids, got, plan.wait_s)
        stats.store_s += time.perf_counter() - t
        stats.store_failures = self.store.failures - failures0
        stats.refused_puts = self.store.refused - refused0
        self._count_hits(plan, hit_ids, got, stats)
        late = [i for i in dict.fromkeys(hit_ids) if i not in got]
        if late:  # planned hits that were not there: from storage, counted
            got.update(self._read_storage(late, stats))

        t = time.perf_counter()
        served = np.array([i for i in plan.ids.tolist() if i in got], dtype=np.int64)
        inputs = self._inputs(served.tolist(), got)
        stats.decode_s = time.perf_counter() - t
        stats.batches, stats.samples = 1, int(served.size)
        # Only the inputs travel as a tensor (shared memory, one fd per tensor); the small
        # id and label arrays are pickled inline and become tensors in the loader.
        return {
            "inputs": inputs,
            "targets": self.labels[served],
            "ids": served,
            "stats": asdict(stats),
        }


def _pass_through(batch: dict) -> dict:
    return batch


class HotsetLoader:
    """A DataLoader over a :class:`~hotset.plan.PlanSource`: iterate it as usual,
    ``set_epoch`` it as a DistributedSampler, read ``stats`` (or ``counters()``) for what
    happened."""

    def __init__(
        self,
        dataset: CachedDataset,
        planner: PlanSource,
        *,
        num_workers: int = 2,
        progress: bool = False,
        desc: str = "",
        **dataloader_kwargs,
    ) -> None:
        if num_workers > 0 and not dataset.store.shared_across_processes:
            raise ConfigError(
                f"store {type(dataset.store).__name__} is private to one process; with "
                f"num_workers={num_workers} use a shared store ('shared' or a Redis URL)"
            )
        for k in ("batch_size", "shuffle", "sampler", "batch_sampler", "collate_fn", "drop_last"):
            if k in dataloader_kwargs:
                raise ConfigError(f"{k} is set by hotset's planner; do not pass it to the loader")
        self.dataset = dataset
        self.planner = planner
        self.progress = progress
        self.desc = desc
        self.stats = LoaderStats()
        self._warned_store = False
        self.dataloader = DataLoader(
            dataset,
            batch_sampler=planner,
            num_workers=num_workers,
            collate_fn=_pass_through,
            **dataloader_kwargs,
        )

    def set_epoch(self, epoch: int) -> None:
        self.planner.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.planner)

    def __iter__(self) -> Iterator[Batch]:
        it = self.dataloader
        bar = (
            tqdm(it, total=len(self), desc=self.desc or "epoch", leave=False, disable=None)
            if self.progress
            else it
        )
        pin = self.dataloader.pin_memory
        for n, raw in enumerate(bar):
            self.planner.batch_consumed()
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
            targets = torch.from_numpy(raw["targets"])
            yield Batch(
                raw["inputs"],
                targets.pin_memory() if pin else targets,
                torch.from_numpy(raw["ids"]),
            )

    @property
    def wants_embeddings(self) -> bool:
        """Whether ``feedback`` needs the batch's embeddings (graph importance)."""
        return self.planner.wants_embeddings

    def feedback(self, ids, losses, embeddings=None) -> None:
        """Hand back the per-sample losses of a batch, against the ``ids`` it served
        (tensors or arrays): importance samplers and score-keyed policies use them.
        SpiderCache also needs ``embeddings`` (one row per id, from the model's feature
        layer); see ``wants_embeddings``."""
        emb = None if embeddings is None else as_numpy(embeddings).astype(np.float32)
        self.planner.feedback(
            as_numpy(ids).astype(np.int64), as_numpy(losses).astype(np.float64), emb
        )

    def report_accuracy(self, accuracy: float) -> None:
        """Validation accuracy after an epoch, for samplers that watch it (SHADE's guard)."""
        self.planner.report_accuracy(float(accuracy))

    def counters(self) -> dict:
        """The data plane's counters (``LoaderStats``) with the control plane's."""
        out = self.stats.as_dict()
        out.update(self.planner.counters())
        return out

    def close(self) -> None:
        """Stop background threads (iCACHE's packager, SpiderCache's graph worker) and
        leave the multi-job service."""
        self.planner.close()

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


def make_loader(
    storage: Storage,
    *,
    batch_size: int,
    policy: str = "lru",
    cache_fraction: float | None = None,
    capacity_bytes: int | None = None,
    store: str | Store = "shared",
    sampler: str = "uniform",
    seed: int = 0,
    num_replicas: int = 1,
    rank: int = 0,
    num_workers: int = 2,
    decode: Callable[[bytes], np.ndarray | torch.Tensor] = decode_sample,
    transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
    on_error: str = "raise",
    drop_last: bool = False,
    progress: bool = False,
    policy_options: dict | None = None,
    sampler_options: dict | None = None,
    package_dir: str | None = None,
    **dataloader_kwargs,
) -> HotsetLoader:
    """One call from a Storage to a cached loader: store, policy, sampler, planner, loader.

    Args:
        storage: where the samples live (``FileStorage`` over a directory or fsspec URL).
        batch_size: samples per batch.
        policy: the cache policy by name (``hotset.POLICIES``): ``lru``, ``minio``,
            ``belady``, ``app`` (SHADE), ``icache``, ``spider``, ...
        cache_fraction: the cache's size as a fraction of the dataset's bytes, or
        capacity_bytes: its size in bytes (give exactly one of the two).
        store: where cached bytes live: ``"shared"`` (LMDB on /dev/shm, shared by the
            workers), ``"memory"`` (this process only: ``num_workers=0``), a
            ``redis://`` URL, or a ``Store`` holding at least the capacity.
        sampler: what each epoch reads, by name (``hotset.SAMPLERS``): ``uniform``,
            ``shade``, ``iis``, ``spider``.
        seed: seeds the sampler's orders and the policy's random choices.
        num_replicas, rank: data-parallel sharding, as ``DistributedSampler``'s.
        num_workers: DataLoader worker processes executing the plans.
        decode: bytes -> array or tensor (default: ``.npy`` or any PIL image).
        transform: per-sample tensor -> tensor, after decoding.
        on_error: ``"raise"`` on a missing or corrupt sample, or ``"skip"`` it (counted).
        drop_last: drop the last incomplete batch of each epoch.
        progress: show a tqdm bar per epoch.
        policy_options: keyword arguments of the policy's constructor.
        sampler_options: keyword arguments of the sampler's constructor (a sampler that
            ``needs_labels``, ``spider``, gets the storage's unless given).
        package_dir: where a policy's feeder writes its files (``icache``'s packages),
            beside the storage (default: a temporary directory removed by ``close()``).
        **dataloader_kwargs: passed to ``torch.utils.data.DataLoader`` (``pin_memory``,
            ``persistent_workers``, ``prefetch_factor``, ...); hotset sets the batch
            sampler and collation itself.
    """
    capacity = cache_capacity(storage, cache_fraction, capacity_bytes)
    if isinstance(store, str):
        store = make_store(store, capacity)
    elif store.capacity_bytes < capacity:
        raise ConfigError(
            f"store holds {store.capacity_bytes} bytes, the policy plans for {capacity}"
        )
    pol = make_policy(policy, capacity, sizes=storage.sizes, seed=seed, **(policy_options or {}))
    sampler_options = dict(sampler_options or {})
    if sampler_class(sampler).needs_labels:
        sampler_options.setdefault("labels", storage.labels)
    smp = make_sampler(
        sampler, len(storage), num_replicas=num_replicas, rank=rank, seed=seed, **sampler_options
    )
    prefetch = dataloader_kwargs.get("prefetch_factor") or (2 if num_workers else 0)
    pol.set_pipeline_depth(prefetch * num_workers)  # plans a DataLoader runs at once
    planner = Planner(
        smp, pol, batch_size, drop_last=drop_last, storage=storage, store=store,
        package_dir=package_dir,
    )  # fmt: skip
    dataset = CachedDataset(storage, store, decode=decode, transform=transform, on_error=on_error)
    return HotsetLoader(
        dataset, planner, num_workers=num_workers, progress=progress, **dataloader_kwargs
    )
