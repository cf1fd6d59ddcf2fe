"""`hotset compare`: the main job. Trains a model (a small CNN, or ResNet-18 on a GPU)
through hotset for each system and cache fraction, reading the dataset from emulated
remote storage, and reports hit ratio, storage reads, epoch time and test accuracy side by
side (table, JSON, PNG). The systems run interleaved, an epoch of each in turn, so that
the machine's load falls on all alike. Decisions that watch accuracy (SHADE's bias guard,
SpiderCache's accuracy monitor) see a validation split held out of the training set,
never the test set."""

from __future__ import annotations

import json
import logging
import posixpath
import sys
import time
from collections.abc import Generator
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

import numpy as np
import torch
from torch import nn

from hotset.build import default_readahead_bytes, make_loader
from hotset.codecs import decode_sample
from hotset.collate import collate, split_sample
from hotset.compare_peers import PEERS, check_peers, peer_note, peer_python, train_peer
from hotset.errors import ConfigError
from hotset.feedback import per_sample_loss
from hotset.models import accuracy, make_model, model_factory, resolve_device
from hotset.plotting import pyplot, written
from hotset.policy import POLICIES
from hotset.sampling import SAMPLERS
from hotset.sim.oracle import LossOracle
from hotset.storage import Storage, SubsetStorage, ThrottledStorage
from hotset.storage.manifest import MANIFEST_NAME
from hotset.storage.open import open_storage
from hotset.store import make_store
from hotset.systems import resolve_system
from hotset.training import train_epoch

log = logging.getLogger(__name__)

IMAGE_SIZE = (28, 28)  # Fashion-MNIST's: the job scenarios' and the benchmarks' images
IN_MEMORY = "inmemory"  # the compute floor: torch's DataLoader over tensors in memory
TARGET_GAP = 0.005  # the default target: the in-memory run's final accuracy less 0.5 pt


@dataclass
class CompareConfig:
    data: str
    policies: list[str]
    cache_fractions: list[float]
    epochs: int = 3
    batch_size: int = 128
    num_workers: int = 2
    latency_ms: float = 2.0
    bandwidth_mb_s: float = 100.0
    concurrency: int = 4
    store: str = "shared"
    seed: int = 0
    progress: bool = True
    device: str = "auto"
    model: str = "tiny"  # or a user's module:callable (models.make_model)
    size: tuple[int, int] | None = None  # (width, height) images are resized to; None: as they are
    val_fraction: float = 1 / 12  # 5,000 of Fashion-MNIST's 60,000
    sampler_options: dict = field(default_factory=dict)
    policy_options: dict = field(default_factory=dict)
    seeds: list[int] | None = None  # several runs per system (default: ``seed`` alone)
    target_accuracy: float | None = None  # default: in-memory's final accuracy - TARGET_GAP
    peers: list[str] = field(default_factory=list)  # loaders beside hotset's rows (streaming)
    peer_python: str | None = None  # the Python that runs them (compare_peers.peer_python)

    def decode(self) -> partial:
        """How each sample is decoded: resized to ``size`` where it is given."""
        return partial(decode_sample, size=self.size)

    def validate(self) -> None:
        if not self.policies:
            raise ConfigError("--systems: give at least one system")
        if self.seeds is not None and not self.seeds:
            raise ConfigError("--seeds: give at least one seed")
        if self.target_accuracy is not None and not 0.0 < self.target_accuracy <= 1.0:
            raise ConfigError(f"--target-accuracy: {self.target_accuracy} is not in (0, 1]")
        systems = [resolve_system(name) for name in self.policies if name != IN_MEMORY]
        check_peers(self.peers)
        for f in self.cache_fractions:
            if not 0.0 <= f <= 1.0:
                raise ConfigError(f"--cache-fractions: {f} is not in [0, 1]")
        if self.epochs < 1:
            raise ConfigError(f"--epochs must be >= 1, got {self.epochs}")
        if not 0.0 <= self.val_fraction < 1.0:
            raise ConfigError(f"--val-fraction: {self.val_fraction} is not in [0, 1)")
        model_factory(self.model)
        resolve_device(self.device)
        for flag, options, registry, part in (
            ("--sampler-option", self.sampler_options, SAMPLERS, "sampler"),
            ("--policy-option", self.policy_options, POLICIES, "policy"),
        ):
            taken = set().union(*(registry.options_for(getattr(s, part), options) for s in systems))
            if set(options) - taken:
                raise ConfigError(
                    f"{flag}: no {part} of {', '.join(self.policies)} takes "
                    f"{', '.join(sorted(set(options) - taken))}"
                )


