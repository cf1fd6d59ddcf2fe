"""Replay sampling and caching without bytes: the same sampler and policy objects the
loader uses, driven by the same Planner, on ids only."""

from __future__ import annotations

import time

import numpy as np

from hotset.errors import ConfigError
from hotset.plan import Planner
from hotset.policy.base import make_policy
from hotset.sampling.base import make_sampler, sampler_class
from hotset.sim.oracle import LossOracle


def _result(
    policy_name: str,
    hits_per_epoch: list[int],
    accesses_per_epoch: list[int],
    seconds: float,
    **extra,
) -> dict:
    hits, accesses = sum(hits_per_epoch), sum(accesses_per_epoch)
    warm_h, warm_a = sum(hits_per_epoch[1:]), sum(accesses_per_epoch[1:])
    return {
        "policy": policy_name,
        "accesses": accesses,
        "hits": hits,
        "misses": accesses - hits,
        "hit_ratio": hits / accesses if accesses else 0.0,
        # after the first epoch, when the cache is warm
        "steady_hit_ratio": warm_h / warm_a if warm_a else None,
        "hit_ratio_per_epoch": [
            h / a if a else 0.0 for h, a in zip(hits_per_epoch, accesses_per_epoch, strict=True)
        ],
        "seconds": seconds,
        "accesses_per_s": accesses / seconds if seconds > 0 else float("inf"),
        **extra,
    }


def simulate(
    policy: str,
    dataset_size: int,
    epochs: int,
    cache_fraction: float | None = None,
    capacity_items: int | None = None,
    sizes: np.ndarray | None = None,
    sampler: str = "uniform",
    batch_size: int = 256,
    seed: int = 0,
    policy_options: dict | None = None,
    sampler_options: dict | None = None,
    oracle: LossOracle | None = None,
) -> dict:
    """Hit ratio and control-plane speed of ``policy`` under ``sampler`` for ``epochs``.

    Items are of equal size unless ``sizes`` (bytes per id) is given; the cache is
    ``cache_fraction`` of the dataset's bytes or ``capacity_items`` items of the mean size.
    With a loss ``oracle`` every planned batch is fed back its recorded losses at that
    point of training, as the training loop would.
    """
    if epochs < 1:
        raise ConfigError(f"epochs must be >= 1, got {epochs}")
    sizes = np.ones(dataset_size, np.int64) if sizes is None else np.asarray(sizes, np.int64)
    if sizes.size != dataset_size:
        raise ConfigError(f"sizes has {sizes.size} entries for dataset_size={dataset_size}")
    if (cache_fraction is None) == (capacity_items is None):
        raise ConfigError("give exactly one of cache_fraction and capacity_items")
    if capacity_items is not None:
        capacity = int(capacity_items * sizes.mean())
    elif 0.0 <= cache_fraction <= 1.0:
        capacity = int(cache_fraction * sizes.sum())
    else:
        raise ConfigError(f"cache_fraction must be in [0, 1], got {cache_fraction}")
    pol = make_policy(policy, capacity, sizes=sizes, seed=seed, **(policy_options or {}))
    sampler_options = dict(sampler_options or {})
    if sampler_class(sampler).needs_embeddings:  # replay: score inline, deterministically
        if oracle is None or oracle.embeddings is None or oracle.labels is None:
            raise ConfigError(
                f"sampler {sampler!r} scores embeddings: give an oracle recorded with them "
                "(`hotset record` saves embeddings and labels)"
            )
        sampler_options.setdefault("labels", oracle.labels)
        sampler_options.setdefault("background", False)
        sampler_options.setdefault("total_epochs", epochs)
    smp = make_sampler(sampler, dataset_size, seed=seed, **sampler_options)
    if smp.learns_from_feedback and oracle is None:
        raise ConfigError(
            f"sampler {sampler!r} learns from losses: give a loss oracle "
            "(--oracle FILE.npz from `hotset record`)"
        )
    if oracle is not None and oracle.num_samples != dataset_size:
        raise ConfigError(
            f"the oracle has {oracle.num_samples} samples, dataset_size={dataset_size}"
        )
    # Offline policies see the whole run's accesses, known in advance here; a feeder
    # (iCACHE's packages) works on ids alone: no storage, no store.
    planner = Planner(smp, pol, batch_size, feed_future=False)
    if pol.needs_future:
        pol.set_future(np.concatenate([smp.epoch_order(e) for e in range(epochs)]))
    hits, subs, accesses, trained = [], [], [], []
    start = time.perf_counter()
    batches = len(planner)
    for epoch in range(epochs):
        planner.set_epoch(epoch)
        h = a = sub = 0
        served = np.zeros(dataset_size, bool)
        for plan in planner:
            served[plan.ids] = True
            h += int(plan.hits.sum())
            if plan.substituted is not None:
                sub += int((plan.substituted & plan.hits).sum())
            a += plan.ids.size
            if oracle is not None:
                t = epoch + (plan.index + 1) / batches
                emb = oracle.embeddings_at(plan.ids, t) if oracle.embeddings is not None else None
                planner.feedback(plan.ids, oracle.at(plan.ids, t), emb)
        hits.append(h)
        subs.append(sub)
        accesses.append(a)
        trained.append(float(served.mean()))
    seconds = time.perf_counter() - start
    total = max(1, sum(accesses))
    return _result(
        policy,
        hits,
        accesses,
        seconds,
        sampler=sampler,
        dataset_size=dataset_size,
        epochs=epochs,
        capacity_bytes=capacity,
        cache_fraction=capacity / sizes.sum(),
        substitute_hits=sum(subs),
        exact_hits=sum(hits) - sum(subs),
        planning_us_per_sample=1e6 * planner.planning_s / total,
        feedback_us_per_sample=1e6 * planner.feedback_s / total,
        sampler_counters=smp.counters(),
        trained_share_per_epoch=trained,  # distinct samples served (trained) per epoch
    )


def simulate_trace(
    trace: np.ndarray,
    policy: str,
    capacity_items: int,
    batch_size: int = 256,
    seed: int = 0,
    policy_options: dict | None = None,
) -> dict:
    """Hit ratio of ``policy`` on a fixed access sequence of int ids, items of equal size."""
    trace = np.asarray(trace)
    if trace.ndim != 1 or not np.issubdtype(trace.dtype, np.integer):
        raise ConfigError(f"trace must be a 1-D array of int ids, got {trace.dtype} {trace.shape}")
    if trace.size and trace.min() < 0:
        raise ConfigError("trace holds negative ids")
    trace = trace.astype(np.int64)
    n = int(trace.max()) + 1 if trace.size else 1
    pol = make_policy(
        policy, int(capacity_items), sizes=np.ones(n, np.int64), seed=seed, **(policy_options or {})
    )
    pol.set_future(trace)
    hits = 0
    start = time.perf_counter()
    for lo in range(0, trace.size, batch_size):
        hits += int(pol.access(trace[lo : lo + batch_size]).hits.sum())
    seconds = time.perf_counter() - start
    return _result(policy, [hits], [int(trace.size)], seconds, capacity_items=int(capacity_items))
