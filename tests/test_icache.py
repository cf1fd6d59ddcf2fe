"""iCACHE: IIS, the H-cache heap with its shadow, L-cache packages and substitution."""

from __future__ import annotations

import copy
import pickle
from collections import deque

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.test_shade import entries

import hotset.policy.icache as icache_module
import hotset.policy.icache_lists as lists_module
import hotset.policy.icache_packages as packages_module
from hotset import make_policy
from hotset.build import make_loader
from hotset.checkpoint import from_safe, to_safe
from hotset.errors import ConfigError, CorruptSampleError
from hotset.models import TinyCNN
from hotset.packages import Packager, read_package
from hotset.plan import Planner, PlanReport
from hotset.sampling import make_sampler
from hotset.storage import FileStorage
from hotset.store import make_store
from hotset.training import train_epoch


def hints(hot, importance):
    return {"hot": np.asarray(hot, bool), "importance": np.asarray(importance, float)}


def test_iis_selects_by_importance_after_warmup_and_hands_over_the_h_list():
    n = 2000
    s = make_sampler(
        "iis", n, warmup_epochs=2, full_every=5, seed=1, h_fraction=0.7, coverage_epochs=None
    )
    assert np.array_equal(np.sort(s.global_order(0)), np.arange(n))  # nothing known
    assert s.cache_hints(0)["hot"].all()
    losses = np.linspace(0.0, 1.0, n)  # id i has the i-th smallest loss
    s.feedback(np.arange(n), losses)
    assert np.array_equal(np.sort(s.global_order(1)), np.arange(n))  # warm-up: full pass
    kept = np.zeros(n)
    for e in (2, 3, 4, 6):
        order = s.global_order(e)
        assert np.unique(order).size == order.size  # each selected id once
        kept[order] += 1
    assert np.array_equal(np.sort(s.global_order(5)), np.arange(n))  # the periodic full pass
    pct = np.arange(n) / (n - 1)
    expect = 4 * pct**0.33
    assert abs(kept.sum() - expect.sum()) < 0.03 * expect.sum()
    assert kept[: n // 10].mean() < 0.6 * kept[-n // 10 :].mean()  # unimportant: rarer
    h = s.cache_hints(2)
    assert np.array_equal(h["hot"], pct >= 0.3)  # the prototype's: the top 70%
    s.set_epoch(2)
    assert len(s) == s.global_order(2).size < n  # the loader's length follows the subset


def test_iis_keeps_its_losses_as_its_scores_once_through_a_saved_state():
    """IIS's importance is the loss: its board holds one array for both (8 B per id), and
    a state saved to bytes and loaded keeps it so, with the same percentiles."""
    n = 500
    s = make_sampler("iis", n, seed=4)
    ids = np.arange(0, n, 3)
    s.feedback(ids, np.cos(ids))
    assert "score" not in vars(s.board) and s.board.score is s.board.loss
    assert (s.board.score[np.setdiff1d(np.arange(n), ids)] == 1.0).all()  # a number to key
    pct = s.percentiles()
    assert pct.dtype == np.float32 and (pct[np.setdiff1d(np.arange(n), ids)] == 1).all()
    assert np.array_equal(np.argsort(pct[ids], kind="stable"), np.argsort(np.cos(ids)))
    with pytest.raises(ConfigError, match="losses"):
        s.board.fill_unseen(0.5)  # no prior to write over the losses
    again = make_sampler("iis", n, seed=4)
    again.load_state_dict(from_safe(to_safe(s.state_dict())))
    assert again.board.score is again.board.loss
    assert np.array_equal(again.percentiles(), pct)
    again.feedback(ids[:2], np.array([9.0, 9.0]))
    assert (again.board.score[ids[:2]] == 9.0).all()


@settings(max_examples=30, deadline=None)
@given(
    fraction=st.floats(0.02, 0.9),
    sizes=st.lists(st.integers(1, 50), min_size=20, max_size=200),
)
def test_the_default_h_list_is_what_fits_the_cache(fraction, sizes):
    """h_fraction=None (the paper's reading): the cache takes as its H-list the most
    important samples whose bytes fit it, so no H-sample is more important than a sample
    left out that would have fitted in its place, and the list never outgrows the cache."""
    n = len(sizes)
    sizes = np.array(sizes)
    capacity = max(1, int(fraction * sizes.sum()))
    s = make_sampler("iis", n, seed=3)
    s.feedback(np.arange(n), np.random.default_rng(n).random(n))
    s.set_epoch(1)
    hints = s.cache_hints(1)
    assert hints["hot"] is None  # the cache decides
    p = make_policy("icache", capacity, sizes=sizes)
    p.apply_hints(hints)
    hot, imp = p.is_h, hints["importance"]
    assert sizes[hot].sum() <= capacity
    if (~hot).any():  # the H-list is a prefix by importance, cut where the next misses
        left = np.flatnonzero(~hot)
        top_left = left[np.argmax(imp[left])]
        assert not hot.any() or imp[hot].min() > imp[top_left]
        assert sizes[hot].sum() + sizes[top_left] > capacity


@settings(max_examples=80, deadline=None)
@given(
    levels=st.lists(st.integers(0, 4), min_size=0, max_size=300),
    fraction=st.floats(0.0, 1.2),
    seed=st.integers(0, 3),
    float64=st.booleans(),
)
def test_the_h_list_is_the_most_important_that_fit(levels, fraction, seed, float64):
    """``h_list_to_fit`` orders only the ids that can be in it, yet its H-list is a prefix
    of the full order by importance: what it holds fits, nothing left out is more
    important than what it holds, and the next most important would not fit."""
    from hotset.policy.icache_lists import h_list_to_fit

    imp = (np.array(levels, float) / 4).astype(np.float64 if float64 else np.float32)
    sizes = (np.arange(imp.size) * 7919 % 50 + 1).astype(np.int64)
    capacity = int(fraction * sizes.sum())
    hot = h_list_to_fit(imp, sizes, capacity, seed)
    assert sizes[hot].sum() <= capacity
    if hot.any() and (~hot).any():
        assert imp[hot].min() >= imp[~hot].max()
    if (~hot).any():  # one of the most important left out is the next, and does not fit
        left = np.flatnonzero(~hot)
        nxt = left[imp[left] == imp[left].max()]
        assert (sizes[hot].sum() + sizes[nxt] > capacity).any()


@settings(max_examples=120, deadline=None)
@given(
    levels=st.lists(st.integers(0, 6), min_size=1, max_size=200),
    fraction=st.floats(0.0, 1.2),
    share=st.integers(1, 4),
)
def test_the_h_list_of_ranked_ids_is_the_h_list_to_fit(levels, fraction, share):
    """IIS's ``ranked`` (the most important ids in order, down, ties in id order) gives
    ``h_list_to_fit``'s H-list, whatever its seed, or ``None`` exactly where the first id
    left out ties with another (a smaller one of equal importance might fit) or is not
    known to be followed by a less important one (``ranked`` ends at it or before)."""
    from hotset.policy.icache_lists import h_list_of_ranked, h_list_to_fit

    imp = np.asarray(levels, np.float32) / 6
    n = imp.size
    ranked = np.argsort(-imp, kind="stable")[: n // share]
    sizes = (np.arange(n) * 7919 % 50 + 1).astype(np.int64)
    capacity = int(fraction * sizes.sum())
    hot = h_list_of_ranked(ranked, imp, sizes, capacity)
    fit = int((np.cumsum(sizes[ranked]) <= capacity).sum())
    tie = fit < ranked.size and (imp == imp[ranked[fit]]).sum() > 1
    assert (hot is None) == (fit + 1 >= ranked.size < n or tie)
    if hot is not None:
        for seed in range(3):
            assert np.array_equal(hot, h_list_to_fit(imp, sizes, capacity, seed))
    if ranked.size > 1 and imp[ranked[0]] > imp[ranked[-1]]:  # out of order: refused
        with pytest.raises(ConfigError, match="ranked"):
            h_list_of_ranked(ranked[::-1], imp, sizes, sizes.sum())
    with pytest.raises(ConfigError, match="ranked"):
        h_list_of_ranked(np.append(ranked, n), imp, sizes, capacity)


def test_plans_are_the_same_with_iis_s_ranked_ids_or_without(monkeypatch):
    """What a run of IIS and iCACHE serves (each batch's ids, hits, admissions and
    evictions, four epochs with feedback) is the same whether the cache takes its
    H-list from IIS's ranked ids or sorts the importances itself; the ranked ids were
    taken at each scored start."""
    from hotset.sampling.iis import IISSampler

    n = 4000
    sizes = (np.arange(n) * 7919 % 50 + 10).astype(np.int64)
    losses = np.random.default_rng(0).random(n)

    def plans() -> list[list[int]]:
        policy = make_policy("icache", int(0.1 * sizes.sum()), sizes=sizes)
        planner = Planner(make_sampler("iis", n, seed=1), policy, 64)
        out = []
        for epoch in range(4):
            planner.set_epoch(epoch)
            for plan in planner:
                out.append([plan.ids.tolist(), plan.hits.tolist(), plan.admitted.tolist(),
                            plan.evicted.tolist()])  # fmt: skip
                planner.feedback(plan.ids, losses[plan.ids] + epoch)
        return out

    taken = []
    ranked = lists_module.h_list_of_ranked
    monkeypatch.setattr(lists_module, "h_list_of_ranked",
                        lambda *a: taken.append(r := ranked(*a)) or r)  # fmt: skip
    with_ranked = plans()
    assert len(taken) == 3 and all(t is not None for t in taken)
    hints = IISSampler.cache_hints

    def unranked(self, epoch: int) -> dict:
        return {k: v for k, v in hints(self, epoch).items() if k != "ranked"}

    monkeypatch.setattr(IISSampler, "cache_hints", unranked)
    assert plans() == with_ranked and len(taken) == 3


@pytest.mark.parametrize("fraction", [0.5, 0.95])
def test_the_h_list_takes_equally_important_samples_at_random(fraction):
    """Ties at the cut are broken at random: of 8 equally important samples of one size
    and a cache for 4, each is in the H-list in about half of 4,000 draws (a chi-square
    test); with a cache for 7 of 8 (every id ordered, no partition), in 7/8 of them."""
    from hotset.policy.icache_lists import h_list_to_fit

    n, draws = 8, 4000
    fits = int(fraction * n)
    counts = sum(
        h_list_to_fit(np.ones(n, np.float32), np.full(n, 10), 10 * fits, seed).astype(int)
        for seed in range(draws)
    )
    assert counts.sum() == draws * fits
    want = draws * fits / n
    chi2 = float((((counts - want) ** 2) / want).sum())
    assert chi2 < 24.3, (counts, chi2)  # 7 degrees of freedom, p = 0.001


def evict_in_turn(p, capacity: int) -> None:
    """Algorithm 1's evictions one at a time, as an admission makes them: pop the least
    important H resident until the H-cache fits, pinned ones put back."""
    held = []
    while p.h_used > capacity and (top := p.heap.peek()) is not None:
        j = p.heap.pop()
        if p.pinned[j]:
            held.append((j, top[1]))
            continue
        p.h_used -= p.size_of(j)
        p._evicted(j)
    for j, level in held:
        p.heap.push(j, level)


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 40), min_size=30, max_size=30),
    accesses=st.lists(st.integers(0, 29), min_size=1, max_size=80),
    pins=st.lists(st.integers(0, 29), max_size=8),
    share=st.floats(0.0, 0.9),
    rebuilding=st.booleans(),
)
def test_a_new_split_evicts_at_once_what_one_by_one_would(
    sizes, accesses, pins, share, rebuilding
):
    """A smaller H-cache (a new split at an epoch start) evicts its least important
    unpinned residents at once: the same victims, in the same order, the same bytes
    and heap left as evictions one at a time; a rebuild in progress ends first (its
    shadow's levels decide)."""
    import copy

    rng = np.random.default_rng(len(accesses))
    p = make_policy("icache", 400, sizes=np.array(sizes), h_share=1.0, package_bytes=40)
    p.apply_hints(hints(np.ones(30), rng.integers(0, 4, 30) / 4))  # ties: by id
    p.access(np.array(accesses))
    if rebuilding:  # new levels: the heap turns read-only, the shadow holds them
        p.rebuild_per_batch = 1
        p.apply_hints(hints(np.ones(30), rng.integers(0, 4, 30) / 4))
        assert p.shadow is not None or not p.h_residents().size
    p.pinned[np.array(pins, np.int64)] += 1
    p._take_evicted()
    at_once, in_turn = copy.deepcopy(p), copy.deepcopy(p)
    at_once.set_split(share)
    in_turn.rebuild_step(in_turn._rebuild)
    evict_in_turn(in_turn, at_once.h_capacity)
    one_by_one = in_turn._take_evicted().tolist()
    assert one_by_one == at_once._take_evicted()[: len(one_by_one)].tolist()
    assert at_once.h_used == in_turn.h_used
    assert at_once.h_residents().tolist() == in_turn.h_residents().tolist()  # the same H
    assert np.array_equal(at_once.heap.in_order(), in_turn.heap.in_order())
    assert [at_once.heap.pop() for _ in range(len(at_once.heap))] == [
        in_turn.heap.pop() for _ in range(len(in_turn.heap))
    ]