def open_split(data: str, split: str) -> Storage:
    """``data/split`` in whatever format it is (``open_storage``)."""
    path = posixpath.join(data, split)
    try:
        return open_storage(path)
    except ConfigError as exc:
        raise ConfigError(
            f"--data {data}: its {split}/ split cannot be read ({exc}); --data holds train/ "
            f"and test/ splits, as `hotset prepare` writes them ({MANIFEST_NAME} trees, tar "
            "shards or Parquet; --format)"
        ) from exc


def load_split(data: str, split: str, decode) -> tuple[torch.Tensor, torch.Tensor] | None:
    """A whole split in memory (the test set), or None where there is none."""
    try:
        storage = open_split(data, split)
    except ConfigError:
        return None
    return load_ids(storage, np.arange(len(storage)), decode)


def _model_for(
    train: Storage, seed: int, model: str, device, test, decode
) -> tuple[nn.Module, torch.optim.Optimizer]:
    """A fresh model for ``train``'s classes (where its storage knows no labels before
    reading, as tar shards, the test split's targets say how many) and its inputs'
    channels."""
    torch.manual_seed(seed)
    n = max(len(train.classes), int(train.labels.max()) + 1)
    if n <= 0 and test is not None:
        n = int(test[1].max()) + 1
    if n <= 0:
        raise ConfigError("the training split names no classes and there is no test split")
    net = make_model(model, num_classes=n, in_channels=input_channels(train, decode))
    net = net.to(resolve_device(device))
    return net, torch.optim.Adam(net.parameters(), lr=1e-3)


def input_channels(storage: Storage, decode, probe: int = 8) -> int:
    """The channels of the split's inputs (C x H x W; 1 for H x W), from its first
    samples. Images of more than one size need ``--size``: nothing is resized unasked."""
    ids = list(range(min(probe, len(storage))))
    shapes = {
        tuple(split_sample(storage, i, decode(b), storage.labels[i])[0].shape)
        for i, b in zip(ids, storage.read_many(ids), strict=True)
    }
    if len(shapes) > 1:
        raise ConfigError(
            f"--data: its samples differ in shape ({', '.join(map(str, sorted(shapes)))}): "
            "give --size W,H to resize images as they are decoded"
        )
    shape = shapes.pop() if shapes else (1,)
    return int(shape[0]) if len(shape) == 3 else 1


def split_train(data: str, val_fraction: float, seed: int = 0) -> tuple[Storage, np.ndarray]:
    """The training split less a held-out validation part: (the storage to train on, the
    validation ids in the full split). The same ``seed`` holds out the same samples."""
    full = open_split(data, "train")
    n_val = int(round(val_fraction * len(full)))
    if n_val == 0:
        return full, np.zeros(0, np.int64)
    perm = np.random.default_rng(seed).permutation(len(full))
    return SubsetStorage(full, np.sort(perm[n_val:])), np.sort(perm[:n_val])


def load_ids(storage: Storage, ids: np.ndarray, decode) -> tuple[torch.Tensor, torch.Tensor]:
    """Samples ``ids`` of a (local) storage as in-memory tensors."""
    ids = [int(i) for i in ids]
    pairs = [
        split_sample(storage, i, decode(b), storage.labels[i])
        for i, b in zip(ids, storage.read_many(ids), strict=True)
    ]
    inputs, targets = collate(ids, pairs, storage.describe)
    return inputs, torch.as_tensor(targets, dtype=torch.int64)


def _train_and_validation(cfg: CompareConfig, decode):
    """The storage to train on and the held-out validation samples in memory (or None)."""
    train, val_ids = split_train(cfg.data, cfg.val_fraction, cfg.seed)
    if not val_ids.size:
        return train, None
    return train, load_ids(open_split(cfg.data, "train"), val_ids, decode)


def system_arguments(cfg: CompareConfig, name: str) -> dict:
    """What ``make_loader`` is given for system ``name`` (its run's options): the same
    arguments a user's ``make_loader(system=name, ...)`` takes, so that compare measures
    exactly what a user builds (``tests/test_systems_table.py`` checks both ways)."""
    system = resolve_system(name)
    return {
        "system": system.name, "batch_size": cfg.batch_size, "seed": cfg.seed,
        "epochs": cfg.epochs,
        "sampler_options": SAMPLERS.options_for(system.sampler, cfg.sampler_options),
        "policy_options": POLICIES.options_for(system.policy, cfg.policy_options),
    }  # fmt: skip


