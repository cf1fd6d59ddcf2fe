"""SHADE: rank importance, feedback attribution, PADS, APP (Algorithm 1)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from hotset import (
    ConfigError,
    FileStorage,
    ScoreBoard,
    coarse_importance,
    make_loader,
    make_policy,
    make_sampler,
    per_sample_loss,
    rank_importance,
)
from hotset.plan import Planner
from hotset.policy import priority_kernel


def test_rank_formula_on_the_papers_example():
    """B1 = <0.3, 0.5, 0.4>: sample 5 (0.5) beats two others, 6 (0.4) one, 4 none."""
    assert rank_importance(np.array([0.3, 0.5, 0.4]), b0=10) == pytest.approx(np.log([10, 12, 11]))
    assert rank_importance(np.array([0.6, 1.2, 0.8]), b0=10) == pytest.approx(
        np.log([10, 12, 11])  # B2 ranks the same: scores share one range across batches
    )
    assert rank_importance(np.array([0.2, 0.2, 0.1]), b0=1) == pytest.approx(np.log([2, 2, 1]))
    assert coarse_importance(np.array([0.3, 0.5, 0.4])) == pytest.approx([0.4] * 3)


def test_per_sample_loss_matches_mean_loss():
    logits, y = torch.randn(8, 10), torch.randint(0, 10, (8,))
    losses = per_sample_loss(logits, y)
    assert losses.shape == (8,)
    assert losses.mean() == pytest.approx(torch.nn.functional.cross_entropy(logits, y).item())


@pytest.mark.parametrize("served_order", [[0, 1, 2, 3, 4, 5], [5, 3, 1, 0, 4, 2]])
def test_raising_chosen_losses_raises_exactly_their_probabilities(served_order):
    s = make_sampler("shade", 20)
    ids = np.array([3, 7, 11, 12, 15, 19])[served_order]
    base = {3: 0.5, 7: 0.4, 11: 0.3, 12: 0.2, 15: 0.1, 19: 0.05}
    s.feedback(ids, np.array([base[i] for i in ids.tolist()]))
    before = s.probabilities()
    chosen = {12, 15}
    raised = {i: (v + 10 if i in chosen else v) for i, v in base.items()}
    s.feedback(ids, np.array([raised[i] for i in ids.tolist()]))
    after = s.probabilities()
    for i in range(20):
        if i in chosen:
            assert after[i] > before[i], i
        else:
            assert after[i] <= before[i] + 1e-15, i


def shade_loader(storage):
    """SHADE (PADS + APP) at a 20% shared cache, two DataLoader workers."""
    return make_loader(
        storage,
        batch_size=32,
        sampler="shade",
        policy="app",
        cache_fraction=0.2,
        store="shared",
        num_workers=2,
    )


def test_feedback_reaches_the_samples_served_by_workers(fmnist_dir):
    """Through real DataLoader workers: the loss handed back for each served id lands on
    that id's score-board entry, whatever order the batches arrived in."""
    storage = FileStorage(str(fmnist_dir / "train"))
    loader = shade_loader(storage)
    try:
        for epoch in range(2):
            loader.set_epoch(epoch)
            for _x, y, ids in loader:
                assert torch.equal(y, torch.as_tensor(storage.labels[ids.numpy()]))
                loader.feedback(ids, ids.double() / 1000.0)  # a loss that names its sample
        board = loader.planner.sampler.board
        seen = np.flatnonzero(board.seen)
        assert seen.size > 0.5 * len(storage)
        assert board.loss[seen] == pytest.approx(seen / 1000.0)
    finally:
        loader.dataset.store.close(destroy=True)


