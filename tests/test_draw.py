"""The draws of :mod:`hotset.sampling.draw`: the weighted draw with replacement that
SHADE and SpiderCache make each epoch (the distribution of ``rng.choice(n, n, p=p)``, ids
with no weight never drawn), the sorted search under it, and the shuffle drawn block by
block as ids are taken."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hotset.sampling.draw as draw
from hotset.sampling import draw_kernel
from hotset.sampling.draw import draw_weighted, sorted_search


@settings(max_examples=40, deadline=None)
@given(
    weights=st.lists(st.sampled_from([0.0, 0.1, 1.0, 3.0, 10.0]), min_size=1, max_size=12),
    seed=st.integers(0, 2**32 - 1),
)
def test_draw_follows_the_weights(weights, seed):
    w = np.asarray(weights)
    if w.sum() == 0:
        w[0] = 1.0
    p = w / w.sum()
    n = 20_000
    ids = draw_weighted(np.random.default_rng(seed), p, n)
    assert ids.shape == (n,) and ids.min() >= 0 and ids.max() < p.size
    share = np.bincount(ids, minlength=p.size) / n
    assert np.all(share[p == 0] == 0)  # no weight, never drawn
    assert np.abs(share - p).max() < 5 * np.sqrt(0.25 / n) + 1e-9  # 5 sigma


def test_draw_is_in_random_order_and_reproducible():
    p = np.full(1000, 1e-3)
    a = draw_weighted(np.random.default_rng(7), p, 1000)
    assert np.array_equal(a, draw_weighted(np.random.default_rng(7), p, 1000))
    assert not np.all(np.diff(a) >= 0)  # shuffled, not the sorted walk
    assert draw_weighted(np.random.default_rng(0), p, 0).size == 0
    # into a slice of the caller's array, the weights' own array holding the sums: the same
    out, q = np.full(1010, -1, a.dtype), p.copy()
    draw_weighted(np.random.default_rng(7), q, 1000, out=out[10:], overwrite=True)
    assert np.array_equal(out[10:], a) and np.all(out[:10] == -1)
    assert np.allclose(q, np.cumsum(p))


def test_draw_in_pieces_follows_the_weights(monkeypatch):
    monkeypatch.setattr(draw, "DRAW_PIECE", 1000)  # 20 pieces on two threads
    p = np.arange(1.0, 11.0)
    p /= p.sum()
    n = 20_000
    ids = draw_weighted(np.random.default_rng(3), p, n)
    assert ids.dtype == np.int32 and ids.size == n
    share = np.bincount(ids, minlength=p.size) / n
    assert np.abs(share - p).max() < 5 * np.sqrt(0.25 / n)


@settings(max_examples=60, deadline=None)
@given(
    a=st.lists(st.integers(0, 20), max_size=50).map(lambda x: np.cumsum(x, dtype=float)),
    v=st.lists(st.floats(-5, 1100, allow_nan=False), max_size=60).map(np.sort),
    block=st.integers(1, 7),
    compiled=st.booleans(),
)
def test_sorted_search_is_searchsorted(a, v, block, compiled):
    """Repeated values in ``a`` (ids with no weight) and queries on them included; the
    compiled walk (``draw_kernel``) and numpy's blocks alike."""
    v = np.concatenate([v, a[: v.size // 3]])
    v.sort()
    assert draw_kernel.load()
    draw_kernel._ready = compiled
    try:
        got = sorted_search(a, v, block)
        assert np.array_equal(got, np.searchsorted(a, v, side="right"))
        into = np.full(v.size, -1, np.int32)  # a draw's ids, written in place
        assert sorted_search(a, v, block, out=into) is into and np.array_equal(into, got)
    finally:
        draw_kernel._ready = True


@pytest.mark.parametrize("block", [1, 2, 4096])
def test_a_job_order_shuffled_as_it_is_taken_is_uniform_and_whole(monkeypatch, block):
    """The service's independent orders (``Unsampled`` with a generator) are drawn block
    by block as a job takes ids, Quiver putting back what it looked at and did not
    serve: every id served once, and all 24 orders of 4 equally often, blocks of 1 and 2
    (across block ends) as of 4096."""
    from functools import partial

    from hotset.service import modes

    monkeypatch.setattr(modes, "shuffle_next", partial(draw.shuffle_next, block=block))
    counts: dict[tuple, int] = {}
    trials = 4800
    for seed in range(trials):
        order = modes.Unsampled(np.array([10, 11, 12, 13]), np.random.default_rng(seed))
        served = order.take(1).tolist()
        window = order.take(2).copy()  # looked at two, serves the first
        served.append(int(window[0]))
        order.put_back(window[1:])
        while len(order):
            served += order.take(1).tolist()
        assert sorted(served) == [10, 11, 12, 13]
        counts[tuple(served)] = counts.get(tuple(served), 0) + 1
    assert len(counts) == 24
    c = np.array(list(counts.values()))
    assert float(((c - trials / 24) ** 2 / (trials / 24)).sum()) < 49.7  # 23 dof, p = 0.001


@settings(max_examples=60, deadline=None)
@given(
    size=st.integers(0, 40),
    cut=st.integers(0, 40),
    steps=st.lists(st.integers(1, 9), min_size=1, max_size=12),
    block=st.integers(1, 5),
    seed=st.integers(0, 2**32 - 1),
)
def test_an_order_shuffled_as_read_is_one_order_however_it_is_read(size, cut, steps, block, seed):
    """``ShuffledAsRead``: read a few ids at a time, copied (as a checkpoint does) or
    saved with ``to_safe`` halfway, it ends as the order ``whole()`` gives at once; each
    part holds its own ids, and what was final stays as it was."""
    import copy

    from hotset.checkpoint import from_safe, to_safe
    from hotset.sampling.draw import ShuffledAsRead

    ids = np.arange(100, 100 + size, dtype=np.int32)
    ends = [min(cut, size)]
    at_once = ShuffledAsRead(ids.copy(), np.random.default_rng(seed), ends, block).whole()
    order = ShuffledAsRead(ids.copy(), np.random.default_rng(seed), ends, block)
    stop, seen = 0, []
    for k, step in enumerate(steps):
        stop += step
        got = order.ready(stop)[: min(stop, size)].copy()
        assert np.array_equal(got[: len(seen)], seen)  # what was final stays
        seen = got
        if k == 1:
            order = copy.deepcopy(order)
        if k == 2:
            order = from_safe(to_safe(order))
    assert np.array_equal(order.whole(), at_once)
    for lo, hi in ((0, ends[0]), (ends[0], size)):
        assert sorted(at_once[lo:hi]) == ids[lo:hi].tolist()


@pytest.mark.parametrize("block", [1, 3, 4096])
def test_an_order_shuffled_as_read_is_uniform_within_each_part(block):
    """All 24 orders of a part of 4 equally often (blocks within and across the part),
    the part before it (2 ids) untouched by it and shuffled too; a saved state that does
    not fit together is refused."""
    from hotset.errors import ConfigError
    from hotset.sampling.draw import ShuffledAsRead

    counts: dict[tuple, int] = {}
    firsts = np.zeros(2)
    trials = 4800
    for seed in range(trials):
        order = ShuffledAsRead(np.arange(6), np.random.default_rng(seed), [2], block)
        got = [int(order.ready(k)[k - 1]) for k in range(1, 7)]  # one id at a time
        assert sorted(got[:2]) == [0, 1] and sorted(got[2:]) == [2, 3, 4, 5]
        firsts[got[0]] += 1
        counts[tuple(got[2:])] = counts.get(tuple(got[2:]), 0) + 1
    assert len(counts) == 24
    c = np.array(list(counts.values()))
    assert float(((c - trials / 24) ** 2 / (trials / 24)).sum()) < 49.7  # 23 dof, p = 0.001
    assert abs(firsts[0] - trials / 2) < 4 * np.sqrt(trials / 4)
    state = order.__getstate__()
    for bad in ({"_done": 7}, {"_ends": [2, 7]}, {"_ends": [6, 2]}, {"size": 5}, {"_block": 0}):
        with pytest.raises(ConfigError, match="shuffled as it is read"):
            ShuffledAsRead.__new__(ShuffledAsRead).__setstate__({**state, **bad})


@pytest.mark.parametrize(("n", "m"), [(40, 4), (30, 1), (12, 5)])
def test_a_subset_is_m_distinct_ids_each_as_likely(n, m):
    """``subset``: ``m`` distinct ids of ``n``, ascending, each in it m/n of the time (a
    chi-square over 6,000 draws; the geometric gaps for the small shares, numpy's choice
    for the large)."""
    from hotset.sampling.draw import subset

    rng, counts, draws = np.random.default_rng(3), np.zeros(n), 6000
    for _ in range(draws):
        got = subset(n, m, rng)
        assert got.size == m and (np.diff(got) > 0).all() and got[0] >= 0 and got[-1] < n
        counts[got] += 1
    want = draws * m / n
    assert float(((counts - want) ** 2 / want).sum()) < {40: 72.1, 30: 58.3, 12: 31.3}[n]


@settings(max_examples=40, deadline=None)
@given(
    score=st.lists(st.sampled_from([0.0, -1.0, 1e-13, 0.5, 2.0, 7.25, float("nan")]),
                   min_size=1, max_size=40),
    held=st.lists(st.booleans(), min_size=40, max_size=40),
    repetition=st.sampled_from([1.0, 3.0, 2.5]),
    dtype=st.sampled_from([np.int32, np.int64]),
)  # fmt: skip
def test_the_compiled_passes_give_numpys_values(score, held, repetition, dtype):
    """SHADE's weights split and the cumulative sum in place: the compiled passes
    (``draw_kernel``) give numpy's steps' values, bit for bit, so a plan does not depend
    on whether numba is there."""
    assert draw_kernel.load()
    score, cached = np.asarray(score), np.asarray(held[: len(score)])
    out = []
    for compiled in (True, False):
        draw_kernel._ready = compiled
        try:
            w = np.empty(score.size)
            ids, w_held = draw_kernel.split_weights(score, cached, repetition, w, dtype)
            sums = draw_kernel.cumsum_inplace(np.abs(np.nan_to_num(w)) + 0.1)
            out.append((ids, w_held, w, sums))
        finally:
            draw_kernel._ready = True
    (ids, w_held, w, sums), (ids2, w_held2, w2, sums2) = out
    assert ids.dtype == ids2.dtype == dtype and np.array_equal(ids, np.flatnonzero(cached))
    assert np.array_equal(w_held, w_held2, equal_nan=True)
    assert np.array_equal(w, w2, equal_nan=True) and np.all(w[cached] == 0)
    assert np.array_equal(sums, sums2)
    weights = np.maximum(score, 1e-12)
    weights[cached] *= repetition
    assert np.array_equal(w_held, weights[cached], equal_nan=True)