def interleaved(runs: list[Generator[None, None, dict]]) -> list[dict]:
    """Run ``runs`` an epoch at a time in turn, each round starting one further along,
    so that the machine's load (a noisy neighbour, a busy core) falls on each alike and
    not on whichever runs last; their rows, in order."""
    rows: list[dict | None] = [None] * len(runs)
    live = list(range(len(runs)))
    turn = 0
    while live:
        for k in live[turn % len(live) :] + live[: turn % len(live)]:
            try:
                next(runs[k])
            except StopIteration as done:
                rows[k] = done.value
        live = [k for k in live if rows[k] is None]
        turn += 1
    return rows  # type: ignore[return-value]


def train_epochs(
    cfg: CompareConfig, name: str, fraction: float, test
) -> Generator[None, None, dict]:
    """Train from scratch with one system and cache size, yielding after each epoch
    (``interleaved`` runs several in turn); returns the row of the table."""
    system = resolve_system(name)
    decode = cfg.decode()
    train, val = _train_and_validation(cfg, decode)
    storage = ThrottledStorage(train, cfg.latency_ms, cfg.bandwidth_mb_s, cfg.concurrency)
    capacity = int(fraction * train.manifest.total_bytes)
    # the read-ahead a user's make_loader gets, beside the cache (its store holds both)
    readahead = default_readahead_bytes(storage)
    store = make_store(cfg.store, capacity + readahead)
    device = resolve_device(cfg.device)
    loader = None
    try:
        loader = make_loader(
            storage, **system_arguments(cfg, system.name), capacity_bytes=capacity,
            readahead_bytes=readahead, store=store, num_workers=cfg.num_workers, decode=decode,
            progress=cfg.progress,
            persistent_workers=cfg.num_workers > 0, pin_memory=device.type == "cuda",
        )  # fmt: skip
        model, opt = _model_for(train, cfg.seed, cfg.model, device, test, decode)
        epoch_times, hit_ratios, accs, train_losses, reads, requests = [], [], [], [], [], []
        test_accs, waits = [], []
        for epoch in range(cfg.epochs):
            loader.set_epoch(epoch)
            loader.desc = f"{name} {fraction:.0%} epoch {epoch + 1}/{cfg.epochs}"
            before = loader.counters()
            start = time.perf_counter()
            train_losses.append(train_epoch(loader, model, opt))
            epoch_times.append(time.perf_counter() - start)
            after = loader.counters()
            served = after["accesses"] - before["accesses"]
            hit_ratios.append((after["hits"] - before["hits"]) / served if served else 0.0)
            reads.append(after["storage_reads"] - before["storage_reads"])
            requests.append(after["storage_requests"] - before["storage_requests"])
            waits.append(after["storage_wait_s"] - before["storage_wait_s"])
            if val is not None:
                accs.append(accuracy(model, *val))
                loader.report_accuracy(accs[-1])
            if test is not None:  # not timed: the epoch's clock stopped above
                test_accs.append(accuracy(model, *test))
            epoch_line(cfg, f"{name} {fraction:.0%}", epoch, epoch_times[-1],
                       hit_ratios[-1], reads[-1], test_accs[-1] if test_accs else None)  # fmt: skip
            yield
        loader.planner.drain()  # graph importance: let the worker finish
        c = loader.counters()
        test_acc = test_accs[-1] if test_accs else None
    finally:
        if loader is not None:
            loader.close()
        store.close(destroy=True)
    return {
        "policy": name,
        "sampler": system.sampler,
        "eviction": system.policy,
        "cache_fraction": fraction,
        "capacity_bytes": capacity,
        "readahead_bytes": readahead,
        "epochs": cfg.epochs,
        "hit_ratio": c["hit_ratio"],
        "steady_hit_ratio": float(np.mean(hit_ratios[1:])) if cfg.epochs > 1 else hit_ratios[0],
        "hit_ratio_per_epoch": hit_ratios,
        "epoch_time_s": float(np.mean(epoch_times)),
        "steady_epoch_time_s": float(np.mean(epoch_times[min(2, cfg.epochs - 1) :])),
        "epoch_times_s": epoch_times,
        "storage_reads_per_epoch": reads,
        "storage_requests_per_epoch": requests,
        "storage_wait_s_per_epoch": waits,
        "test_accuracy": test_acc,
        "test_accuracy_per_epoch": test_accs,
        "seed": cfg.seed,
        "val_accuracy_per_epoch": accs,
        "model": cfg.model,
        "device": str(device),
        "train_loss_per_epoch": train_losses,
        "bias_guard_epochs": c["internal"].get("bias_guard_epochs", []),
        "planning_us_per_sample": 1e6 * c["planning_s"] / max(1, c["accesses"]),
        "counters": c,
    }