def test_pads_marginals_match_the_weights():
    n = 12
    s = make_sampler("shade", n, repetition=3.0, steep_drop=10.0, coverage_epochs=None)
    s.feedback(np.arange(n), np.linspace(0.1, 2.0, n))  # ranks 0..11
    s.set_cached(np.array([0, 5]))  # cached samples are repeated
    p = s.probabilities()
    assert p[0] / p[1] == pytest.approx(3 * np.log(10) / np.log(11))
    counts, hits = np.zeros(n), []
    for epoch in range(1, 401):
        order = s.global_order(epoch)
        counts += np.bincount(order, minlength=n)
        held = np.isin(order, [0, 5])
        hits.append(int(held.sum()))
        assert not np.any(held[hits[-1] :])  # the default order: the hits first
    assert chisquare(counts, p * counts.sum()).pvalue > 0.001
    # drawn part by part, the hits of an epoch are Binomial(n, P(cached)) as when one
    # draw of n is partitioned: mean and variance within 5 standard errors
    q = p[[0, 5]].sum()
    assert abs(np.mean(hits) - n * q) < 5 * np.sqrt(n * q * (1 - q) / len(hits))
    assert np.var(hits) == pytest.approx(n * q * (1 - q), rel=0.35)


def test_pads_epoch_zero_is_a_permutation_and_ranks_share_one_list():
    a = make_sampler("shade", 50, num_replicas=2, rank=0, seed=4)
    b = make_sampler("shade", 50, num_replicas=2, rank=1, seed=4)
    assert sorted(np.concatenate([a.epoch_order(0), b.epoch_order(0)]).tolist()) == list(range(50))
    for s in (a, b):  # the same feedback on both ranks: the same global list
        s.feedback(np.arange(50), np.arange(50) / 50.0)
    glob = a.global_order(1)
    assert np.array_equal(glob, b.global_order(1))
    assert np.array_equal(a.epoch_order(1), glob[0::2])
    assert np.array_equal(b.epoch_order(1), glob[1::2])
    assert len(a) == len(a.epoch_order(1)) == 25


def test_bias_guard_reshuffles_after_a_steep_loss_drop_or_stagnant_accuracy():
    s = make_sampler("shade", 30, steep_drop=0.5, stagnation=0.01, patience=2)
    for epoch, loss in ((0, 2.0), (1, 0.5)):  # loss fell by 75%
        s.set_epoch(epoch)
        s.feedback(np.arange(30), np.full(30, loss) + np.arange(30) / 100)
    order = s.global_order(2)
    assert s.guard_epochs == [2] and sorted(order.tolist()) == list(range(30))
    s2 = make_sampler("shade", 30, steep_drop=10.0, stagnation=0.01, patience=2)
    s2.feedback(np.arange(30), np.arange(30) / 30)
    for acc in (0.80, 0.805, 0.806):
        s2.report_accuracy(acc)
    s2.global_order(3)
    assert s2.guard_epochs == [3]


def trace(policy, ids):
    return [bool(h) for h in policy.access(ids).hits]


def test_app_follows_algorithm_1():
    board = ScoreBoard(6)
    app = make_policy("app", 2, num_samples=6)
    app.attach_scores(board)
    board.update(np.array([0, 1]), np.array([5.0, 3.0]), np.zeros(2))
    assert trace(app, [0, 1]) == [False, False]  # lines 9-10: room, admit
    assert set(app.cached_ids().tolist()) == {0, 1}
    r = app.access([2])  # full, 2 never scored: lines 21-22, skip
    assert r.admitted.size == 0 and r.evicted.size == 0
    board.update(np.array([2, 3]), np.array([4.0, 1.0]), np.zeros(2))
    r = app.access([2])  # 4.0 >= min 3.0 (sample 1): evict the minimum, admit
    assert r.evicted.tolist() == [1] and r.admitted.tolist() == [2]
    r = app.access([3])  # 1.0 < min 4.0: read from storage, skip caching (line 20)
    assert r.admitted.size == 0 and set(app.cached_ids().tolist()) == {0, 2}
    board.update(np.array([0]), np.array([0.5]), np.zeros(1))  # 0 lost its importance
    app.scores_updated(np.array([0]))
    assert app.min_score() == 0.5
    r = app.access([3])  # now 1.0 >= 0.5: the adaptive update made room for 3
    assert r.evicted.tolist() == [0] and r.admitted.tolist() == [3]
    assert trace(app, [2, 3]) == [True, True]


V = [0.0] * 9  # the rest of an op's scores


