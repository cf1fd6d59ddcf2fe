"""``make_loader``: one call from a dataset to a cached loader (the storage, the store,
the system's sampler and policy, the planner, the loader), each argument checked before
anything is opened."""


from __future__ import annotations

import binascii
import difflib
import functools
import hashlib
import inspect
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from pydantic import SkipValidation
from torch.utils.data import DataLoader, Dataset

from hotset.arguments import Int, IntPair, Real, checked
from hotset.codecs import decode_sample
from hotset.distributed import RankGroup, detect_ranks, node_name
from hotset.errors import (
    ConfigError,
)
from hotset.first_epoch import StreamedStart
from hotset.loader import CachedDataset, HotsetLoader, _refuse_planner_args, _release
from hotset.plan import Planner
from hotset.plan_process import PlannerProcess
from hotset.policy import POLICIES
from hotset.policy.base import make_policy, policy_class
from hotset.sampling.base import make_sampler, sampler_class
from hotset.sampling.blocks import check_order
from hotset.storage.base import Storage
from hotset.storage.columns import DigestColumn
from hotset.storage.decoded import DecodedStorage
from hotset.storage.on_disk import DiskTierStorage
from hotset.storage.open import detect_format, open_storage
from hotset.storage.tar_spool import ShardSpool
from hotset.store import Store, make_store
from hotset.store.base import NamespacedStore
from hotset.store.disk import OpeningFill, open_disk_tier
from hotset.store.shared import SharedStore
from hotset.store.tiered import PREFIX as TIERED
from hotset.store.tiered import TieredStore
from hotset.systems import SYSTEMS, resolve_system

log = logging.getLogger(__name__)

FIRST_EPOCH = ("index", "stream")


#: the RAM tier's share of /dev/shm when no cache size is given
DEFAULT_RAM_SHARE = 0.25