def run_peer(cfg: CompareConfig, peer: str, fraction: float, test, python: str) -> dict:
    """``peer`` (``compare_peers``) over the same training split, model and link."""
    decode = cfg.decode()
    train, val = _train_and_validation(cfg, decode)
    model, _ = _model_for(train, cfg.seed, cfg.model, "cpu", test, decode)
    # the same memory as hotset's row: its cache and its read-ahead
    memory = fraction + default_readahead_bytes(train) / max(1, train.manifest.total_bytes)
    row = train_peer(cfg, peer, memory, train, model, val, test, cfg.size, python)
    row["cache_fraction"] = fraction
    for epoch, seconds in enumerate(row["epoch_times_s"]):
        accs = row["test_accuracy_per_epoch"]
        reads = row["storage_reads_per_epoch"][epoch]
        epoch_line(cfg, f"{peer} {fraction:.0%}", epoch, seconds, None, reads,
                   accs[epoch] if accs else None)  # fmt: skip
    return row


def train_in_memory(cfg: CompareConfig, test) -> dict:
    """The compute floor: the same model, optimiser and epochs through a plain
    ``DataLoader`` over the training split decoded into memory (no storage, no cache)."""
    from torch.utils.data import DataLoader, TensorDataset

    decode = cfg.decode()
    train, val = _train_and_validation(cfg, decode)
    x, y = load_ids(train, np.arange(len(train)), decode)
    device = resolve_device(cfg.device)
    loader = DataLoader(
        TensorDataset(x, y), batch_size=cfg.batch_size, shuffle=True,
        generator=torch.Generator().manual_seed(cfg.seed), pin_memory=device.type == "cuda",
    )  # fmt: skip
    model, opt = _model_for(train, cfg.seed, cfg.model, device, test, decode)
    times, accs, test_accs = [], [], []
    for _ in range(cfg.epochs):
        start = time.perf_counter()
        model.train()
        for xb, yb in loader:
            xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
            loss = per_sample_loss(model(xb), yb).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        float(loss.detach())  # the epoch ends when its last step has run
        times.append(time.perf_counter() - start)
        if val is not None:
            accs.append(accuracy(model, *val))
        if test is not None:
            test_accs.append(accuracy(model, *test))
        epoch_line(cfg, IN_MEMORY, len(times) - 1, times[-1], 1.0, 0,
                   test_accs[-1] if test_accs else None)  # fmt: skip
    return {
        "policy": IN_MEMORY, "sampler": "uniform", "eviction": None, "cache_fraction": 1.0,
        "epochs": cfg.epochs, "hit_ratio": 1.0, "steady_hit_ratio": 1.0,
        "epoch_time_s": float(np.mean(times)), "epoch_times_s": times,
        "steady_epoch_time_s": float(np.mean(times[min(2, cfg.epochs - 1) :])),
        "test_accuracy": test_accs[-1] if test_accs else None,
        "test_accuracy_per_epoch": test_accs, "seed": cfg.seed,
        "val_accuracy_per_epoch": accs, "model": cfg.model, "device": str(device),
        "planning_us_per_sample": 0.0, "counters": {},
    }  # fmt: skip


def epoch_line(
    cfg: CompareConfig, run: str, epoch: int, seconds: float, hit: float | None, reads: int,
    acc: float | None,
) -> None:  # fmt: skip
    """One line per epoch where no progress bar shows (outside a terminal, or
    ``--no-progress``): a log that never goes quiet for a whole run."""
    if cfg.progress and sys.stderr.isatty():
        return
    test = f", test acc {acc:.4f}" if acc is not None else ""
    print(f"{run} seed {cfg.seed} epoch {epoch + 1}/{cfg.epochs}: {seconds:.1f} s, "
          f"hit ratio {'-' if hit is None else f'{hit:.3f}'}, {reads} storage reads{test}",
          flush=True)  # fmt: skip


