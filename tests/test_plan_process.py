"""``planner_process=True``: the planner in a process of its own serves what the loader
needs (every sample once per epoch under uniform sampling, the right bytes, a cache
within its budget that the store really holds), learns the feedback, saves and resumes,
and fails with errors that name the cause; the ranks' planner processes decide alike
(``test_distributed.py``'s ``-process`` cases)."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
import torch

import hotset
from hotset.plan_process import PlannerGone
from hotset.storage import FileStorage
from hotset.store import SharedStore
from test_truth import synthetic_feedback, through_torch_save


def _make(storage, system="lru", store="shared", **kw):
    return hotset.make_loader(
        storage, batch_size=40, cache_fraction=0.2, system=system, store=store,
        num_workers=1, seed=3, planner_process=True, **kw,
    )  # fmt: skip


def _store_ids(loader) -> set[int]:
    return set(loader.dataset.ids_of(loader.dataset.store.list_keys()).tolist())


def test_a_planner_process_serves_each_sample_once_with_the_right_bytes(fmnist_dir):
    storage = FileStorage(str(fmnist_dir / "train"))
    loader = _make(storage, "minio")  # (CoorDL's cache: hits a fifth of each epoch)
    child = loader.planner._proc
    capacity = loader.dataset.store.capacity_bytes
    hits = []
    for epoch in range(3):
        loader.set_epoch(epoch)
        served, before = [], loader.counters()["hits"]
        for _, y, ids in loader:
            assert (y.numpy() == storage.labels[ids.numpy()]).all()
            assert loader.dataset.store.used_bytes <= capacity
            served += ids.tolist()
        assert sorted(served) == list(range(len(storage)))  # each sample once
        assert len(served) == len(loader) * 40
        hits.append(loader.counters()["hits"] - before)
    c = loader.counters()
    assert hits[0] == 0 and min(hits[1:]) > 150  # a 20% cache, planned and really hit
    assert c["planning_s"] > 0 and "planner_wait_s" in c["internal"]  # the child's, and the wait
    assert c["internal"]["sync_fixes"] == 0 and c["corrupt_hits"] == 0  # the plan is the store's
    loader.close()
    assert not child.is_alive() and child.exitcode == 0


def test_the_planner_process_learns_feedback_and_resumes_where_it_stopped(fmnist_dir, tmp_path):
    """SHADE in a planner process: its orders follow the fed-back losses (they differ
    from an unscored run's), and a state saved mid-epoch (through torch.save) resumes in
    a new loader on the same store to exactly what the uninterrupted run served."""
    storage = FileStorage(str(fmnist_dir / "train"))

    def run(loader, cut=None, feed=True):
        served = {}
        for epoch in range(3):
            loader.set_epoch(epoch)
            served[epoch] = []
            for n, (_, y, ids) in enumerate(loader):
                if feed:
                    synthetic_feedback(loader, ids, y, epoch)
                served[epoch] += ids.tolist()
                if (epoch, n + 1) == cut:
                    return served, through_torch_save(loader.state_dict())
        return served, None

    with _make(storage, "shade") as ref_loader:
        ref, _ = run(ref_loader)
    with _make(storage, "shade") as unfed:
        blind, _ = run(unfed, feed=False)
    assert ref[2] != blind[2]  # the feedback reached the sampler in the child
    store = SharedStore(int(0.2 * storage.manifest.total_bytes), str(tmp_path / "store"))
    try:
        _, state = run(_make(storage, "shade", store=store), cut=(1, 7))
        resumed = _make(storage, "shade", store=store)
        resumed.load_state_dict(state)
        assert len(resumed) == -(-(len(ref[1]) - 7 * 40) // 40)
        rest = {}
        for epoch in (1, 2):
            if epoch == 2:
                resumed.set_epoch(epoch)
            rest[epoch] = []
            for _, y, ids in resumed:
                synthetic_feedback(resumed, ids, y, epoch)
                rest[epoch] += ids.tolist()
        assert resumed.counters()["internal"]["sync_fixes"] == 0
        resumed.close()
        assert rest[1] == ref[1][7 * 40 :] and rest[2] == ref[2]
    finally:
        store.close(destroy=True)


def test_a_wrong_option_is_named_from_the_planner_process(fmnist_dir):
    storage = FileStorage(str(fmnist_dir / "train"))
    children = set(os.listdir("/proc/self/task"))
    with pytest.raises(hotset.ConfigError, match="bogus") as info:
        _make(storage, "shade", sampler_options={"bogus": 1})
    assert any("planner process" in n for n in info.value.__notes__)
    with pytest.raises(hotset.ConfigError, match="private to one process"):
        _make(storage, store="memory")
    assert set(os.listdir("/proc/self/task")) <= children  # no thread left behind


def test_a_planner_process_that_dies_is_named_not_waited_for(fmnist_dir):
    storage = FileStorage(str(fmnist_dir / "train"))
    loader = _make(storage)
    batches = iter(loader)
    next(batches)
    os.kill(loader.planner._proc.pid, signal.SIGKILL)
    with pytest.raises(PlannerGone, match=r"planner process \(pid \d+\) ended \(exit code -9\)"):
        for _ in batches:
            pass
    loader.close()  # and closing after it is quiet


def test_losses_on_the_wrong_shape_are_refused_before_they_travel(fmnist_dir):
    storage = FileStorage(str(fmnist_dir / "train"))
    with _make(storage, "shade") as loader:
        _, y, ids = next(iter(loader))
        with pytest.raises(hotset.ConfigError, match="losses"):
            loader.feedback(ids, torch.ones(3, dtype=torch.float64))
        loader.feedback(ids, np.ones(len(ids)))  # the loader goes on
        assert len(list(loader)) == len(loader)
