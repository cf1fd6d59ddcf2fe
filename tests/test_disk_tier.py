"""The node's disk tier (``store/disk.py``, ``make_loader(disk_dir=...)``): real
directories, real processes, real object-store servers; every served sample checked
against the shards' bytes (``disk_job.py``). No speed is asserted here
(``benchmarks/disk_tier.py`` measures it)."""

from __future__ import annotations

import errno
import io
import json
import os
import signal
import stat
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import hotset
from hotset.errors import ConfigError
from hotset.store.disk import SEGMENT_MIN, SUBDIR, DiskTier
from hotset.testing import DelayProxy, S3Server

N, SHARDS, FLOATS = 48, 3, 2500  # 48 samples of 10 KB in 3 shards
JOB = Path(__file__).with_name("disk_job.py")


def write_shards(root: Path, seed: int = 0, only: int | None = None, n: int = N,
                 shards: int = SHARDS, floats: int = FLOATS) -> int:  # fmt: skip
    """``n`` samples (``floats`` float32 and a label) in ``shards`` tar shards; ``only``:
    rewrite that shard alone. Returns the arrays' bytes."""
    root.mkdir(parents=True, exist_ok=True)
    per = n // shards
    for s in range(shards):
        if only is not None and s != only:
            continue
        with tarfile.open(root / f"shard-{s:03d}.tar", "w") as tf:
            for k in range(s * per, (s + 1) * per):
                buf = io.BytesIO()
                np.save(buf, np.random.default_rng([seed, k]).standard_normal(floats, np.float32))
                for field, data in (("npy", buf.getvalue()), ("cls", str(k % 3).encode())):
                    info = tarfile.TarInfo(f"s{k:04d}.{field}")
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
    return n * floats * 4


