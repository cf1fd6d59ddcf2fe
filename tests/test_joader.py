"""JOADER: dependent sampling (DSA) and its tree, RefCnt, and the Table 2 replays."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from scipy.stats import chi2_contingency, chisquare
from tests.test_shade import entries

from hotset import ConfigError, make_policy
from hotset.sampling.dsa import MAX_JOBS, DependentSampling
from hotset.sim.jobs import access_sequence, replay, table2_cases


class RoundByRound(DependentSampling):
    """Runs of rounds drawn with ``round``'s draws (``_rounds_in_step``, the tree), never
    at once: the runs these tests compare draw by draw with single rounds."""

    at_once_min = 1 << 62


class AtOnce(DependentSampling):
    """Every run of two or more rounds that can be drawn at once is; counts them."""

    at_once_min = 2
    made = 0

    def _rounds_at_once(self, order, n, parts):
        k = super()._rounds_at_once(order, n, parts)
        self.made += k
        return k


def reference_tree(remaining: list[set[int]]) -> tuple[list[set[int]], list[set[int]]]:
    """Definition 1 by sets: root = the intersection, the smallest dataset's difference
    a leaf, the tree of the others' differences below. Returns (intersections, leaves)."""
    inters, leaves = [], []
    while remaining:
        inter = set.intersection(*remaining)
        inters.append(inter)
        leaves.append(remaining[0] - inter if len(remaining) > 1 else set())
        remaining = [d - inter for d in remaining[1:]]
    return inters, leaves


def check_tree(dsa: DependentSampling, remaining: dict) -> None:
    order = sorted(
        (j for j in remaining if remaining[j]), key=lambda j: (len(remaining[j]), dsa.bit[j])
    )
    inters, leaves = reference_tree([remaining[j] for j in order])
    got = dsa.vertices()
    want = [("intersection", tuple(order[k:]), s) for k, s in enumerate(inters)]
    want += [("difference", (order[k],), s) for k, s in enumerate(leaves)]
    assert [(v.kind, v.jobs, set(v.ids.tolist())) for v in got] == want
    for j in remaining:  # every root-to-leaf path is what the job has left
        assert dsa.left[j] == len(remaining[j])


datasets_st = st.lists(st.sets(st.integers(0, 39), min_size=1), min_size=1, max_size=5)
ops_st = st.lists(
    st.tuples(st.sampled_from(["round", "partial", "epoch", "add", "remove"]), st.integers(0, 99)),
    max_size=120,
)


@settings(max_examples=80, deadline=None)
@given(datasets_st, ops_st, st.sets(st.integers(0, 39), min_size=1), st.integers(0, 99))
def test_each_job_reads_its_dataset_once_per_epoch_and_the_tree_is_definition_1(
    datasets, ops, extra, seed
):
    dsa = DependentSampling(40, seed=seed)
    data, remaining, read = {}, {}, {}
    for j, d in enumerate(datasets):
        dsa.add_job(j, sorted(d))
        data[j], remaining[j], read[j] = d, set(d), []
    next_job = len(datasets)
    for op, arg in ops:
        if op in ("round", "partial"):
            jobs = None if op == "round" else [j for j in data if (arg >> (j % 7)) & 1]
            picks = dsa.round(jobs)
            expect = {j for j in (data if jobs is None else jobs) if remaining[j]}
            assert set(picks) == expect  # one pick per named job with something left
            for j, e in picks.items():
                assert e in remaining[j]  # never twice in an epoch, never outside D_j
                remaining[j].discard(e)
                read[j].append(e)
                if not remaining[j]:
                    assert sorted(read[j]) == sorted(data[j])  # the epoch covered D_j once
        elif op == "epoch" and data:
            j = sorted(data)[arg % len(data)]
            dsa.start_epoch(j)
            remaining[j], read[j] = set(data[j]), []
        elif op == "add":
            dsa.add_job(next_job, sorted(extra))  # smaller or larger than the root
            data[next_job], remaining[next_job], read[next_job] = extra, set(extra), []
            next_job += 1
        elif op == "remove" and data:
            j = sorted(data)[arg % len(data)]
            needed = dsa.remove_job(j)
            assert set(needed.tolist()) == remaining[j]  # references to release
            del data[j], remaining[j], read[j]
        check_tree(dsa, remaining)


def test_more_than_sixteen_jobs_regroup_by_their_wide_masks():
    """Up to 16 jobs the masks are sorted as uint16 (a radix sort); beyond, as uint64:
    the tree stays Definition 1's, and each of 20 jobs reads every sample of its dataset
    once in an epoch, one restarting its epoch midway (a regroup with bit 19 set)."""
    rng = np.random.default_rng(5)
    dsa = DependentSampling(60, seed=1)
    data = {j: set(rng.choice(60, 12 + j, replace=False).tolist()) for j in range(20)}
    for j, d in data.items():
        dsa.add_job(j, sorted(d))
    remaining = {j: set(d) for j, d in data.items()}
    read: dict[int, list[int]] = {j: [] for j in data}
    for k in range(45):
        if k == 10:
            dsa.start_epoch(19)
            remaining[19], read[19] = set(data[19]), []
        for j, e in dsa.round().items():
            assert e in remaining[j]
            remaining[j].discard(e)
            read[j].append(e)
        check_tree(dsa, remaining)
    for j, d in data.items():  # 31 samples at most, 35 rounds after the restart
        assert sorted(read[j]) == sorted(d)


