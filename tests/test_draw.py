"""The draws of :mod:`hotset.sampling.draw`: the weighted draw with replacement that
SHADE and SpiderCache make each epoch (the distribution of ``rng.choice(n, n, p=p)``, ids
with no weight never drawn), its sorted search, and the two-thread permutations."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hotset.sampling.draw as draw
from hotset.sampling.draw import draw_weighted, permutation, shuffled, sorted_search


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
)
def test_sorted_search_is_searchsorted(a, v, block):
    """Repeated values in ``a`` (ids with no weight) and queries on them included."""
    v = np.concatenate([v, a[: v.size // 3]])
    v.sort()
    got = sorted_search(a, v, block)
    assert np.array_equal(got, np.searchsorted(a, v, side="right"))


def test_shuffle_is_uniform_over_all_orders(monkeypatch):
    """Every one of the 24 orders of 4 ids equally often (chi-square), through the
    bucketed two-thread path."""
    monkeypatch.setattr(draw, "PARALLEL_SHUFFLE_MIN", 1)
    monkeypatch.setattr(draw, "SHUFFLE_BUCKETS", 3)
    rng = np.random.default_rng(11)
    trials = 12_000
    codes = np.empty(trials, np.int64)
    for t in range(trials):
        order = permutation(rng, 4)
        codes[t] = int("".join(map(str, order)), 4)
    counts = np.unique(codes, return_counts=True)[1]
    assert counts.size == 24
    expected = trials / 24
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 49.7  # 23 degrees of freedom, p = 0.001


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(a=st.lists(st.integers(-50, 50), max_size=300), seed=st.integers(0, 2**32 - 1))
def test_shuffled_keeps_every_element_and_is_reproducible(monkeypatch, a, seed):
    monkeypatch.setattr(draw, "PARALLEL_SHUFFLE_MIN", 1)  # the same for every input
    a = np.asarray(a, np.int64)
    out = shuffled(np.random.default_rng(seed), a)
    assert np.array_equal(np.sort(out), np.sort(a))
    assert np.array_equal(out, shuffled(np.random.default_rng(seed), a))