def test_a_new_splits_evictions_are_reported_by_the_next_batch_once_and_first():
    """The residents a smaller H-cache evicts at once (0 and 1, the least important)
    come first in the next batch's evictions, once each: 0, admitted again into the
    room 1 left and evicted again in that batch for 20, is listed at its first place;
    the batch after lists only its own."""
    sizes = np.full(40, 10)
    sizes[[1, 20]] = 50
    p = make_policy("icache", 400, sizes=sizes, h_share=1.0, package_bytes=10)
    p.apply_hints(hints(np.ones(40), np.arange(40) / 40))
    p.access(np.arange(10))
    p.set_split(0.3125)  # an H-cache of 125 bytes: 15 of the 140 held must go
    assert p.access(np.array([0, 20])).evicted.tolist() == [0, 1, 2]
    assert p.access(np.array([21])).evicted.tolist() == [3]


def test_a_smaller_l_caches_removals_are_reported_by_the_next_batch():
    """A new split that shrinks the L-cache removes its residents the first loaded
    first; the next batch lists them (its store deletes them), the one after does not."""
    p = make_policy("icache", 400, sizes=np.full(40, 10), h_share=0.5, package_bytes=20)
    p.apply_hints(hints(np.arange(40) < 20, np.arange(40) / 40))  # 20-39: L-samples
    feeder = p.make_feeder(lock=None)
    p.access(np.arange(20, 40))  # L-misses, loaded in packages in turn
    feeder.poll()
    assert p.l_residents().tolist() == list(range(20, 30))
    p.set_split(0.9)  # an L-cache of 40 bytes
    assert p.access(np.array([5])).evicted.tolist() == list(range(20, 26))
    assert p.access(np.array([6])).evicted.tolist() == []


def test_h_cache_follows_algorithm_1():
    p = make_policy("icache", 4, num_samples=10, h_share=1.0, package_bytes=1)
    assert p.h_capacity == 2 and p.l_capacity == 2  # never below one package (+ 1 sample)
    p.apply_hints(hints(np.ones(10), np.arange(10) / 10))
    r = p.access([5, 6])  # room: both admitted (lines 9-10)
    assert list(r.admitted) == [5, 6]
    r = p.access([2])  # 0.2 < top's 0.5: not admitted (line 14)
    assert not r.admitted.size and 2 not in p
    r = p.access([9])  # 0.9 > 0.5: the top (5) is evicted (line 15)
    assert list(r.admitted) == [9] and list(r.evicted) == [5]
    assert p.access([6, 9]).hits.all()