def job(tmp_path: Path, **cfg) -> subprocess.Popen:
    """A training job (``disk_job.py``) in a process (and session) of its own."""
    cfg.setdefault("url", str(tmp_path / "shards"))
    cfg.setdefault("shards", str(tmp_path / "shards"))
    cfg.setdefault("disk_dir", str(tmp_path / "nvme"))
    cfg.setdefault("epochs", 2)
    env = {**os.environ, "HOTSET_CACHE_DIR": str(tmp_path / "index-cache")}
    return subprocess.Popen([sys.executable, str(JOB), json.dumps(cfg)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip


def finished(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def each_once(run: dict) -> None:
    for epoch in run["epochs"]:
        assert sorted(epoch["served"]) == list(range(run["samples"]))


@pytest.fixture(scope="module")
def s3():
    pytest.importorskip("s3fs")
    server = S3Server()
    yield server
    server.stop()


def on_s3_behind_a_wire(tmp_path: Path, s3, name: str, **shards):
    """The shards (``write_shards``'s ``shards``) on the S3 server under ``name``, and a
    wire in front of it that counts its bytes: (the shards' bytes, their URL, the wire,
    the storage options through it)."""
    write_shards(tmp_path / "shards", **shards)
    data = sum(p.stat().st_size for p in (tmp_path / "shards").iterdir())
    url = f"s3://disk-tier/{name}"
    s3.upload(tmp_path / "shards", url)
    wire = DelayProxy(int(s3.endpoint.rsplit(":", 1)[1]), latency_ms=0.5, bandwidth_mb_s=0)
    options = {**s3.storage_options, "client_kwargs": {
        **s3.storage_options["client_kwargs"], "endpoint_url": wire.url}}  # fmt: skip
    return data, url, wire, options


def test_a_second_run_reads_only_metadata_from_the_source(tmp_path, s3):
    """Two runs in two processes over shards on an S3 server, behind a wire that counts
    the server's bytes: the first reads the data once (each shard read whole to index
    it fills the disk tier; its epochs read nothing more), the second run reads nothing
    but the listing and the shards' metadata; every sample exact, each once an epoch."""
    data, url, wire, options = on_s3_behind_a_wire(tmp_path, s3, "shards")
    try:
        first = finished(job(tmp_path, url=url, storage_options=options))
        mid = wire.stats()["bytes_down"]
        second = finished(job(tmp_path, url=url, storage_options=options, epochs=1))
        after = wire.stats()["bytes_down"]
    finally:
        wire.stop()
    each_once(first)
    each_once(second)
    for epoch in first["epochs"]:  # (the shards, read to be indexed, filled the tier)
        assert epoch["storage_bytes"] == 0 and epoch["disk_hits"] >= N - epoch["hits"]
    assert second["counters"]["storage_bytes"] == 0 and second["counters"]["disk_hits"] > 0
    assert data <= mid <= 1.05 * data, f"the first run moved {mid} bytes of {data}"
    assert after - mid < 0.05 * data, f"the second run moved {after - mid} bytes"


def test_a_fresh_disk_tier_fills_at_opening_though_the_index_is_cached(tmp_path, s3):
    """The index is the user's (cached), the disk tier the node's: a job on a node whose
    tier is empty reads each shard whole once at opening, as with the index cold, and its
    epochs read nothing more from the source."""
    data, url, wire, options = on_s3_behind_a_wire(tmp_path, s3, "fresh")
    try:
        finished(job(tmp_path, url=url, storage_options=options, epochs=1))  # the index
        before = wire.stats()["bytes_down"]
        other = finished(job(tmp_path, url=url, storage_options=options,
                             disk_dir=str(tmp_path / "other-node")))  # fmt: skip
        moved = wire.stats()["bytes_down"] - before
    finally:
        wire.stop()
    each_once(other)
    for epoch in other["epochs"]:
        assert epoch["storage_bytes"] == 0 and epoch["disk_hits"] >= N - epoch["hits"]
    assert data <= moved <= 1.05 * data, f"the fresh tier's job moved {moved} of {data}"


def test_a_tier_smaller_than_the_data_fills_at_opening_only_as_far_as_it_has_room(
    tmp_path, s3
):
    """The index cached, a fresh tier of a third of the data: opening reads whole only
    the shards the tier has room for (more would evict those kept before them, and the
    first epoch would read them all again: 2x the data), so opening and the first epoch
    together read the data about once (1.16x measured: the epoch's own reads fill the
    tier, evicting some of what opening kept); every sample exact, once."""
    data, url, wire, options = on_s3_behind_a_wire(
        tmp_path, s3, "small-tier", n=96, shards=6, floats=25_000)  # 6 shards of 1.6 MB
    try:
        finished(job(tmp_path, url=url, storage_options=options, epochs=1))  # the index
        before = wire.stats()["bytes_down"]
        small = finished(job(tmp_path, url=url, storage_options=options, epochs=1,
                             disk_dir=str(tmp_path / "small"), disk_bytes=data // 3))  # fmt: skip
        moved = wire.stats()["bytes_down"] - before
    finally:
        wire.stop()
    each_once(small)
    assert small["epochs"][0]["disk_hits"] > 0  # (what opening kept was served from disk)
    assert moved <= 1.3 * data, f"opening and an epoch moved {moved} bytes of {data}"


def test_what_the_disk_tier_holds_is_read_from_it_not_staged_ahead(tmp_path):
    """Read-ahead stages later batches' samples with a batch's range requests while they
    come from the source, on the disk tier (the read put them there; none in the RAM
    store, which holds the cache alone), and their batches take them from it; once the
    tier holds a sample, it is read from there (the planner asks the tier's index): the
    later epochs stage nothing more, every sample exact."""
    write_shards(tmp_path / "shards")
    run = finished(job(tmp_path, epochs=3))
    each_once(run)
    staged = [e["staged"] for e in run["epochs"]]  # the run's, after each epoch
    assert 0 < staged[0] == staged[1] == staged[2], staged
    assert run["epochs"][0]["taken"] == staged[0]  # every staged sample taken, from disk
    assert all(e["staged_in_ram"] == 0 for e in run["epochs"])
    assert run["ram_bytes"] == run["cache_bytes"]  # no read-ahead beside the cache
    assert run["epochs"][1]["storage_bytes"] == run["epochs"][2]["storage_bytes"] == 0


def test_a_job_killed_mid_fill_and_restarted_at_once_reuses_what_was_complete(tmp_path):
    write_shards(tmp_path / "shards")
    progress = tmp_path / "progress"
    first = job(tmp_path, progress=str(progress), epochs=3)
    deadline = time.monotonic() + 120
    while not (progress.exists() and progress.read_text() and int(progress.read_text()) >= 3):
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()[1]
        time.sleep(0.01)
    os.killpg(first.pid, signal.SIGKILL)  # the job and its DataLoader workers, mid-epoch
    first.wait()
    run = finished(job(tmp_path, epochs=1))  # at once, as an elastic agent restarts it
    each_once(run)
    assert run["counters"]["disk_hits"] > 0


def test_a_shard_rewritten_between_runs_is_not_served_from_the_disk_tier(tmp_path):
    write_shards(tmp_path / "shards")
    each_once(finished(job(tmp_path, epochs=1)))
    time.sleep(0.01)  # (a later modification time)
    write_shards(tmp_path / "shards", seed=1, only=1)
    run = finished(job(tmp_path, epochs=1))  # checks every sample against the new shard
    each_once(run)
    per = N // SHARDS
    assert run["counters"]["disk_hits"] <= N - per  # the rewritten shard's came from it
    assert run["counters"]["storage_reads"] >= per


def test_two_jobs_at_once_share_one_fill(tmp_path):
    data = write_shards(tmp_path / "shards")
    runs = [job(tmp_path, seed=s) for s in (0, 1)]
    for run in map(finished, runs):
        each_once(run)
        assert run["epochs"][1]["storage_bytes"] == 0
    tier = DiskTier(tmp_path / "nvme", 1 << 30)
    assert len(tier) == N  # each sample kept once
    assert tier.used_bytes < 2 * data  # (both may read a sample at once: one is kept)


def test_a_full_disk_degrades_to_the_source(tmp_path):
    """A disk tier on a filesystem smaller than the data: writes past its end fail and are
    counted; every epoch completes, exact, from the source."""
    small = tmp_path / "small"
    small.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=200k", "tmpfs", str(small)],
                      capture_output=True).returncode:  # fmt: skip
        pytest.skip("cannot mount a small filesystem here (needs root)")
    try:
        write_shards(tmp_path / "shards")
        run = finished(job(tmp_path, disk_dir=str(small / "tier"), disk_bytes=64 << 20))
        each_once(run)
        assert run["counters"]["disk_failures"] > 0
        assert run["epochs"][1]["storage_bytes"] > 0
    finally:
        subprocess.run(["umount", "-l", str(small)], check=False)


def test_make_loader_works_with_no_cache_argument(tmp_path, monkeypatch):
    """No cache argument: the RAM tier takes the data, at most a quarter of /dev/shm's
    size; ``$HOTSET_DISK_DIR`` names the disk tier, of three quarters of its free space;
    every epoch serves every sample."""
    monkeypatch.setenv("HOTSET_CACHE_DIR", str(tmp_path / "index-cache"))
    monkeypatch.setenv("HOTSET_DISK_DIR", str(tmp_path / "nvme"))
    write_shards(tmp_path / "shards")
    shm = os.statvfs("/dev/shm")
    free = os.statvfs(tmp_path)
    with hotset.make_loader(str(tmp_path / "shards"), batch_size=16, num_workers=0,
                            input_field="npy", target_field="cls") as loader:  # fmt: skip
        total = loader.dataset.storage.manifest.total_bytes
        assert loader.budget["capacity_bytes"] == min(total, int(0.25 * shm.f_blocks
                                                                 * shm.f_frsize))  # fmt: skip
        tier = loader.dataset.storage.tier
        assert tier.capacity_bytes == pytest.approx(0.75 * free.f_bavail * free.f_frsize,
                                                    rel=0.01)  # fmt: skip
        for epoch in range(2):
            loader.set_epoch(epoch)
            assert sorted(i for _, _, ids in loader for i in ids.tolist()) == list(range(N))
    assert os.path.isdir(tmp_path / "nvme" / SUBDIR)  # found by $HOTSET_DISK_DIR


def test_a_corrupt_extent_is_a_miss_never_wrong_bytes(tmp_path):
    tier = DiskTier(tmp_path / "nvme", 8 << 20)
    values = {f"k{i}": os.urandom(5000 + i) for i in range(10)}
    assert tier.put(values) == 10
    segment = next((tmp_path / "nvme" / SUBDIR).glob("seg-*"))
    raw = bytearray(segment.read_bytes())
    raw[7000] ^= 0xFF  # inside k1
    segment.write_bytes(bytes(raw))
    got = dict(zip(values, tier.get_many(list(values)), strict=True))
    assert got["k1"] is None and tier.corrupt == 1
    assert all(got[k] == v for k, v in values.items() if k != "k1")
    assert not tier.contains("k1")  # dropped: the next read of it goes to the source


def test_the_directory_follows_the_stores_ownership_rules(tmp_path):
    target = tmp_path / "real"
    target.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(ConfigError, match="not a directory of yours"):
        DiskTier(tmp_path / "link", 8 << 20)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(ConfigError, match="open to other users"):
        DiskTier(shared, 8 << 20)
    if os.geteuid() == 0:
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o700)
        os.chown(theirs, 65534, 65534)
        with pytest.raises(ConfigError, match="not a directory of yours"):
            DiskTier(theirs, 8 << 20)
    tier = DiskTier(tmp_path / "mine", 8 << 20)
    tier.put({"a": b"x" * 100})
    for path in (tmp_path / "mine" / SUBDIR).rglob("*"):
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode & 0o077 == 0, f"{path} is {mode:o}"


@settings(max_examples=25, deadline=None)
@given(
    ops=st.lists(st.tuples(st.integers(0, 59), st.integers(1, 120_000), st.booleans()),
                 min_size=1, max_size=120),  # fmt: skip
)
def test_disk_tier_property(tmp_path_factory, ops):
    """Whatever is put and read: the tier never takes more than its budget on disk, a
    read is the bytes put under that key or a miss, and an entry read since it was written
    outlives, through an eviction, the entries of its segment that were not read."""
    root = tmp_path_factory.mktemp("tier")
    capacity = 4 * SEGMENT_MIN
    tier = DiskTier(root, capacity)
    truth: dict[str, bytes] = {}
    for key, size, read in ops:
        k = f"k{key}"
        if read:
            got = tier.get_many([k])[0]
            assert got is None or got == truth[k]
        else:
            value = truth.get(k) or np.random.default_rng(key).bytes(size)
            truth[k] = value
            tier.put({k: value})
        assert tier.used_bytes <= capacity
    # second chance: an entry read again between evictions stays, its neighbours go
    tier2 = DiskTier(root / "two", capacity)
    first = {f"a{i}": bytes([i]) * 100_000 for i in range(8)}
    tier2.put(first)
    for r in range(40):  # 16 MB through a 4 MB tier: every early segment is evicted
        assert tier2.get_many(["a3"])[0] == first["a3"]
        tier2.put({f"b{r}-{i}": bytes([r]) * 100_000 for i in range(4)})
    assert tier2.get_many(["a3"])[0] == first["a3"]
    assert tier2.evicted > 0 and tier2.get_many(["a0"]) == [None]


def test_hotset_serve_jobs_read_through_its_disk_tier_and_a_restart_finds_it_warm(tmp_path):
    """Two jobs of ``hotset serve --disk-dir``: both exact, the data kept once; the
    service stopped and started again: a new job's epoch reads nothing from the source."""
    from disk_job import expected
    from hotset.service.server import start_service

    write_shards(tmp_path / "shards")
    truth = expected(str(tmp_path / "shards"))
    storage = hotset.open_storage(str(tmp_path / "shards"), input_field="npy",
                                  target_field="cls")  # fmt: skip
    names = [p.split("#", 1)[1] for p in storage.manifest.paths]
    address = f"ipc://{tmp_path}/svc.sock"

    def epoch_of(loaders) -> list[dict]:
        served = [[] for _ in loaders]
        for ld in loaders:
            ld.set_epoch(0)
        for batches in zip(*loaders, strict=True):  # the jobs in lockstep
            for k, (x, _, ids) in enumerate(batches):
                for j, i in enumerate(ids.tolist()):
                    assert np.array_equal(x[j].numpy(), truth[names[i]][0]), f"sample {i}"
                served[k] += ids.tolist()
        for s in served:
            assert sorted(s) == list(range(N))
        return [ld.counters() for ld in loaders]

    for run in range(2):
        proc = start_service(address, capacity_bytes=100_000, disk_dir=str(tmp_path / "nvme"),
                             disk_bytes=64 << 20)  # fmt: skip
        client = hotset.connect(address, timeout_s=20)
        loaders = [client.make_loader(storage, batch_size=8, num_workers=2, name=f"j{k}")
                   for k in range(2 - run)]  # fmt: skip
        try:
            counters = epoch_of(loaders)
        finally:
            for ld in loaders:
                ld.close()
            client.stop()
            proc.join(10)
            client.close()
        if run == 0:
            assert len(DiskTier(tmp_path / "nvme", 64 << 20)) == N  # kept once
        else:
            assert counters[0]["storage_bytes"] == 0 and counters[0]["disk_hits"] > 0


def test_a_torch_dataset_has_no_identity_to_keep_and_is_refused(tmp_path):
    data = [(torch.full((4,), float(i)), i % 2) for i in range(20)]
    with pytest.raises(ConfigError, match="no source identity"):
        hotset.make_loader(hotset.from_dataset(data), batch_size=4, num_workers=0,
                           store="memory", disk_dir=tmp_path / "nvme")  # fmt: skip


def test_a_streamed_first_epoch_fills_the_disk_tier(tmp_path, s3, monkeypatch):
    """``first_epoch="stream"``: the shards the first epoch streams fill the disk tier as
    they land, so the next epoch reads nothing from the source: the run's source bytes
    are the data's, once."""
    from disk_job import expected

    monkeypatch.setenv("HOTSET_CACHE_DIR", str(tmp_path / "index-cache"))
    write_shards(tmp_path / "shards")
    data = sum(p.stat().st_size for p in (tmp_path / "shards").iterdir())
    truth = expected(str(tmp_path / "shards"))
    url = "s3://disk-tier-stream/shards"
    s3.upload(tmp_path / "shards", url)
    wire = DelayProxy(int(s3.endpoint.rsplit(":", 1)[1]), latency_ms=0.5, bandwidth_mb_s=0)
    options = {**s3.storage_options, "client_kwargs": {
        **s3.storage_options["client_kwargs"], "endpoint_url": wire.url}}  # fmt: skip
    try:
        loader = hotset.make_loader(
            url, batch_size=8, system="lru", cache_fraction=0.1, num_workers=2,
            storage_options=options, input_field="npy", target_field="cls",
            first_epoch="stream", disk_dir=tmp_path / "nvme",
        )  # fmt: skip
        assert type(loader).__name__ == "StreamedStart"
        moved = []
        for epoch in range(2):
            loader.set_epoch(epoch)
            before, seen = wire.stats()["bytes_down"], []
            for x, _, ids in loader:
                paths = loader.dataset.storage.manifest.paths if epoch else None
                for k, i in enumerate(ids.tolist()):
                    if paths is not None:
                        assert torch.equal(x[k], torch.from_numpy(
                            truth[paths[i].split("#", 1)[1]][0]))  # fmt: skip
                seen += ids.tolist()
            assert sorted(seen) == list(range(N))
            moved.append(wire.stats()["bytes_down"] - before)
        loader.close()
    finally:
        wire.stop()
    assert data <= moved[0] <= 1.05 * data and moved[1] < 0.02 * data, moved


STRESS = """
import sys, time
import numpy as np
from hotset.store.disk import DiskTier
tier = DiskTier(sys.argv[1], int(sys.argv[2]))
rng, wrong, deadline = np.random.default_rng(int(sys.argv[3])), 0, time.monotonic() + 3
def value(k):
    return np.random.default_rng(k).bytes(20_000 + k * 37)
while time.monotonic() < deadline:
    ks = rng.integers(0, 400, 16).tolist()
    got = tier.get_many([f"k{k}" for k in ks])
    wrong += sum(g is not None and g != value(k) for g, k in zip(got, ks))
    tier.put({f"k{k}": value(k) for k, g in zip(ks, got) if g is None})
print(wrong, tier.hits, tier.evicted, flush=True)
"""


def test_processes_that_fill_evict_and_read_at_once_never_see_wrong_bytes(tmp_path):
    """Four processes read and fill one small tier at once for 3 s (every put past its
    budget evicts segments others may be reading): no read is ever another key's bytes
    or torn, and the budget holds."""
    capacity = 4 * SEGMENT_MIN
    procs = [subprocess.Popen([sys.executable, "-c", STRESS, str(tmp_path), str(capacity),
                               str(seed)], stdout=subprocess.PIPE, text=True)
             for seed in range(4)]  # fmt: skip
    results = [p.communicate(timeout=60)[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert sum(int(r[0]) for r in results) == 0  # no wrong bytes
    assert sum(int(r[1]) for r in results) > 0 and sum(int(r[2]) for r in results) > 0
    assert DiskTier(tmp_path, capacity).used_bytes <= capacity
    on_disk = sum(p.stat().st_blocks * 512 for p in (tmp_path / SUBDIR).rglob("*")
                  if p.is_file())  # fmt: skip
    assert on_disk <= capacity + (1 << 20)  # what the files take (LMDB's lock file aside)


def test_what_the_ram_tier_evicts_outlives_on_disk_what_it_never_admitted(tmp_path):
    """The RAM tier's victims (``Storage.demoted``: the next by the system's measure) get
    the disk tier's second chance; samples the policy never admitted do not: when their
    segment is evicted, the first stay and the others go."""
    from hotset.storage.on_disk import DiskTierStorage

    write_shards(tmp_path / "shards")
    tier = DiskTier(tmp_path / "nvme", 4 * SEGMENT_MIN)
    storage = DiskTierStorage(hotset.open_storage(str(tmp_path / "shards")), tier)
    demoted = {f"d{i}": bytes([i]) * 100_000 for i in range(4)}
    never = {f"n{i}": bytes([i]) * 100_000 for i in range(4)}
    tier.put({**demoted, **never})  # one segment
    storage.demoted(list(demoted))
    rounds = 0
    while not tier.evicted:  # until that first segment is evicted
        tier.put({f"r{rounds}-{i}": bytes([rounds % 256]) * 100_000 for i in range(4)})
        rounds += 1
    assert tier.get_many(list(demoted)) == list(demoted.values())
    assert tier.get_many(list(never)) == [None] * len(never)


def test_what_read_ahead_is_told_the_tier_holds_is_what_it_holds_as_it_evicts(tmp_path):
    """``Storage.on_disk`` (read-ahead leaves those ids to the tier) answers what the
    tier holds at each call: a sample put is held at once, and one whose segment the tier
    evicted since is not, though it was held when last asked."""
    from hotset.storage.on_disk import DiskTierStorage

    write_shards(tmp_path / "shards")
    source = hotset.open_storage(str(tmp_path / "shards"))
    tier = DiskTier(tmp_path / "nvme", 4 * SEGMENT_MIN)
    storage = DiskTierStorage(source, tier)
    ids = np.arange(len(storage))
    assert not storage.on_disk(ids).any()
    storage.read_many([0, 1, 2])  # read from the source, then kept
    assert np.flatnonzero(storage.on_disk(ids)).tolist() == [0, 1, 2]
    rounds, key = 0, storage.manifest.keys[0]
    while tier.contains(key):  # until evicted (contains marks no read: no second chance)
        tier.put({f"r{rounds}-{i}": bytes([rounds % 256]) * 100_000 for i in range(8)})
        rounds += 1
    held = [tier.contains(k) for k in storage.manifest.keys.take(ids)]
    assert storage.on_disk(ids).tolist() == held and not held[0]


def test_a_tier_removed_and_made_again_in_one_process_is_the_new_one(tmp_path):
    """``rm -rf`` of the tier between two loaders of one process (a notebook, a benchmark
    that starts each run fresh): the new tier does not write into the removed files, and
    a worker forked from it (which opens the index anew) finds what it holds."""
    import shutil

    from hotset.store.disk import _close_before_fork

    first = DiskTier(tmp_path / "nvme", 4 * SEGMENT_MIN)
    first.put({"old": b"o" * 1000})
    first.close()
    shutil.rmtree(tmp_path / "nvme")
    tier = DiskTier(tmp_path / "nvme", 4 * SEGMENT_MIN)
    assert tier.get_many(["old"]) == [None]
    assert tier.put({"new": b"n" * 1000}) == 1
    _close_before_fork()  # as a fork does: the next use opens the index from its files
    assert tier.put({"newer": b"m" * 1000}) == 1
    assert DiskTier(tmp_path / "nvme", 4 * SEGMENT_MIN).get_many(["new", "newer"]) == [
        b"n" * 1000, b"m" * 1000]  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(scores=st.lists(st.floats(0, 10, allow_nan=False), min_size=0, max_size=60),
       data=st.data())  # fmt: skip
def test_the_most_important_fill_the_budget_by_score(scores, data):
    """``most_important``: the ids by score (ties: the lower id first), as many as fit
    the budget together, and no more: the next would not fit."""
    from hotset.importance.tiers import most_important

    n = len(scores)
    sizes = np.array(data.draw(st.lists(st.integers(1, 50), min_size=n, max_size=n)), np.int64)
    budget = data.draw(st.integers(0, int(sizes.sum()) + 10))
    top = most_important(np.array(scores), sizes, budget)
    by_score = sorted(range(n), key=lambda i: (-scores[i], i))
    assert top.tolist() == by_score[: top.size]
    assert sizes[top].sum() <= budget
    assert top.size == n or sizes[top].sum() + sizes[by_score[top.size]] > budget


def _shade_over_tiers(tmp_path: Path, cache_tiers: str) -> tuple[list[float], list[str]]:
    """SHADE, a RAM tier of 5% over a disk tier of 30% (3,000 samples of 10 KB, local
    shards), 4 epochs with persistent per-sample losses: each epoch's hits over both
    tiers, and at each epoch start whether the sampler was told the cache holds what
    ``cache_tiers`` says (checked against the tier's own index)."""
    from hotset.importance.tiers import most_important

    data = write_shards(tmp_path / "shards", n=3000, shards=6)
    loader = hotset.make_loader(
        str(tmp_path / "shards"), batch_size=50, system="shade", cache_fraction=0.05,
        disk_dir=tmp_path / f"nvme-{cache_tiers}", disk_bytes=int(0.3 * data), seed=0,
        sampler_options={"cache_tiers": cache_tiers}, input_field="npy", target_field="cls",
    )  # fmt: skip
    planner, storage = loader.planner, loader.dataset.storage
    told, sampler = [], planner.sampler
    set_cached = sampler.set_cached_mask

    def checked(mask):  # what the tiers hold, asked of the tier's index
        expected = planner.policy.cached_ids()
        if cache_tiers == "both" and sampler.prior is not None:
            budget = planner.policy.capacity_bytes + storage.disk_capacity
            top = most_important(sampler.board.score, storage.sizes, budget)
            held, _ = storage.tier.contains_many(list(storage.manifest.keys.take(top)))
            expected = np.union1d(expected, top[held])
        same = np.array_equal(np.flatnonzero(mask), np.unique(expected))
        told.append("as said" if same else "other")
        set_cached(mask)

    sampler.set_cached_mask = checked
    losses = np.exp(2.0 * ((np.arange(3000) * 7919) % 97 / 97.0))
    hits = []
    with loader:
        for epoch in range(4):
            loader.set_epoch(epoch)
            for _, _, ids in loader:
                loader.feedback(ids, torch.from_numpy(losses[ids.numpy()]))
            e = loader.epoch_stats[-1]
            hits.append((e.hits + e.disk_hits) / e.samples)
    return hits, told


def test_shade_repeats_what_both_tiers_hold_among_the_most_important(tmp_path):
    """Two tiers, one policy: SHADE's repetition favours the RAM tier's residents and
    the disk tier's samples among the most important that both budgets fit
    (``cache_tiers="both"``, the default with a disk tier), so that more of each epoch
    hits one tier or the other than when it favours the RAM tier's alone ("ram")."""
    both, told_both = _shade_over_tiers(tmp_path, "both")
    ram, told_ram = _shade_over_tiers(tmp_path, "ram")
    assert told_both == told_ram == ["as said"] * 4
    assert min(both[1:]) > max(ram[1:]) + 0.05  # (measured: 0.49-0.56 against 0.36-0.37)


def test_threads_of_one_process_read_hand_over_and_evict_at_once(tmp_path):
    """iCACHE's feeder thread reads through the tier while the loader's thread hands it
    the RAM tier's victims and fills it past its budget: each sets hit bits a batch at a
    time and closes the handles of the segments it evicts, and neither may break the
    other's reads (it ended a run in "Set changed size during iteration"; a handle closed
    under a read would lose the entry, or read another file's bytes)."""
    tier = DiskTier(tmp_path / "tier", 4 * SEGMENT_MIN)
    values = {f"k{i}": bytes([i % 251]) * 512 for i in range(2048)}
    tier.put(values)
    keys, errors = list(values), []

    def run(step) -> None:
        try:
            for n in range(400):
                step(n, keys[(n * 64) % 2048 :][:64])
        except Exception as exc:  # noqa: BLE001 (the test reports any)
            errors.append(exc)

    def read(n, ks) -> None:
        assert all(v in (None, values[k]) for k, v in zip(ks, tier.get_many(ks), strict=True))

    def fill(n, ks) -> None:  # (evicts the oldest segments as it goes)
        tier.put({f"new{n}-{k}": b"n" * 16384 for k in range(4)})

    steps = [read, lambda n, ks: tier.touch(ks), fill, read, lambda n, ks: tier.touch(ks), read]
    threads = [threading.Thread(target=run, args=(f,)) for f in steps]
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # (the threads take turns often)
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(switch)
    assert errors == []
    assert tier.evicted > 0 and tier.corrupt == 0 and tier.failures == 0
    tier.close()


def test_a_segment_evicted_while_a_read_of_it_is_in_flight_keeps_its_handle(tmp_path,
                                                                          monkeypatch):
    """A thread's read waits in its ``pread`` while another thread's put evicts that
    segment (and opens files meanwhile, which would take a closed handle's number): the
    read still returns the entry's bytes, no failure, no corruption counted."""
    tier = DiskTier(tmp_path / "tier", 4 * SEGMENT_MIN)
    values = {f"k{i}": bytes([i]) * 4096 for i in range(64)}
    tier.put(values)
    tier.get_many(["k0"])  # (its segment's handle open)
    in_pread, go, pread = threading.Event(), threading.Event(), os.pread

    def held_pread(fd: int, length: int, offset: int) -> bytes:
        if threading.current_thread().name == "reader":
            in_pread.set()
            go.wait(30)
        return pread(fd, length, offset)

    monkeypatch.setattr(os, "pread", held_pread)
    got: list = []
    reader = threading.Thread(target=lambda: got.append(tier.get_many(["k0"])), name="reader")
    reader.start()
    assert in_pread.wait(30)
    n = 0
    while tier.evicted < len(values):  # (the oldest segment first: k0's)
        tier.put({f"fill{n}-{k}": b"f" * 65536 for k in range(4)})
        n += 1
    opened = [os.open(os.devnull, os.O_RDONLY) for _ in range(4)]
    go.set()
    reader.join(30)
    for fd in opened:
        os.close(fd)
    assert got == [[values["k0"]]]
    assert tier.failures == tier.corrupt == 0
    tier.close()


def test_a_read_the_disk_fails_is_counted_and_is_a_miss(tmp_path, monkeypatch):
    """An I/O error under a hit (the disk's, injected: a real one cannot be made here)
    counts in ``failures`` and serves nothing: the caller reads the source."""
    tier = DiskTier(tmp_path / "tier", 4 * SEGMENT_MIN)
    tier.put({"a": b"x" * 4096, "b": b"y" * 4096})

    def failing(fd: int, length: int, offset: int) -> bytes:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "pread", failing)
    assert tier.get_many(["a"]) == [None]
    assert tier.failures == 1 and tier.corrupt == 0
    monkeypatch.undo()
    assert tier.get_many(["b"]) == [b"y" * 4096]
    tier.close()


def test_a_directory_another_process_makes_meanwhile_is_shared_not_refused(tmp_path, monkeypatch):
    """Two ranks (or runs) that start at once both find ``disk_dir`` missing; the one
    whose ``makedirs`` comes second finds it made: it checks and shares it, not a
    ConfigError (which stopped one rank of a job in CI)."""
    import hotset.store.disk as disk

    path = tmp_path / "nvme"
    DiskTier(path, 1 << 24).close()  # (the first one made it)
    seen = os.path.lexists
    monkeypatch.setattr(disk.os.path, "lexists", lambda p: False if p == str(path) else seen(p))
    tier = DiskTier(path, 1 << 24)  # (the second looked before it was made)
    assert tier.directory == os.path.realpath(path)
    tier.close()
    monkeypatch.undo()
    os.chmod(path, 0o777)  # and what it finds is still checked
    with pytest.raises(ConfigError, match="nvme"):
        DiskTier(path, 1 << 24)