def accuracy_target(rows: list[dict], given: float | None = None) -> tuple[float | None, str]:
    """The accuracy a run must reach: ``given``, else, as the papers measure it, the
    uniform baseline's mean final test accuracy less ``TARGET_GAP`` (the in-memory runs',
    else the runs under uniform shuffling), else the best run's less the same; and where
    it came from."""
    if given is not None:
        return given, "given"
    uniform = [r for r in filter(_is_system, rows)
               if resolve_system(r["policy"]).sampler == "uniform"]  # fmt: skip
    for source, pick in (("in-memory", [r for r in rows if r["policy"] == IN_MEMORY]),
                         ("uniform baseline", uniform), ("best run", rows)):  # fmt: skip
        finals = [r["test_accuracy"] for r in pick if r.get("test_accuracy") is not None]
        if finals:
            best = max(finals) if source == "best run" else float(np.mean(finals))
            return best - TARGET_GAP, f"{source} {best:.4f} - {TARGET_GAP * 100:.1f} pt"
    return None, "no test split"


def _is_system(row: dict) -> bool:
    """A row of a hotset system (not the in-memory floor nor a peer)."""
    return row["policy"] != IN_MEMORY and row["policy"] not in PEERS


#: a run is I/O-bound where its workers wait on storage at least this share of its epoch
IO_BOUND_SHARE = 0.5


def io_bound_note(rows: list[dict], num_workers: int) -> str | None:
    """Where the uniform baseline (LRU, else the first uniform run) did not wait on
    storage for most of its epoch, why the epoch times hardly differ, and what to do;
    None where it did (each row gets its ``storage_wait_share``)."""
    for r in rows:
        wait = steady(r, "storage_wait_s_per_epoch") / max(1, num_workers)
        epoch = r["steady_epoch_time_s"]
        r["storage_wait_share"] = wait / epoch if epoch else 0.0
    base = [r for r in rows if r["policy"] == "lru"] or [
        r for r in rows if _is_system(r) and resolve_system(r["policy"]).sampler == "uniform"
    ]
    if not base or max(r["storage_wait_share"] for r in base) >= IO_BOUND_SHARE:
        return None
    r = max(base, key=lambda r: r["storage_wait_share"])
    return (
        f"not I/O-bound: {r['policy']}'s workers waited on storage {r['storage_wait_share']:.0%} "
        f"of its epoch ({r['storage_wait_share'] * r['steady_epoch_time_s']:.1f} of "
        f"{r['steady_epoch_time_s']:.1f} s each), so decoding and training set the epoch "
        "time and a better hit ratio barely moves it (the hit ratio and reads still show "
        "what the cache saves). To see it in time: raise --latency-ms, lower --bandwidth-mb-s, "
        "or train a lighter --model"
    )


def add_time_to_target(rows: list[dict], target: float | None) -> None:
    """Each row's training time (the epochs' wall time, evaluation excluded) until the end
    of the first epoch whose test accuracy reaches ``target``; ``None``: never reached."""
    for r in rows:
        r["target_accuracy"] = target
        r["time_to_target_s"] = None
        elapsed = np.cumsum(r["epoch_times_s"])
        for t, acc in zip(elapsed, r.get("test_accuracy_per_epoch", []), strict=False):
            if target is not None and acc >= target:
                r["time_to_target_s"] = float(t)
                break