def test_the_old_heap_serves_evictions_until_the_shadow_is_rebuilt():
    p = make_policy("icache", 5, num_samples=10, h_share=1.0, package_bytes=1, rebuild_per_batch=1)
    p.apply_hints(hints(np.ones(10), np.arange(10) / 10))
    p.access([1, 2, 3])
    # New values turn the order around: 3 is now the least important.
    p.apply_hints(hints(np.ones(10), 1 - np.arange(10) / 10))
    assert p.shadow is not None and p.swaps == 0
    r = p.access([0])  # 1.0 beats the old top: the old heap evicts 1 (old value 0.1),
    assert list(r.evicted) == [1]  # not 3, the minimum by the new values
    assert p.shadow is not None  # one id re-inserted per batch: not complete yet
    p.access([])
    p.access([])
    assert p.shadow is None and p.swaps == 1
    r = p.access([4])  # against the new heap: 4 (0.6) is below every resident (3: 0.7)
    assert not r.admitted.size
    r = p.access([0, 0])
    assert r.hits.all()


def test_a_resident_in_both_heaps_during_a_rebuild_is_evicted_once():
    sizes = np.ones(10, np.int64)
    sizes[9] = 3  # needs the whole H-cache
    p = make_policy("icache", 7, sizes=sizes, h_share=1.0, package_bytes=1, rebuild_per_batch=1)
    assert p.h_capacity == 3
    imp = np.arange(10) / 10
    p.apply_hints(hints(np.ones(10), imp))
    p.access([1, 2])
    p.apply_hints(hints(np.ones(10), imp))  # a rebuild starts: the old heap is read-only
    r = p.access([5])  # admitted into the shadow, which holds every resident
    assert list(r.admitted) == [5] and 2 in p.heap and 2 in p.shadow
    r = p.access([9])  # drains the old heap (1, 2), then the shadow (1 and 2 again, then 5)
    assert sorted(r.evicted.tolist()) == [1, 2, 5] and list(r.admitted) == [9]
    assert p.h_used == 3 and set(p.h_residents().tolist()) == {9}


class _ShadowBuiltAsInThePaper(icache_module.ICachePolicy):
    """The shadow heap rebuilt as III-B describes: the residents re-inserted
    ``rebuild_per_batch`` per batch (those still resident and not admitted meanwhile)."""

    def apply_hints(self, hints):
        super().apply_hints(hints)
        if self.shadow is not None:
            self.shadow = icache_module.KeyedHeap(self.num_samples)
            self._todo = self.h_residents().tolist()

    def rebuild_step(self, budget):
        if self.shadow is None:
            return
        while self._todo and budget > 0:
            i, budget = self._todo.pop(), budget - 1
            if self._where[i] == icache_module.H and i not in self.shadow:
                self.shadow.push(i, int(self._level[i]))
        if not self._todo:
            self.heap, self.shadow = self.shadow, None
            self.swaps += 1


def accessed_while_pinned(policies, pins: np.ndarray, ids: np.ndarray) -> list:
    """Each policy's access of ``ids`` while a plan in flight pins ``pins``."""
    results = []
    for p in policies:
        p.pin(pins)
        results.append(p.access(ids))
        p.pin(pins, -1)
    return results


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10**6), st.integers(4, 40), st.integers(1, 6))
def test_the_shadow_filled_at_once_evicts_as_the_one_rebuilt_per_batch(seed, cap, per_batch):
    """Filled with every resident at the H-list's arrival and swapped after as many
    batches, the shadow heap makes the decisions of the paper's rebuild (H-cache only,
    pins held across batches, several H-lists with a rebuild still running)."""
    n = 40
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 4, n)
    kw = dict(sizes=sizes, h_share=1.0, package_bytes=1, rebuild_per_batch=per_batch)
    ours = make_policy("icache", cap, **kw)
    paper = _ShadowBuiltAsInThePaper(cap, **kw)
    for _ in range(5):
        importance = rng.random(n).round(1)  # ties too
        for p in (ours, paper):
            p.apply_hints(hints(np.ones(n), importance))
        for _ in range(rng.integers(1, 6)):
            pins = rng.integers(0, n, rng.integers(0, 4))
            ids = rng.integers(0, n, 6)
            a, b = accessed_while_pinned((ours, paper), pins, ids)
            assert a.hits.tolist() == b.hits.tolist()
            assert a.admitted.tolist() == b.admitted.tolist()
            assert a.evicted.tolist() == b.evicted.tolist()
            assert (ours.shadow is None) == (paper.shadow is None) and ours.swaps == paper.swaps
            assert ours.h_used == paper.h_used <= ours.h_capacity


def test_l_misses_are_substituted_by_unused_l_samples_never_for_h_requests():
    n = 100
    p = make_policy("icache", 30, num_samples=n, h_share=0.5, package_bytes=10, seed=3)
    hot = np.arange(n) >= 50
    p.apply_hints(hints(hot, np.arange(n) / n))
    feeder = p.make_feeder(lock=None)  # no storage, no store: the simulator's feeder
    feeder.poll()
    assert feeder.counters()["packages_loaded"] >= 1 and p.l_fresh() > 0
    cached_l = set(p.l_residents().tolist())
    assert cached_l and all(not hot[i] for i in cached_l)
    served_subs = []
    for ids in np.array_split(np.random.default_rng(0).permutation(n), 10):
        r = p.access(ids)
        req_h = hot[ids]
        assert not r.substituted[req_h].any()  # an H-request is never substituted
        assert np.array_equal(r.served[req_h], ids[req_h])
        subs = r.served[r.substituted]
        assert not hot[subs].any()  # substitutes are L-samples
        served_subs += subs.tolist()
        feeder.poll()
    assert served_subs and len(served_subs) == len(set(served_subs))  # once per epoch
    assert p.used <= p.capacity_bytes


def test_h_l_split_follows_access_frequencies():
    p = make_policy("icache", 100, num_samples=1000, package_bytes=5)
    assert p.h_capacity == 90  # the initial 9:1
    hot = np.arange(1000) < 700
    p.apply_hints(hints(hot, np.arange(1000) / 1000))
    p.access(np.r_[np.arange(600), np.arange(700, 900)])  # 600 H, 200 L accesses
    p.apply_hints(hints(hot, np.arange(1000) / 1000))
    assert p.h_capacity == 75 and p.l_capacity == 25  # 100 * 600 / 800
    p.access(np.arange(700))  # only H accesses: the L-cache keeps one package
    p.apply_hints(hints(hot, np.arange(1000) / 1000))
    assert p.l_capacity == 6 and p.h_capacity == 94


#: seed, capacity, package bytes, share of H-samples: a small iCACHE driven at random
SMALL_CACHES = (st.integers(0, 10**6), st.integers(5, 60), st.integers(1, 12), st.floats(0.0, 1.0))