@pytest.mark.parametrize("jobs", [2, 6])
def test_regroup_by_scans_builds_the_buckets_the_sort_does(monkeypatch, jobs):
    """Few distinct need masks are regrouped by one pass per mask, many by a sort of the
    ids by mask: the same buckets, ids in the same (increasing) order, the same places,
    so every job is handed the same samples, each of its dataset once in the epoch."""
    import hotset.sampling.dsa as dsa_module

    def run(scan: int):
        monkeypatch.setattr(dsa_module, "SCAN_MASKS", scan)
        rng = np.random.default_rng(jobs)
        dsa = DependentSampling(500, seed=3)
        for j in range(jobs):
            dsa.add_job(j, np.sort(rng.choice(500, 300, replace=False)))
        served = {j: [e] for j, e in dsa.round().items()}
        dsa.start_epoch(0)  # a regroup with every job's bit in play; job 0 starts over
        served[0] = []
        buckets = {m: list(b) for m, b in dsa.buckets.items()}
        pos = dsa.pos[dsa.mask > 0].copy()
        while picks := dsa.round():
            for j, e in picks.items():
                served[j].append(e)
        return dsa, buckets, pos, served

    scans, buckets, pos, served = run(64)  # 2 jobs: 3 masks, 6 jobs: up to 63
    _, sort_buckets, sort_pos, sort_served = run(0)
    assert buckets == sort_buckets and np.array_equal(pos, sort_pos)
    assert all(b == sorted(b) for b in buckets.values())
    assert served == sort_served
    for j, d in scans.datasets.items():
        assert sorted(served[j]) == d.tolist()  # each once


def test_picks_stay_uniform_for_every_job_theorem_2():
    """Chi-square of the first and the fifth pick of each job over many epochs."""
    rng = np.random.default_rng(0)
    datasets = [np.arange(12), np.arange(6, 24), np.sort(rng.choice(30, 20, replace=False))]
    dsa = DependentSampling(30, seed=7)
    for j, d in enumerate(datasets):
        dsa.add_job(j, d)
    first = {j: [] for j in range(3)}
    fifth = {j: [] for j in range(3)}
    for _ in range(4000):
        for j in range(3):
            dsa.start_epoch(j)
        for r in range(5):
            picks = dsa.round()
            for j, e in picks.items():
                (first if r == 0 else fifth if r == 4 else {}).setdefault(j, []).append(e)
    for j, d in enumerate(datasets):
        for got in (first[j], fifth[j]):
            counts = np.array([got.count(i) for i in d.tolist()])
            assert counts.sum() == 4000
            assert chisquare(counts).pvalue > 1e-3


@pytest.mark.parametrize(
    ("d1", "d2"),
    [(range(0, 40), range(10, 50)), (range(0, 30), range(0, 40)), (range(0, 40), range(20, 60))],
)
def test_two_jobs_pick_the_same_element_with_probability_i_over_max(d1, d2):
    same = 0
    dsa = DependentSampling(60, seed=1)
    dsa.add_job("a", list(d1))
    dsa.add_job("b", list(d2))
    trials = 4000
    for _ in range(trials):
        dsa.start_epoch("a")
        dsa.start_epoch("b")
        picks = dsa.round()
        same += picks["a"] == picks["b"]
    p = len(set(d1) & set(d2)) / max(len(d1), len(d2))
    assert abs(same / trials - p) < 4 * np.sqrt(p * (1 - p) / trials) + 1e-9


def test_compensation_keeps_a_partly_read_element_for_the_jobs_that_still_need_it():
    dsa = DependentSampling(10, seed=0)
    for j in "abc":
        dsa.add_job(j, range(10))
    e = dsa.round(["a"])["a"]  # partial sampling: only the fast job
    root, below = dsa.vertices()[:2]
    assert root.jobs == ("a", "b", "c") and e not in root.ids
    assert below.jobs == ("b", "c") and below.ids.tolist() == [e]  # moved down, not lost
    picks = dsa.round(["b", "c"])
    assert picks["b"] == picks["c"]  # equal sizes: they share every pick


def test_deletion_merges_and_insertion_of_a_smaller_dataset_makes_a_new_root():
    dsa = DependentSampling(20, seed=0)
    dsa.add_job("big", range(20))
    dsa.add_job("mid", range(10))
    dsa.add_job("small", range(5, 10))
    assert [v.ids.tolist() for v in dsa.vertices() if v.kind == "intersection"] == [
        list(range(5, 10)), list(range(5)), list(range(10, 20))
    ]  # fmt: skip
    dsa.remove_job("mid")  # its leaf goes, its vertex merges with its sibling
    inter = [v for v in dsa.vertices() if v.kind == "intersection"]
    assert [v.jobs for v in inter] == [("small", "big"), ("big",)]
    assert inter[1].ids.tolist() == list(range(5)) + list(range(10, 20))
    dsa.add_job("tiny", [7, 8, 19])
    root = dsa.vertices()[0]
    assert root.jobs == ("tiny", "small", "big") and root.ids.tolist() == [7, 8]


