"""Jobs outlive the service: a job the service forgot (timed out) or a service killed and
restarted mid-epoch: each job registers again, finishes its epoch reading each sample
once, and shares the cache again afterwards."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time

import numpy as np
import pytest

import hotset
from hotset.service.coordinator import JobCoordinator
from hotset.service.modes import SAMPLING
from hotset.service.server import start_service
from hotset.storage import FileStorage


def keys(ids) -> list[str]:
    return [f"key{i}" for i in ids]


def plan_epoch(co: JobCoordinator, job: int, epoch: int) -> list[int]:
    out: list[int] = []
    while (p := co.plan(job, epoch))["gids"].size:
        out += co.jobs[job].local(p["gids"]).tolist()
    return out


@pytest.mark.parametrize("sampling", sorted(SAMPLING))
def test_a_job_registering_again_reads_only_what_it_had_not(sampling):
    before = JobCoordinator(100, max_samples=1000, sampling=sampling)
    a = before.register("a", keys(range(300)), np.ones(300), batch_size=20)
    plan_epoch(before, a, 0)
    served = []
    for _ in range(4):  # four batches of epoch 1, then the service is gone
        served += before.jobs[a].local(before.plan(a, 1)["gids"]).tolist()
    after = JobCoordinator(100, max_samples=1000, sampling=sampling)  # a restarted service
    b = after.register("other", keys(range(300)), np.ones(300), batch_size=20)
    a = after.register("a", keys(range(300)), np.ones(300), batch_size=20, epoch=1,
                       served=np.array(served))  # fmt: skip
    rest = plan_epoch(after, a, 1)
    assert not set(rest) & set(served) and len(rest) == len(set(rest))  # none read twice
    if sampling != "iis":  # iis reads the subset its losses select; the others all of it
        assert sorted(rest + served) == list(range(300))
    whole = plan_epoch(after, a, 2)  # the next epoch is whole again
    assert len(whole) == len(set(whole)) and (sampling == "iis" or len(whole) == 300)
    after.leave(a)
    after.leave(b)
    if hasattr(after.policy.template, "refs"):  # RefCnt
        assert after.policy.template.refs.sum() == 0  # every reference given back


def test_resuming_with_everything_read_ends_the_epoch():
    co = JobCoordinator(100, max_samples=1000, sampling="dsa")
    a = co.register("a", keys(range(40)), np.ones(40), batch_size=8, epoch=3,
                    served=np.arange(40))  # fmt: skip
    assert co.plan(a, 3)["gids"].size == 0
    assert sorted(plan_epoch(co, a, 4)) == list(range(40))


@pytest.fixture
def data(fmnist_dir) -> str:
    return str(fmnist_dir / "train")


def test_a_job_the_service_timed_out_registers_again(data, tmp_path):
    address = f"ipc://{tmp_path}/svc.sock"
    proc = start_service(address, capacity_bytes=400_000, job_timeout_s=1.0, reap_every_s=0.1)
    client = hotset.connect(address, timeout_s=20)
    storage = FileStorage(data)
    loader = client.make_loader(storage, batch_size=50, num_workers=0, name="sleepy")
    loader.planner._stop.set()  # no heartbeats: the service will time the job out
    served: list[int] = []
    try:
        for k, (_, y, ids) in enumerate(loader):
            assert np.array_equal(y.numpy(), storage.labels[ids.numpy()])
            served += ids.tolist()
            if k == 3:
                time.sleep(2.0)  # a long validation pass
        assert ["sleepy", "timed out"] in client.stats()["removed"]
        c = loader.counters()
    finally:
        loader.close()
        client.stop()
        proc.join(10)
    assert sorted(served) == sorted(set(served)) and len(served) == len(set(storage.keys))
    assert c["service_rejoins"] == 1 and c["service_failures"] == 0


def _job(address: str, data: str, name: str, paused, resume, out) -> None:
    storage = FileStorage(data)
    loader = hotset.connect(address, timeout_s=5).make_loader(
        storage, batch_size=25, num_workers=1, name=name
    )
    epochs = []
    for epoch in range(2):
        loader.set_epoch(epoch)
        before = loader.counters()
        ids_read = []
        for k, (_, y, ids) in enumerate(loader):
            assert np.array_equal(y.numpy(), storage.labels[ids.numpy()]), name
            ids_read += ids.tolist()
            if epoch == 0 and k == 5:
                paused.set()
                assert resume.wait(60), "never resumed"
        now = loader.counters()
        moved = now["internal"]["bytes_from_storage"] - before["internal"]["bytes_from_storage"]
        epochs.append((ids_read, moved, now["hits"] - before["hits"]))
    c = loader.counters()
    out.put((name, epochs, c["service_rejoins"], c["service_failures"]))
    loader.close()


def test_kill_9_of_the_service_mid_epoch_then_restart(data, tmp_path):
    """Two jobs; the service is killed (-9) mid-epoch and started again on the same
    address and store: both finish the epoch with each sample once, register again, and
    share reads in the next epoch."""
    address, store = f"ipc://{tmp_path}/svc.sock", str(tmp_path / "store")
    opts = {"capacity_bytes": 1_000_000, "store_path": store, "job_timeout_s": 5.0}
    service = start_service(address, **opts)
    hotset.connect(address, timeout_s=20).close()  # it answers
    ctx = mp.get_context("spawn")
    out, resume = ctx.Queue(), ctx.Event()
    pauses = [ctx.Event() for _ in range(2)]
    jobs = [
        ctx.Process(target=_job, args=(address, data, f"job{k}", pauses[k], resume, out))
        for k in range(2)
    ]
    for p in jobs:
        p.start()
    try:
        for e in pauses:
            assert e.wait(120), "a job never started"
        os.kill(service.pid, signal.SIGKILL)
        service.join(10)
        service = start_service(address, **opts)
        client = hotset.connect(address, timeout_s=20)
        resume.set()
        results = sorted(out.get(timeout=240) for _ in jobs)
        for p in jobs:
            p.join(30)
            assert p.exitcode == 0
        stats = client.stats()  # the restarted service saw both jobs register and leave
    finally:
        resume.set()
        for p in jobs:
            if p.is_alive():
                p.kill()
        service.kill()
        service.join(10)
    storage = FileStorage(data)
    distinct, total = len(set(storage.keys)), int(np.sum(storage.sizes))
    for _name, epochs, rejoins, failures in results:
        assert rejoins == 1 and failures == 0
        for ids_read, _, _ in epochs:
            assert len(ids_read) == len(set(ids_read)) == distinct  # each once per epoch
    # sharing again: together the two jobs read far less than two datasets in epoch 1
    assert sum(epochs[1][1] for _, epochs, _, _ in results) < 1.5 * total
    assert all(epochs[1][2] > 0 for _, epochs, _, _ in results)  # both hit
    assert sorted(stats["removed"]) == [["job0", "left"], ["job1", "left"]]


def test_the_id_space_grows_to_a_larger_dataset_and_the_running_job_rejoins(data, tmp_path):
    """docs/service.md: a service started for few ids takes a job whose dataset has more
    (no flag to remember): its id space grows, the job already running rejoins as after
    a restart and finishes its epoch with each sample once, and both read right."""
    from hotset.storage.subset import SubsetStorage

    address = f"ipc://{tmp_path}/svc.sock"
    proc = start_service(address, capacity_bytes=400_000, max_samples=300)
    client = hotset.connect(address, timeout_s=20)
    full = FileStorage(data)
    small = SubsetStorage(full, np.arange(200))
    a = client.make_loader(small, batch_size=20, num_workers=0, name="small")
    b = None
    try:
        served_a: list[int] = []
        for k, (_, y, ids) in enumerate(a):
            assert np.array_equal(y.numpy(), small.labels[ids.numpy()])
            served_a += ids.tolist()
            if k == 2:  # mid-epoch: a dataset of 1000 ids joins a service of 300
                assert client.stats()["cached"] > 0
                b = client.make_loader(full, batch_size=50, num_workers=0, name="full")
                # the cache starts again empty: the plan and the store alike
                assert client.stats()["cached"] == 0 and len(b.dataset.store.inner) == 0
                served_b = []
                for _, yb, idb in b:
                    assert np.array_equal(yb.numpy(), full.labels[idb.numpy()])
                    served_b += idb.tolist()
        assert sorted(served_a) == list(range(200))  # each once, across the growth
        assert sorted(served_b) == list(range(1000))
        assert a.counters()["service_rejoins"] == 1 and a.counters()["service_failures"] == 0
    finally:
        for loader in (a, b):
            if loader is not None:
                loader.close()
        client.stop()
        proc.join(10)