def summarise(rows: list[dict]) -> list[dict]:
    """Per system and cache size over its seeds: mean and spread (the standard deviation)
    of the steady epoch time, hit ratio, final accuracy and time to target (over the
    seeds that reached it)."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["policy"], r["cache_fraction"]), []).append(r)
    out = []
    for (policy, fraction), rs in groups.items():
        row = {"policy": policy, "cache_fraction": fraction, "seeds": len(rs)}
        for key in ("steady_epoch_time_s", "steady_hit_ratio", "test_accuracy", "time_to_target_s"):
            vals = [r[key] for r in rs if r.get(key) is not None]
            row[key] = float(np.mean(vals)) if vals else None
            row[key + "_std"] = float(np.std(vals)) if vals else None
        row["reached_target"] = sum(r.get("time_to_target_s") is not None for r in rs)
        out.append(row)
    return out


def format_summary(summary: list[dict], target: float | None, source: str) -> str:
    """The table users judge by: time to the target accuracy beside the steady epoch time,
    hit ratio and final accuracy, mean +- spread over the seeds."""

    def pm(r: dict, key: str, fmt: str) -> str:
        if r[key] is None:
            return "never" if key == "time_to_target_s" else "-"
        return f"{r[key]:{fmt}} +- {r[key + '_std']:{fmt}}" if r["seeds"] > 1 else f"{r[key]:{fmt}}"

    goal = f"{target:.4f} ({source})" if target is not None else source
    head = (
        f"{'system':<10} {'cache':>6} {'seeds':>5} {'time to target':>18} {'reached':>7} "
        f"{'steady epoch s':>16} {'hit ratio':>16} {'final acc':>18}"
    )
    lines = [f"target accuracy: {goal}", head, "-" * len(head)]
    for r in summary:
        cache = "-" if r["policy"] == IN_MEMORY else f"{r['cache_fraction']:.0%}"
        lines.append(
            f"{r['policy']:<10} {cache:>6} {r['seeds']:>5d} "
            f"{pm(r, 'time_to_target_s', '.1f'):>18} {r['reached_target']:>4d}/{r['seeds']:<2d} "
            f"{pm(r, 'steady_epoch_time_s', '.2f'):>16} {pm(r, 'steady_hit_ratio', '.3f'):>16} "
            f"{pm(r, 'test_accuracy', '.4f') if r['test_accuracy'] is not None else 'n/a':>18}"
        )
    return "\n".join(lines)


def record_oracle(
    data: str,
    epochs: int,
    out: str,
    batch_size: int = 128,
    seed: int = 0,
    num_workers: int = 2,
    model: str = "tiny",
    device: str = "auto",
    val_fraction: float = 1 / 12,
    embedding_dims: int = 0,
    size: tuple[int, int] | None = None,
) -> LossOracle:
    """Train with uniform shuffling (local storage, no cache) on the training split less
    its validation part (as ``compare``) and keep every sample's loss and embedding at
    every epoch: the oracle the simulator and the I/O-bound benchmark replay.
    ``embedding_dims`` > 0 keeps a fixed random projection of the embeddings to that many
    dimensions (distances preserved in expectation; a smaller file for a 512-d model)."""
    train, _ = split_train(data, val_fraction, seed)
    decode = partial(decode_sample, size=size)
    dev = resolve_device(device)
    store = make_store("shared" if num_workers else "memory", 0)
    loader = make_loader(
        train, batch_size=batch_size, policy="minio", capacity_bytes=0, store=store,
        seed=seed, num_workers=num_workers, decode=decode, progress=True,
        pin_memory=dev.type == "cuda",
    )  # fmt: skip
    net, opt = _model_for(train, seed, model, dev, None, decode)
    dim = net.embedding_dim
    project = None
    if 0 < embedding_dims < dim:
        g = torch.Generator().manual_seed(seed)
        project = (torch.randn(dim, embedding_dims, generator=g) / embedding_dims**0.5).to(dev)
        dim = embedding_dims
    losses = np.full((epochs, len(train)), np.nan, dtype=np.float32)
    emb = np.zeros((epochs, len(train), dim), dtype=np.float16)

    def keep(ids: np.ndarray, batch_losses: torch.Tensor, e: torch.Tensor) -> None:
        losses[epoch, ids] = batch_losses.cpu().numpy()
        emb[epoch, ids] = (e if project is None else e @ project).cpu().numpy()

    try:
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            loader.desc = f"record epoch {epoch + 1}/{epochs}"
            net.train()
            for x, y, ids in loader:
                x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
                logits, e = net.forward_with_embedding(x)
                batch_losses = per_sample_loss(logits, y)
                opt.zero_grad(set_to_none=True)
                batch_losses.mean().backward()
                opt.step()
                keep(ids.numpy(), batch_losses.detach(), e)
    finally:
        loader.close()
        store.close(destroy=True)
    meta = {"data": data, "epochs": epochs, "batch_size": batch_size, "seed": seed,
            "model": model, "val_fraction": val_fraction, "embedding_dims": dim}  # fmt: skip
    oracle = LossOracle(losses, meta, embeddings=emb, labels=train.labels)
    oracle.save(out)
    return oracle


def steady(r: dict, key: str) -> float:
    """A per-epoch figure's mean from the third epoch on (the first fills the cache)."""
    vals = r.get(key) or [0.0]
    return float(np.mean(vals[min(2, len(vals) - 1) :]))