def test_errors_name_the_job_and_setting():
    dsa = DependentSampling(10)
    dsa.add_job("a", [1, 2])
    with pytest.raises(ConfigError, match="'a' is already registered"):
        dsa.add_job("a", [3])
    with pytest.raises(ConfigError, match="unknown job 'zz'"):
        dsa.round(["zz"])
    with pytest.raises(ConfigError, match=r"ids must lie in \[0, 10\)"):
        dsa.add_job("b", [10])
    with pytest.raises(ConfigError, match="dataset is empty"):
        dsa.add_job("c", [])
    for j in range(MAX_JOBS - 1):
        dsa.add_job(j, [0])
    with pytest.raises(ConfigError, match=f"at most {MAX_JOBS} jobs"):
        dsa.add_job("one too many", [0])


def test_identical_datasets_reach_the_minimum_misses_with_a_one_slot_cache():
    for case in ("overlap-100", "overlap-50"):
        datasets = table2_cases()[case]
        union = np.unique(np.concatenate(datasets)).size
        seq = access_sequence(datasets, "dsa", seed=3)
        assert seq.size == sum(d.size for d in datasets)
        assert replay(datasets, seq, "lru", 1) == union  # |D1 u D2|: the minimum
        isa = access_sequence(datasets, "isa", seed=3)
        assert replay(datasets, isa, "lru", 1) > 0.95 * isa.size  # independent: ~all miss


def test_refcnt_evicts_the_lowest_count_and_never_caches_a_dead_element():
    p = make_policy("refcnt", 2, num_samples=10)
    p.add_references([1, 1, 1, 2, 3, 3])  # 1 read thrice, 2 once, 3 twice
    r = p.access([1, 3])  # after the reads: 1 has 2 left, 3 has 1
    assert r.admitted.tolist() == [1, 3]
    r = p.access([2])  # its only read: nobody needs it again, not admitted
    assert not r.admitted.size and 2 not in p
    p.add_references([5, 5, 5])
    r = p.access([5])  # 2 left: evicts 3 (1 left), not 1 (2 left: a tie loses to nobody)
    assert r.evicted.tolist() == [3] and set(p.cached_ids().tolist()) == {1, 5}
    p.add_references([7])
    p.access([7, 7])  # 7 has no reads left after its first: evicts nothing
    assert set(p.cached_ids().tolist()) == {1, 5}


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 19), min_size=1, max_size=200),
    st.lists(st.integers(1, 5), min_size=20, max_size=20),
    st.integers(0, 40),
)
def test_refcnt_capacity_and_counts(seq, sizes, capacity):
    p = make_policy("refcnt", capacity, sizes=sizes)
    p.add_references(seq)  # every read announced in advance
    future = np.bincount(seq, minlength=20)
    for lo in range(0, len(seq), 7):
        ids = seq[lo : lo + 7]
        before = set(p.cached_ids().tolist())
        r = p.access(ids)
        np.subtract.at(future, ids, 1)
        assert np.array_equal(p.refs, future)  # each read consumed one reference
        after = set(p.cached_ids().tolist())
        assert after == (before - set(r.evicted.tolist())) | set(r.admitted.tolist())
        assert p.used == sum(sizes[i] for i in after) <= capacity
        for i in r.admitted.tolist():  # only what is read again (later, or in this batch)
            assert future[i] > 0 or ids.count(i) > 1


def test_refcnt_evicts_by_counts_raised_after_admission():
    """A job's epoch start and a pin raise keys without touching the heap: the victim is
    still the resident with the fewest references now, and never a pinned one."""
    p = make_policy("refcnt", 3, num_samples=10)
    p.add_references([1, 1, 2, 2, 3, 3])
    p.access([1, 2, 3])  # each admitted with one read left
    p.add_references([1])  # 1: two reads left
    p.pin([2])  # 2: a plan in flight reads it
    p.add_references([5, 5, 5])
    assert p.access([5]).evicted.tolist() == [3]  # the one left with the fewest
    p.add_references([6, 6])
    assert not p.access([6]).admitted.size  # 1 has more reads left, 2 and 5 pinned or more
    p.pin([2], -1)
    p.add_references([7, 7])
    assert p.access([7]).evicted.tolist() == [2]  # released: one read left, as 7


