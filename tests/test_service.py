"""The multi-job service: the coordinator's sampling and references, and a real server
process with real jobs (DataLoader workers on a shared LMDB store)."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import hotset
from hotset import ConfigError, ServiceError
from hotset.compare_jobs import SCENARIOS, JobsConfig, compare_jobs, scenario_jobs
from hotset.service.coordinator import JobCoordinator
from hotset.service.jobs import IdQueue
from hotset.service.server import start_service
from hotset.storage import FileStorage, SubsetStorage
from hotset.storage.columns import DigestColumn
from hotset.storage.manifest import content_key
from hotset.store.sealed import sealed_id
from test_truth import read_epoch


def keys(ids) -> list[str]:
    return [f"k{i:05d}" for i in ids]


RAW_LMDB = """
import json, sys, lmdb
path, flip = sys.argv[1], sys.argv[2]
env = lmdb.open(path, max_dbs=2, lock=True)
db = env.open_db(b"data")
with env.begin(write=bool(flip), db=db) as txn:
    if flip:
        raw = bytearray(txn.get(flip.encode()))
        raw[0] ^= 0xFF
        txn.put(flip.encode(), bytes(raw))
    print(json.dumps([[k.decode(), bytes(v).hex()] for k, v in txn.cursor()]))
"""


def raw_entries(path: str, flip: str = "") -> list[tuple[str, bytes]]:
    """The entries of a shared store's LMDB as another process (no digests) sees them;
    ``flip``: first flip a byte of that entry."""
    out = subprocess.run(
        [sys.executable, "-c", RAW_LMDB, path, flip], capture_output=True, check=True, text=True
    )
    return [(k, bytes.fromhex(v)) for k, v in json.loads(out.stdout)]


def refs(co: JobCoordinator) -> int:
    """References held for the epochs sampled so far (less each job's one reference per
    id for its next epoch)."""
    ahead = sum(job.unique.size for job in co.jobs.values()) if co.next_epoch else 0
    return int(co.policy.template.refs.sum()) - ahead


def unread(co: JobCoordinator) -> int:
    """References the jobs still hold: what the sampler has left of their epochs, and
    what is sampled but not yet planned."""
    return sum(co.unread(j) for j in co.jobs)


@pytest.mark.parametrize("sampling", ["dsa", "isa"])
def test_identical_jobs_read_each_sample_from_storage_once_with_dsa(sampling):
    co = JobCoordinator(capacity_bytes=80, max_samples=1000, sampling=sampling)
    a = co.register("a", keys(range(300)), np.ones(300), batch_size=32)
    b = co.register("b", keys(range(300)), np.ones(300), batch_size=32)
    misses = shared = 0
    for _ in range(10):  # the two jobs side by side
        pa, pb = co.plan(a, 0), co.plan(b, 0)
        misses += int((~pa["hit"]).sum() + (~pb["hit"]).sum())
        shared += np.intersect1d(pa["gids"], pb["gids"]).size
    assert refs(co) == unread(co)  # both read everything (DSA: epoch 1 began)
    if sampling == "dsa":  # the union: the minimum
        assert misses == 300 and shared >= 9 * 32 * 0.8
    else:  # independent shuffles: the cache (80 of 300) cannot bridge the two orders
        assert misses > 1.2 * 300


def digests(ids) -> DigestColumn:
    """Content keys as the manifest holds them: packed 32-hex digests."""
    return DigestColumn(f"{i * 7919:032x}" for i in ids)


@pytest.mark.parametrize("keys", [keys, digests])
@pytest.mark.parametrize("sampling", ["dsa", "quiver"])
def test_keys_are_numbered_in_order_of_first_sight(sampling, keys):
    """The first job of an empty service (no key index to look up) and a job after it:
    one global id per distinct key, numbered as the keys are first seen, a repeated key
    gets one id, and each job is served each of its distinct keys once an epoch."""
    co = JobCoordinator(capacity_bytes=50, max_samples=100, sampling=sampling)
    a = co.register("a", keys([5, 3, 5, 9, 3]), np.array([2, 1, 2, 3, 1]), batch_size=2)
    assert co.jobs[a].gids.tolist() == [0, 1, 0, 2, 1]
    assert list(co.keys) == list(keys([5, 3, 9]))
    b = co.register("b", keys([9, 7, 5, 7]), np.array([3, 4, 2, 4]), batch_size=2)
    assert co.jobs[b].gids.tolist() == [2, 3, 0, 3]
    assert co.policy.sizes[:4].tolist() == [2, 1, 3, 4]
    assert co.samples_per_epoch(a) == 3 and co.samples_per_epoch(b) == 3
    for job, want in ((a, [5, 3, 9]), (b, [9, 7, 5])):
        served = []
        while (gids := co.plan(job, 0)["gids"]).size:
            served += [co.keys[g] for g in gids]
        assert sorted(served) == sorted(keys(want))


@pytest.mark.parametrize(
    ("sampling", "keys"),
    [("dsa", keys), ("isa", keys), ("quiver", keys), ("chunks", keys), ("dsa", digests)],
)
def test_each_job_reads_its_dataset_once_per_epoch_at_any_pace(sampling, keys, monkeypatch):
    """Quiver's and isa's orders shuffled 5 ids at a time as the jobs take them (across
    many block ends, as 14M ids are)."""
    from functools import partial

    from hotset.sampling import draw
    from hotset.service import modes

    monkeypatch.setattr(modes, "shuffle_next", partial(draw.shuffle_next, block=5))
    co = JobCoordinator(capacity_bytes=50, max_samples=1000, seed=3, sampling=sampling)
    a = co.register("a", keys(range(200)), np.ones(200), batch_size=16)
    b = co.register("b", keys(range(100, 400)), np.ones(300), batch_size=7)
    c = co.register("c", [*keys(range(50, 150))] * 2, np.ones(200), batch_size=5)  # dup keys
    assert co.samples_per_epoch(c) == 100
    rng = np.random.default_rng(0)
    seen = {a: [], b: [], c: []}
    done = set()
    while len(done) < 3:
        j = int(rng.choice([j for j in seen if j not in done]))
        p = co.plan(j, 0)
        if not p["gids"].size:
            done.add(j)
        seen[j] += p["gids"].tolist()
    for j, expect in ((a, range(200)), (b, range(100, 400)), (c, range(50, 150))):
        got = [co.keys[g] for g in seen[j]]
        assert sorted(got) == sorted(keys(expect))  # each once
    # one global id per key: shared by the jobs whose manifests list it, twice listed
    # keys (c's) map to one id, and distinct keys never share one
    ga, gb, gc = (co.jobs[j].gids for j in (a, b, c))
    assert ga[150] == gb[50] == co.keys.positions(keys([150]))[0] and gc[0] == gc[100] == ga[50]
    assert len(set(co.keys)) == len(co.keys) == 400
    assert isinstance(co.keys, DigestColumn) == (keys is digests)  # packed when digests
    assert refs(co) == unread(co)  # every read consumed its reference


@pytest.mark.parametrize("sampling", ["dsa", "quiver"])
def test_a_planned_hit_is_in_the_store_when_its_batch_is_read(sampling):
    """Two jobs at different paces, as workers: job a reads its batches four plans after
    asking for them, job b at once. A batch read, the store deletes its plan's evictions
    and puts its admissions (the loader's step 3). Every planned hit is then in the
    store, or on its way from a plan not yet read (the worker waits for it): the other
    job's evictions never take what a plan in flight reads (RefCnt's pins, raised
    lazily), over two epochs each; the store keeps to the capacity."""
    from collections import Counter, deque

    co = JobCoordinator(capacity_bytes=40, max_samples=1000, seed=2, sampling=sampling)
    jobs = [co.register("a", keys(range(150)), np.ones(150), batch_size=8),
            co.register("b", keys(range(60, 210)), np.ones(150), batch_size=6)]  # fmt: skip
    lag = dict(zip(jobs, (4, 0), strict=True))
    store: set[str] = set()
    coming: Counter = Counter()  # keys that plans not yet read will put
    flight = {j: deque() for j in jobs}
    epoch, read, hits = dict.fromkeys(jobs, 0), dict.fromkeys(jobs, 0), 0

    def read_one(j: int) -> None:
        nonlocal hits
        p = flight[j].popleft()
        for g in p["gids"][p["hit"]].tolist():
            assert co.keys[g] in store or coming[co.keys[g]], f"planned hit {co.keys[g]} gone"
        hits += int(p["hit"].sum())
        store.difference_update(p["evict_keys"])
        admitted = [co.keys[g] for g in np.asarray(p["admit"]).tolist()]
        store.update(admitted)
        coming.subtract(admitted)
        assert len(store) <= 40
        read[j] += bool(p["gids"].size)

    while any(e < 2 for e in epoch.values()):
        for j in jobs:
            if epoch[j] < 2:
                p = co.plan(j, epoch[j], done=read[j])
                flight[j].append(p)  # an epoch's empty last plan may still evict
                coming.update(co.keys[g] for g in np.asarray(p["admit"]).tolist())
                epoch[j] += not p["gids"].size
            while len(flight[j]) > (lag[j] if epoch[j] < 2 else 0):
                read_one(j)
    assert hits > 0


def test_quiver_serves_cached_candidates_first():
    hits = {}
    for sampling in ("isa", "quiver"):
        co = JobCoordinator(100, max_samples=1000, sampling=sampling, policy="lru")
        a = co.register("a", keys(range(500)), np.ones(500), batch_size=25)
        b = co.register("b", keys(range(500)), np.ones(500), batch_size=25)
        hits[sampling] = 0
        for _ in range(20):
            p = co.plan(a, 0)
            hits[sampling] += int(p["hit"].sum())
            p = co.plan(b, 0)
            hits[sampling] += int(p["hit"].sum())
            if sampling == "quiver":  # a substitute is cached, and served first
                assert p["hit"][: int(p["hit"].sum())].all()
    assert hits["quiver"] > 2 * hits["isa"]  # with LRU at 20%: 262 against 93


def test_a_second_epoch_and_leaving_release_the_references():
    co = JobCoordinator(capacity_bytes=20, max_samples=100)
    a = co.register("a", keys(range(40)), np.ones(40), batch_size=8)
    b = co.register("b", keys(range(40)), np.ones(40), batch_size=8)
    co.plan(b, 0)
    co.plan(a, 0)
    assert refs(co) == unread(co) == 2 * 40 - 16
    co.plan(a, 1)  # a moves on early: what it had not read of epoch 0 is given back
    assert refs(co) == unread(co) == 32 + 32  # b: 40 - 8; a: 40 - 8
    co.leave(b)
    assert refs(co) == unread(co) == 32  # a's epoch 1 after its first batch
    assert co.removed == [("b", "left")]
    with pytest.raises(ConfigError, match="unknown job"):
        co.plan(b, 0)


def _python_lines(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` and the Python lines it executed (numpy's C loops execute
    none)."""
    count = [0]

    def tracer(frame, event, arg):
        if event == "line":
            count[0] += 1
        return tracer

    sys.settrace(tracer)
    try:
        out = fn(*args, **kwargs)
    finally:
        sys.settrace(None)
    return out, count[0]


