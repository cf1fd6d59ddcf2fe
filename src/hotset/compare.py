"""`hotset compare`: the main job. Trains a small CNN through hotset for each policy and
cache fraction, reading the dataset from emulated remote storage, and reports hit ratio,
epoch time and test accuracy side by side (table, JSON, PNG)."""

from __future__ import annotations

import json
import logging
import posixpath
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import torch
from torch import nn

from hotset.codecs import decode_sample, to_tensor
from hotset.errors import ConfigError
from hotset.feedback import per_sample_loss
from hotset.loader import make_loader
from hotset.models import TinyCNN, accuracy
from hotset.sampling import sampler_class
from hotset.sim.oracle import LossOracle
from hotset.storage import FileStorage, ThrottledStorage
from hotset.store import make_store
from hotset.systems import resolve_system
from hotset.training import train_epoch

log = logging.getLogger(__name__)

IMAGE_SIZE = (28, 28)


@dataclass
class CompareConfig:
    data: str
    policies: list[str]
    cache_fractions: list[float]
    epochs: int = 3
    batch_size: int = 128
    num_workers: int = 2
    latency_ms: float = 2.0
    bandwidth_mb_s: float = 0.0
    concurrency: int = 4
    store: str = "shared"
    seed: int = 0
    progress: bool = True

    def validate(self) -> None:
        if not self.policies:
            raise ConfigError("--policies: give at least one policy")
        for name in self.policies:
            resolve_system(name)
        for f in self.cache_fractions:
            if not 0.0 <= f <= 1.0:
                raise ConfigError(f"--cache-fractions: {f} is not in [0, 1]")
        if self.epochs < 1:
            raise ConfigError(f"--epochs must be >= 1, got {self.epochs}")


def load_split(data: str, split: str, decode) -> tuple[torch.Tensor, torch.Tensor] | None:
    """A whole split in memory (the test set), read straight from local storage."""
    try:
        storage = FileStorage(posixpath.join(data, split))
    except ConfigError:
        return None
    ids = list(range(len(storage)))
    inputs = to_tensor(np.stack([decode(b) for b in storage.read_many(ids)]))
    return inputs, torch.as_tensor(storage.labels, dtype=torch.int64)


def _model_for(train: FileStorage, seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = TinyCNN(num_classes=max(len(train.classes), int(train.labels.max()) + 1))
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)


def train_one(cfg: CompareConfig, name: str, fraction: float, test) -> dict:
    """Train from scratch with one system and cache size; returns the row of the table."""
    system = resolve_system(name)
    train = FileStorage(posixpath.join(cfg.data, "train"))
    storage = ThrottledStorage(train, cfg.latency_ms, cfg.bandwidth_mb_s, cfg.concurrency)
    capacity = int(fraction * train.manifest.total_bytes)
    store = make_store(cfg.store, capacity)
    sampler_options = dict(system.sampler_options)
    if sampler_class(system.sampler).needs_embeddings:
        sampler_options.setdefault("total_epochs", cfg.epochs)  # the ratio controller's T
    loader = None
    try:
        loader = make_loader(
            storage, batch_size=cfg.batch_size, policy=system.policy, sampler=system.sampler,
            sampler_options=sampler_options, capacity_bytes=capacity, store=store,
            seed=cfg.seed, num_workers=cfg.num_workers,
            decode=partial(decode_sample, size=IMAGE_SIZE), progress=cfg.progress,
            persistent_workers=cfg.num_workers > 0,
            package_dir=posixpath.join(cfg.data, "train.packages"),
        )  # fmt: skip
        model, opt = _model_for(train, cfg.seed)
        epoch_times, hit_ratios, accs, train_losses = [], [], [], []
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
            if test is not None:
                accs.append(accuracy(model, *test))
                loader.report_accuracy(accs[-1])
        loader.planner.drain()  # graph importance: let the worker finish
        c = loader.counters()
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
        "epochs": cfg.epochs,
        "hit_ratio": c["hit_ratio"],
        "steady_hit_ratio": float(np.mean(hit_ratios[1:])) if cfg.epochs > 1 else hit_ratios[0],
        "hit_ratio_per_epoch": hit_ratios,
        "epoch_time_s": float(np.mean(epoch_times)),
        "epoch_times_s": epoch_times,
        "test_accuracy": accs[-1] if accs else None,
        "accuracy_per_epoch": accs,
        "train_loss_per_epoch": train_losses,
        "bias_guard_epochs": c.get("bias_guard_epochs", []),
        "planning_us_per_sample": 1e6 * c["planning_s"] / max(1, c["accesses"]),
        "counters": c,
    }