_REFCNT_OPS = st.lists(
    st.tuples(
        st.sampled_from(["access", "refs", "leave", "pin", "unpin"]),
        st.lists(st.integers(0, 29), min_size=1, max_size=12),
        st.integers(0, 1),  # which partition
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=80, deadline=None)
@given(_REFCNT_OPS, st.lists(st.integers(1, 5), min_size=30, max_size=30),
       st.integers(0, 30))  # fmt: skip
@example(  # 0's count went up after it was keyed: it outranks 5, which is not admitted
    [("refs", [0, 0], 0), ("access", [0], 0), ("refs", [0, 0, 0], 0), ("refs", [5, 5], 0),
     ("access", [5], 0)], [1] * 30, 1,
)  # fmt: skip
def test_refcnt_inlined_loop_decides_as_its_steps_do(ops, sizes, capacity):
    """RefCnt's one-loop miss path against the base loop driven by its steps (``_on_hit``,
    ``_wants``, ``_victim``, ``_level``): the same hits, admissions, evictions, counts
    and residents, with references added and taken back, pins held and released, and
    two partitions sharing the counts. Keys raised lazily: the residents still leave in
    the order of their current counts (pinned last), ties to the lower id. A partition
    reads only ids the other does not hold (the service routes a resident's read to the
    partition holding it; a read elsewhere would lower a count under the holder's key)."""
    _drive_refcnt(ops, sizes, capacity)


@settings(max_examples=150, deadline=None)
@given(_REFCNT_OPS, st.lists(st.integers(1, 5), min_size=30, max_size=30),
       st.integers(0, 30))  # fmt: skip
@example(  # 1's count was raised lazily; read before 3's eviction, it keeps its level (1)
    # and goes below 2: the loop evicts 1 for 3, not 2
    [("refs", [1, 1, 2, 2], 0), ("access", [1, 2], 0), ("refs", [1, 3, 3, 3], 0),
     ("access", [1, 3], 0)], [1] * 30, 2,
)  # fmt: skip
@example(  # 1, read between two evictions, goes below 5: 4 evicts 1, not 5 (the checked
    # victims fail: to the merge, which reads 9 once, as before)
    [("refs", [1, 1, 1, 2, 2, 5, 5, 9, 9, 9], 0), ("access", [1, 2, 5, 9], 0),
     ("refs", [3, 3, 3, 4, 4, 4], 0), ("access", [9, 3, 1, 4], 0)], [1] * 30, 4,
)  # fmt: skip
@example(  # 2 (count 1) evicts 1, 20-22 and cannot free enough: they are put back, and 3
    # (count 5) then evicts 1, admitted just before 2
    [("refs", [20, 20, 21, 21, 22, 22] + [8, 9, 10] * 6, 0),
     ("access", [20, 21, 22, 8, 9, 10], 0), ("refs", [1, 1, 2, 2] + [3] * 6, 0),
     ("access", [1, 2, 3], 0)], [1, 1, 5] + [1] * 27, 7,
)  # fmt: skip
@example(  # 5's count went up after it was keyed (one reference, not re-keyed at once):
    # 3 evicts 9, not 5
    [("refs", [5, 5, 9, 9], 0), ("access", [5, 9], 0), ("refs", [3, 3, 4, 4], 0),
     ("refs", [5], 0), ("access", [3, 4], 0)], [1] * 30, 2,
)  # fmt: skip
@example(  # the same with 8 read between (the victims checked, not merged): 7 evicts 6
    [("refs", [5, 5, 9, 9] + [8] * 6, 0), ("access", [5, 9, 8], 0), ("refs", [6, 6, 7, 7], 0),
     ("access", [6, 8, 7], 0)], [1] * 30, 3,
)  # fmt: skip
@example(  # 7's victim is 6, admitted just before it, not 8 (the merge)
    [("refs", [5, 5, 8, 8], 0), ("access", [5, 8], 0), ("refs", [6, 6, 7, 7], 0),
     ("access", [6, 7], 0)], [1] * 30, 2,
)  # fmt: skip
@example(  # as below, with 7 read after the first eviction (the victims checked, not merged)
    [("refs", [5, 5, 5, 9, 9, 9] + [7] * 6, 0), ("access", [5, 9, 7], 0),
     ("refs", [3, 3, 4, 4, 4, 4], 0), ("pin", [3], 0), ("access", [3, 7, 4], 0)], [1] * 30, 3,
)  # fmt: skip
@example(  # 3 (pinned, one read left) cannot evict 5 (two): not admitted; 4 evicts 5
    [("refs", [5, 5, 5, 9, 9, 9], 0), ("access", [5, 9], 0), ("refs", [3, 3, 4, 4, 4, 4], 0),
     ("pin", [3], 0), ("access", [3, 4], 0)], [1] * 30, 2,
)  # fmt: skip
@example(  # 3 evicts 1 and 2 (five bytes): room for 1, read next (a miss, admitted
    # again) and for 4: admitted in turn, 3, 1, 4
    [("refs", [1, 1, 1, 2, 2, 2], 0), ("access", [1, 2], 0), ("refs", [3, 3, 3, 4, 4], 0),
     ("access", [3, 1, 4], 0)], [1, 1, 5, 2] + [1] * 26, 6,
)  # fmt: skip
@example(  # 3 takes 1 and 2 and cannot free enough: they go back; 2, read, goes below 1,
    # and 4 evicts 2, then 1 (in that order)
    [("refs", [1, 1, 1, 2, 2, 2] + [5] * 10, 0), ("access", [1, 2, 5], 0),
     ("refs", [3, 3, 3, 4, 4, 4], 0), ("access", [3, 2, 4], 0)], [1, 1, 1, 3, 2] + [1] * 25, 3,
)  # fmt: skip
def test_refcnt_batch_at_once_decides_as_its_steps_do(ops, sizes, capacity):
    """Batches of distinct ids (each access's repeats dropped), which RefCnt decides at
    once (``_access_at_once``: its victims checked to be any order's, or its newcomers
    merged with the residents in order), against the base loop's steps; the
    batches drawn take every path (``test_refcnt_batches_take_every_path``)."""
    _drive_refcnt(ops, sizes, capacity, distinct=True)


def test_refcnt_batches_take_every_path():
    """The batches of the test above, drawn here from a fixed seed, go every way (the
    comparison is not vacuous for any): all newcomers fitting (numpy alone), victims
    checked, the merge, and in it a resident evicted before its read (a miss then)."""
    from hotset.policy.refcnt import RefCntPolicy

    rng = np.random.default_rng(0)
    kinds = ["access", "refs", "leave", "pin", "unpin"]
    ops = [
        (kinds[rng.integers(5)], rng.integers(0, 30, rng.integers(1, 13)).tolist(),
         int(rng.integers(2)))
        for _ in range(400)
    ]  # fmt: skip
    took: list[str] = []
    at_once, merge, checked = (
        RefCntPolicy._access_at_once, RefCntPolicy._merge, RefCntPolicy._checked
    )  # fmt: skip

    def counted_at_once(self, ids):
        took.append("fit")
        r = at_once(self, ids)
        if r is None:
            took[-1] = "loop"
        return r

    def counted_merge(self, ids, hit, *args, **kwargs):
        r = merge(self, ids, hit, *args, **kwargs)
        if kwargs.get("apart", True):  # (not the loop's reads in turn)
            took[-1] = "turned" if (hit & ~r.hits).any() else "merged"
        return r

    def counted_checked(self, *args):
        r = checked(self, *args)
        took[-1] = "checked" if r is not None else took[-1]
        return r

    RefCntPolicy._access_at_once = counted_at_once
    RefCntPolicy._merge, RefCntPolicy._checked = counted_merge, counted_checked
    try:
        _drive_refcnt(ops, rng.integers(1, 6, 30).tolist(), 20, distinct=True)
    finally:
        RefCntPolicy._access_at_once = at_once
        RefCntPolicy._merge, RefCntPolicy._checked = merge, checked
    assert {"fit", "checked", "merged", "turned"} <= set(took), took


def _drive_refcnt(ops, sizes, capacity, distinct: bool = False) -> None:
    import copy

    from hotset.policy.base import Policy
    from hotset.policy.refcnt import PINNED

    def leaving_order(policy):
        q = copy.deepcopy(policy)
        out = []
        while (top := q._top()) is not None:
            out.append(top)
            q._heap.pop()
        return out

    def family():
        first = make_policy("refcnt", capacity, sizes=sizes)
        return [first, first.new_partition(capacity // 2, np.asarray(sizes))]

    fast, slow = family(), family()
    for part in slow:  # the generic loop calling the steps one by one
        part._access = Policy._access.__get__(part)
        part.access = Policy.access.__get__(part)
    held: list[list[int]] = []
    for op, ids, k in ops:
        for parts in (fast, slow):
            if op == "refs":
                parts[0].add_references(ids)
            elif op == "leave":
                parts[0].add_references(ids, -1)
            elif op == "pin":
                parts[0].pin(ids)
            elif op == "unpin" and held:
                parts[0].pin(held[0], -1)
        if op == "pin":
            held.append(ids)
        elif op == "unpin" and held:
            held.pop(0)
        if op == "access":  # the other partition's residents are read through it
            ids = [i for i in (dict.fromkeys(ids) if distinct else ids) if i not in fast[1 - k]]
        if op == "access" and ids:
            a, b = fast[k].access(ids), slow[k].access(ids)
            assert a.hits.tolist() == b.hits.tolist()
            assert a.admitted.tolist() == b.admitted.tolist()
            assert a.evicted.tolist() == b.evicted.tolist()
            assert not fast[0].pinned[a.evicted].any()  # a plan in flight keeps its ids
        assert np.array_equal(fast[0].refs, slow[0].refs)
        for f, s in zip(fast, slow, strict=True):
            assert f.used == s.used <= f.capacity_bytes
            assert sorted(f.cached_ids().tolist()) == sorted(s.cached_ids().tolist())
            assert len(f) == f.cached_ids().size
            keys = [(int(f.refs[i]) + (PINNED if f.pinned[i] else 0), i) for i in f.cached_ids()]
            assert leaving_order(f) == [(i, key) for key, i in sorted(keys)]


def test_refcnt_has_ten_percent_fewer_misses_than_lru_fifo_random_with_four_jobs():
    cases = table2_cases()
    for case in ("overlap-random-x4", "size-x4"):
        datasets = cases[case]
        seq = access_sequence(datasets, "dsa", seed=0)
        for cap in (1000, 2500, 5000):
            misses = {p: replay(datasets, seq, p, cap) for p in ("lru", "fifo", "random", "refcnt")}
            others = min(misses["lru"], misses["fifo"], misses["random"])
            assert misses["refcnt"] <= 0.9 * others, (case, cap, misses)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sets(st.integers(0, 60), min_size=1), min_size=1, max_size=4),
       st.integers(1, 80), st.data())  # fmt: skip
def test_a_run_of_rounds_draws_what_single_rounds_draw(datasets, n, data):
    """``rounds(jobs, n)`` (the service's batch of rounds) gives the rounds that ``n``
    calls of ``round`` give from the same state, and stops where a job runs out; jobs in
    step on one dataset (or nearly) take ``_rounds_in_step``, the others the tree, and
    either leaves the same state (a second run of rounds draws the same too)."""
    jobs = st.lists(st.sampled_from(range(len(datasets))), min_size=1, unique=True)
    _rounds_as_single_rounds(datasets, n, [data.draw(jobs), data.draw(jobs)])


def test_jobs_in_step_draw_their_rounds_as_single_rounds_do():
    """Three jobs on one dataset, the first ahead by 9 (the others then draw from what it
    read too, a round at a time by the tree), then in step to the end, then a job alone."""
    calls = [[0], [0, 1, 2], [0, 1, 2], [1, 2], [3]]
    _rounds_as_single_rounds([set(range(12))] * 3 + [{40, 41, 42}], 9, calls)


@settings(max_examples=80, deadline=None)
@given(st.sets(st.integers(0, 60), min_size=1), st.sets(st.integers(0, 60), min_size=1),
       st.integers(0, 30), st.integers(1, 9), st.integers(0, 30))  # fmt: skip
@example({0, 1, 2, 3}, {2, 3, 4, 5, 6}, 0, 3, 30)  # each job's own bucket and a shared one
@example(set(range(20)), set(range(20)), 8, 4, 30)  # the second joins 8 reads late
def test_two_jobs_out_of_step_draw_their_rounds_as_single_rounds_do(a, b, ahead, n, again):
    """Two jobs out of step (the second joins after the first read ``ahead``; the first
    starts its next epoch at call ``again``), on datasets that overlap or not: runs of
    rounds draw what single rounds draw and leave the same state."""
    one, many = DependentSampling(61, seed=5), RoundByRound(61, seed=5)
    for d in (one, many):
        d.add_job(0, sorted(a))
    for _ in range(min(ahead, len(a))):
        assert many.rounds([0], 1) == [one.round([0])]
    for d in (one, many):
        d.add_job(1, sorted(b))
    for call in range(30):
        if call == again:
            for d in (one, many):
                d.start_epoch(0)
        got = many.rounds([0, 1], n)
        assert got == [one.round([0, 1]) for _ in got]
        assert many.left == one.left and many.mask.tolist() == one.mask.tolist()
        assert many.pos.tolist() == one.pos.tolist()
        assert {m: x.tolist() for m, x in many.buckets.items()} == {
            m: x.tolist() for m, x in one.buckets.items()
        }


def _rounds_as_single_rounds(datasets, n: int, calls: list[list[int]]) -> None:
    one, many = DependentSampling(61, seed=5), RoundByRound(61, seed=5)
    for j, d in enumerate(datasets):
        one.add_job(j, sorted(d))
        many.add_job(j, sorted(d))
    for jobs in calls:
        live = [j for j in jobs if one.left[j]]
        got = many.rounds(jobs, n)
        assert len(got) == min([n] + [one.left[j] for j in live]) if live else not got
        assert got == [one.round(jobs) for _ in got]
        assert many.left == one.left and many.mask.tolist() == one.mask.tolist()
        assert many.pos.tolist() == one.pos.tolist()
        assert {m: b.tolist() for m, b in many.buckets.items()} == {
            m: b.tolist() for m, b in one.buckets.items()
        }


def _check_state(dsa: DependentSampling, remaining: dict) -> None:
    """Every bucket's ids have its mask and their slots in ``pos``; each job's bit is on
    exactly the elements it has left, and ``left`` counts them."""
    bucketed = set()
    for m, b in dsa.buckets.items():
        for k, e in enumerate(b.tolist()):
            assert dsa.pos[e] == k and dsa.mask[e] == m
            bucketed.add(e)
    assert bucketed == set(np.flatnonzero(dsa.mask).tolist())
    for j, rest in remaining.items():
        bit = np.uint64(1 << dsa.bit[j])
        assert set(np.flatnonzero(dsa.mask & bit).tolist()) == rest
        assert dsa.left[j] == len(rest)


@settings(max_examples=60, deadline=None)
@given(st.sets(st.integers(0, 119), min_size=2), st.sets(st.integers(0, 119), min_size=2),
       st.integers(0, 60), st.lists(st.integers(2, 40), min_size=1, max_size=12),
       st.integers(0, 12))  # fmt: skip
def test_runs_drawn_at_once_read_each_element_once_per_epoch(a, b, ahead, ns, again):
    """Runs of rounds drawn at once (the first job alone, in step, then two jobs out of
    step on datasets that overlap or not; the first job starting its next epoch at call
    ``again``): each job reads each of its elements once per epoch, and the buckets,
    masks, slots and counts left are what they must be."""
    dsa = AtOnce(120, seed=3)
    data = {0: a, 1: b}
    dsa.add_job(0, sorted(a))
    remaining, read = {0: set(a)}, {0: []}
    for e in dsa.picks([0], min(ahead, len(a) - 1))[0].tolist():
        remaining[0].remove(e)
        read[0].append(e)
    dsa.add_job(1, sorted(b))
    remaining[1], read[1] = set(b), []
    for call, n in enumerate(ns):
        if call == again:
            dsa.start_epoch(0)
            remaining[0], read[0] = set(a), []
        for j, got in dsa.picks([0, 1], n).items():
            for e in got.tolist():
                assert e in remaining[j]  # never twice in an epoch, never outside D_j
                remaining[j].remove(e)
                read[j].append(e)
            if not remaining[j]:
                assert sorted(read[j]) == sorted(data[j])
        _check_state(dsa, remaining)


def test_runs_drawn_at_once_are_taken_in_step_and_out_of_step():
    """The service's cases: jobs in step on one dataset, and a second job joined
    mid-epoch (V_0 and each job's own bucket) draw their runs at once."""
    in_step = AtOnce(300, seed=1)
    for j in range(3):
        in_step.add_job(j, np.arange(300))
    got = in_step.picks([0, 1, 2], 64)
    assert in_step.made == 64 and got[0].tolist() == got[1].tolist() == got[2].tolist()
    apart = AtOnce(300, seed=1)
    apart.add_job(0, np.arange(300))
    apart.picks([0], 100)
    apart.add_job(1, np.arange(300))
    made = apart.made
    apart.picks([0, 1], 64)
    assert apart.made - made == 64


def _round_kinds(dsa: DependentSampling, rounds: int, trials: int) -> tuple:
    """Over ``trials`` epoch starts of jobs 0 (ids 0-29) and 1 (10-49), the kind of each
    of the first ``rounds`` rounds (0: both read the element, 1: job 0 read an element
    of both alone, 2: job 0 read its own) and each job's last pick."""
    kinds = np.zeros((rounds, 3), np.int64)
    last0, last1 = np.zeros(30, np.int64), np.zeros(50, np.int64)
    for _ in range(trials):
        dsa.start_epoch(0)
        dsa.start_epoch(1)
        got = dsa.picks([0, 1], rounds)
        for t, (e, f) in enumerate(zip(got[0].tolist(), got[1].tolist(), strict=True)):
            kinds[t, 0 if e == f else 1 if e >= 10 else 2] += 1
        last0[got[0][-1]] += 1
        last1[got[1][-1]] += 1
    return kinds, last0, last1[10:]


def test_runs_drawn_at_once_have_the_law_of_single_rounds():
    """Two jobs out of step: the kinds of each of the first five rounds drawn at once
    against rounds drawn one at a time (chi-square of the two tables), and each job's
    fifth pick uniform over its dataset (Theorem 2)."""
    sides = []
    for cls in (AtOnce, RoundByRound):
        dsa = cls(50, seed=11)
        dsa.add_job(0, np.arange(30))
        dsa.add_job(1, np.arange(10, 50))
        sides.append(_round_kinds(dsa, 5, 3000))
        if cls is AtOnce:
            assert dsa.made == 5 * 3000
    for t in range(5):
        assert chi2_contingency(np.stack([sides[0][0][t], sides[1][0][t]])).pvalue > 1e-3
    for last in sides[0][1:]:
        assert chisquare(last).pvalue > 1e-3


@settings(max_examples=150, deadline=None)
@given(st.one_of(st.lists(st.integers(0, 30)), st.sets(st.integers(0, 30)).map(sorted),
                 st.tuples(st.integers(0, 30), st.integers(0, 30)).map(lambda t: range(*t))),
       st.sampled_from([-2, -1, 1, 3]), st.sampled_from([np.int32, np.int64]))  # fmt: skip
def test_refcnt_counts_references_as_add_at_does(ids, delta, dtype):
    """Ids in any order with repeats (``np.add.at``), ascending and distinct (a gather
    and a write), or a range (a slice): each id gains ``delta`` per time it is listed,
    and counts stay at or above zero."""
    policy = make_policy("refcnt", 100, sizes=np.ones(31, np.int64))
    policy.add_references(np.arange(31), 1)  # a range
    ids = np.array(list(ids), dtype)
    want = np.ones(31, np.int64)
    np.add.at(want, ids.astype(np.int64), delta)
    policy.add_references(ids, delta)
    assert policy.refs.tolist() == np.maximum(want, 0).tolist()


def test_an_epoch_started_on_given_ids_needs_exactly_those():
    """``start_epoch`` with the ids a job has left (a range, taken as a slice, or not;
    in no order, the first and last as far apart as a range of their count's)."""
    cases = (np.arange(5, 15, dtype=np.int32), np.array([3, 4, 9, 30]), np.array([7]),
             np.array([0, 5, 2]))  # fmt: skip
    for left in cases:
        dsa = DependentSampling(40, seed=0)
        dsa.add_job("a", np.arange(40))
        dsa.start_epoch("a", left)
        check_tree(dsa, {"a": set(left.tolist())})


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(30, 400), st.floats(0.05, 0.5),
       st.integers(2, 96))  # fmt: skip