@settings(max_examples=80, deadline=None)
@given(
    st.sampled_from([("pq", None), ("app", None), ("app", 0.5)]),
    st.lists(
        st.tuples(
            st.sampled_from(["access", "access", "scores", "pin", "unpin", "save"]),
            st.lists(st.integers(0, 11), min_size=1, max_size=10),
            st.lists(st.sampled_from([0.0, 1.0, 2.0, 3.0]), min_size=12, max_size=12),
        ),
        min_size=1,
        max_size=24,
    ),
    st.lists(st.integers(1, 4), min_size=12, max_size=12),
    st.integers(0, 16),
)
@example(  # 0, a resident when the batch starts, is evicted by 2 before its turn: a miss
    ("pq", None), [("scores", [0, 1, 2], [1.0, 2.0, 3.0, *V]), ("access", [0, 1], [0.0] * 12),
                   ("access", [2, 0], [0.0] * 12)], [1] * 12, 2,
)  # fmt: skip
@example(  # 0 is pinned and passed by 2's admission (1 goes), then a state is saved
    ("pq", None), [("scores", [0, 1, 2], [1.0, 2.0, 3.0, *V]), ("access", [0, 1], [0.0] * 12),
                   ("pin", [0], [0.0] * 12), ("access", [2], [0.0] * 12),
                   ("save", [0], [0.0] * 12), ("unpin", [0], [0.0] * 12),
                   ("access", [3], [0.0] * 12)], [1] * 12, 2,
)  # fmt: skip
@example(  # 0 is pinned and passed by 2's admission (1 goes), released: it goes for 3
    ("pq", None), [("scores", [0, 1, 2, 3], [1.0, 2.0, 3.0, 3.0, *V[:8]]),
                   ("access", [0, 1], [0.0] * 12), ("pin", [0], [0.0] * 12),
                   ("access", [2], [0.0] * 12), ("unpin", [0], [0.0] * 12),
                   ("scores", [3], [4.0, *V, 0.0, 0.0]), ("access", [3], [0.0] * 12)],
    [1] * 12, 2,
)  # fmt: skip
@example(  # 0 is pinned: 1, the next lowest, goes for 2
    ("pq", None), [("scores", [0, 1, 2], [1.0, 2.0, 3.0, *V]), ("access", [0, 1], [0.0] * 12),
                   ("pin", [0], [0.0] * 12), ("access", [2], [0.0] * 12)], [1] * 12, 2,
)  # fmt: skip
@example(  # 0 is evicted by 2, admitted again at its turn, evicted by 3: its last
    # position is a miss once (0 admitted there), not a miss and then a hit
    ("pq", None), [("scores", [0, 1, 2, 3], [0.0, 1.0, 2.0, 3.0, *V[:8]]),
                   ("access", [0, 1], [0.0] * 12), ("access", [2, 0, 3, 0], [0.0] * 12)],
    [1, 2, 2, 2] + [1] * 8, 3,
)  # fmt: skip
@example(  # as above, 7's first eviction the one where it alone makes room (for 2)
    ("pq", None), [("access", [10, 7, 11], [0.0] * 12),
                   ("scores", [8, 2, 4], [3.0, 3.0, 2.0, *V]),
                   ("access", [2, 4, 7, 8, 7], [0.0] * 12)],
    [1, 1, 1, 1, 3, 1, 1, 1, 3, 1, 2, 3], 6,
)  # fmt: skip
def test_pq_and_app_inlined_loop_decide_as_their_steps_do(policy, ops, sizes, capacity):
    """SHADE's cache (APP) and the priority queue decide in one loop over the batch's
    misses (the residents at its start are hits at once; while the cache fills, all its
    misses are admitted at once): against the base loop driven by their steps
    (``_victim``, ``_level``), the same hits, admissions, evictions, bytes, residents and
    order of leaving, with repeats in a batch, residents evicted before their turn in it,
    scores raised and lowered, ties, pins held and released, states saved meanwhile. The
    loop compiled (numba, the default) and in Python leave the same heap, entry for
    entry."""
    from hotset.policy.base import Policy

    name, ghost = policy
    board = ScoreBoard(12)
    options = {"ghost_epochs": ghost} if ghost else {}
    fast, slow, python = (make_policy(name, capacity, sizes=np.asarray(sizes), **options)
                          for _ in range(3))  # fmt: skip
    slow._access = Policy._access.__get__(slow)  # the generic loop calling the steps
    python.compiled = False
    assert priority_kernel.load()  # (numba is a dependency)
    for p in (fast, slow, python):
        p.attach_scores(board)
    held: list[list[int]] = []
    for op, ids, values in ops:
        if op == "scores":
            board.update(np.asarray(ids), np.asarray(values[: len(ids)]), np.zeros(len(ids)))
            for p in (fast, slow, python):
                p.scores_updated(np.asarray(ids))
        elif op == "pin":
            for p in (fast, slow, python):
                p.pin(ids)
            held.append(ids)
        elif op == "unpin" and held:
            for p in (fast, slow, python):
                p.pin(held[0], -1)
            held.pop(0)
        elif op == "save":  # a saved state holds every resident, pinned ones too
            saved = make_policy(name, capacity, sizes=np.asarray(sizes), **options)
            order = leaving_order(fast)
            saved.load_state_dict(fast.state_dict())
            assert leaving_order(saved) == order == leaving_order(fast)
        elif op == "access":
            a, b, c = fast.access(ids), slow.access(ids), python.access(ids)
            assert a.hits.tolist() == b.hits.tolist() == c.hits.tolist()
            assert a.admitted.tolist() == b.admitted.tolist() == c.admitted.tolist()
            assert a.evicted.tolist() == b.evicted.tolist() == c.evicted.tolist()
            assert not fast.pinned[a.evicted].any()  # a plan in flight keeps its ids
            assert entries(fast._heap) == entries(python._heap)
            assert fast._heap._parked == python._heap._parked
        assert fast.used == slow.used == python.used <= capacity
        assert fast.cached_ids().tolist() == slow.cached_ids().tolist()
        assert leaving_order(fast) == leaving_order(slow)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["pq", "app"]), st.integers(0, 2**32 - 1), st.integers(20, 400),
       st.floats(0.03, 0.5), st.integers(1, 96))  # fmt: skip