def record_oracle(
    data: str, epochs: int, out: str, batch_size: int = 128, seed: int = 0, num_workers: int = 2
) -> LossOracle:
    """Train with uniform shuffling (local storage, no cache) and keep every sample's loss
    at every epoch: the loss oracle the simulator replays."""
    train = FileStorage(posixpath.join(data, "train"))
    store = make_store("shared" if num_workers else "memory", 0)
    loader = make_loader(
        train,
        batch_size=batch_size,
        policy="minio",
        capacity_bytes=0,
        store=store,
        seed=seed,
        num_workers=num_workers,
        decode=partial(decode_sample, size=IMAGE_SIZE),
        progress=True,
    )
    model, opt = _model_for(train, seed)
    losses = np.full((epochs, len(train)), np.nan, dtype=np.float32)
    emb = np.zeros((epochs, len(train), model.head.in_features // 49), dtype=np.float16)
    try:
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            loader.desc = f"record epoch {epoch + 1}/{epochs}"
            model.train()
            for x, y, ids in loader:
                logits, e = model.forward_with_embedding(x)
                batch_losses = per_sample_loss(logits, y)
                opt.zero_grad(set_to_none=True)
                batch_losses.mean().backward()
                opt.step()
                losses[epoch, ids.numpy()] = batch_losses.detach().numpy()
                emb[epoch, ids.numpy()] = e.numpy()
    finally:
        loader.dataset.store.close(destroy=True)
    oracle = LossOracle(
        losses,
        {
            "data": data,
            "epochs": epochs,
            "batch_size": batch_size,
            "seed": seed,
            "model": "TinyCNN",
        },
        embeddings=emb,
        labels=train.labels,
    )
    oracle.save(out)
    return oracle


def format_table(rows: list[dict]) -> str:
    head = (
        f"{'policy':<10} {'cache':>6} {'hit ratio':>9} {'exact':>7} {'subst':>7} {'steady':>7} "
        f"{'late':>6} {'refused':>7} {'phantom':>7} {'read':>8} {'epoch s':>8} {'test acc':>8} "
        f"{'plan us':>8}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        acc = f"{r['test_accuracy']:.4f}" if r["test_accuracy"] is not None else "n/a"
        c = r["counters"]
        n = max(1, c["accesses"])
        lines.append(
            f"{r['policy']:<10} {r['cache_fraction']:>6.0%} {r['hit_ratio']:>9.4f} "
            f"{c['exact_hits'] / n:>7.4f} {c['substitute_hits'] / n:>7.4f} "
            f"{r['steady_hit_ratio']:>7.4f} {c['late_misses']:>6d} {c['refused_puts']:>7d} "
            f"{c['phantoms']:>7d} {c['accesses']:>8d} "
            f"{r['epoch_time_s']:>8.2f} {acc:>8} {r['planning_us_per_sample']:>8.2f}"
        )
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    policies = list(dict.fromkeys(r["policy"] for r in rows))
    fractions = sorted({r["cache_fraction"] for r in rows})
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    width = 0.8 / max(1, len(policies))
    x = np.arange(len(fractions))
    for k, p in enumerate(policies):
        by_f = {r["cache_fraction"]: r for r in rows if r["policy"] == p}
        hr = [by_f[f]["steady_hit_ratio"] if f in by_f else 0 for f in fractions]
        et = [by_f[f]["epoch_time_s"] if f in by_f else 0 for f in fractions]
        axes[0].bar(x + k * width, hr, width, label=p)
        axes[1].bar(x + k * width, et, width, label=p)
    for ax, title in zip(axes, ("hit ratio (after epoch 1)", "mean epoch time (s)"), strict=True):
        ax.set_xticks(x + width * (len(policies) - 1) / 2, [f"{f:.0%}" for f in fractions])
        ax.set_xlabel("cache size (fraction of dataset)")
        ax.set_title(title)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run_compare(
    cfg: CompareConfig, out_dir: str | None = "out", json_path: str | None = None
) -> list[dict]:
    cfg.validate()
    test = load_split(cfg.data, "test", partial(decode_sample, size=IMAGE_SIZE))
    FileStorage(posixpath.join(cfg.data, "train"))  # fail early on a wrong --data
    rows = []
    for policy in cfg.policies:
        for fraction in cfg.cache_fractions:
            rows.append(train_one(cfg, policy, fraction, test))
            log.info("%s at %.0f%%: %s", policy, 100 * fraction, rows[-1]["hit_ratio"])
    print(format_table(rows))
    if out_dir:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "compare.json").write_text(json.dumps(rows, indent=2))
        plot(rows, out / "compare.png")
        print(f"wrote {out / 'compare.json'} and {out / 'compare.png'}")
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(rows, indent=2))
    return rows