def test_refcnt_compiled_loops_decide_and_leave_the_heap_as_python_s(seed, n, share, b):
    """Two jobs out of step over a full cache of many residents (the regime of the
    compiled merge, which the tests above reach with a few), in two partitions sharing
    the counts: batches of distinct ids and, now and then, with repeats; a job leaving
    and starting again; pins held for a batch and released; sizes that vary. The
    compiled loops (``refcnt_kernel``), the Python loops and the base loop's steps
    decide alike, and the compiled heaps' entries are the Python heaps', entry for
    entry, after every batch."""
    _drive_out_of_step(seed, n, share, b)


def test_refcnt_out_of_step_batches_reach_the_compiled_loops():
    """The batches of the test above take the compiled merge, the checked victims and
    their putting back (the comparison is not vacuous), and none of these loops is
    compiled in a batch: ``load`` ran each with the types the policy passes (a fresh
    process, where nothing else ran them; a first call with other types compiles, or
    loads from numba's cache, for milliseconds to a second)."""
    import subprocess
    import sys
    from pathlib import Path

    code = """if True:
        import json
        from hotset.policy import refcnt_kernel
        from tests.test_joader import _drive_out_of_step
        assert refcnt_kernel.load()
        names = ("merge", "lowest", "put_back")
        kernels = {k: getattr(refcnt_kernel, k) for k in names}
        count = lambda: {k: len(getattr(kernels[k], "signatures", ())) for k in names}
        warmed = count()
        calls = _drive_out_of_step(0, 300, 0.3, 64)
        print(json.dumps({"calls": calls, "warmed": warmed, "after": count()}))
    """
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=root, check=True)  # fmt: skip
    seen = json.loads(out.stdout.splitlines()[-1])
    calls = seen["calls"]
    assert calls["merge"] >= 8 and calls["lowest"] >= 1 and calls["put_back"] >= 1, calls
    assert seen["after"] == seen["warmed"]