TABLE_LEGEND = (
    "vs LRU: uniform+LRU's steady epoch time over this one's (same cache and seed); hit "
    "ratio from epoch 2, requests, wait and epoch\nper epoch from epoch 3; requests: to "
    "storage (a peer's: shard downloads); wait: worker-seconds on storage reads; to target: "
    "training time to the target accuracy; --verbose: every counter"
)


def format_table(rows: list[dict], verbose: bool = False) -> str:
    """One line per run: the figures users judge by (``verbose``: every counter)."""
    if verbose:
        return format_counters(rows)
    head = (
        f"{'system':<10} {'cache':>6} {'seed':>4} {'vs LRU':>7} {'hit ratio':>9} "
        f"{'requests':>8} {'wait s':>8} {'epoch s':>8} {'test acc':>8} {'to target s':>11}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        base = next((b for b in rows if b["policy"] == "lru" and b.get("seed") == r.get("seed")
                     and b["cache_fraction"] == r["cache_fraction"]), None)  # fmt: skip
        vs = f"{base['steady_epoch_time_s'] / r['steady_epoch_time_s']:.2f}x" if base else "-"
        if r.get("tuned") is False:
            vs = "thrash"
        hit = "-" if r["steady_hit_ratio"] is None else f"{r['steady_hit_ratio']:.3f}"
        wait = (f"{steady(r, 'storage_wait_s_per_epoch'):.1f}"
                if "storage_wait_s_per_epoch" in r else "-")  # fmt: skip
        acc = f"{r['test_accuracy']:.4f}" if r["test_accuracy"] is not None else "n/a"
        ttt = r.get("time_to_target_s")
        cache = "-" if r["policy"] == IN_MEMORY else f"{r['cache_fraction']:.0%}"
        lines.append(
            f"{r['policy']:<10} {cache:>6} {r.get('seed', 0):>4} {vs:>7} "
            f"{hit:>9} {steady(r, 'storage_requests_per_epoch'):>8.0f} "
            f"{wait:>8} {r['steady_epoch_time_s']:>8.2f} "
            f"{acc:>8} {'never' if ttt is None else f'{ttt:.1f}':>11}"
        )
    lines.append(TABLE_LEGEND)
    return "\n".join(lines)


def format_counters(rows: list[dict]) -> str:
    """One line per run: hits (exact and substituted), every storage request (misses, late
    misses, prefetches, iCACHE's packaging reads and package loads), late misses, refused
    puts, epoch time (all epochs; steady: from the third on) and test accuracy."""
    head = (
        f"{'policy':<10} {'cache':>6} {'hit ratio':>9} {'exact':>7} {'subst':>7} {'steady':>7} "
        f"{'storage':>8} {'late':>6} {'refused':>7} {'phantom':>7} {'epoch s':>8} "
        f"{'steady s':>8} {'test acc':>8} {'plan us':>8}"
    )
    lines = [head, "-" * len(head)]
    for r in filter(_is_system, rows):
        acc = f"{r['test_accuracy']:.4f}" if r["test_accuracy"] is not None else "n/a"
        c = {k: 0 for k in ("accesses", "exact_hits", "substitute_hits", "storage_reads",
                            "late_misses", "refused_puts", "phantoms")}  # fmt: skip
        c |= r["counters"] | r["counters"].get("internal", {})
        n = max(1, c["accesses"])
        lines.append(
            f"{r['policy']:<10} {r['cache_fraction']:>6.0%} {r['hit_ratio']:>9.4f} "
            f"{c['exact_hits'] / n:>7.4f} {c['substitute_hits'] / n:>7.4f} "
            f"{r['steady_hit_ratio']:>7.4f} {c['storage_reads']:>8d} {c['late_misses']:>6d} "
            f"{c['refused_puts']:>7d} {c['phantoms']:>7d} {r['epoch_time_s']:>8.2f} "
            f"{r['steady_epoch_time_s']:>8.2f} {acc:>8} {r['planning_us_per_sample']:>8.2f}"
        )
    return "\n".join(lines)