@pytest.mark.parametrize("sampling", ["quiver", "dsa"])
def test_registration_does_no_python_work_per_id(sampling):
    """Registration is column work: a job of 200,000 ids, and a second job on the same
    dataset, run about as many Python lines as jobs of 20,000 (a loop per id would run
    ten times as many), and each job is then planned from its own ids."""
    lines = {}
    for n in (20_000, 200_000):
        raw = np.random.default_rng(n).integers(0, 256, (n, 16), dtype=np.uint8)
        digests = DigestColumn.of_raw(raw)
        sizes = np.random.default_rng(1).integers(1000, 2000, n)
        co = JobCoordinator(int(sizes.sum()) // 10, max_samples=n, sampling=sampling)
        runs = [_python_lines(co.register, name, digests, sizes, batch_size=256)
                for name in ("a", "b")]  # fmt: skip
        lines[n] = [count for _, count in runs]
        for job, _ in runs:
            gids = co.plan(job, 0)["gids"]
            assert gids.size == 256 and np.all((gids >= 0) & (gids < n))
        assert len(co.keys) == n  # the second job's keys were found, not added again
    for small, large in zip(lines[20_000], lines[200_000], strict=True):
        assert large < 1.5 * small + 200, lines


def test_a_dead_or_silent_job_is_removed():
    co = JobCoordinator(capacity_bytes=20, max_samples=100, job_timeout_s=5)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    import socket

    a = co.register(
        "dead", keys(range(10)), np.ones(10), 4, pid=dead.pid, host=socket.gethostname()
    )
    b = co.register("quiet", keys(range(10)), np.ones(10), 4)
    c = co.register(
        "alive", keys(range(10)), np.ones(10), 4, pid=os.getpid(), host=socket.gethostname()
    )
    co.plan(a, 0)
    assert co.reap() == [a]  # its process is gone
    assert co.reap(now=time.monotonic() + 6) == [b, c]  # silent past the timeout
    assert co.removed == [("dead", "process gone"), ("quiet", "timed out"), ("alive", "timed out")]
    assert refs(co) == unread(co) == 0


def test_configuration_errors_name_the_setting():
    with pytest.raises(ConfigError, match="sampling must be one of"):
        JobCoordinator(10, sampling="nope")
    co = JobCoordinator(10, max_samples=5)
    with pytest.raises(ConfigError, match="at most 5 distinct samples"):
        co.register("big", keys(range(6)), np.ones(6), 2)
    with pytest.raises(ConfigError, match="batch_size must be >= 1"):
        co.register("x", keys(range(2)), np.ones(2), 0)


@pytest.mark.parametrize("url, path", [("memory", None), ("redis://h:1/0", "/dev/shm/x")])
def test_a_store_url_that_cannot_be_pooled_is_named(tmp_path, url, path):
    from hotset.service.server import CacheService

    with pytest.raises(ConfigError, match=r"store_url=.*Redis or Redis Cluster URL"):
        CacheService(f"ipc://{tmp_path}/svc.sock", 1000, store_path=path, store_url=url)
    CacheService(f"ipc://{tmp_path}/svc.sock", 1000).close(destroy_store=True)  # (free again)


# -- a real service, real jobs -----------------------------------------------------------


@pytest.fixture
def service(tmp_path):
    address = f"ipc://{tmp_path}/svc.sock"
    proc = start_service(address, capacity_bytes=400_000, job_timeout_s=3.0)
    client = hotset.connect(address, timeout_s=20)
    yield address, proc, client
    if proc.is_alive():
        proc.terminate()
    proc.join(10)
    client.close()


def test_two_jobs_share_reads_through_the_service(fmnist_dir, service):
    address, _, client = service
    storage = FileStorage(str(fmnist_dir / "train"))
    loaders = [
        client.make_loader(storage, batch_size=50, num_workers=2, name=f"job{k}") for k in (0, 1)
    ]
    try:
        for epoch in range(2):
            served = [[], []]
            for ld in loaders:
                ld.set_epoch(epoch)
            for batches in zip(*loaders, strict=True):  # the two jobs in lockstep
                for k, (_, y, ids) in enumerate(batches):
                    assert np.array_equal(y.numpy(), storage.labels[ids.numpy()])
                    served[k] += ids.tolist()
            distinct = len(set(storage.keys))
            for s in served:
                assert len(s) == len(set(s)) == distinct  # each once per epoch
        c0, c1 = (ld.counters() for ld in loaders)
        total = c0["internal"]["bytes_from_storage"] + c1["internal"]["bytes_from_storage"]
        alone = 2 * sum(storage.sizes)  # two epochs of one job
        assert total < 0.75 * alone  # the second job's reads are mostly the first's
        assert c1["hits"] + c0["hits"] > 0.5 * 2 * len(storage)
        stats = client.stats()
        assert {j["name"] for j in stats["jobs"].values()} == {"job0", "job1"}
    finally:
        for ld in loaders:
            ld.close()
    assert client.stats()["jobs"] == {}  # both left


def _doomed_job(address: str, data: str) -> None:
    storage = FileStorage(data)
    loader = hotset.connect(address).make_loader(
        storage, batch_size=20, num_workers=0, name="doomed"
    )
    for _ in loader:
        time.sleep(60)  # killed while training


def test_a_killed_job_is_removed_without_disturbing_the_others(fmnist_dir, service):
    address, _, client = service
    data = str(fmnist_dir / "train")
    proc = mp.get_context("spawn").Process(target=_doomed_job, args=(address, data))
    proc.start()
    deadline = time.monotonic() + 60
    while not any(j["name"] == "doomed" and j["reads"] for j in client.stats()["jobs"].values()):
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.2)
    loader = client.make_loader(FileStorage(data), batch_size=50, num_workers=0, name="survivor")
    it = iter(loader)
    next(it)
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(10)
    n = 1 + sum(1 for _ in it)  # the survivor finishes its epoch
    assert n == len(loader)
    deadline = time.monotonic() + 10
    while ["doomed", "process gone"] not in client.stats()["removed"]:
        assert time.monotonic() < deadline, client.stats()
        time.sleep(0.2)
    loader.close()


