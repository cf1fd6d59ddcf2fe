"""The pooled tier on a real 3-master Redis Cluster started by the tests: entries spread
over every master, the budget holds with no cross-slot script, and a master killed
mid-epoch is absorbed (the epoch finishes from storage, each sample once)."""

from __future__ import annotations

import os

import numpy as np
import pytest

import hotset
from hotset.storage import FileStorage
from hotset.store import RedisClusterStore, TieredStore, make_store
from test_truth import read_epoch


def test_entries_spread_over_every_master_and_the_budget_holds(redis_cluster):
    store = make_store(redis_cluster.url, 30_000)
    assert isinstance(store, RedisClusterStore)
    for lo in range(0, 400, 50):  # a batch's admissions at a time
        stored, refused = store.put({f"k{i}": bytes([i % 256]) * 100 for i in range(lo, lo + 50)})
        assert (stored, len(refused)) == ((50, 0) if lo < 300 else (0, 50))  # 30,000 B budget
    assert store.used_bytes == 30_000 <= store.capacity_bytes
    assert min(redis_cluster.keys_per_master()) > 50  # no single hash tag: all masters
    got = store.get_many([f"k{i}" for i in range(400)])
    assert got == [bytes([i % 256]) * 100 for i in range(300)] + [None] * 100
    assert store.put({"k0": b"z" * 100}) == (0, [])  # already there: counted once
    store.delete_many([f"k{i}" for i in range(100)])
    assert store.used_bytes == store.reconcile() == 20_000 and len(store.list_keys()) == 200
    store.close(destroy=True)
    assert len(store) == 0 and store.used_bytes == 0


@pytest.mark.parametrize("victim", [0, 1, 2])
def test_a_master_killed_mid_epoch_costs_its_keys_only(redis_cluster, fmnist_dir, victim):
    """Whichever master dies (each in turn), the epoch finishes from storage, each sample
    once, right bytes; the two live masters still serve their keys, and writes go on
    landing on them (the budget is spread: no master holds all of it)."""
    storage = FileStorage(str(fmnist_dir / "train"))
    loader = hotset.make_loader(storage, batch_size=50, cache_fraction=0.5, policy="lru",
                                store=redis_cluster.url, num_workers=1)  # fmt: skip
    with loader:
        read_epoch(loader, 0)  # fills the cache
        loader.set_epoch(1)
        served = []
        for k, (_, y, ids) in enumerate(loader):
            assert np.array_equal(y.numpy(), storage.labels[ids.numpy()])
            served += ids.tolist()
            if k == 3:
                redis_cluster.kill(redis_cluster.ports[victim])
        assert sorted(served) == list(range(len(storage)))  # each sample once, right bytes
        before = loader.counters()["hits"]
        read_epoch(loader, 2)
        c = loader.counters()
        held = len(loader.dataset.store.list_keys())
    assert c["store_failures"] > 0 and c["corrupt_hits"] == 0
    assert held > 0.25 * len(storage)  # writes land on the live masters: ~2/3 of 50%
    assert c["hits"] - before > 0.1 * len(storage)  # and are read back


def test_node_copies_in_front_of_the_cluster(redis_cluster):
    """``shared+redis+cluster://``: what the pooled tier takes is copied to the node's
    LMDB and read from there; the pooled budget decides (a refused entry is not copied);
    trimming drops copies the pooled tier no longer holds."""
    store = make_store("shared+" + redis_cluster.url, 1_000)
    assert isinstance(store, TieredStore) and store.shared_across_processes
    items = {f"k{i}": bytes([i]) * 100 for i in range(12)}
    stored, refused = store.put(items)
    assert stored == 10 and len(refused) == 2  # the pooled budget: 1,000 bytes
    assert sorted(store.local.list_keys()) == sorted(set(items) - set(refused))
    # which keys the budget refuses depends on how the cluster spread its slots
    a, b, c = [k for k in items if k not in refused][:3]
    store.inner.delete_many([a])  # the plan evicted it (through another node)
    assert store.get_many([a, b]) == [items[a], items[b]]  # both from the node
    assert store.local_hits == 2
    reader = TieredStore(store.local, store.inner, trims=False)
    assert reader.trim_copies() == 0  # another rank of the node: the tier's maker trims
    assert store.trim_copies() == 1  # a left the pooled tier: its copy goes
    assert store.get_many([a]) == [None]
    store.local.delete_many([c])  # a node that never read c ...
    assert store.get_many([c]) == [items[c]] and store.local.contains(c)  # copies it
    path = store.local.path
    store.close(destroy=True)
    assert not os.path.exists(path) and len(make_store(store.inner.spec, 1_000)) == 0


def test_a_url_with_several_seeds_starts_from_any_that_answers(redis_cluster):
    """``redis+cluster://a:1,b:2``: a fresh client (a new worker) whose first seed is gone
    starts from the next one."""
    ports = redis_cluster.ports
    url = f"redis+cluster://127.0.0.1:1,127.0.0.1:{ports[1]},127.0.0.1:{ports[2]}"
    store = make_store(url, 10_000)
    assert store.put({f"k{i}": b"x" * 10 for i in range(30)}) == (30, [])
    assert store.get_many(["k0", "k29"]) == [b"x" * 10] * 2 and store.failures == 0
    store.close(destroy=True)


def test_a_full_coverage_cluster_refuses_all_once_a_master_dies_and_says_why(
    tmp_path, caplog
):
    """With Redis's default ``cluster-require-full-coverage yes`` one dead master makes
    every master refuse: absorbed (reads miss, writes store nothing, counted, no error),
    and the warning names the setting to change."""
    from hotset.testing import RedisClusterServers

    cluster = RedisClusterServers(tmp_path, full_coverage=True)
    try:
        store = make_store(cluster.url, 10_000)
        assert store.put({f"k{i}": b"x" * 10 for i in range(30)})[0] == 30
        cluster.kill(cluster.ports[2])
        cluster.wait_state(cluster.ports[0], "fail")
        fresh = make_store(store.spec, 10_000)  # a new worker's client
        with caplog.at_level("WARNING"):
            assert fresh.get_many([f"k{i}" for i in range(30)]) == [None] * 30
            assert fresh.put({"new": b"y"})[0] == 0 and fresh.failures > 0
        assert "cluster-require-full-coverage no" in caplog.text
    finally:
        cluster.stop()