def test_the_compiled_loop_decides_and_leaves_the_heap_as_python_s(name, seed, n, share, b):
    """A full cache of many residents (the regime the compiled loop is for, which the
    test above reaches with a few): batches with repeats, scores that tie, pins held for
    a batch and released, sizes that vary; the compiled loop, the Python loop and the
    base loop's steps decide alike, and the compiled heap's entries are the Python
    heap's, entry for entry, after every batch."""
    from hotset.policy.base import Policy

    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 5, n)
    capacity = max(4, int(share * sizes.sum()))
    board = ScoreBoard(n)
    fast, python, slow = (make_policy(name, capacity, sizes=sizes) for _ in range(3))
    slow._access = Policy._access.__get__(slow)
    python.compiled = False
    assert priority_kernel.load()
    for p in (fast, python, slow):
        p.attach_scores(board)
    pinned = np.zeros(0, np.int64)
    for _ in range(10):
        scored = rng.choice(n, n // 3, replace=False)
        board.update(scored, rng.choice([0.0, 0.5, 1.0, 2.0, 3.0], scored.size),
                     np.zeros(scored.size))  # fmt: skip
        batch = rng.integers(0, n, b)
        results = []
        for p in (fast, python, slow):
            p.scores_updated(scored)
            results.append(p.access(batch))
            p.pin(pinned, -1)
            p.pin(batch[: b // 2])
        pinned = batch[: b // 2]
        a, c, d = results
        for field in ("hits", "admitted", "evicted"):
            assert (getattr(a, field).tolist() == getattr(c, field).tolist()
                    == getattr(d, field).tolist()), field  # fmt: skip
        assert entries(fast._heap) == entries(python._heap)
        assert fast._heap._parked == python._heap._parked
        assert fast.used == python.used == slow.used <= capacity
    assert fast._heap._list is None  # (its entries stayed in the array)


@pytest.mark.parametrize("name", ["app", "refcnt"])
def test_a_state_saved_with_the_python_heap_loads_into_the_compiled_one(name):
    """A SHADE (or RefCnt) cache's state saved before its heap was compiled (a
    ``KeyedHeap``) loads as a ``CompiledHeap`` with the same entries, and decides as the
    policy it was saved from."""
    from hotset.policy.compiled_heap import CompiledHeap
    from hotset.policy.keyed_heap import KeyedHeap

    board = ScoreBoard(200)
    board.update(np.arange(200), np.random.default_rng(0).random(200), np.zeros(200))
    made = []
    for _ in range(3):
        p = make_policy(name, 60, sizes=np.ones(200, np.int64))
        if name == "refcnt":  # two jobs' reads of every id to come
            p.add_references(np.arange(200), 2)
        else:
            p.attach_scores(board)
        made.append(p)
    old, new, same = made
    old.access(np.arange(100))
    state = old.state_dict()
    heap = KeyedHeap.__new__(KeyedHeap)  # the state as an older hotset saved it
    heap.__setstate__(state["_heap"].__getstate__())
    new.load_state_dict({**state, "_heap": heap})
    same.load_state_dict(state)
    assert type(new._heap) is CompiledHeap and entries(new._heap) == entries(old._heap)
    batch = np.random.default_rng(1).permutation(200)[:80]
    a, b = new.access(batch), same.access(batch)
    assert a.admitted.size and a.admitted.tolist() == b.admitted.tolist()
    assert a.evicted.tolist() == b.evicted.tolist() and leaving_order(new) == leaving_order(same)


def entries(heap) -> list[int]:
    """A heap's entries in place, from its array or its list (not turning it to a list)."""
    return heap._array[: heap._n].tolist() if heap._list is None else list(heap._list)


def leaving_order(policy) -> list[int]:
    """The residents in the order a policy's heap would evict them (a copy holds the
    pinned residents that are out of it while their plans run, too)."""
    heap = copy.deepcopy(policy._heap)
    return [heap.pop() for _ in range(len(heap))]


def test_pq_admits_unknown_by_score_and_app_does_not():
    board = ScoreBoard(4, initial=2.0)
    for name, admitted in (("pq", [2]), ("app", [])):
        p = make_policy(name, 2, num_samples=4)
        p.attach_scores(board)
        board.update(np.array([0, 1]), np.array([1.0, 3.0]), np.zeros(2))
        p.access([0, 1])
        assert p.access([2]).admitted.tolist() == admitted, name


def test_wrong_combinations_are_named():
    with pytest.raises(ConfigError, match="needs importance scores"):
        Planner(make_sampler("uniform", 10), make_policy("app", 5, num_samples=10), 4)
    with pytest.raises(ConfigError, match="future access order"):
        Planner(make_sampler("shade", 10), make_policy("belady", 5, num_samples=10), 4)
    with pytest.raises(ConfigError, match="importance"):
        make_sampler("shade", 10, importance="entropy")
    with pytest.raises(ConfigError, match="2 ids but 1 losses"):
        make_sampler("shade", 10).feedback(np.array([1, 2]), np.array([0.1]))


@pytest.mark.slow
def test_shade_trains_with_two_workers_and_caches_what_it_repeats(fmnist_dir):
    from hotset.models import TinyCNN

    loader = shade_loader(FileStorage(str(fmnist_dir / "train")))
    torch.manual_seed(0)
    model = TinyCNN()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    per_epoch = []
    try:
        for epoch in range(4):
            loader.set_epoch(epoch)
            before = loader.counters()
            for x, y, ids in loader:
                losses = per_sample_loss(model(x), y)
                opt.zero_grad()
                losses.mean().backward()
                opt.step()
                loader.feedback(ids, losses)
            c = loader.counters()
            per_epoch.append((c["hits"] - before["hits"]) / (c["accesses"] - before["accesses"]))
        store = loader.dataset.store
        assert store.used_bytes <= store.capacity_bytes
    finally:
        loader.dataset.store.close(destroy=True)
    # uniform + LRU at 20% would hit ~2%; PADS repeats what APP keeps
    assert min(per_epoch[1:]) > 0.25, per_epoch


@pytest.mark.parametrize("name", ["pq", "app"])
def test_scores_that_change_back_do_not_evict_twice(name):
    """A resident re-keyed to a new score and back has two identical live heap entries;
    one eviction must take it once (regression: KeyError / double-counted bytes)."""
    board = ScoreBoard(5)
    ghost = {"ghost_epochs": 10} if name == "app" else {}  # all 7 scores stay fresh
    p = make_policy(name, 2, num_samples=5, **ghost)
    p.attach_scores(board)
    board.update(np.arange(5), np.array([1.0, 2.0, 3.0, 3.0, 5.0]), np.zeros(5))
    p.access([0, 1])
    for v in (4.0, 1.0):  # 0: 1.0 -> 4.0 -> 1.0, pushing a second copy of its first key
        board.update(np.array([0]), np.array([v]), np.zeros(1))
        p.scores_updated(np.array([0]))
    p2 = make_policy(name, 2, sizes=np.array([1, 1, 1, 2, 1]), **ghost)
    p2.attach_scores(board)
    r = p.access([4])  # evicts 0 (min), once
    assert r.evicted.tolist() == [0] and p.used == 2 and len(p) == 2
    p2.access([0, 1])
    board.update(np.array([0]), np.array([4.0]), np.zeros(1))
    p2.scores_updated(np.array([0]))
    board.update(np.array([0]), np.array([1.0]), np.zeros(1))
    p2.scores_updated(np.array([0]))
    r = p2.access([3])  # needs both slots: 0 and 1 go, each once
    assert sorted(r.evicted.tolist()) == [0, 1] and p2.used == 2


def test_repeat_mode_fills_the_epoch_with_cached_repeats_as_the_prototype():
    """The prototype's repetition: each drawn cached id r times, the misses cut to fit;
    a 20% cached draw share becomes 60% of the epoch (weighting gives 43%)."""
    n, r = 20_000, 3
    cached = np.arange(0, n, 5)  # 20% cached, uniform scores
    shares = {}
    for mode in ("weight", "repeat"):
        smp = make_sampler("shade", n, repetition=r, repetition_mode=mode, seed=1)
        smp.feedback(np.arange(n), np.ones(n))  # equal losses: equal ranks within a batch
        smp.set_cached(cached)
        order = smp.global_order(1)
        assert order.size == n
        shares[mode] = np.isin(order, cached).mean()
    assert shares["weight"] == pytest.approx(0.6 / 1.4, abs=0.02)
    assert shares["repeat"] == pytest.approx(0.6, abs=0.02)
    with pytest.raises(ConfigError, match="repetition_mode"):
        make_sampler("shade", n, repetition_mode="twice")


@settings(max_examples=25, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=300), st.sampled_from(["weight", "repeat"]))
def test_a_mask_of_the_cached_ids_draws_the_order_their_list_draws(mask, mode):
    """What the planner hands at an epoch start (a mask of every id) draws the same epoch
    as the ids themselves (``set_cached``)."""
    mask = np.asarray(mask)
    orders = []
    for tell in ("ids", "mask"):
        smp = make_sampler("shade", mask.size, repetition_mode=mode, seed=3)
        smp.feedback(np.arange(mask.size), np.random.default_rng(0).random(mask.size))
        smp.set_cached(np.arange(mask.size)[::2])  # told before: the mask replaces it
        smp.set_cached(np.flatnonzero(mask)) if tell == "ids" else smp.set_cached_mask(mask)
        orders.append(smp.global_order(1))
    assert np.array_equal(*orders)


@pytest.mark.parametrize("r, share", [(1.5, 0.1), (3.0, 0.5)])
def test_repeat_mode_repeats_and_cuts_random_hits(r, share):
    """A fractional r gives its extra copy to random drawn hits, and copies beyond the
    epoch (r x 50% cached) are cut from random hits, not from the hits' tail: the low
    and the high half of the cached ids (equal weights) fill equal shares of the epoch."""
    n, low, high = 20_000, 0, 0
    cached = np.arange(int(share * n))
    half = cached.size // 2
    for seed in range(4):
        smp = make_sampler("shade", n, repetition=r, repetition_mode="repeat", seed=seed)
        smp.feedback(np.arange(n), np.ones(n))
        smp.set_cached(cached)
        order = smp.global_order(1)
        low += np.isin(order, cached[:half]).sum()
        high += np.isin(order, cached[half:]).sum()
    assert low == pytest.approx(high, rel=0.1)  # sd about 2%; from the hits' tail: 2x


def test_app_ghost_cache_is_every_trained_sample_unless_windowed():
    """Algorithm 1 (the default): the ghost cache holds every sample trained so far, so an
    old high score still admits (as PQ does) while a never-trained id does not; the
    window (``ghost_epochs=1``, ours) forgets a score after an epoch's worth of newer ones
    (2 ids of 10 scored early, capacity 1)."""
    n = 10
    decisions = {}
    for name, options in (("app", {}), ("app-window", {"ghost_epochs": 1}), ("pq", {})):
        board = ScoreBoard(n)
        p = make_policy(name.split("-")[0], 1, num_samples=n, **options)
        p.attach_scores(board)
        board.update(np.array([0, 1]), np.array([1.0, 9.0]), np.zeros(2))  # 1: high, early
        p.access([0])
        board.update(np.arange(2, n - 1), np.ones(n - 3), np.zeros(n - 3))  # an epoch's worth
        board.update(np.array([0]), np.array([1.0]), np.zeros(1))
        p.scores_updated(np.array([0]))
        decisions[name] = p.access([1]).admitted.tolist() + p.access([n - 1]).admitted.tolist()
    # n - 1 was never trained: out of APP's ghost cache, but PQ admits it on its prior
    assert decisions == {"app": [1], "app-window": [], "pq": [1]}
    # the board keeps when each score was given only for a window that asked (8 B per id)
    with pytest.raises(ConfigError, match="track_recent"):
        ScoreBoard(n).recent(np.arange(n), 5.0)


@pytest.mark.parametrize("system", ["shade", "spider", "icache"])
def test_the_planner_serves_the_order_as_it_is_shuffled(system):
    """The epoch's order is put in its random order as the planner reads it, not at the
    epoch's start: after the first batch only its first block is final; what the planner
    serves, batch by batch, is the order ``global_order`` gives whole afterwards; a state
    taken halfway holds that order."""
    from hotset.sampling import draw
    from hotset.systems import resolve_system

    n, batch = 12_000, 128
    sysdef = resolve_system(system)
    policy = make_policy(sysdef.policy, 1_200, num_samples=n)
    options = dict(sysdef.sampler_options)
    if system == "spider":
        options["labels"] = np.arange(n) % 10
    sampler = make_sampler(sysdef.sampler, n, seed=3, **options)
    emb = np.random.default_rng(0).normal(size=(n, 4)).astype(np.float32)
    planner = Planner(sampler, policy, batch, feed_future=False)
    for epoch in range(3):
        planner.set_epoch(epoch)
        served = []
        for k, plan in enumerate(planner):
            if k == 0:
                lazy = sampler.order_as_read(epoch)
                assert lazy._done <= draw.SHUFFLE_BLOCK < lazy.size
            if k == 5:
                saved = planner.state_dict()["order"]
            requested = plan.ids if plan.requested is None else plan.requested
            served.append(requested)
            losses = np.random.default_rng(k).random(plan.ids.size)
            planner.feedback(plan.ids, losses, emb[plan.ids])
        sampler.drain()
        order = sampler.global_order(epoch)
        assert np.array_equal(np.concatenate(served), order)
        assert np.array_equal(saved, order)


@settings(max_examples=15, deadline=None)
@given(n=st.integers(50, 3_000), held=st.floats(0.0, 1.0), seed=st.integers(0, 99))
def test_the_misses_are_drawn_in_a_thread_while_the_hits_are_read(n, held, seed):
    """docs/design.md: SHADE draws an epoch's misses in a thread while its hits are
    read: the hits are served before the misses' draw ends, the order is the one drawn
    at once, and a state taken meanwhile holds it whole."""
    import threading

    from hotset.sampling import pads

    def sampler():
        s = make_sampler("shade", n, seed=seed)
        ids = np.arange(n)
        s.feedback(ids, np.random.default_rng(seed).random(n))
        s.set_epoch(1)
        s.set_cached(ids[: int(held * n)])
        return s

    at_once = sampler()
    at_once.coverage.epochs = 10**6  # (the floor's path draws the whole list at once)
    expected = at_once.global_order(1)
    go = threading.Event()
    real = pads.draw_weighted

    def held_back(rng, p, k, out=None, **kw):
        if out is not None:  # the misses' draw: waits till the hits are read
            assert go.wait(30)
        return real(rng, p, k, out=out, **kw)

    s = sampler()
    try:
        pads.draw_weighted = held_back
        order = s.order_as_read(1)
        hits = order._fill_from
        assert 0 <= hits <= n and order._filling is not None
        if hits:
            np.testing.assert_array_equal(order.ready(hits)[:hits], expected[:hits])
        threading.Timer(0.05, go.set).start()
        state = s.state_dict()  # waits for the misses
    finally:
        pads.draw_weighted = real
        go.set()
    np.testing.assert_array_equal(order.whole(), expected)
    np.testing.assert_array_equal(state["_orders"][1].whole(), expected)
    assert not {"_buffers", "_ahead"} & set(state)  # its reused weights: not state
    assert s.weights() is not s.weights()  # (the public weights: an array of their own)


def test_a_pinned_resident_passed_over_goes_back_once_its_pins_are_released_elsewhere():
    """SpiderCache's importance cache counts its pins in the policy holding it
    (``share_pins``): a resident passed over while pinned goes back into the heap once
    that count is released, and is then the first to go."""
    board = ScoreBoard(4)
    board.update(np.arange(4), np.array([1.0, 2.0, 3.0, 4.0]), np.zeros(4))
    holder, cache = make_policy("pq", 2, num_samples=4), make_policy("pq", 2, num_samples=4)
    holder.share_pins(cache)
    cache.attach_scores(board)
    cache.access(np.array([0, 1]))
    holder.pin(np.array([0]))
    assert cache.access(np.array([2])).evicted.tolist() == [1]  # 0 is pinned: passed over
    holder.pin(np.array([0]), -1)
    assert cache.access(np.array([3])).evicted.tolist() == [0]  # released: the least goes


def test_a_score_of_its_own_is_one_registered_function(tmp_path):
    """A new importance score (a moving average of each sample's loss) is one function
    registered by name; SHADE's sampler scores with it, reading the sample's history on
    the board, and a wrong option is refused when the sampler is made."""
    from hotset.importance import SCORERS, register_scorer

    @register_scorer("test-loss-average")
    def loss_average(ids, losses, board, alpha=0.5):
        seen = board.seen[ids]
        return np.where(seen, alpha * losses + (1 - alpha) * board.score[ids], losses)

    try:
        with pytest.raises(ConfigError, match="a scorer named 'test-loss-average'"):
            register_scorer("test-loss-average")(loss_average)
        sampler = make_sampler("shade", 10, importance="test-loss-average",
                               importance_options={"alpha": 0.25})  # fmt: skip
        sampler.feedback(np.array([1, 2]), np.array([4.0, 8.0]))
        sampler.feedback(np.array([1, 3]), np.array([0.0, 2.0]))
        assert sampler.board.score[[1, 2, 3]].tolist() == [3.0, 8.0, 2.0]  # 0.25*0 + 0.75*4
        with pytest.raises(ConfigError, match="beta"):
            make_sampler("shade", 10, importance="test-loss-average",
                         importance_options={"beta": 1})  # fmt: skip
        with pytest.raises(ConfigError, match="b0 must be > 1"):
            make_sampler("shade", 10, b0=1.0)
    finally:
        del SCORERS["test-loss-average"]


@settings(max_examples=200, deadline=None)
@given(
    ids=st.lists(st.integers(0, 99), max_size=12),
    whole=st.integers(1, 3),
    extra=st.integers(0, 12),
    n=st.integers(1, 50),
)
def test_the_repeated_hits_are_written_as_numpy_repeats_them(ids, whole, extra, n):
    """``repetition_mode="repeat"``: each drawn hit ``whole`` times, then the first
    ``extra`` once more, cut at ``n``, written in place: numpy's repeat and concatenate."""
    from hotset.sampling.pads import repeat_into

    ids = np.asarray(ids, np.int32)
    extra = min(extra, ids.size)
    out = np.full(n, -1, np.int32)
    want = np.concatenate([np.repeat(ids, whole), ids[:extra]])[:n]
    assert repeat_into(out, ids, whole, extra) == want.size
    assert np.array_equal(out[: want.size], want) and np.all(out[want.size :] == -1)