def test_the_epoch_finishes_from_storage_when_the_service_goes_away(fmnist_dir, tmp_path):
    address = f"ipc://{tmp_path}/svc2.sock"
    proc = start_service(address, capacity_bytes=400_000)
    storage = FileStorage(str(fmnist_dir / "train"))
    client = hotset.connect(address, timeout_s=20)
    loader = client.make_loader(storage, batch_size=50, num_workers=2, name="lonely")
    client.timeout_s = 1.0
    client.close()  # reconnect with the short timeout
    served = []
    try:
        for k, (_, y, ids) in enumerate(loader):
            assert np.array_equal(y.numpy(), storage.labels[ids.numpy()])
            served += ids.tolist()
            if k == 3:
                proc.terminate()
                proc.join(10)
        c = loader.counters()
    finally:
        loader.close()
    assert sorted(served) == sorted(set(served)) and len(served) == len(set(storage.keys))
    assert c["service_failures"] == 1
    with pytest.raises(ServiceError, match="did not answer"):
        client.stats()


def test_subset_storage_keeps_the_inner_keys(fmnist_dir):
    full = FileStorage(str(fmnist_dir / "train"))
    sub = SubsetStorage(full, [5, 7, 9])
    assert len(sub) == 3 and sub.keys == [full.keys[i] for i in (5, 7, 9)]
    assert sub.read(1) == full.read(7) and sub.labels.tolist() == full.labels[[5, 7, 9]].tolist()
    with pytest.raises(ConfigError, match="subset indices"):
        SubsetStorage(full, [len(full)])


