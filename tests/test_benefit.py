"""Benefit-aware allocation (Quiver) and iCACHE's multi-job handling: the measurement,
the split of the budget, the partitioned cache, the aggregated importance, and a real
service that re-divides its cache from what real jobs measured."""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hotset
from hotset import ConfigError
from hotset.service.allocation import split_budget
from hotset.service.benefit import Benefit, BenefitProbe
from hotset.service.coordinator import JobCoordinator
from hotset.service.partitions import PartitionedPolicy
from hotset.service.server import start_service
from hotset.storage import FileStorage, SubsetStorage, ThrottledStorage


def keys(ids) -> list[str]:
    return [f"k{i:05d}" for i in ids]


def drain(co: JobCoordinator, job: int, epoch: int, losses=None) -> list[int]:
    """Plan the job's whole epoch; feed ``losses(gids)`` back when given."""
    got = []
    while (gids := co.plan(job, epoch)["gids"]).size:
        got += gids.tolist()
        if losses is not None:
            co.feedback(job, co.jobs[job].local(gids), losses(gids))
    return got


# -- the split of the budget ---------------------------------------------------------------
sizes_st = st.lists(st.integers(0, 1000), min_size=1, max_size=6)


@given(sizes_st, st.integers(0, 4000), st.data())
@settings(max_examples=300, deadline=None)
def test_split_never_exceeds_the_budget_or_a_dataset(sizes, budget, data):
    n = len(sizes)
    values = data.draw(
        st.none() | st.lists(st.floats(0, 1) | st.just(np.nan), min_size=n, max_size=n)
    )
    q = split_budget(budget, np.array(sizes), None if values is None else np.array(values))
    sizes = np.array(sizes)
    assert (q >= 0).all() and (q <= sizes).all()
    assert q.sum() == min(budget, sizes.sum())  # nothing left idle that someone could use
    known = np.zeros(n, bool) if values is None else ~np.isnan(values)
    if not known.any():  # even: a dataset below its size has at least everyone else's share
        for d in np.flatnonzero(q < sizes):
            assert (q[d] >= q - 1).all()
    else:  # greedy: a dataset worth more per byte is full before a lesser one gets bytes
        density = np.nan_to_num(values) / np.maximum(sizes, 1)
        for d in np.flatnonzero(known):
            for e in np.flatnonzero(known):
                if density[d] > density[e] and q[e] > 0:
                    assert q[d] == sizes[d]


def test_the_most_beneficial_dataset_gets_the_budget():
    q = split_budget(150, np.array([100, 100]), np.array([0.05, 0.6]))
    assert q.tolist() == [50, 100]
    assert split_budget(150, np.array([100, 100])).tolist() == [75, 75]
    # one measured, one not: the unmeasured keeps an even share, the measured the rest
    assert split_budget(150, np.array([100, 100, 100]), [0.6, np.nan, 0.1]).tolist() == [100, 50, 0]


# -- the measurement -----------------------------------------------------------------------
def test_benefit_ratio_and_saving():
    b = Benefit(t_uncached=0.10, t_cached=0.06, hit=0.5)
    assert b.ratio == pytest.approx(0.10 / 0.06)
    assert b.saving == pytest.approx(0.8)  # 40% saved at half hits: 80% at all hits
    assert Benefit(0.1, 0.11, 0.9).saving == 0.0  # slower with the cache: no value
    assert not Benefit(0.1, 0.1, 0.01).conclusive
    with pytest.raises(ConfigError, match="times > 0"):
        Benefit(0.0, 0.1, 0.5)
    with pytest.raises(ConfigError, match="0 \\(off\\) or >= 2"):
        BenefitProbe(1)


def test_the_probe_times_the_two_phases_of_real_consumption():
    probe = BenefitProbe(5, every=3)
    assert probe.start_epoch(0)
    assert [probe.uncached(k) for k in range(7)] == [True] * 5 + [False] * 2
    for k in range(10):
        probe.planned(0.0 if k < 5 else 0.75)
        time.sleep(0.02 if k < 5 else 0.005)  # fetching batch k
        probe.consumed()
    b = probe.report()
    assert b.t_uncached > 2 * b.t_cached and b.hit == 0.75
    assert probe.report() is None  # once per epoch
    # conclusive: measured again every 3rd epoch only
    assert [probe.start_epoch(e) for e in (1, 2, 3)] == [False, False, True]
    assert BenefitProbe(5, every=3).start_epoch(7)  # nothing conclusive yet: each epoch


