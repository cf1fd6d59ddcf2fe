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
from hotset.packages import Packager
from hotset.plan import BatchPlan, Planner
from hotset.policy.base import make_policy
from hotset.sampling.base import SAMPLERS, make_sampler
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

    def __getitems__(self, plan: BatchPlan) -> dict:
        if not isinstance(plan, BatchPlan):  # a plain batch_sampler: read from storage
            plan = BatchPlan.uncached(plan)
        stats = LoaderStats()
        failures0, refused0 = self.store.failures, self.store.refused
        ids = plan.ids.tolist()
        keys = self.keys
        got: dict[int, bytes] = {}

        t = time.perf_counter()
        hit_ids = plan.ids[plan.hit].tolist()
        for i, v in zip(hit_ids, self.store.get_many([keys[i] for i in hit_ids]), strict=True):
            if v is not None:
                got[i] = v
        stats.store_s += time.perf_counter() - t

        # the plan's misses first, and their admissions: another job's worker may be
        # waiting for them while this one waits for its own planned hits
        planned_hits = set(hit_ids)
        misses = [i for i in dict.fromkeys(ids) if i not in planned_hits]
        if misses:
            got.update(self._read_storage(misses, stats))
        fetched = {}
        if plan.fetch.size:
            fetched = self._read_storage(plan.fetch.tolist(), stats)
            stats.prefetched = len(fetched)
        t = time.perf_counter()
        if plan.evict.size:
            self.store.delete_many([keys[i] for i in plan.evict.tolist()])
        if plan.evict_keys:
            self.store.delete_store_keys(list(plan.evict_keys))
        admit = {keys[i]: got[i] for i in plan.admit.tolist() if i in got}
        admit.update((keys[i], v) for i, v in fetched.items())
        if admit:
            self.store.put_many(admit)
        if plan.wait_s > 0 and any(i not in got for i in planned_hits):
            stats.waited_hits = self._wait_for_peers(hit_ids, got, plan.wait_s)
        stats.store_s += time.perf_counter() - t
        stats.store_failures = self.store.failures - failures0
        stats.refused_puts = self.store.refused - refused0

        # per position: a batch may serve one id several times (sampling with
        # replacement, or one substitute for several requests)
        stats.hits = sum(1 for i in hit_ids if i in got)
        if plan.sub is not None:
            subs = plan.ids[plan.sub & plan.hit].tolist()
            stats.substitute_hits = sum(1 for i in subs if i in got)
        stats.bytes_from_store = sum(len(got[i]) for i in planned_hits if i in got)
        stats.late_misses = len(hit_ids) - stats.hits
        stats.misses = len(ids) - len(hit_ids)
        late = [i for i in dict.fromkeys(hit_ids) if i not in got]
        if late:  # planned hits that were not there: from storage, counted
            got.update(self._read_storage(late, stats))

        t = time.perf_counter()
        served = np.array([i for i in ids if i in got], dtype=np.int64)
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
    """A DataLoader over a planner: iterate it as usual, ``set_epoch`` it as a
    DistributedSampler, read ``stats`` (or ``counters()``) for what happened."""

    def __init__(
        self,
        dataset: CachedDataset,
        planner: Planner,
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
        consumed = getattr(self.planner, "consumed", None)  # the service's planner
        for n, raw in enumerate(bar):
            if consumed is not None:
                consumed()
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
        self._sync_control_plane_times()

    def _sync_control_plane_times(self) -> None:
        """The planner (training process) times its own work; copy it into the stats."""
        self.stats.planning_s = self.planner.planning_s
        self.stats.feedback_s = self.planner.feedback_s
        self.stats.service_failures = getattr(self.planner, "failures", 0)

    @property
    def wants_embeddings(self) -> bool:
        """Whether ``feedback`` needs the batch's embeddings (graph importance)."""
        return bool(getattr(self.planner.sampler, "needs_embeddings", False))

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
        report = getattr(self.planner.sampler, "report_accuracy", None)
        if report is not None:
            report(float(accuracy))

    def counters(self) -> dict:
        self._sync_control_plane_times()
        feeder = self.planner.feeder
        if feeder is not None:  # package threads count in this process
            for k, v in getattr(feeder, "counters", {}).items():
                setattr(self.stats, k, v)
        return self.stats.as_dict()

    def close(self) -> None:
        """Stop background threads (iCACHE's packager, SpiderCache's graph worker) and
        leave the multi-job service."""
        for part in (self.planner, self.planner.feeder, self.planner.sampler):
            close = getattr(part, "close", None)
            if close is not None:
                close()

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

    ``package_dir``: where a package-cache policy (``icache``) writes its package files,
    beside the storage (default: a temporary directory removed by ``loader.close()``).
    Samplers that need labels (``spider``) get the storage's.
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
    if getattr(SAMPLERS.get(sampler), "needs_labels", False):
        sampler_options.setdefault("labels", storage.labels)
    smp = make_sampler(
        sampler, len(storage), num_replicas=num_replicas, rank=rank, seed=seed, **sampler_options
    )
    if hasattr(pol, "activation_delay"):
        # plans in flight at once: a newly cached sample is surely there after them
        prefetch = dataloader_kwargs.get("prefetch_factor") or (2 if num_workers else 0)
        pol.activation_delay = prefetch * num_workers
    planner = Planner(smp, pol, batch_size, drop_last=drop_last)
    if pol.needs_feeder:
        planner.feeder = Packager(storage, store, pol, planner.lock, package_dir)
    dataset = CachedDataset(storage, store, decode=decode, transform=transform, on_error=on_error)
    return HotsetLoader(
        dataset, planner, num_workers=num_workers, progress=progress, **dataloader_kwargs
    )