def _drive_out_of_step(seed: int, n: int, share: float, b: int) -> dict[str, int]:
    """The test above's run; how often each compiled loop ran (``fast``'s)."""
    from hotset.policy import refcnt_kernel
    from hotset.policy.base import Policy

    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 5, n)
    capacity = max(4, int(share * sizes.sum()))

    def family():
        first = make_policy("refcnt", capacity, sizes=sizes)
        return [first, first.new_partition(capacity // 2, sizes)]

    fast, python, slow = family(), family(), family()
    for part in python:
        part.compiled = False
    for part in slow:  # the generic loop calling the steps one by one
        part._access = Policy._access.__get__(part)
        part.access = Policy.access.__get__(part)
    assert refcnt_kernel.load()
    calls = {"merge": 0, "lowest": 0, "put_back": 0}
    kernels = {name: getattr(refcnt_kernel, name) for name in calls}

    def counted(name):
        def call(*args):
            calls[name] += 1
            return kernels[name](*args)

        return call

    everyone = (fast, python, slow)
    orders, at = [rng.permutation(n), rng.permutation(n)], [0, n // 2]  # out of step
    for parts in everyone:
        parts[0].add_references(np.arange(n), 2)
    pinned = np.zeros(0, np.int64)
    for name in calls:
        setattr(refcnt_kernel, name, counted(name))
    try:
        for step in range(16):
            job = step % 2
            batch = orders[job][at[job] : at[job] + b]
            at[job] += b
            if at[job] >= n:  # the job's next epoch: a reference to each id again
                orders[job], at[job] = rng.permutation(n), 0
                for parts in everyone:
                    parts[0].add_references(np.arange(n))
            if rng.random() < 0.25:  # repeats: each read in its turn
                batch = np.concatenate([batch, batch[: b // 3]])
            k = int(rng.integers(2))  # (a partition reads what the other does not hold)
            batch = batch[~fast[1 - k].resident_mask(batch)]
            leaving = rng.choice(n, n // 4, replace=False) if rng.random() < 0.1 else None
            results = []
            for parts in everyone:
                if batch.size:
                    results.append(parts[k].access(batch))
                parts[0].pin(pinned, -1)
                parts[0].pin(batch[: b // 2])
                if leaving is not None:
                    parts[0].add_references(leaving, -1)
            pinned = batch[: b // 2]
            for r in results[1:]:
                for field in ("hits", "admitted", "evicted"):
                    assert getattr(r, field).tolist() == getattr(results[0], field).tolist()
            assert np.array_equal(fast[0].refs, python[0].refs)
            assert np.array_equal(fast[0].refs, slow[0].refs)
            for f, p, s in zip(fast, python, slow, strict=True):
                assert entries(f._heap) == entries(p._heap)
                assert f.used == p.used == s.used <= f.capacity_bytes
                assert f.cached_ids().tolist() == s.cached_ids().tolist()
    finally:
        for name, kernel in kernels.items():
            setattr(refcnt_kernel, name, kernel)
    assert fast[0]._heap._list is None  # (its entries stayed in the array)
    return calls