def _small_cache(seed: int, pkg: int):
    """80 ids of 1-3 bytes: (n, the generator that drives them, the policy's options)."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 4, 80)
    return 80, rng, dict(sizes=sizes, package_bytes=pkg, seed=seed, rebuild_per_batch=3)


@settings(max_examples=40, deadline=None)
@given(*SMALL_CACHES)
def test_icache_never_exceeds_capacity_and_planned_hits_are_resident(seed, cap, pkg, h_frac):
    n, rng, kw = _small_cache(seed, pkg)
    p = make_policy("icache", cap, **kw)
    feeder = p.make_feeder(lock=None)  # no storage, no store: the simulator's feeder
    for _ in range(4):
        p.apply_hints(hints(rng.random(n) < h_frac, rng.random(n)))
        feeder.epoch_started()
        for _ in range(5):
            r = p.access(rng.integers(0, n, 16))
            assert all(i in p for i in r.served[r.hits].tolist() if i not in r.evicted)
            assert p.h_used <= p.h_capacity and p.used <= p.capacity_bytes
            assert set(r.admitted.tolist()) <= set(p.h_residents().tolist())
            feeder.poll()
            assert p.used <= p.capacity_bytes


class OneByOne(icache_module.ICachePolicy):
    """Algorithm 1, lines 7-17, as written: every H position in turn."""

    def _admit_h_in_turn(self, ids, h_pos, misses, hits):
        take, turned = [], []
        for p in h_pos.tolist():
            i = int(ids[p])
            hits[p] = bool(self._where[i] == icache_module.H)
            if not hits[p] and self.is_h[i]:
                if self._admit_h(i):
                    take.append(i)
            elif not hits[p]:
                turned.append(p)
        return np.array(take, np.int64), turned


@settings(max_examples=150, deadline=None)
@given(*SMALL_CACHES, st.booleans(), st.lists(st.integers(0, 79), max_size=6))
def test_the_misses_refused_together_are_those_algorithm_1_refuses_one_by_one(
    seed, cap, pkg, h_frac, scored, pins
):
    """The H-misses a full H-cache refuses at once (no room, the least important
    resident at least as important) settle together; the batches are served, hit,
    admitted and evicted as Algorithm 1's loop over every position decides them, with
    all ids hot and of one importance (a first epoch), or an H-list and levels with
    ties, pinned residents and a shadow heap being rebuilt."""
    n, rng, kw = _small_cache(seed, pkg)
    fast, slow = make_policy("icache", cap, **kw), OneByOne(cap, **kw)
    fast.pinned[pins] += 1
    slow.pinned[pins] += 1
    for _ in range(3):
        if scored:
            new = hints(rng.random(n) < h_frac, rng.integers(0, 4, n) / 4)
            fast.apply_hints(new)
            slow.apply_hints(new)
        for _ in range(6):
            batch = rng.integers(0, n, 24)
            a, b = fast.access(batch), slow.access(batch)
            for field in ("served", "hits", "admitted", "evicted", "substituted"):
                assert np.array_equal(getattr(a, field), getattr(b, field)), field
            assert fast.h_used == slow.h_used


@settings(max_examples=150, deadline=None)
@given(*SMALL_CACHES, st.integers(0, 8))
def test_residents_pinned_by_plans_in_flight_are_passed_as_algorithm_1_passes_them(
    seed, cap, pkg, h_frac, pinned
):
    """Plans in flight pin the latest admissions, the least important residents: each
    batch pins some residents (and other ids), decided by Algorithm 1's loop over every
    position, where each admission pops a pinned resident at the top and puts it back;
    the policy takes it out of the heap once for the batch. The same hits, admissions,
    evictions and bytes, batch after batch, the pins released between them."""
    n, rng, kw = _small_cache(seed, pkg)
    kw["rebuild_per_batch"] = 10**6  # an H-list's heap is rebuilt at once: one heap
    fast, slow = make_policy("icache", cap, **kw), OneByOne(cap, **kw)
    for _ in range(3):
        new = hints(rng.random(n) < h_frac, rng.integers(0, 6, n) / 6)
        fast.apply_hints(new)
        slow.apply_hints(new)
        for _ in range(8):
            kept = rng.permutation(fast.h_residents())[:pinned]
            pins = np.concatenate([kept, rng.integers(0, n, 2)])
            batch = rng.integers(0, n, 24)
            a, b = accessed_while_pinned((fast, slow), pins, batch)
            for field in ("served", "hits", "admitted", "evicted", "substituted"):
                assert np.array_equal(getattr(a, field), getattr(b, field)), field
            assert fast.h_used == slow.h_used <= fast.h_capacity
            assert np.isin(kept, fast.h_residents()).all()  # pinned: never evicted


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(100, 600), st.floats(0.05, 0.4),
       st.integers(8, 128), st.sampled_from([2, 10**6]), st.booleans())  # fmt: skip
def test_the_compiled_h_cache_decides_and_leaves_the_heap_as_python_s(
    seed, n, share, b, per_batch, small_slack
):
    """A full H-cache of many residents (the regime of the compiled loop, which the tests
    above reach with a few): H-lists with tied levels, residents and other ids pinned
    for a batch, repeats, a shadow heap rebuilt over a few batches (the Python loop's
    part) or at once, and (``small_slack``) a heap compacted often, so that the compiled
    loop rebuilds it mid-batch. The compiled loop, the Python loop and Algorithm 1's loop
    over every position decide alike; the compiled heap's entries and held entries are
    the Python heap's after every batch."""
    from hotset.policy import compiled_heap, icache_kernel
    from hotset.policy.keyed_heap import KeyedHeap

    rng = np.random.default_rng(seed)
    kw = dict(sizes=rng.integers(1, 4, n), package_bytes=4, seed=1,
              rebuild_per_batch=per_batch)  # fmt: skip
    cap = max(8, int(share * kw["sizes"].sum()))
    assert icache_kernel.load()
    slack, KeyedHeap.slack = KeyedHeap.slack, 0 if small_slack else KeyedHeap.slack
    try:
        fast, python, slow = make_policy("icache", cap, **kw), make_policy("icache", cap, **kw), \
            OneByOne(cap, **kw)  # fmt: skip
        python.compiled = False
        everyone = (fast, python, slow)
        for _ in range(3):
            new = hints(rng.random(n) < 0.8, rng.integers(0, 5, n) / 5)
            for p in everyone:
                p.apply_hints(new)
            for _ in range(6):
                if small_slack and rng.random() < 0.3:
                    # most residents found absent: stale entries beyond the live ones,
                    # a compaction at the next push
                    gone = rng.permutation(fast.h_residents())
                    for p in everyone:
                        p.discard(gone[: gone.size * 3 // 4])
                kept = rng.permutation(fast.h_residents())[: b // 8]
                pins = np.concatenate([kept, rng.integers(0, n, 4)])
                batch = rng.integers(0, n, b)
                a, c, d = accessed_while_pinned(everyone, pins, batch)
                for field in ("served", "hits", "admitted", "evicted", "substituted"):
                    assert np.array_equal(getattr(a, field), getattr(c, field)), field
                    assert np.array_equal(getattr(a, field), getattr(d, field)), field
                assert fast.h_used == python.h_used == slow.h_used <= fast.h_capacity
                for name in ("heap", "shadow"):
                    f, p = getattr(fast, name), getattr(python, name)
                    assert (f is None) == (p is None)
                    if f is not None:
                        assert entries(f) == entries(p) and f._parked == p._parked
                        assert f.count == p.count
    finally:
        KeyedHeap.slack = slack
    assert isinstance(fast.heap, compiled_heap.CompiledHeap)


def test_an_icache_state_saved_with_the_python_heap_loads_into_the_compiled_one():
    """An iCACHE state saved before its H-cache's heap was compiled (a ``KeyedHeap``)
    loads as a ``CompiledHeap`` with the same entries, and decides as the policy it was
    saved from."""
    from hotset.policy.compiled_heap import CompiledHeap
    from hotset.policy.keyed_heap import KeyedHeap

    rng = np.random.default_rng(0)
    kw = dict(sizes=np.ones(200, np.int64), package_bytes=4, seed=1)
    old, new, same = (make_policy("icache", 60, **kw) for _ in range(3))
    old.apply_hints(hints(rng.random(200) < 0.8, rng.random(200)))
    old.access(np.arange(100))
    state = old.state_dict()
    new.load_state_dict({**state, "heap": state["heap"].recast(KeyedHeap)})
    same.load_state_dict(state)
    assert type(new.heap) is CompiledHeap and entries(new.heap) == entries(old.heap)
    batch = rng.permutation(200)[:80]
    a, b = new.access(batch), same.access(batch)
    for field in ("served", "hits", "admitted", "evicted"):
        assert np.array_equal(getattr(a, field), getattr(b, field)), field
    assert a.evicted.size and entries(new.heap) == entries(same.heap)


def test_the_compiled_h_cache_s_cases_reach_each_path_and_compile_nothing_in_a_batch():
    """The cases of the test above take the compiled loop, its held pinned tops, its
    evictions and its rebuild of the heap mid-batch; and no compiled step is compiled
    in a batch (a fresh process, where nothing else ran them: ``load`` and
    ``compile_steps`` ran each with the types iCACHE passes; a first call with others
    compiles, or loads from numba's cache, for milliseconds to a second)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    code = """if True:
        import json
        from hotset.policy import compiled_heap, icache_kernel
        import tests.test_icache as t
        assert icache_kernel.load()
        steps = [getattr(icache_kernel, "admit_in_turn")] + [
            getattr(compiled_heap, k) for k in ("push", "pop", "push_all", "drop_stale")]
        count = lambda: [len(getattr(f, "signatures", ())) for f in steps]
        warmed, seen = count(), [0, 0, 0, 0]
        kernel = icache_kernel.admit_in_turn
        def counted(*args):
            r = kernel(*args)
            seen[0] += 1; seen[1] += r[5]; seen[2] += r[6]; seen[3] += int(r[7])
            return r
        icache_kernel.admit_in_turn = counted
        run = t.test_the_compiled_h_cache_decides_and_leaves_the_heap_as_python_s
        for case in [(0, 300, 0.2, 64, 10**6, True), (1, 500, 0.1, 128, 2, True)]:
            run.hypothesis.inner_test(*case)
        print(json.dumps({"seen": seen, "warmed": warmed, "after": count()}))
    """
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=root, check=True)  # fmt: skip
    r = json.loads(out.stdout.splitlines()[-1])
    calls, evicted, parked, rebuilt = r["seen"]
    assert calls >= 10 and evicted and parked and rebuilt, r
    assert r["after"] == r["warmed"]


@settings(max_examples=150, deadline=None)
@given(*SMALL_CACHES)
def test_the_instant_load_decides_as_the_package_threads_steps_do(seed, cap, pkg, h_frac):
    """The simulator's feeder loads a package in one step (``l_load_now``: no reservation,
    no arrays), or many at once (``l_load_many``); the package threads compose each, make
    room and commit it. Driven the same way (some ids pinned while packages load, as by
    plans in flight), both serve the same ids with the same hits and hold the same
    residents, loaded in the same order, used in the same order. The simulator's feeder
    with the L-cache's walks compiled (``icache_kernel.candidates``, ``settle_in_turn``)
    and with the Python walks (``compiled`` off, and a few L-samples a call) decide
    alike."""
    n, rng, kw = _small_cache(seed, pkg)
    instant, stepped = make_policy("icache", cap, **kw), make_policy("icache", cap, **kw)
    python = make_policy("icache", cap, **kw)
    python.compiled, python.load_many_ids = False, 3  # (and a few L-samples a call)
    feeders = [p.make_feeder(lock=None) for p in (instant, python)]

    def poll_in_steps():
        while stepped.l_wants_package():
            ids = stepped.l_next_package()
            if not ids.size:
                return
            _, accepted = stepped.l_make_room(ids)
            stepped.l_commit(accepted)

    everyone = (instant, python, stepped)
    for _ in range(6):
        hot, importance = rng.random(n) < h_frac, rng.random(n)
        for p in everyone:
            p.apply_hints(hints(hot, importance))
        for feeder in feeders:
            feeder.epoch_started()
        poll_in_steps()
        for _ in range(5):
            ids = rng.integers(0, n, 16)
            a, c, b = (p.access(ids) for p in everyone)
            for other in (b, c):
                assert a.served.tolist() == other.served.tolist()
                assert a.hits.tolist() == other.hits.tolist()
            pins = ids[rng.random(ids.size) < 0.2]
            for p in everyone:
                p.pin(pins)
            for feeder in feeders:
                feeder.poll()
            poll_in_steps()
            for p in everyone:
                p.pin(pins, -1)
            for other in (python, stepped):
                assert instant.l_residents().tolist() == other.l_residents().tolist()
                assert instant._l_used.in_order(instant._where).tolist() == \
                    other._l_used.in_order(other._where).tolist()  # fmt: skip
                assert instant.used == other.used
            assert not stepped.writing_ids().size


def test_a_package_file_holds_the_samples_it_claims(fmnist_dir, tmp_path):
    storage = FileStorage(str(fmnist_dir / "train"))
    store = make_store("memory", 10**6)
    policy = make_policy("icache", 100_000, sizes=storage.sizes, package_bytes=20_000)
    hot = np.arange(len(storage)) % 2 == 0
    policy.apply_hints(hints(hot, np.linspace(0, 1, len(storage))))
    planner = Planner(
        make_sampler("uniform", len(storage)), policy, 32, storage=storage, store=store,
        package_dir=str(tmp_path / "pk"),
    )  # fmt: skip
    packager = planner.feeder
    try:
        packager.poll()
        for _ in range(200):
            if packager.counters()["packages_loaded"]:
                break
            import time

            time.sleep(0.05)
        files = sorted((tmp_path / "pk").glob("pkg-*.bin"))
        assert files and packager.counters()["packages_loaded"] >= 1
        entries = read_package(files[0])
        assert sum(len(d) for _, _, d in entries) >= 20_000  # >= the package size
        for i, key, data in entries:
            assert not hot[i]  # L-samples only
            assert key == storage.keys[i] and data == storage.read(i)  # bytes compared
        loaded = policy.l_residents().tolist()
        got = store.get_many([storage.keys[i] for i in loaded])
        assert all(g == storage.read(i) for i, g in zip(loaded, got, strict=True))
        blob = bytearray(files[0].read_bytes())
        blob[-1] ^= 0xFF  # a flipped byte in the last sample
        files[0].write_bytes(bytes(blob))
        with pytest.raises(CorruptSampleError, match="does not match"):
            read_package(files[0])
    finally:
        packager.close()


def test_a_packagers_own_directory_goes_with_it_and_not_with_a_forked_copy(fmnist_dir):
    """A loader dropped without close() leaves no package files behind: the packager's own
    temporary directory is removed when it is collected (or at exit), but a forked
    worker's copy of the packager, collected in the worker, leaves its parent's files."""
    import gc
    import os
    import threading

    storage = FileStorage(str(fmnist_dir / "train"))
    policy = make_policy("icache", 100_000, sizes=storage.sizes, package_bytes=20_000)
    policy.apply_hints(hints(np.arange(len(storage)) % 2 == 0, np.linspace(0, 1, len(storage))))
    packager = Packager(storage, make_store("memory", 10**6), policy, threading.RLock(),
                        threads=False)  # fmt: skip
    packager.poll()
    made = packager.dir
    assert list(made.glob("pkg-*.bin"))  # packages were written there
    pid = os.fork()
    if pid == 0:  # the worker: its copy goes, the parent's files stay
        del packager
        gc.collect()
        os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    assert list(made.glob("pkg-*.bin"))
    del packager
    gc.collect()
    assert not made.exists()


@pytest.mark.slow
def test_icache_trains_with_two_workers_and_serves_substitutes(fmnist_dir, tmp_path):
    storage = FileStorage(str(fmnist_dir / "train"))
    loader = make_loader(
        storage, batch_size=50, policy="icache", sampler="iis", cache_fraction=0.3,
        num_workers=2, policy_options={"package_bytes": 20_000}, package_dir=str(tmp_path),
    )  # fmt: skip
    torch.manual_seed(0)
    model = TinyCNN()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    seen_subs = 0
    try:
        for epoch in range(4):
            loader.set_epoch(epoch)
            n_served = 0
            for _, y, ids in loader:
                assert np.array_equal(y.numpy(), storage.labels[ids.numpy()])
                n_served += len(ids)
            if epoch >= 1:
                assert n_served < len(storage)  # IIS: unselected samples are not read
            train_epoch(loader, model, opt)
            seen_subs = loader.counters()["substitute_hits"]
        c = loader.counters()
        # two workers, two batches each ahead: the planner counts four plans in flight
        # beside the next one (``l_in_flight`` sizes the L-cache by them)
        assert loader.planner.policy.in_flight_ids == 2 * 2 * 50
    finally:
        loader.close()
        loader.dataset.store.close(destroy=True)
    assert c["internal"]["packages_loaded"] >= 1 and c["internal"]["packages_written"] >= 1
    assert seen_subs > 0 and c["exact_hits"] > 0
    assert c["hits"] == c["exact_hits"] + c["substitute_hits"]


def test_package_size_adapts_to_a_small_cache_and_an_empty_region_is_warned(caplog):
    """The paper's 1 MB package would take a 2k-sample cache whole; the default size is a
    quarter of the L-cache's share, so the H-cache keeps its 90%."""
    sizes = np.full(2000, 500)  # 1 MB of samples, a 20% cache of 200 kB
    p = make_policy("icache", 200_000, sizes=sizes)
    assert p.package_bytes == pytest.approx(5_000, abs=1) and p.h_capacity >= 0.85 * 200_000
    with caplog.at_level("WARNING", logger="hotset.policy.icache"):
        big = make_policy("icache", 200_000, sizes=sizes, package_bytes=1 << 20)
    assert big.h_capacity == 0 and "H-cache is empty" in caplog.text


@given(
    seed=st.integers(0, 10_000),
    n=st.integers(20, 400),
    l_count=st.integers(1, 400),
    cached=st.floats(0.0, 0.9),
)
@settings(max_examples=60, deadline=None)
def test_a_package_takes_uncached_l_samples_up_to_its_size_without_a_scan(seed, n, l_count, cached):
    """Packages walk an order of the L-samples drawn once per H-list (issue 12: no scan
    of all ids per package), yet when L-samples are rare or nearly all cached the walk
    still finds every one that is left."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 50, n)
    pol = make_policy("icache", int(sizes.sum()), sizes=sizes, seed=seed, h_share=0.5)
    hot = np.ones(n, bool)
    hot[rng.choice(n, min(l_count, n), replace=False)] = False
    pol.apply_hints({"hot": hot, "importance": rng.random(n)})
    l_ids = np.flatnonzero(~hot)
    resident = l_ids[: int(cached * l_ids.size)]
    pol._where[resident] = icache_module.FRESH  # unused L residents
    pol._l.append(resident, pol._where)
    resident = set(resident.tolist())
    pkg = pol.l_next_package().tolist()
    assert len(set(pkg)) == len(pkg) and not set(pkg) & resident
    assert all(not hot[i] for i in pkg)
    got = int(sizes[pkg].sum())
    left = [int(i) for i in l_ids if int(i) not in resident]
    assert got <= pol.l_capacity
    if got < min(pol.package_bytes, pol.l_capacity):  # short: nothing else would fit
        assert all(got + sizes[i] > pol.l_capacity for i in left if i not in pkg)


@pytest.mark.parametrize("block", [1, 2, 4096])
def test_the_l_samples_pool_is_each_once_in_a_uniform_order_then_walked_again(
    monkeypatch, block
):
    """The pool drawn block by block as packages take it: each L-sample once in the
    first walk, the same order in the second, and all 24 orders of 4 equally often,
    blocks of 1 and 2 (across block ends) as of 4096."""
    monkeypatch.setattr(packages_module, "POOL_BLOCK", block)
    hot = np.array([True, False, True, False, False, False])
    counts: dict[tuple, int] = {}
    trials = 4800
    for seed in range(trials):
        p = make_policy("icache", 100, num_samples=6, seed=seed)
        p.apply_hints(hints(hot, np.arange(6) / 6))
        walk = list(p._pool_ids())
        assert sorted(walk[:4]) == [1, 3, 4, 5] and walk[4:] == walk[:4]
        counts[tuple(walk[:4])] = counts.get(tuple(walk[:4]), 0) + 1
    assert len(counts) == 24
    c = np.array(list(counts.values()))
    assert float(((c - trials / 24) ** 2 / (trials / 24)).sum()) < 49.7  # 23 dof, p = 0.001


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("use"), st.lists(st.integers(0, 19), unique=True, max_size=6)),
            st.tuples(st.sampled_from(["evict", "load"]), st.sets(st.integers(0, 19), max_size=4)),
            st.tuples(st.just("clear")),
        ),
        max_size=60,
    )
)
def test_the_use_order_walks_the_used_longest_used_first(ops):
    """``UseOrder`` (the used L residents' order, an array with dead entries) walked
    from its head lists what an ordered dict moving each use to its end holds: an id
    used again counts at its last use, one evicted or loaded again (unused) is not
    listed, and compaction (a small array, grown) keeps the order."""
    where = np.zeros(20, np.int8)
    order, ref = icache_module.UseOrder(20, np.int32), {}
    for op in ops:
        if op[0] == "use":
            ids = np.array(op[1], np.int64)
            where[ids] = icache_module.USED
            order.append(ids, where)
            for i in op[1]:
                ref.pop(i, None)
                ref[i] = None
        elif op[0] == "clear":
            where[where == icache_module.USED] = icache_module.FRESH
            order.clear()
            ref.clear()
        else:  # evicted, or loaded again and not used yet
            for i in op[1]:
                where[i] = icache_module.NONE if op[0] == "evict" else icache_module.FRESH
                ref.pop(i, None)
        at = np.arange(order.head, order.end)
        ids = order.ids[order.head : order.end]
        assert ids[order.live(ids, at, where)].tolist() == list(ref)


@settings(max_examples=40, deadline=None)
@given(*SMALL_CACHES, st.integers(1, 30))
def test_the_l_cache_evicts_the_used_longest_used_first_then_the_unused_first_loaded(
    seed, cap, pkg, h_frac, need
):
    """Driven at random (pins held by some batches), the L-cache's room is made by
    removing unpinned residents in one order, as a walk one by one would: the used
    ones, the longest-used first, then the unused, the first loaded first."""
    import copy

    n, rng, kw = _small_cache(seed, pkg)
    p = make_policy("icache", cap, **kw)
    feeder = p.make_feeder(lock=None)
    for _ in range(3):
        p.apply_hints(hints(rng.random(n) < h_frac, rng.random(n)))
        feeder.epoch_started()
        for _ in range(5):
            r = p.access(rng.integers(0, n, 16))
            pins = r.served[rng.random(r.served.size) < 0.3]
            p.pin(pins)
            walk = p._l_used.in_order(p._where).tolist()
            walk += [i for i in p.l_residents().tolist() if p._where[i] == icache_module.FRESH]
            want, room, expected = copy.deepcopy(p), p.l_capacity - p.l_used, []
            for i in walk:
                if room >= need:
                    break
                if not p.pinned[i]:
                    expected.append(i)
                    room += int(kw["sizes"][i])
            assert want._free_l(need) == expected
            assert want.l_used == p.l_used - int(kw["sizes"][expected].sum())
            p.pin(pins, -1)
            feeder.poll()


def test_substitutes_are_drawn_uniformly_from_those_left_as_more_arrive():
    """``RandomPool``: a draw, more ids added, a second draw: each of the 3 x 12
    outcomes (the first id, then an ordered pair of the 4 left) equally often."""
    counts: dict[tuple, int] = {}
    trials = 7200
    for seed in range(trials):
        rng = np.random.default_rng(seed)
        pool = icache_module.RandomPool(np.arange(3), np.int32)
        first = pool.take(1, rng).tolist()
        pool.add([3, 4])
        second = pool.take(2, rng).tolist()
        assert len(pool) == 2 and not set(first) & set(second)
        counts[tuple(first + second)] = counts.get(tuple(first + second), 0) + 1
    assert len(counts) == 36
    c = np.array(list(counts.values()))
    assert float(((c - trials / 36) ** 2 / (trials / 36)).sum()) < 66.6  # 35 dof, p = 0.001


def test_two_pools_with_the_same_ids_left_save_the_same_bytes():
    """A pool's state is the ids left, not those taken before nor the memory beyond them
    (a grown pool's tail was ``np.empty``: the ranks of one job compared their planners'
    states and differed by it, now and then); saved and loaded, it draws as before."""
    pool = icache_module.RandomPool(np.arange(10), np.int64)
    pool.take(4, np.random.default_rng(0))
    pool.add(list(range(10, 200)))  # grows
    left = pool.ids[pool.start : pool.end].copy()
    assert pickle.dumps(pool) == pickle.dumps(icache_module.RandomPool(left, np.int64))
    drawn = pool.take(7, np.random.default_rng(1)).tolist()
    same = icache_module.RandomPool(left, np.int64)
    assert drawn == same.take(7, np.random.default_rng(1)).tolist()
    copies = [copy.deepcopy(pool), from_safe(to_safe(pool))]
    then = pool.take(9, np.random.default_rng(2)).tolist()
    for saved in copies:
        assert len(saved) == 189 and saved.take(9, np.random.default_rng(2)).tolist() == then


def test_substitutes_are_distinct_where_an_id_sits_twice_among_the_unused():
    """An L resident loaded, evicted and loaded again in one epoch is twice in the pool of
    unused ones: the substitutes drawn hold it once."""
    p = make_policy("icache", 400, sizes=np.full(40, 10), h_share=0.5)
    p.apply_hints(hints(np.zeros(40, bool), np.zeros(40)))
    ids = np.arange(8)
    p._where[ids] = icache_module.FRESH
    p._fresh.add(np.concatenate([ids, ids[::-1]]))
    assert sorted(p._take_fresh(16).tolist()) == ids.tolist()


def _l_cache_driven(seed: int):
    """A small cache (``_small_cache``, packages of 3 bytes) with half of it the L-cache,
    its packages loaded by the simulator's feeder over three batches: (n, the generator,
    the options, the policy, its feeder)."""
    n, rng, kw = _small_cache(seed, 3)
    p = make_policy("icache", 60, h_share=0.5, **kw)
    feeder = p.make_feeder(lock=None)
    p.apply_hints(hints(rng.random(n) < 0.5, rng.random(n)))
    feeder.epoch_started()
    for _ in range(3):
        p.access(rng.integers(0, n, 16))
        feeder.poll()
    return n, rng, kw, p, feeder


def test_a_saved_load_order_s_cursor_is_not_trusted():
    """The load order's ``fresh`` (where the walk for unused residents starts: hotset's
    shortcut) comes back from a saved state at the order's head, whatever was saved: a
    state whose cursor was moved past unused residents decides as the policy it was
    saved from."""
    import pickle

    n, rng, kw, p, feeder = _l_cache_driven(7)
    state = pickle.loads(pickle.dumps(p.state_dict()))
    state["_l"].fresh = state["_l"].end  # crafted: every unused resident skipped
    q = make_policy("icache", 60, h_share=0.5, **kw)
    q.load_state_dict(pickle.loads(pickle.dumps(state)))
    assert q._l.fresh == q._l.head
    feeders = (feeder, q.make_feeder(lock=None))
    for _ in range(30):
        ids = rng.integers(0, n, 16)
        a, b = p.access(ids), q.access(ids)
        assert a.served.tolist() == b.served.tolist() and a.hits.tolist() == b.hits.tolist()
        for f in feeders:
            f.poll()
        assert p.l_residents().tolist() == q.l_residents().tolist()


def test_an_icache_state_saved_with_dicts_loads_and_a_crafted_one_is_refused():
    """A state saved before the L-cache's places were arrays (``_l``: id -> used, the
    used order an ``OrderedDict``, the unused a list, the served a set) loads as the
    same residents, marks and orders; one naming an id beyond the dataset gets a
    ``ConfigError``, not a crash at the next batch."""
    from collections import OrderedDict

    n, rng, kw, p, feeder = _l_cache_driven(5)
    order = p._l_used.in_order(p._where).tolist()
    assert order, "the drive used some L residents"
    fresh = p._fresh.ids[p._fresh.start : p._fresh.end].tolist()
    old = p.state_dict()
    for name in ("_where", "_pick_rng"):
        del old[name]
    old.update(
        _h=dict.fromkeys(p.h_residents().tolist()),
        _l={i: bool(p._where[i] == icache_module.USED) for i in p.l_residents().tolist()},
        _l_used=OrderedDict.fromkeys(order), _fresh=fresh,
        _served=set(np.flatnonzero(p._served).tolist()), _due=set(),
    )  # fmt: skip
    q = make_policy("icache", 60, h_share=0.5, **kw)
    q.load_state_dict(old)
    assert q._where.tolist() == p._where.tolist() and q._served.tolist() == p._served.tolist()
    loaded = p.l_residents().tolist()
    assert q.l_residents().tolist() == loaded and len(q._l) == len(loaded)
    assert q.h_residents().tolist() == p.h_residents().tolist()
    assert q._l_used.in_order(q._where).tolist() == order
    assert q._fresh.ids[q._fresh.start : q._fresh.end].tolist() == fresh
    r = q.access(rng.integers(0, n, 16))  # and it plans on
    assert r.served.size == 16 and q.used <= q.capacity_bytes
    with pytest.raises(ConfigError, match="_l holds ids not below 80"):
        make_policy("icache", 60, h_share=0.5, **kw).load_state_dict({**old, "_l": {999: False}})
    crafted, before = {**p.state_dict(), "_served": {1, 2}}, q.state_dict()
    with pytest.raises(ConfigError, match="_served is not 80 bool"):
        q.load_state_dict(crafted)
    assert q._served.tolist() == before["_served"].tolist()  # refused before it was taken
    # saved when the places were arrays and the L residents still a dict, in load order
    r = make_policy("icache", 60, h_share=0.5, **kw)
    r.load_state_dict({**p.state_dict(), "_l": dict.fromkeys(loaded)})
    assert r.l_residents().tolist() == loaded and len(r) == len(p)
    elsewhere = next(i for i in range(n) if i not in loaded)  # not an L resident
    for bad, why in (({**p.state_dict(), "_l": dict.fromkeys(loaded[1:])}, "does not count"),
                     ({**p.state_dict(), "_l": dict.fromkeys([*loaded, elsewhere])}, "once each"),
                     ({**p.state_dict(), "_evict_next": [999]}, "_evict_next holds ids not"),
                     ({**p.state_dict(), "_evict_bulk": [np.array([999])]}, "_evict_bulk holds"),
                     ({**p.state_dict(), "_evict_bulk": [np.array([1.5])]}, "not arrays of ids"),
                     ({**p.state_dict(), "in_flight_ids": -1}, "in_flight_ids is not a count")):
        with pytest.raises(ConfigError, match=why):
            q.load_state_dict(bad)


def _epoch_of_plans(planner: Planner, ahead: int) -> int:
    """An epoch's plans, each consumed ``ahead`` plans after it was taken (a DataLoader's
    prefetch); returns the hits."""
    taken, hits = deque(), 0
    for plan in planner:
        hits += int(plan.hits.sum())
        taken.append(plan)
        if len(taken) > ahead:
            planner.batch_consumed(PlanReport(stored=taken.popleft().admitted))
    while taken:
        planner.batch_consumed(PlanReport(stored=taken.popleft().admitted))
    return hits


def _first_epoch_with_an_h_list(ahead: int, **options) -> tuple[Planner, int]:
    """A 10% cache over 4,000 samples of 100 B (the paper's split: 40 L items), batches
    of 32 taken ``ahead`` plans ahead: the planner after its first epoch with an H-list
    (the most important tenth), and that epoch's hits."""
    n = 4000
    policy = make_policy("icache", 40_000, sizes=np.full(n, 100), seed=0, **options)
    planner = Planner(make_sampler("uniform", n, seed=0), policy, 32,
                      store=make_store("memory", 1))  # fmt: skip
    planner.set_epoch(0)
    _epoch_of_plans(planner, ahead)
    importance = np.random.default_rng(0).random(n)
    policy.apply_hints(hints(importance >= np.quantile(importance, 0.9), importance))
    planner.set_epoch(1)
    return planner, _epoch_of_plans(planner, ahead)


def test_the_l_cache_holds_its_share_beside_what_the_plans_in_flight_hold():
    """With a DataLoader's plans in flight, the L-hits and substitutes they serve stay
    pinned: where the paper's L-cache (a tenth of the cache) is smaller than they are,
    each package's room is made of unused residents, evicted unread. The planner counts
    the ids in flight and the L-cache keeps its first share beside their L-samples: the
    hits and the packages of no plan in flight (hotset's ``l_in_flight``; off: the
    paper's split, which loses the hits)."""
    alone, hits_alone = _first_epoch_with_an_h_list(0)
    assert alone.policy.in_flight_ids == 0 and alone.policy.l_capacity == 4_000
    planner, hits = _first_epoch_with_an_h_list(4)
    policy = planner.policy
    assert policy.in_flight_ids == 4 * 32  # four plans beside the one being planned
    held = int(4 * 32 * 0.9 * 100)  # their L-samples' expected bytes
    assert policy.l_capacity == 4_000 + held and policy.h_capacity == 40_000 - 4_000 - held
    assert hits >= 0.95 * hits_alone
    assert planner.feeder.packages_loaded <= 1.1 * alone.feeder.packages_loaded
    paper, hits_paper = _first_epoch_with_an_h_list(4, l_in_flight=False)
    assert paper.policy.l_capacity == 4_000 and hits_paper < 0.8 * hits_alone


def test_the_l_cache_s_floor_follows_the_sizes_it_was_given_last():
    """The floor beside the plans in flight counts their L-samples at the sizes' mean,
    found once (not at each H-list: 17 ms at 14M ids) and again where the sizes change
    (``set_sizes``) or a state is loaded (its sizes, not a saved mean)."""
    n = 1_000
    p = make_policy("icache", 40_000, sizes=np.full(n, 100), seed=0)
    p.in_flight_ids = 40
    hot = np.arange(n) < n // 2  # half of them L-samples
    p.apply_hints(hints(hot, np.linspace(0, 1, n)))
    assert p.l_capacity == 4_000 + 40 * 50
    p.set_sizes(np.arange(n), np.full(n, 150))
    p.apply_hints(hints(hot, np.linspace(0, 1, n)))
    assert p.l_capacity == 4_000 + 40 * 75
    state = {**p.state_dict(), "_mean_size": 1e9}  # crafted: not what the sizes say
    q = make_policy("icache", 40_000, sizes=np.full(n, 150), seed=0)
    q.load_state_dict(state)
    q.in_flight_ids = 40
    q.apply_hints(hints(hot, np.linspace(0, 1, n)))
    assert q.l_capacity == 4_000 + 40 * 75


def test_the_l_cache_s_floor_for_plans_in_flight_fits_half_the_cache_and_yields():
    """Where the first share beside the plans in flight would take more than half the
    cache, the paper's split stands (the batches in flight are too large for the cache:
    the L-cache cannot hold them and serve, and a halved H-cache would lose more); and
    a larger III-A split stands over the floor."""
    n = 4000
    p = make_policy("icache", 40_000, sizes=np.full(n, 100), seed=0)
    hot = np.arange(n) < 400
    p.in_flight_ids = 177  # 159.3 L-samples of 100 B beside the first share's 4,000 B
    p.apply_hints(hints(hot, hot.astype(float)))
    assert p.l_capacity == 4_000 + 15_930 and p._fresh_wanted() == 20
    p.in_flight_ids = 178  # one more: over half the cache
    p.apply_hints(hints(hot, hot.astype(float)))
    assert p.l_capacity == 4_000 and p.h_capacity == 36_000 and p._fresh_wanted() == 20
    p.in_flight_ids = 64
    p.freq_h, p.freq_l = 1, 3  # III-A: a quarter of the accesses were the H-list's
    p.apply_hints(hints(hot, hot.astype(float)))
    assert p.l_capacity == 30_000
    with pytest.raises(ConfigError, match="l_in_flight must be True or False, got 'False'"):
        make_policy("icache", 40_000, sizes=np.full(n, 100), l_in_flight="False")


def test_a_loader_with_two_workers_serves_its_first_h_list_epoch_from_the_cache(fmnist_dir):
    """What the user gets from a real loader (two DataLoader workers, four plans in
    flight, PNG bytes from storage): every sample with its own label, and in the first
    epoch with an H-list the hits of an L-cache sized beside the plans in flight, where
    the paper's split (``l_in_flight=False``) serves a third fewer from the cache."""
    storage = FileStorage(str(fmnist_dir / "train"))
    hits = {}
    for sized in (True, False):
        loader = make_loader(
            storage, batch_size=20, system="icache", cache_fraction=0.3, num_workers=2,
            policy_options={"package_threads": False, "l_in_flight": sized},
        )  # fmt: skip
        try:
            for epoch in range(2):
                loader.set_epoch(epoch)
                before, served = loader.counters()["hits"], 0
                for _, y, ids in loader:
                    assert np.array_equal(y.numpy(), storage.labels[ids.numpy()])
                    served += len(ids)
                    loader.feedback(ids, torch.rand(len(ids)))
            hits[sized] = (loader.counters()["hits"] - before) / served
        finally:
            loader.close()
    assert hits[True] >= 0.6 and hits[False] <= 0.8 * hits[True], hits


def _icache_run(fmnist_dir, epochs: int, **policy_options) -> list[list[int]]:
    """The ids served per batch by iCACHE over ``epochs`` epochs, losses a function of the
    id (so the feedback is the same in every run)."""
    from hotset import make_loader

    loader = make_loader(str(fmnist_dir / "train"), batch_size=50, system="icache",
                         cache_fraction=0.2, num_workers=0, store="memory", seed=3,
                         policy_options={"package_bytes": 8_000, **policy_options})  # fmt: skip
    served = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for _, _, ids in loader:
            served.append(ids.tolist())
            loader.feedback(ids, (ids.float() * 0.618) % 1.0)
    loader.close()
    return served


def test_icache_serves_the_same_sequence_twice_without_package_threads(fmnist_dir):
    """With ``package_threads=False`` (packages made and loaded in the planner's thread,
    as under ranks) a plan is a function of the seed, the data and the feedback: two runs
    serve the same ids in the same order, substitutes included (the default packages in
    background threads, so which substitutes a plan serves depends on when one lands)."""
    first = _icache_run(fmnist_dir, 4, package_threads=False)
    assert _icache_run(fmnist_dir, 4, package_threads=False) == first
    assert len(first) < 4 * 1000 // 50  # IIS trained a subset after its warm-up
