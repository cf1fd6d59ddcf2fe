"""Policies: property tests over random access sequences and sizes."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from hotset import POLICIES, ConfigError, ScoreBoard
from hotset import make_policy as _make_policy
from hotset.policy.belady import next_use


def make_policy(name, capacity, sizes=None, seed=0, **kw):
    """Policies that key on importance get a board: random scores, even ids scored."""
    p = _make_policy(name, capacity, sizes=sizes, seed=seed, **kw)
    if p.needs_scores:
        board = ScoreBoard(p.num_samples)
        ids = np.arange(0, p.num_samples, 2)
        board.update(ids, np.random.default_rng(seed).random(ids.size), np.zeros(ids.size))
        p.attach_scores(board)
    return p


ONLINE = [p for p in POLICIES if p != "belady"]
seqs = st.lists(st.integers(0, 19), min_size=1, max_size=300)
size_lists = st.lists(st.integers(1, 50), min_size=20, max_size=20)


def run(policy, seq, batch=7):
    """Feed ``seq`` in batches, checking invariants after every batch; returns hits."""
    if policy.needs_future:
        policy.set_future(np.asarray(seq))
    hits = 0
    resident = set()
    for lo in range(0, len(seq), batch):
        ids = seq[lo : lo + batch]
        before = set(resident)
        r = policy.access(ids)
        # a planned hit is resident when the batch starts or was admitted earlier in it
        seen = set()
        for i, h in zip(ids, r.hits.tolist(), strict=True):
            if h:
                assert i in before or i in seen, f"hit on {i} that was never admitted"
            seen.add(i)
        resident = set(policy.cached_ids().tolist())
        mask = policy.cached_mask(np.ones(policy.num_samples, bool))  # what a sampler is told
        assert set(np.flatnonzero(mask).tolist()) == resident
        # net changes take the store from the old resident set to the new one
        assert resident == (before - set(r.evicted.tolist())) | set(r.admitted.tolist())
        assert set(r.admitted.tolist()) <= set(ids)
        assert policy.used == sum(policy.size_of(i) for i in resident)
        assert policy.used <= policy.capacity_bytes
        hits += int(r.hits.sum())
    return hits


@pytest.mark.parametrize("name", list(POLICIES))
@settings(max_examples=60, deadline=None)
@given(seq=seqs, sizes=size_lists, capacity=st.integers(0, 300))
def test_capacity_never_exceeded_and_hits_are_resident(name, seq, sizes, capacity):
    run(make_policy(name, capacity, sizes=sizes, seed=3), seq)


@settings(max_examples=150, deadline=None)
@given(seq=seqs, capacity=st.integers(0, 12))
def test_belady_misses_at_most_every_other_policy(seq, capacity):
    """MIN with bypass is optimal in misses for items of equal size."""
    ones = np.ones(20, np.int64)
    best = run(make_policy("belady", capacity, sizes=ones), seq)
    for name in ONLINE:
        assert best >= run(make_policy(name, capacity, sizes=ones, seed=1), seq), name


def reference_lru(seq, sizes, capacity):
    """Textbook LRU on a list: most recent at the end."""
    cache, used, hits = [], 0, []
    for i in seq:
        if i in cache:
            cache.remove(i)
            cache.append(i)
            hits.append(True)
            continue
        hits.append(False)
        if sizes[i] > capacity:
            continue
        cache.append(i)
        used += sizes[i]
        while used > capacity:
            used -= sizes[cache.pop(0)]
    return hits, cache


@settings(max_examples=150, deadline=None)
@given(seq=seqs, sizes=size_lists, capacity=st.integers(0, 300))
def test_lru_equals_reference(seq, sizes, capacity):
    p = make_policy("lru", capacity, sizes=sizes)
    hits = p.access(seq).hits.tolist()
    ref_hits, ref_cache = reference_lru(seq, sizes, capacity)
    assert hits == ref_hits
    assert p.recency_order().tolist() == ref_cache


@settings(max_examples=150, deadline=None)
@given(seq=seqs, sizes=size_lists, capacity=st.integers(0, 300), data=st.data())
def test_lru_decides_a_batch_as_its_accesses_one_by_one_while_plans_pin_residents(
    seq, sizes, capacity, data
):
    """With residents pinned by plans in flight (never evicted), a batch's hits,
    admissions, victims and recency are those of its accesses made one at a time."""
    whole, single = make_policy("lru", capacity, sizes=sizes), make_policy("lru", capacity,
                                                                            sizes=sizes)
    at = 0
    while at < len(seq):
        batch = seq[at : at + data.draw(st.integers(1, 24))]
        at += len(batch)
        pins = sorted(data.draw(st.sets(st.integers(0, 19), max_size=20)))
        for p in (whole, single):
            p.pin(pins)
        got = whole.access(batch)
        one = [single.access([i]) for i in batch]
        assert got.hits.tolist() == [bool(r.hits[0]) for r in one]
        assert whole.recency_order().tolist() == single.recency_order().tolist()
        assert whole.used == single.used <= capacity
        assert not whole.pinned[got.evicted].any()
        for p in (whole, single):
            p.pin(pins, -1)


@settings(max_examples=100, deadline=None)
@given(seq=seqs, capacity=st.integers(0, 10))
def test_fifo_ignores_hits_and_minio_never_evicts(seq, capacity):
    ones = np.ones(20, np.int64)
    fifo = make_policy("fifo", capacity, sizes=ones)
    order = OrderedDict()
    for i in seq:
        hit = fifo.access([i]).hits[0]
        assert hit == (i in order)
        if not hit and capacity:
            order[i] = None
            if len(order) > capacity:
                order.popitem(last=False)
    minio = make_policy("minio", capacity, sizes=ones)
    r = minio.access(seq)
    assert r.evicted.size == 0
    assert list(dict.fromkeys(seq))[:capacity] == sorted(minio.cached_ids().tolist(), key=seq.index)


def test_lfu_evicts_least_frequent():
    p = make_policy("lfu", 2, sizes=np.ones(5, np.int64))
    p.access([0, 0, 0, 1, 2])  # 1 and 2 seen once: 1 set earlier, evicted for 2
    assert set(p.cached_ids().tolist()) == {0, 2}
    r = p.access([3])
    assert r.evicted.tolist() == [2] and r.admitted.tolist() == [3]


@pytest.mark.parametrize("name", ["lfu", "belady"])  # (pq, sh_pq: test_shade.py)
@settings(max_examples=60, deadline=None)
@given(
    seq=st.lists(st.integers(0, 19), min_size=20, max_size=300),
    sizes=size_lists,
    capacity=st.integers(20, 200),  # a few residents: the pinned ones are often victims
    pins=st.data(),
)
def test_heap_policies_hold_pinned_victims_as_putting_them_back_decides(
    name, seq, sizes, capacity, pins
):
    """A heap policy's base loop holds a pinned victim out of its heap until a batch finds
    it unpinned (``KeyedHeap.hold``): the decisions of the loop that puts each back after
    every admission, with plans in flight pinning what they read, held for two batches."""
    from hotset.policy.base import Policy

    fast = make_policy(name, capacity, sizes=sizes)
    slow = make_policy(name, capacity, sizes=sizes)
    slow.__class__ = type("PutBack", (type(slow),), {"_park": Policy._park})
    for p in (fast, slow):
        if p.needs_future:
            p.set_future(np.asarray(seq))
    in_flight: list[list[int]] = []
    for lo in range(0, len(seq), 7):
        ids = seq[lo : lo + 7]
        a, b = fast.access(ids), slow.access(ids)
        assert a.hits.tolist() == b.hits.tolist()
        assert a.admitted.tolist() == b.admitted.tolist()
        assert a.evicted.tolist() == b.evicted.tolist()
        assert not fast.pinned[a.evicted].any()
        assert fast.used == slow.used <= capacity
        assert fast.cached_ids().tolist() == slow.cached_ids().tolist()
        held = sorted(set(ids) | set(pins.draw(st.lists(st.integers(0, 19), max_size=5))))
        for p in (fast, slow):
            p.pin(held)
        in_flight.append(held)
        if len(in_flight) > 2 or pins.draw(st.booleans()):
            done = in_flight.pop(0)
            for p in (fast, slow):
                p.pin(done, -1)


def test_random_is_seeded():
    seq = np.random.default_rng(0).integers(0, 50, 500)
    a = make_policy("random", 10, sizes=np.ones(50, np.int64), seed=5).access(seq).hits
    b = make_policy("random", 10, sizes=np.ones(50, np.int64), seed=5).access(seq).hits
    assert (a == b).all()


def test_next_use():
    assert next_use(np.array([3, 1, 3, 3, 1]), 99).tolist() == [2, 4, 3, 99, 99]


def test_belady_follows_planned_sequence_only():
    p = make_policy("belady", 2, sizes=np.ones(5, np.int64))
    p.set_future(np.array([0, 1, 2, 0]))
    p.access([0, 1])
    with pytest.raises(ConfigError, match="planned sequence"):
        p.access([3])


def test_belady_example():
    """Classic: capacity 2, sequence 0 1 2 0 1 -> MIN keeps 0 and (1 or bypasses 2)."""
    p = make_policy("belady", 2, sizes=np.ones(3, np.int64))
    p.set_future(np.array([0, 1, 2, 0, 1]))
    assert p.access([0, 1, 2, 0, 1]).hits.tolist() == [False, False, False, True, True]


def test_registry_errors():
    with pytest.raises(ConfigError, match="unknown policy 'lruu'.*lru"):
        _make_policy("lruu", 10, sizes=[1, 2])
    with pytest.raises(ConfigError, match="capacity_bytes"):
        make_policy("lru", -1, sizes=[1, 2])
    with pytest.raises(ConfigError, match="policy 'lru'"):
        make_policy("lru", 1, sizes=[1], bogus=3)
    with pytest.raises(ConfigError, match="num_samples"):
        _make_policy("lru", 1)
    p = make_policy("fifo", 2, num_samples=5)  # equal sizes: the capacity counts items
    assert p.access([0, 1, 2]).evicted.tolist() == [0] and len(p) == 2


@pytest.mark.parametrize("name", ["pq", "app"])
@settings(max_examples=80, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.lists(st.integers(0, 19), min_size=1, max_size=6),  # a batch of accesses
            st.lists(
                st.tuples(st.integers(0, 19), st.sampled_from([0.0, 0.5, 1.0, 2.0])), max_size=6
            ),  # then feedback: few values, so scores flip back
        ),
        max_size=30,
    ),
    sizes=size_lists,
    capacity=st.integers(0, 200),
)
def test_priority_policies_keep_invariants_while_scores_move(name, steps, sizes, capacity):
    board = ScoreBoard(20)
    p = _make_policy(name, capacity, sizes=sizes)
    p.attach_scores(board)
    resident: set[int] = set()
    for batch, updates in steps:
        r = p.access(batch)
        assert resident - set(r.evicted.tolist()) | set(r.admitted.tolist()) == set(
            p.cached_ids().tolist()
        )
        resident = set(p.cached_ids().tolist())
        assert set(np.flatnonzero(p.cached_mask(np.ones(20, bool))).tolist()) == resident
        assert p.used == sum(sizes[i] for i in resident) <= capacity
        if updates:
            ids = np.array([i for i, _ in updates])
            board.update(ids, np.array([v for _, v in updates]), np.zeros(len(ids)))
            p.scores_updated(ids)
        if resident:  # the heap's minimum is the lowest current score of a resident
            assert p.min_score() == pytest.approx(min(board.score[list(resident)]), abs=1e-6)


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(st.integers(0, 200), st.integers(0, 50), min_size=1, max_size=60),
    st.lists(st.integers(0, 1 << 60), min_size=60, max_size=60),
    st.sampled_from([8, 12]),
)
def test_keyed_heap_rekeys_all_members_as_pushes_would(members, levels, bits):
    """``rekey_all`` (one array write and a heapify) and ``rekey`` (the batch at once)
    leave the heap as a push per member would: the same members and levels, popped in
    the same order; keys beyond int64 (a level near 2^60 above 8 or 12 bits of id) take
    Python ints."""
    from hotset.policy.keyed_heap import KeyedHeap

    a, b, c = (KeyedHeap(1 << bits) for _ in range(3))
    for h in (a, b, c):
        for i, level in members.items():
            h.push(i, level)
    ids = np.array(sorted(members), np.int64)
    new = np.asarray(levels[: len(members)], np.int64)
    a.rekey_all(new)
    for i, level in zip(ids.tolist(), new.tolist(), strict=True):
        b.push(i, level)
    outsiders = np.setdiff1d(np.arange(300), ids)[:5]  # not members: left out
    c.rekey(np.concatenate([ids, outsiders]), np.concatenate([new, np.zeros(5, np.int64)]))
    for h in (a, c):
        assert np.array_equal(h.levels, b.levels) and len(h) == len(b) == len(members)
    popped = [b.pop() for _ in range(len(members))]
    assert [a.pop() for _ in range(len(members))] == popped == [c.pop() for _ in popped]
    assert len(a) == len(c) == 0 and (a.levels < 0).all()


HEAP_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("push"), st.integers(0, 63), st.integers(0, 1 << 58)),
        st.tuples(st.just("push"), st.integers(0, 63), st.integers(0, 3)),  # ties
        st.tuples(st.just("drop"), st.integers(0, 63)),
        st.tuples(st.just("pop")),
        st.tuples(st.sampled_from(["put back", "settle"]), st.integers(1, 4)),
        st.tuples(st.just("rekey"), st.sets(st.integers(0, 63), max_size=12), st.integers(0, 9)),
        st.tuples(st.just("rekey all"), st.integers(0, 9)),
        st.tuples(st.just("add"), st.sets(st.integers(0, 63), max_size=12), st.integers(0, 9)),
        st.tuples(st.just("remove"), st.sets(st.integers(0, 63), max_size=12)),
        st.tuples(st.just("copy")),
        st.tuples(st.just("pin"), st.sets(st.integers(0, 63), max_size=12)),
        st.tuples(st.just("release"), st.sets(st.integers(0, 63), max_size=12)),
        st.tuples(st.just("evict")),
    ),
    max_size=80,
)


@settings(max_examples=150, deadline=None)
@given(
    HEAP_OPS,
    st.sampled_from([64, 1 << 14]),
    st.sampled_from([-(1 << 20), 3, 1024]),
    st.sampled_from([np.int64, np.int32]),
)
@example(  # a push that changes nothing leaves the dropped id's entry (CI found it)
    [("push", 0, 0), ("push", 1, 0), ("drop", 0), ("push", 1, 0)], 64, -(1 << 20), np.int64
)
@example(  # 0 and 1 pinned, held by the first eviction, passed by the second; 0 released
    [("push", 0, 0), ("push", 1, 1), ("push", 2, 2), ("push", 3, 3), ("pin", {0, 1}),
     ("evict",), ("evict",), ("release", {0}), ("evict",), ("copy",)], 64, 1024, np.int64,
)  # fmt: skip
def test_keyed_heap_holds_what_a_dict_of_levels_would(ops, num_ids, slack, dtype):
    """Every operation leaves the heap's members and levels those of a plain dict, and
    pops come out by (level, id); with a negative slack every push that changes a level
    compacts (one that changes nothing pushes nothing, so stale entries may stay; keys made
    at once, or one at a time where they pass int64), and a copy (as a checkpoint makes)
    holds the same; int32 levels (iCACHE's) too. ``in_order`` lists the members as pops
    would give them, ``add`` makes many members at once (into an empty heap or not), and
    ``remove`` drops many at once (given the rest in order, or not). Pinned members that
    an eviction takes are held (members still) and never evicted; takes and pops pass
    only pinned members; released, they are evicted in their turn again."""
    import copy

    from hotset.policy.keyed_heap import KeyedHeap

    h, ref, pinned = KeyedHeap(num_ids, dtype), {}, set()
    h.slack = slack
    top = np.iinfo(dtype).max

    def passing_pinned_only(got: list[int]) -> None:
        order, at = sorted(ref, key=lambda i: (ref[i], i)), 0
        for i in got:
            k = order.index(i, at)
            assert pinned.issuperset(order[at:k]), (got, order, pinned)
            at = k + 1

    for op in ops:
        compacted = op[0] == "rekey"
        if op[0] == "push":
            compacted = ref.get(op[1]) != op[2] % top
            h.push(op[1], op[2] % top)
            ref[op[1]] = op[2] % top
        elif op[0] == "drop":
            h.drop(op[1])
            ref.pop(op[1], None)
        elif op[0] == "pop" and h.peek() is None:
            assert pinned.issuperset(ref)  # every member held
        elif op[0] == "pop":
            low = h.pop()
            passing_pinned_only([low])
            del ref[low]
        elif op[0] in ("put back", "settle"):
            taken = [h.take() for _ in range(op[1])]
            taken = [i for i in taken if i >= 0]
            passing_pinned_only(taken)
            if op[0] == "put back":
                h.put_back(taken)
            else:
                h.settle()
                for i in taken:
                    del ref[i]
        elif op[0] == "rekey":
            ids = np.array(sorted(op[1]), np.int64)
            h.rekey(ids, ids % 5 + op[2])
            ref.update({i: i % 5 + op[2] for i in op[1] if i in ref})
        elif op[0] == "rekey all":
            h.rekey_all(h.members() % 3 + op[1])
            ref = {i: i % 3 + op[1] for i in ref}
        elif op[0] == "add":  # the non-members among them, at once
            new = np.array(sorted(op[1] - ref.keys()), np.int64)
            h.add(new, new % 7 + op[2])
            ref.update({i: i % 7 + op[2] for i in new.tolist()})
        elif op[0] == "remove":
            gone = sorted(op[1] & ref.keys())
            rest = None  # or the others in pop order, as a caller that has them gives
            if len(op[1]) % 2:
                rest = np.array(sorted(ref.keys() - op[1], key=lambda i: (ref[i], i)), np.int64)
            h.remove(np.array(gone, np.int64), rest)
            for i in gone:
                del ref[i]
        elif op[0] == "copy":
            h = copy.deepcopy(h)
        elif op[0] == "pin":
            pinned |= op[1] & ref.keys()
        elif op[0] == "release":
            pinned -= op[1]
            pins = np.zeros(num_ids, np.int32)
            pins[list(pinned)] = 1
            h.release(pins)
        elif op[0] == "evict":  # as a policy's eviction: pinned members taken are held
            low = min((i for i in ref if i not in pinned), key=lambda i: (ref[i], i), default=-1)
            while (j := h.take()) in pinned:
                h.hold(j)
            assert j == low and not h._taken.keys() & pinned
            h.settle()
            ref.pop(j, None)
        assert len(h) == len(ref) and h.members().tolist() == sorted(ref)
        assert h.in_order().tolist() == sorted(ref, key=lambda i: (ref[i], i))
        assert [h.live[i] for i in sorted(ref)] == [ref[i] for i in sorted(ref)]
        if slack < 0 and compacted:  # no stale entry left
            assert sorted(h.heap) == sorted(h.key(i, level) for i, level in ref.items())
        assert all((i in h) == (i in ref) for i in range(64))
    h.release()
    assert [h.pop() for _ in range(len(ref))] == sorted(ref, key=lambda i: (ref[i], i))
    assert h.peek() is None


@pytest.mark.parametrize("name", POLICIES)
def test_a_mapped_manifests_sizes_are_shared_not_copied(name, tmp_path):
    """A policy over a manifest mapped from its columns file reads the sizes there (8 B
    per id not copied into each process), checkpoints them as before, and copies them
    before it changes one: the file and the manifest keep theirs."""
    import copy
    import pickle

    from hotset.storage.manifest import Manifest

    n = 40
    sizes = np.random.default_rng(1).integers(1, 50, n)
    made = Manifest([f"{i}.bin" for i in range(n)], [f"{i:032x}" for i in range(n)], sizes,
                    np.zeros(n, np.int64))  # fmt: skip
    (tmp_path / "columns").write_bytes(made.to_columns())
    file_bytes = (tmp_path / "columns").read_bytes()
    manifest = Manifest.map_columns(str(tmp_path / "columns"))
    p = make_policy(name, 300, sizes=manifest.sizes)
    if p.needs_future:
        p.set_future(np.arange(60) % n)
    p.access(np.arange(30) % n)
    assert np.shares_memory(np.asarray(p._sizes), manifest.sizes)
    assert [p.size_of(i) for i in range(n)] == sizes.tolist()

    state = p.state_dict()
    for other in (copy.deepcopy(p), pickle.loads(pickle.dumps(p))):
        assert [other.size_of(i) for i in range(n)] == sizes.tolist()
    resumed = make_policy(name, 300, sizes=manifest.sizes)
    resumed.load_state_dict(state)
    assert np.shares_memory(np.asarray(resumed._sizes), manifest.sizes)
    assert sorted(resumed.cached_ids().tolist()) == sorted(p.cached_ids().tolist())

    gone = next(i for i in range(n) if i not in p)  # a resident's size cannot change
    p.set_sizes(np.array([gone]), np.array([sizes[gone] + 7]))
    assert p.size_of(gone) == sizes[gone] + 7
    assert manifest.sizes[gone] == sizes[gone]
    assert (tmp_path / "columns").read_bytes() == file_bytes


def test_the_compiled_loops_compile_nothing_in_a_batch_whatever_arrays_they_get():
    """SHADE's, RefCnt's and iCACHE's compiled loops (its L-cache's walks too, packages
    loaded in turn) are compiled when a policy is made, with the types it then passes:
    over sizes of its own or a mapped (read-only) column, batches writable or read-only,
    a full cache and pins, no batch compiles a loop again
    (a fresh process, where nothing else ran them; a compile in a batch costs
    milliseconds loading numba's cache, a second or more without it)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    code = """if True:
        import json
        import numpy as np
        from hotset import ScoreBoard, make_policy
        from hotset.policy import compiled_heap, icache_kernel, priority_kernel, refcnt_kernel

        n = 400
        made = lambda name, sizes: make_policy(name, 120, sizes=sizes)
        made("app", np.ones(n, np.int64)), made("refcnt", np.ones(n, np.int64))
        made("icache", np.ones(n, np.int64))
        loops = [getattr(compiled_heap, k) for k in ("push", "pop", "push_all", "drop_stale")]
        loops += [priority_kernel._admit] + [getattr(icache_kernel, k) for k in (
            "admit_in_turn", "candidates", "settle_in_turn")] + [
            getattr(refcnt_kernel, k) for k in ("merge", "lowest", "put_back")]
        from hotset.policy.icache import ICachePolicy
        in_turn, settle = [0], ICachePolicy._settle_in_turn
        def counted(*args):
            in_turn[0] += 1
            return settle(*args)
        ICachePolicy._settle_in_turn = counted
        count = lambda: [len(f.signatures) for f in loops]
        warmed = count()
        rng = np.random.default_rng(0)
        board = ScoreBoard(n)
        board.update(np.arange(n), rng.random(n), np.zeros(n))
        for frozen in (False, True):
            sizes = rng.integers(1, 4, n)
            sizes.flags.writeable = not frozen  # (a node's mapped column is read-only)
            for name in ("app", "refcnt", "icache"):
                p = made(name, sizes)
                if name == "app":
                    p.attach_scores(board)
                elif name == "refcnt":
                    p.add_references(np.arange(n), 3)
                else:  # (its L-cache's packages loaded by the simulator's feeder)
                    p.apply_hints({"hot": rng.random(n) < 0.8, "importance": rng.random(n)})
                    feeder = p.make_feeder(lock=None)
                for _ in range(12):
                    batch = rng.permutation(n)[:64]
                    batch.flags.writeable = not frozen
                    p.pin(batch[:8])
                    p.access(batch)
                    if name == "icache":
                        feeder.poll()
                    p.pin(batch[:8], -1)
        print(json.dumps({"warmed": warmed, "after": count(), "in_turn": in_turn[0]}))
    """
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=root, check=True)  # fmt: skip
    r = json.loads(out.stdout.splitlines()[-1])
    assert r["in_turn"] and r["after"] == r["warmed"], r


@pytest.mark.parametrize("name", POLICIES)
def test_every_policys_state_goes_into_a_checkpoint_and_back(name):
    """A loader's state holds the policy's as plain values (``checkpoint.to_safe``: what
    ``torch.load(weights_only=True)`` reads); RefCnt's, which names its partitions, was
    refused with "cannot be saved in a state"."""
    from hotset.checkpoint import from_safe, to_safe

    n, sizes = 40, np.random.default_rng(1).integers(1, 50, 40)
    p = make_policy(name, 300, sizes=sizes)
    if p.needs_future:
        p.set_future(np.arange(60) % n)
    if p.needs_scores:
        p.attach_scores(ScoreBoard(n))
    p.access(np.arange(30) % n)
    resumed = make_policy(name, 300, sizes=sizes)
    resumed.load_state_dict(from_safe(to_safe(p.state_dict())))
    assert sorted(resumed.cached_ids().tolist()) == sorted(p.cached_ids().tolist())
    assert resumed.used == p.used