# -- the partitioned cache -----------------------------------------------------------------
@given(
    st.sampled_from(["lru", "minio", "refcnt"]),
    st.lists(st.tuples(st.integers(0, 2), st.lists(st.integers(0, 59), max_size=12)), max_size=40),
    st.lists(st.integers(0, 300), min_size=3, max_size=3),
)
@settings(max_examples=200, deadline=None)
def test_partitions_keep_within_their_bytes_and_one_copy(kind, batches, resize_to):
    sizes = np.random.default_rng(1).integers(1, 20, 60)
    pp = PartitionedPolicy(kind, 60)
    pp.set_sizes(np.arange(60), sizes)
    for _ in range(3):
        pp.add_partition(120)
    if kind == "refcnt":
        pp.add_references(np.arange(60), 5)
    for n, (part, ids) in enumerate(batches):
        ids = list(dict.fromkeys(ids))
        before = pp.owner.copy()
        r = pp.access(np.array(ids, np.int64), part)
        was = before[np.array(ids, np.int64)]
        assert (was[r.hits] >= 0).all()  # a hit was resident ...
        assert r.hits[(was >= 0) & (was != part)].all()  # ... and one in another partition hits
        assert (pp.owner[r.admitted] == part).all()  # a miss goes to the job's partition
        if n == len(batches) // 2:
            for p, cap in enumerate(resize_to):
                pp.resize(p, cap)
        for p, policy in enumerate(pp.parts):
            assert policy.used <= policy.capacity_bytes
            assert policy.used == sizes[pp.owner == p].sum()
            assert sorted(policy.cached_ids().tolist()) == np.flatnonzero(pp.owner == p).tolist()


@pytest.mark.parametrize("kind", ["refcnt", "lfu"])
def test_a_template_holding_nothing_serves_as_one_with_a_heap(kind, monkeypatch):
    """The partitions' template (capacity 0) keeps no heap levels of its own
    (``hold_nothing``; the memory saved is ``plan_scale.py --memory``'s to show): two
    partitions over the same accesses, references and pins answer alike (hits, what the
    store is told to admit and evict) whether the template holds nothing or keeps a
    heap. A policy with bytes refuses to hold nothing."""
    from hotset.policy.base import make_policy
    from hotset.policy.keyed_heap import HeapPolicy

    def run(pp: PartitionedPolicy) -> list:
        rng = np.random.default_rng(5)
        pp.set_sizes(np.arange(200), rng.integers(1, 20, 200))
        for _ in range(2):
            pp.add_partition(300)
        out = []
        for step in range(60):
            ids = rng.choice(200, 12, replace=False)
            if kind == "refcnt" and step % 10 == 0:
                pp.add_references(rng.choice(200, 80, replace=False), rng.choice([-1, 2]))
            pp.pin(ids[:3], 1)
            r = pp.access(ids, step % 2)
            pp.pin(ids[:3], -1)
            out.append((r.hits.tolist(), sorted(r.admitted.tolist()), sorted(r.evicted.tolist())))
        return out

    with pytest.raises(ConfigError, match="holds samples"):
        make_policy(kind, 100, sizes=np.ones(10, np.int64)).hold_nothing()
    holding_nothing = run(PartitionedPolicy(kind, 200))
    assert any(adm for _, adm, _ in holding_nothing)  # the partitions did admit
    monkeypatch.setattr(HeapPolicy, "hold_nothing", lambda self: None)  # a template with a heap
    assert run(PartitionedPolicy(kind, 200)) == holding_nothing


# -- benefit-aware allocation in the coordinator -------------------------------------------
def test_the_service_divides_its_cache_by_measured_benefit():
    co = JobCoordinator(
        capacity_bytes=150, max_samples=1000, sampling="isa", policy="minio", allocation="benefit"
    )
    a = co.register("io-bound", keys(range(100)), np.ones(100), batch_size=10)
    b = co.register("compute-bound", keys(range(100, 200)), np.ones(100), batch_size=10)
    assert co.policy.capacities() == [75, 75]  # nothing measured: even
    for j in (a, b):
        drain(co, j, 0)
    assert [p.used for p in co.policy.parts] == [75, 75]
    co.report_benefit(a, Benefit(0.10, 0.06, 0.75))
    co.report_benefit(b, Benefit(0.10, 0.02, 0.01))  # a cold cache tells nothing
    assert co.jobs[b].saving is None
    assert co.policy.capacities() == [75, 75]  # b not measured yet: its even share
    co.report_benefit(b, Benefit(0.10, 0.099, 0.75))
    assert co.policy.capacities() == [100, 50]
    first = co.plan(b, 1)  # b's evictions go out with the next plan
    assert len(first["evict_keys"]) == 25
    assert all(int(k[1:]) >= 100 for k in first["evict_keys"])  # b's own samples
    drain(co, b, 1)
    drain(co, a, 1)
    assert [p.used for p in co.policy.parts] == [100, 50]
    co.report_benefit(b, Benefit(0.10, 0.099, 0.01))  # inconclusive: keeps its saving
    assert co.jobs[b].saving == pytest.approx(0.01 / 0.75)
    co.leave(a)
    assert co.policy.capacities() == [0, 100]  # a's dataset has no job left


def test_a_benefit_report_after_a_timing_without_the_cache():
    co = JobCoordinator(capacity_bytes=100, max_samples=1000, sampling="isa", policy="lru")
    a = co.register("a", keys(range(50)), np.ones(50), batch_size=10)
    drain(co, a, 0)
    p = co.plan(a, 1, cache=False)
    assert not p["hit"].any() and p["admit"].size == 0  # all cached, but read from storage
    assert co.plan(a, 1)["hit"].all()
    with pytest.raises(ConfigError, match="allocation"):
        JobCoordinator(100, allocation="quiver")
    with pytest.raises(ConfigError, match="sampling='chunks'"):
        JobCoordinator(100, sampling="chunks", allocation="benefit")
    with pytest.raises(ConfigError, match="probe_batches"):
        JobCoordinator(100, probe_batches=1)