def cache_capacity(
    storage: Storage, cache_fraction: float | None, capacity_bytes: int | None
) -> int:
    """Bytes for a cache given either a fraction of the dataset or a byte count; neither:
    the dataset's bytes, at most ``DEFAULT_RAM_SHARE`` of /dev/shm's size (the node's
    shared memory; its size, not what is free now, so a resumed run plans the same)."""
    _check_capacity(cache_fraction, capacity_bytes)
    if capacity_bytes is not None:
        return int(capacity_bytes)
    if cache_fraction is not None:
        return int(cache_fraction * storage.manifest.total_bytes)
    try:
        st = os.statvfs("/dev/shm")
        share = int(DEFAULT_RAM_SHARE * st.f_blocks * st.f_frsize)
    except OSError:
        share = int(DEFAULT_RAM_SHARE * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    return min(int(storage.manifest.total_bytes), share)


def _check_capacity(cache_fraction: float | None, capacity_bytes: int | None) -> None:
    if cache_fraction is not None and capacity_bytes is not None:
        raise ConfigError("give at most one of cache_fraction and capacity_bytes")
    if capacity_bytes is not None and capacity_bytes < 0:
        raise ConfigError(f"capacity_bytes must be >= 0, got {capacity_bytes}")
    if cache_fraction is not None and not 0.0 <= cache_fraction <= 1.0:
        raise ConfigError(f"cache_fraction must be in [0, 1], got {cache_fraction}")


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
    planner_process: bool | str = False,
    order: str = "paper",
    block_size: Int = 2048,
    epochs: Int | None = None,
    first_epoch: str = "index",
    disk_dir: str | os.PathLike[str] | None = None,
    disk_bytes: Int | None = None,
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
        policy: the cache policy by name (``hotset.POLICIES``, default ``minio``,
            CoorDL's never-evict cache: under a uniform shuffle it hits as often as any
            online policy and writes the cache once, where ``lru`` rewrites it every
            epoch): ``lru``, ``minio``, ``belady``, ``app`` (SHADE's), ``icache``, ...
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
            With ``disk_dir`` the staged samples wait on the disk tier instead (the
            read put them there), by default at most a quarter of ``disk_bytes`` too.
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
            ``"node"``: one such process for all the ranks of a node (its first rank's
            child; the ranks take their shards of each plan from it over a Unix socket),
            so a node keeps one control plane, not one per rank; the same plans as
            ``True``. hotset's option.
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
        first_epoch: ``"index"`` (default): every shard is indexed before the first
            batch; ``"stream"``: remote tar shards not yet indexed are streamed in the
            first epoch, as WebDataset reads them, and indexed meanwhile: the first batch
            waits for one shard, not for every shard's bytes. The loader asked for
            serves from the second epoch on; the first is read in shard order through a
            shuffle buffer, caches nothing and has no ``len`` until it ends
            (``first_epoch.py``; one rank; hotset's option).
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
    args = dict(locals())  # (as given: a streamed first epoch makes the loader with them)
    sampler, policy, sampler_options = _parts(system, sampler, policy, sampler_options)
    sampler_options = _run_length(sampler, sampler_options, epochs)
    check_order(order, block_size)
    _check_dataloader(num_workers, dataloader_kwargs)  # before anything is opened
    if first_epoch not in FIRST_EPOCH:
        raise ConfigError(f"first_epoch must be one of {FIRST_EPOCH}, got {first_epoch!r}")
    if first_epoch == "stream":
        streamed = _streamed_start(args)
        if streamed is not None:
            return streamed
    storage = _opened(storage, format, storage_options, input_field, target_field,
                      open_disk_tier(disk_dir, disk_bytes))  # fmt: skip
    capacity = cache_capacity(storage, cache_fraction, capacity_bytes)
    ranks = detect_ranks(distributed)
    readahead = _readahead_bytes(storage, readahead_bytes, ranks, store, capacity)
    storage, decode, budget = _what_is_cached(
        storage, decode, size, mode, cache_decoded, capacity, readahead
    )
    given_policy_options = policy_options  # (what a state is checked against)
    num_replicas, rank, sampler_options, policy_options = _replicas(
        ranks, num_replicas, rank, sampler, policy, sampler_options, policy_options)
    owns_store = isinstance(store, str)
    store = _sized_store(store, capacity, 0 if storage.disk_capacity else readahead, ranks)
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
        planner = _planner_in(planner_process, plan_with, dataset, ranks)
        fits = {  # what a loaded state must have been saved by
            "hotset": _version(), "dataset": namespace, "samples": len(storage),
            "batch_size": batch_size, "drop_last": drop_last, "seed": seed,
            "sampler": sampler, "sampler_options": _digest(sampler_options),
            "policy": policy, "policy_options": _digest(given_policy_options),
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


def _opened(storage, format, storage_options, input_field, target_field, tier) -> Storage:
    """The storage opened (``storage/open.py``), read through the node's disk tier
    ``tier`` where there is one (its opening's reads of whole shards fill it)."""
    fields = {"input_field": input_field, "target_field": target_field,
              "keep": None if tier is None else tier.put,
              "wants": None if tier is None else OpeningFill(tier)}  # fmt: skip
    storage = open_storage(storage, format, storage_options,
                           **{k: v for k, v in fields.items() if v is not None})  # fmt: skip
    return storage if tier is None else DiskTierStorage(storage, tier)


def _replicas(ranks, num_replicas, rank, sampler, policy, sampler_options, policy_options):
    """``num_replicas``, ``rank`` and the parts' options the sampler and the policy are
    made with: with ranks (``distributed``), one global list drawn alike on every rank,
    which the planner shards. A sampler that learns from feedback needs them."""
    if ranks is not None:
        return 1, 0, *_deterministic(sampler, policy, sampler_options, policy_options)
    if num_replicas > 1 and sampler_class(sampler).learns_from_feedback:
        raise ConfigError(
            f"sampler {sampler!r} learns from each rank's feedback: with num_replicas > 1 "
            "initialise torch.distributed so that the ranks plan together"
        )
    return num_replicas, rank, sampler_options, policy_options


def _planner_in(in_process: bool | str, plan_with, dataset, ranks):
    """The planner, in a process of its own (``planner_process``: the rank's, or the
    node's) or in this one."""
    if in_process not in (False, True, "node"):
        raise ConfigError(f"planner_process must be False, True or 'node', got {in_process!r}")
    if not in_process:
        return plan_with(ranks)
    if not dataset.store.shared_across_processes:
        raise ConfigError(
            f"planner_process={in_process!r}: store {type(dataset.store.inner).__name__} is "
            "private to one process, and the planner's process reconciles with it (iCACHE's "
            "packager writes to it): use a shared store ('shared' or a Redis URL)"
        )
    return PlannerProcess(plan_with, dataset, ranks, per_node=in_process == "node")


def _streamed_start(args: dict) -> HotsetLoader | None:
    """``make_loader(**args)`` with its first epoch streamed (``first_epoch.py``) where
    the storage is remote tar shards not all indexed yet and the job has one rank; else
    None (each shard is then indexed first; a user who asked is told why)."""
    url, options = args["storage"], args["storage_options"]
    _check_capacity(args["cache_fraction"], args["capacity_bytes"])
    if args["store"] == "memory" and args["num_workers"] > 0:
        raise ConfigError(
            f"store 'memory' is private to one process; with num_workers={args['num_workers']}"
            " use a shared store ('shared' or a Redis URL)"
        )
    why = ""
    if not isinstance(url, str | os.PathLike | list | tuple):
        why = "the storage is not a URL"
    elif (args["format"] or detect_format(url, options)) != "tar":
        why = "the storage is not tar shards"
    elif args["num_replicas"] > 1 or detect_ranks(args["distributed"]) is not None:
        why = "it is for one rank"
    tier = None if why else open_disk_tier(args["disk_dir"], args["disk_bytes"])
    spool = None if why else ShardSpool(url if isinstance(url, list | tuple) else str(url),
                                        options, keep=None if tier is None else tier.put)
    if spool is not None and (not spool.remote or spool.indexed()):
        spool.close()
        why, spool = "the shards are local or indexed already", None
    if spool is None:
        log.info("first_epoch='stream': %s; the shards are indexed first", why)
        return None
    kwargs = {k: v for k, v in args.items() if k != "dataloader_kwargs"}
    make = functools.partial(make_loader, **{**kwargs, "first_epoch": "index"},
                             **args["dataloader_kwargs"])  # fmt: skip
    first = {k: args[k] for k in ("batch_size", "seed", "drop_last", "input_field",
                                  "target_field", "transform", "on_error", "max_skipped",
                                  "collate_fn")}  # fmt: skip
    first["decode"] = args["decode"] or functools.partial(
        decode_sample, size=args["size"], mode=args["mode"]
    )
    loader = {"num_workers": args["num_workers"], **args["dataloader_kwargs"]}
    if loader.get("pin_memory") and not torch.cuda.is_available():
        loader["pin_memory"] = False
    return StreamedStart(spool, make, options=first, loader=loader, with_ids=args["with_ids"],
                         progress=args["progress"])  # fmt: skip


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


#: the policy when neither ``system`` nor ``policy`` is named (README, "Which system to
#: pick": the best a cache does under uniform shuffling)
DEFAULT_POLICY = "minio"


def _parts(system: str | None, sampler: str | None, policy: str | None, sampler_options):
    """The sampler, policy and sampler options ``system`` names (the user's options over
    its own), or the parts given (default: uniform + MinIO)."""
    if system is None:
        if policy in SYSTEMS and policy not in POLICIES:
            raise ConfigError(
                f"policy={policy!r} names a system (sampler, policy and options): did you "
                f"mean system={policy!r}? (its policy alone is "
                f"{SYSTEMS[policy].policy!r})"
            )
        return sampler or "uniform", policy or DEFAULT_POLICY, sampler_options
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
#: with a disk tier, read-ahead stages on it: at most this share of its budget too
DISK_READAHEAD = 0.25


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
    objects or ranks plan together; the default fitted to a given store's spare bytes,
    or with a disk tier (which stages then) to ``DISK_READAHEAD`` of the tier's (more
    staged there evicts what the tier keeps: SHADE's hits over both tiers fell from
    0.43 to 0.39 with a quarter of the tier, ``benchmarks/disk_peers.py``)."""
    if given is not None and (not isinstance(given, int | np.integer) or given < 0):
        raise ConfigError(f"readahead_bytes must be an int >= 0, got {given!r}")
    if storage.extents is None or ranks is not None:
        return 0
    if given is not None:
        return int(given)
    auto = default_readahead_bytes(storage)
    if storage.disk_capacity:
        return min(auto, int(DISK_READAHEAD * storage.disk_capacity))
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


def dataset_namespace(keys: Sequence[str]) -> str:
    """A prefix for a dataset's store keys: a digest of its manifest's keys, one after
    another (packed digests: their hex text a block at a time, no string per key)."""
    digest = hashlib.blake2b(digest_size=6)
    if isinstance(keys, DigestColumn):
        for lo in range(0, len(keys), 1 << 16):
            digest.update(binascii.hexlify(keys.raw[lo : lo + (1 << 16)]))
    else:
        for k in keys:
            digest.update(k.encode())
    return digest.hexdigest() + ":"
