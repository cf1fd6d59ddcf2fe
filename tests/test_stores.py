"""Stores: one interface, three real backends, a byte budget that is never exceeded."""

from __future__ import annotations

import multiprocessing as mp
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hotset import ConfigError, MemoryStore, RedisStore, SharedStore, make_store
from hotset.store import lease
from hotset.store.redis_store import REDIS_LEASE
from hotset.testing import RedisServer, forget_redis_leases


@pytest.fixture(params=["memory", "shared", "redis"])
def store_factory(request, tmp_path):
    """A factory of fresh stores of each backend (Redis: a real server)."""
    created = []
    server = None
    if request.param == "redis":
        server = RedisServer(tmp_path)
        server.start()

    def make(capacity: int):
        n = len(created)
        if request.param == "memory":
            s = MemoryStore(capacity)
        elif request.param == "shared":
            s = SharedStore(capacity, path=str(tmp_path / f"lmdb{n}"))
        else:
            s = RedisStore(capacity, url=server.url, namespace=f"t{n}")
        created.append(s)
        return s

    yield make
    for s in created:
        s.close(destroy=True)
    if server:
        server.shutdown()


def test_roundtrip_and_interface(store_factory):
    s = store_factory(1000)
    assert s.put_many({"a": b"x" * 10, "b": b"y" * 20}) == 2
    assert s.get_many(["a", "missing", "b"]) == [b"x" * 10, None, b"y" * 20]
    assert s.contains("a") and not s.contains("missing")
    assert s.used_bytes == 30 and len(s) == 2
    assert s.put_many({"a": b"x" * 10}) == 0  # same key, same content: no-op
    assert s.used_bytes == 30
    s.delete_many(["a", "never-there"])
    assert s.used_bytes == 20 and s.get_many(["a"]) == [None]
    s.clear()
    assert s.used_bytes == 0 and len(s) == 0


def test_budget_refuses_rather_than_exceeds(store_factory):
    s = store_factory(100)
    assert s.put_many({"a": b"1" * 60, "b": b"2" * 50, "c": b"3" * 40}) == 2
    assert s.used_bytes == 100 and s.refused == 1
    assert s.get_many(["b"]) == [None]


ops = st.lists(
    st.tuples(
        st.sampled_from(["put", "delete"]),
        st.lists(st.tuples(st.integers(0, 30), st.integers(0, 120)), min_size=1, max_size=6),
    ),
    max_size=25,
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=ops, capacity=st.integers(0, 400))
def test_budget_never_exceeded_counting_every_byte(store_factory, ops, capacity):
    """Property: whatever the puts and deletes, the bytes held (counted value by value)
    never exceed the capacity, and used_bytes equals that count."""
    s = store_factory(capacity)
    model: dict[str, bytes] = {}
    for op, items in ops:
        keys = [f"k{k}" for k, _ in items]
        if op == "put":
            # the same key always carries the same bytes (content addressing)
            s.put_many({f"k{k}": bytes([k % 256]) * ((k * 7) % 120) for k, _ in items})
        else:
            s.delete_many(keys)
        values = s.get_many([f"k{k}" for k in range(31)])
        held = sum(len(v) for v in values if v is not None)
        assert held <= capacity
        assert s.used_bytes == held
        for k, v in enumerate(values):
            if v is not None:
                assert v == bytes([k % 256]) * ((k * 7) % 120)
        model = {f"k{k}": v for k, v in enumerate(values) if v is not None}
    assert len(s) == len(model)


def _child_put(store, key, value):
    store.put_many({key: value})


def _child_get(store, key, q):
    q.put(store.get_many([key])[0])