# -- iCACHE multi-job: importance sampling per job, aggregated importance ------------------
def test_iis_jobs_sample_their_own_subsets_and_the_cache_keeps_the_highest_aiv():
    co = JobCoordinator(capacity_bytes=40, max_samples=1000, sampling="iis", seed=2)
    a = co.register("shufflenet", keys(range(200)), np.ones(200), batch_size=16)
    b = co.register("resnet", keys(range(200)), np.ones(200), batch_size=16)
    gid = co.keys.positions(keys(range(200)))
    rank = np.empty(200)
    rank[gid] = np.arange(200)  # job a finds sample k harder the larger k is
    for j in (a, b):  # epoch 0: a full pass, each sample once
        sign = 1.0 if j == a else -1.0
        assert sorted(drain(co, j, 0, lambda g, s=sign: s * rank[g])) == sorted(gid)
    # epoch 1: a subset, biased to each job's own hard samples
    got = {j: np.array(drain(co, j, 1)) for j in (a, b)}
    for j in (a, b):
        assert 0 < got[j].size < 200 and got[j].size == len(set(got[j].tolist()))
    assert rank[got[a]].mean() > rank[got[b]].mean() + 10
    # a is cache-eligible, b is not: the aggregated importance is a's alone
    co.report_benefit(a, Benefit(0.3, 0.1, 0.5))
    co.report_benefit(b, Benefit(0.1, 0.09, 0.5))
    aiv = co.mode.importance.score[gid]
    pct = co.mode.samplers[a].percentiles()  # over a's sorted gids

    def h_list(p):  # by default the H-list is what fits the cache: 40 samples of 1 byte
        return p >= np.sort(p)[-40]

    assert np.allclose(
        co.mode.importance.score[co.jobs[a].unique], 3.0 * np.where(h_list(pct), pct, 0)
    )
    for e in (2, 3):  # the H-cache settles on the highest AIV among what is read
        for j in (a, b):
            drain(co, j, e)
    cached = co.policy.cached_ids()
    assert co.mode.importance.score[cached].min() >= np.quantile(aiv, 0.7)
    # nobody eligible: every job weighs 1
    co.report_benefit(a, Benefit(0.1, 0.1, 0.5))
    pa, pb = (co.mode.samplers[j].percentiles() for j in (a, b))
    both = np.where(h_list(pa), pa, 0) + np.where(h_list(pb), pb, 0)
    assert np.allclose(co.mode.importance.score[co.jobs[a].unique], both)


# -- a real service, real jobs ----------------------------------------------------------------
def test_real_jobs_measure_their_benefit_and_the_service_reallocates(fmnist_dir, tmp_path):
    """An I/O-bound job (slow storage) and a job on fast storage, on two halves of the
    data, through a real service: each times its minibatches without and with the cache,
    and the cache goes to the dataset whose job gains."""
    address = f"ipc://{tmp_path}/svc.sock"
    full = FileStorage(str(fmnist_dir / "train"))
    halves = [SubsetStorage(full, np.arange(0, 500)), SubsetStorage(full, np.arange(500, 1000))]
    slow = ThrottledStorage(halves[0], latency_ms=8.0, bandwidth_mb_s=0.0, concurrency=1)
    half_bytes = int(sum(halves[0].sizes))
    proc = start_service(
        address, capacity_bytes=int(1.2 * half_bytes / 0.95), sampling="isa", policy="minio",
        allocation="benefit", probe_batches=8, job_timeout_s=30,
    )  # fmt: skip
    client = hotset.connect(address, timeout_s=30)
    loaders = [
        client.make_loader(s, batch_size=10, num_workers=0, name=n)
        for s, n in ((slow, "slow"), (halves[1], "fast"))
    ]
    try:
        for epoch in range(3):
            for ld in loaders:
                ld.set_epoch(epoch)
                served = []
                for _, _, ids in ld:
                    time.sleep(0.01)  # a training step
                    served += ids.tolist()
                assert sorted(served) == list(range(500))  # each once, probing or not
        stats = client.stats()
    finally:
        for ld in loaders:
            ld.close()
        proc.terminate()
        proc.join(10)
        client.close()
    jobs = {j["name"]: j for j in stats["jobs"].values()}
    # who gains, not by how much (a figure of the machine's load: benchmarks measure it)
    assert jobs["slow"]["benefit"] > max(1.0, jobs["fast"]["benefit"])
    assert jobs["fast"]["saving"] < jobs["slow"]["saving"]
    part = {n: stats["partition_bytes"][jobs[n]["partition"]] for n in ("slow", "fast")}
    assert part["slow"] == half_bytes and part["fast"] < 0.25 * half_bytes