def test_scenarios_vary_what_they_say():
    same, stag, speeds, over, benefit, iis = (scenario_jobs(s, 4, 10.0) for s in SCENARIOS)
    assert {j.window for j in same} == {(0.0, 1.0)} and [j.start_s for j in stag] == [0, 10, 20, 30]
    assert len({j.width for j in speeds}) == 4 and len({j.window for j in over}) == 4
    assert [j.window[1] for j in benefit] == [0.25, 0.5, 0.75, 1.0]  # disjoint slices
    assert {(j.width, j.latency_ms) for j in benefit} == {(8, None), (48, 0.0)}
    assert {j.width for j in iis} == {8, 48} and {j.window for j in iis} == {(0.0, 1.0)}


@pytest.mark.slow
def test_compare_jobs_reads_less_through_the_service(fmnist_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where its socket goes
    cfg = JobsConfig(
        data=str(fmnist_dir), jobs=2, scenario="same", samples=600, epochs=1,
        batch_size=25, cache_fraction=0.5, num_workers=0, latency_ms=5.0,
    )  # fmt: skip  # the cache holds more than the batches in flight; steps not too short
    # no worker processes: on 2 busy cores one job's worker once came up ~1 s after the
    # other's, so that job ran more than the cache behind, and JOADER's hits (only ever
    # the reads of the job ahead still cached) fell from 600 to 339
    assert cfg.modes == ("service", "quiver", "chunks", "independent")
    doc = compare_jobs(cfg, out_dir=str(tmp_path))
    t = doc["totals"]
    assert {r["mode"] for r in doc["rows"]} == set(cfg.modes)
    for r in doc["rows"]:
        assert r["accesses"] == 600 and r["test_accuracy"] is not None
    assert t["independent"]["samples_read"] > 1100  # each job reads all 600 itself
    for mode in ("service", "quiver", "chunks"):  # sharing reads
        assert t[mode]["samples_read"] < 0.8 * t["independent"]["samples_read"], mode
    assert t["service"]["samples_read"] < 0.7 * t["independent"]["samples_read"]
    assert (tmp_path / "compare-jobs-same.json").exists()
    assert not list(tmp_path.glob("hotset-jobs-*"))  # no socket left behind


def test_planted_wrong_entries_are_dropped_and_the_service_forgets_them(fmnist_dir, service):
    """Wrong bytes under the entries the service planned (tampered, or a mixed-up write):
    the job counts each as a corrupt hit, serves the sample from storage, deletes the
    entry and reports it absent; the service forgets it and admits the sample again, so
    no wrong entry is met twice and the hits come back."""
    address, _, client = service
    storage = FileStorage(str(fmnist_dir / "train"))
    loader = client.make_loader(storage, batch_size=50, num_workers=1, name="victim")
    try:
        read_epoch(loader, 0)
        sealed = loader.dataset.store
        planted = [k for k, v in zip(storage.keys, sealed.get_many(list(storage.keys)),
                                     strict=True) if v is not None][:200]  # fmt: skip
        assert len(planted) > 100
        sealed.inner.delete_many([sealed_id(k) for k in planted])
        sealed.inner.put_many({sealed_id(k): b"wrong bytes" for k in planted})
        counts = []
        for epoch in (1, 2, 3):
            before = loader.counters()
            loader.set_epoch(epoch)
            for x, _, ids in loader:
                i = int(ids[0])
                assert torch.equal(x[0], loader.dataset[i][0])  # never the wrong bytes
            after = loader.counters()
            counts.append({k: after[k] - before[k] for k in ("corrupt_hits", "hits")})
        assert counts[0]["corrupt_hits"] > 0 and counts[1]["corrupt_hits"] == 0
        assert counts[2]["corrupt_hits"] == 0 and client.stats()["phantoms"] > 0
        held = sealed.get_many(planted)
        assert all(v is None or content_key(v) == k for k, v in zip(planted, held, strict=True))
        assert counts[2]["hits"] > 0
    finally:
        loader.close()


def test_a_sealed_id_is_the_keys_personalised_blake2b_each_time():
    """Where an entry lives (``sealed_id``) is BLAKE2b-128 of its content key,
    personalised ``hotset-id``, whatever was sealed before: entries stored by an earlier
    hotset stay found, and one key's id does not depend on the keys sealed before it."""
    import hashlib

    keys = ["", "k", "x" * 5000, content_key(b"bytes"), "k"]
    want = [hashlib.blake2b(k.encode(), digest_size=16, person=b"hotset-id").hexdigest()
            for k in keys]  # fmt: skip
    assert [sealed_id(k) for k in keys] == want
    assert [sealed_id(k) for k in reversed(keys)] == want[::-1]


def test_a_job_without_the_digests_cannot_read_the_entries(fmnist_dir, service):
    _, _, client = service
    full = FileStorage(str(fmnist_dir / "train"))
    owned = SubsetStorage(full, np.arange(500))
    loader = client.make_loader(owned, batch_size=50, num_workers=0, name="owner")
    try:
        for _ in loader:  # fills the shared cache
            pass
        sealed = loader.dataset.store
        entries = raw_entries(sealed.inner.path)  # everything another process can list
        assert len(entries) >= 10
        plain = {full.read(i) for i in range(500)}
        for k, v in entries:
            assert k not in set(owned.keys) and v not in plain  # neither digests nor bytes
        got = dict(zip(owned.keys, sealed.get_many(owned.keys), strict=True))
        held = {k: v for k, v in got.items() if v is not None}
        assert len(held) == len(entries)  # the owner, with the digests, reads them all
        assert all(held[k] == owned.read(i) for i, k in enumerate(owned.keys) if k in held)
        victim = next(iter(held))
        raw_entries(sealed.inner.path, flip=sealed_id(victim))  # a flipped byte in one entry
        (wrong,) = sealed.get_many([victim])  # unseals to bytes its digest refuses
        assert content_key(wrong) != victim
    finally:
        loader.close()


@pytest.mark.parametrize("sampling", ["dsa", "isa"])
def test_job_limit_is_a_clear_refusal_that_changes_nothing(sampling):
    """DSA samples at most 64 jobs together (a bit each): the 65th is refused before it
    is recorded and the others plan on; ISA has no limit (100 jobs register and leave)."""
    from hotset.service.coordinator import JobCoordinator

    co = JobCoordinator(capacity_bytes=4_000, max_samples=10_000, sampling=sampling)
    keys = [f"k{i}" for i in range(50)]
    sizes = np.full(50, 100)
    n = 64 if sampling == "dsa" else 100
    jobs = [co.register(f"job{j}", keys, sizes, 10) for j in range(n)]
    if sampling == "dsa":
        before = (len(co.keys), sorted(co.jobs))
        with pytest.raises(ConfigError, match="refused: --sampling dsa samples at most 64"):
            co.register("job64", keys + ["new"], np.full(51, 100), 10)
        assert (len(co.keys), sorted(co.jobs)) == before  # nothing recorded, no new key
    served = [co.plan(j, 0)["gids"].size for j in jobs[:3]]
    assert served == [10, 10, 10]
    for j in jobs:
        co.leave(j)
    assert not co.jobs and co.policy.used >= 0


@pytest.mark.parametrize("sampling", ["dsa", "isa"])
def test_a_job_alone_under_refcnt_keeps_its_next_epoch(sampling):
    """RefCnt counts each job's next epoch: a job alone at a 50% cache hits about half
    its reads from its second epoch on (MinIO's ratio); without it, almost nothing."""
    ratios = {}
    for next_epoch in (True, False):
        co = JobCoordinator(200, max_samples=1000, sampling=sampling, next_epoch=next_epoch)
        a = co.register("a", keys(range(400)), np.ones(400), batch_size=20)
        hits = reads = 0
        for epoch in range(4):
            while (p := co.plan(a, epoch))["gids"].size:
                if epoch:
                    hits += int(p["hit"].sum())
                    reads += p["gids"].size
                assert len(co.policy) <= 200
        ratios[next_epoch] = hits / reads
    assert 0.45 <= ratios[True] <= 0.55, ratios
    assert ratios[False] < 0.15, ratios


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.lists(st.integers(0, 99), max_size=9), st.integers(-1, 12))))
def test_a_jobs_queue_hands_out_its_ids_in_the_order_they_came(ops):
    """Runs of sampled ids in (lists), batches taken from the front (numbers; -1: all)."""
    queue, want = IdQueue(), []
    for op in ops:
        if isinstance(op, list):
            queue.extend(np.array(op, np.int64))
            want += op
        else:
            n = None if op < 0 else op
            got = queue.take(n).tolist()
            assert got == want[: len(want) if n is None else n]
            want = want[len(got) :]
        assert len(queue) == len(want)