@pytest.mark.parametrize("ctx", ["fork", "spawn"])
def test_shared_store_seen_by_other_processes(tmp_path, ctx):
    s = SharedStore(10_000, path=str(tmp_path / "shm"))
    s.put_many({"parent": b"p" * 100})
    c = mp.get_context(ctx)
    p = c.Process(target=_child_put, args=(s, "child", b"c" * 50))
    p.start()
    p.join(30)
    assert p.exitcode == 0
    assert s.get_many(["child"]) == [b"c" * 50]
    assert s.used_bytes == 150  # budget kept across processes
    q = c.Queue()
    p = c.Process(target=_child_get, args=(s, "parent", q))
    p.start()
    assert q.get(timeout=30) == b"p" * 100
    p.join(30)
    # a second process opening the same path by name sees the same entries
    other = SharedStore(10_000, path=str(tmp_path / "shm"))
    assert other.get_many(["parent", "child"]) == [b"p" * 100, b"c" * 50]
    with pytest.raises(ConfigError, match="capacity_bytes"):
        SharedStore(5, path=str(tmp_path / "shm"))
    s.close(destroy=True)


def test_redis_down_then_back(redis_server):
    s = RedisStore(1000, url=redis_server.url, retry_after_s=0.2, socket_timeout_s=0.5)
    s.put_many({"a": b"1" * 10})
    redis_server.stop()
    assert s.get_many(["a", "b"]) == [None, None]  # absorbed, not raised
    assert s.put_many({"c": b"3"}) == 0
    s.delete_many(["a"])
    assert s.failures >= 3
    redis_server.start()
    import time

    time.sleep(0.3)
    assert s.put_many({"c": b"3"}) == 1  # reconnects after retry_after_s
    assert s.get_many(["c"]) == [b"3"]


def test_a_server_gone_for_good_takes_its_leases_with_it(tmp_path):
    """A store closed while its server is down keeps its namespace's lease (the next store
    drawn on that server clears what it left); a test's server shut down for good (it
    saves nothing) forgets the leases drawn on it, held or not, and no other server's."""
    servers = [RedisServer(tmp_path / name) for name in ("a", "b")]
    for server in servers:
        server.workdir.mkdir()
        server.start()
    held, other = (RedisStore(100, url=server.url) for server in servers)
    left = RedisStore(100, url=servers[0].url)
    path = {s: os.path.join(lease.private_base(), REDIS_LEASE + s.namespace)
            for s in (held, other, left)}  # fmt: skip
    try:
        servers[0].stop()
        left.close(destroy=True)  # its server is down: nothing cleared, the lease stays
        assert os.path.exists(path[left])
        servers[1].stop()
        other.close(destroy=True)
        servers[1].start()  # back: a later store on it clears what ``other`` left
        servers[0].shutdown()
        assert not os.path.exists(path[left])
        assert not os.path.exists(path[held])  # its store is open, its server gone
        assert os.path.exists(path[other])
        held.close(destroy=True)  # the lease it held has gone: closes all the same
    finally:
        for server in servers:
            server.shutdown()
    assert not any(os.path.exists(p) for p in path.values())


def test_make_store_specs(tmp_path):
    assert isinstance(make_store("memory", 10), MemoryStore)
    s = make_store(f"shared://{tmp_path}/x", 10)
    assert isinstance(s, SharedStore)
    s.close(destroy=True)
    nowhere = make_store("redis://localhost:1/0", 10)
    assert isinstance(nowhere, RedisStore)
    nowhere.close(destroy=True)
    forget_redis_leases("redis://localhost:1/0")  # no server there to clear it
    with pytest.raises(ConfigError, match="unknown store 'nope'"):
        make_store("nope", 10)
    with pytest.raises(ConfigError, match="capacity_bytes"):
        MemoryStore(-1)


def test_list_keys_by_prefix_and_namespaces(store_factory):
    from hotset.store.base import NamespacedStore

    s = store_factory(1000)
    s.put_many({"a:1": b"x", "a:2": b"y", "b:1": b"z", "ab": b"w"})
    assert sorted(s.list_keys()) == ["a:1", "a:2", "ab", "b:1"]
    assert sorted(s.list_keys("a:")) == ["a:1", "a:2"]
    ns = NamespacedStore(s, "a:")
    assert sorted(ns.list_keys()) == ["1", "2"] and len(ns) == 2
    ns.clear()  # only its own entries
    assert sorted(s.list_keys()) == ["ab", "b:1"]