def plot(rows: list[dict], path: Path, cfg: CompareConfig | None = None) -> None:
    """Hit ratio per epoch, steady epoch time and storage wait (from epoch 3) per system
    and cache size, and test accuracy against training time (one line per system and
    cache size, the seeds' mean), the setup as a subtitle."""
    plt = pyplot(path)
    if plt is None:
        return

    runs: dict[str, list[dict]] = {}
    for r in rows:
        cache = "" if r["policy"] == IN_MEMORY else f" {r['cache_fraction']:.0%}"
        runs.setdefault(r["policy"] + cache, []).append(r)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    x = np.arange(len(runs))
    for k, (label, mine) in enumerate(runs.items()):
        if mine[0].get("hit_ratio_per_epoch"):
            hr = np.mean([r["hit_ratio_per_epoch"] for r in mine], axis=0)
            axes[0].plot(np.arange(1, hr.size + 1), hr, marker="o", label=label, color=f"C{k}")
        axes[1].bar(k - 0.2, np.mean([r["steady_epoch_time_s"] for r in mine]), 0.4,
                    color=f"C{k}", label="epoch time" if k == 0 else None)  # fmt: skip
        wait = np.mean([steady(r, "storage_wait_s_per_epoch") for r in mine])
        axes[1].bar(k + 0.2, wait, 0.4, color=f"C{k}", alpha=0.4, hatch="//",
                    label="storage wait (worker-s)" if k == 0 else None)  # fmt: skip
        if mine[0].get("test_accuracy_per_epoch"):
            t = np.mean([np.cumsum(r["epoch_times_s"]) for r in mine], axis=0)
            acc = np.mean([r["test_accuracy_per_epoch"] for r in mine], axis=0)
            axes[2].plot(t, acc, marker="o", label=label, color=f"C{k}")
    axes[0].xaxis.get_major_locator().set_params(integer=True)
    axes[0].set_xlabel("epoch")
    axes[0].set_title("hit ratio per epoch")
    axes[1].set_xticks(x, list(runs), rotation=30, ha="right", fontsize=8)
    axes[1].set_title("steady epoch (s, from epoch 3)")
    axes[1].legend(fontsize=8)
    target = next((r.get("target_accuracy") for r in rows if r.get("target_accuracy")), None)
    if target is not None:
        axes[2].axhline(target, color="grey", linestyle="--", linewidth=1, label="target")
    axes[2].set_xlabel("training time (s, evaluation excluded)")
    axes[2].set_title("test accuracy")
    axes[2].legend(fontsize=8)
    axes[0].legend(fontsize=8)
    if cfg is not None:
        seeds = cfg.seeds or [cfg.seed]
        n = max((r["counters"].get("accesses", 0) // max(1, r["epochs"]) for r in rows), default=0)
        caches = ", ".join(f"{f:.0%}" for f in cfg.cache_fractions)
        bound = io_bound_note(rows, cfg.num_workers)
        fig.suptitle(
            f"{cfg.data} ({n:,} training samples): storage {cfg.latency_ms:g} ms/read, "
            f"{cfg.concurrency} in flight, {cfg.num_workers} workers, cache {caches}, "
            f"{cfg.model}, {cfg.epochs} epochs, seeds {','.join(map(str, seeds))}"
            + ("\nnot I/O-bound: the epoch time is decoding and training, not storage "
               "(see the table's note)" if bound else ""),
            fontsize=10,
        )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run_compare(
    cfg: CompareConfig, out_dir: str | None = "out", json_path: str | None = None,
    verbose: bool = False,
) -> list[dict]:
    cfg.validate()
    input_channels(open_split(cfg.data, "train"), cfg.decode())  # a wrong --data or --size
    test = load_split(cfg.data, "test", cfg.decode())
    python = peer_python(cfg.peer_python) if cfg.peers else None
    rows = []
    for seed in cfg.seeds or [cfg.seed]:
        run, runs = replace(cfg, seed=seed), []
        for policy in cfg.policies:
            if policy == IN_MEMORY:
                runs.append(train_in_memory(run, test))
                continue
            runs += [train_epochs(run, policy, fraction, test) for fraction in cfg.cache_fractions]
        systems = interleaved([r for r in runs if not isinstance(r, dict)])  # an epoch each
        rows += [r if isinstance(r, dict) else systems.pop(0) for r in runs]
        for peer in cfg.peers:
            for fraction in cfg.cache_fractions:
                rows.append(run_peer(run, peer, fraction, test, python))
    target, source = accuracy_target(rows, cfg.target_accuracy)
    add_time_to_target(rows, target)
    note = io_bound_note(rows, cfg.num_workers)
    print(format_table(rows, verbose))
    for line in (note, peer_note(rows)):
        if line:
            print(line)
    print(format_summary(summarise(rows), target, source))
    if out_dir:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "compare.json").write_text(json.dumps(rows, indent=2))
        plot(rows, out / "compare.png", cfg)
        print(f"wrote {written(out, 'compare')}")
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(rows, indent=2))
    return rows
