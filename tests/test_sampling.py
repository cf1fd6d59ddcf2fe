"""Uniform sampler: DistributedSampler semantics on numpy."""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hotset
from hotset import ConfigError, make_sampler
from hotset.sampling import iis

sys.path.insert(0, str(Path(__file__).parent))
from test_sources import _images, _write_tar  # noqa: E402


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 500),
    replicas=st.integers(1, 8),
    seed=st.integers(0, 99),
    epoch=st.integers(0, 5),
    drop_last=st.booleans(),
)
def test_ranks_share_one_epoch_list(n, replicas, seed, epoch, drop_last):
    shards = []
    for rank in range(replicas):
        s = make_sampler(
            "uniform", n, num_replicas=replicas, rank=rank, seed=seed, drop_last=drop_last
        )
        s.set_epoch(epoch)
        shards.append(s.epoch_order())
    lengths = {len(x) for x in shards}
    assert len(lengths) == 1  # every rank gets the same number of samples
    allids = np.concatenate(shards)
    if drop_last:
        assert len(allids) == (n // replicas) * replicas
        assert len(np.unique(allids)) == len(allids)  # disjoint
    else:
        assert set(allids.tolist()) == set(range(n))  # covers the dataset
        assert len(allids) == -(-n // replicas) * replicas


def test_matches_distributed_sampler_layout():
    """Same padding and striding as torch's DistributedSampler given the same order."""
    from torch.utils.data import DistributedSampler

    n, r = 10, 4
    for rank in range(r):
        ours = make_sampler("uniform", n, num_replicas=r, rank=rank, shuffle=False)
        theirs = DistributedSampler(range(n), num_replicas=r, rank=rank, shuffle=False)
        assert list(ours) == list(theirs)


def test_epochs_differ_and_are_reproducible():
    a = make_sampler("uniform", 1000, seed=1)
    b = make_sampler("uniform", 1000, seed=1)
    a.set_epoch(3)
    b.set_epoch(3)
    assert list(a) == list(b)
    b.set_epoch(4)
    assert list(a) != list(b)
    assert sorted(a) == list(range(1000))


def test_uniform_marginals():
    """Over many epochs, each id appears at each position equally often (chi-square)."""
    from scipy.stats import chisquare

    s = make_sampler("uniform", 8, seed=0)
    first = np.zeros(8)
    for e in range(4000):
        first[s.global_order(e)[0]] += 1
    assert chisquare(first).pvalue > 0.001


@settings(max_examples=20, deadline=None)
@given(
    n=st.integers(20, 400), batch=st.integers(1, 16), replicas=st.integers(1, 3),
    shuffle=st.sampled_from([True, False, "shards"]), replacement=st.booleans(),
    jump=st.booleans(),
)  # fmt: skip
def test_the_next_epochs_order_is_drawn_in_the_tail_and_is_the_one_drawn_at_its_start(
    n, batch, replicas, shuffle, replacement, jump
):
    """docs/design.md: a sampler whose orders are fixed in advance draws the next epoch's
    in a thread from the last quarter of an epoch's batches; that epoch then starts
    without drawing it (``global_order`` is not called), with the same order; an epoch
    other than the next (a resume elsewhere) is drawn at its start as before."""
    from hotset.plan import Planner
    from hotset.policy.base import make_policy

    def sampler():
        return make_sampler("uniform", n, seed=5, shuffle=shuffle, replacement=replacement,
                            objects=np.arange(n) // 7, num_replicas=replicas, rank=replicas - 1)

    s, fresh = sampler(), sampler()
    planner = Planner(s, make_policy("lru", 10, sizes=np.ones(n, np.int64)), batch)
    plans = iter(planner)
    for _ in range(len(planner) - max(1, len(planner) // 4)):  # up to the tail
        next(plans)
        assert s._ahead is None
    rest = list(plans)
    assert rest and s._ahead is not None and s._ahead.epoch == 1
    assert s.state_dict() and pickle.loads(pickle.dumps(s))._ahead is None  # a thread: not state
    drawn = []
    s.global_order = lambda e: drawn.append(e) or fresh.global_order(e)
    nxt = 4 if jump else 1
    s.set_epoch(nxt)
    served = np.concatenate([p.ids for p in planner])
    s._ahead.result()  # (the epoch after, drawn in this one's tail)
    assert drawn == ([4, 5] if jump else [2])  # the next epoch's was drawn in the tail
    np.testing.assert_array_equal(served, fresh.epoch_order(nxt)[: served.size])
    assert served.size == len(fresh)


def test_bad_config_named():
    with pytest.raises(ConfigError, match="rank"):
        make_sampler("uniform", 10, num_replicas=2, rank=2)
    with pytest.raises(ConfigError, match="unknown sampler 'shuffled'"):
        make_sampler("shuffled", 10)
    with pytest.raises(ConfigError, match="num_samples"):
        make_sampler("uniform", 0)


@settings(max_examples=60, deadline=None)
@given(
    shard_sizes=st.lists(st.integers(1, 40), min_size=1, max_size=12),
    block=st.integers(1, 64),
    epoch=st.integers(0, 5),
)
def test_shard_local_shuffle_is_a_permutation_whose_windows_stay_within_few_shards(
    shard_sizes, block, epoch
):
    """``shuffle="shards"``: each epoch a permutation of all ids; each window of
    ``shuffle_block`` positions holds the samples of a run of consecutive shards in the
    epoch's shard order (at most ceil(block / smallest) + 1 shards), and every shard's
    samples sit in one run of positions of at most its size + 2 windows."""
    objects = np.repeat(np.arange(len(shard_sizes)) * 7 + 3, shard_sizes)  # any ints
    n = objects.size
    s = make_sampler("uniform", n, seed=epoch, shuffle="shards", shuffle_block=block,
                     objects=objects)  # fmt: skip
    order = s.global_order(epoch)
    assert np.array_equal(np.sort(order), np.arange(n))
    for k in range(0, n, block):
        window = objects[order[k : k + block]]
        assert np.unique(window).size <= -(-block // min(shard_sizes)) + 1
    for o in np.unique(objects):
        pos = np.flatnonzero(objects[order] == o)
        assert pos.max() - pos.min() < np.sum(objects == o) + 2 * block
    assert np.array_equal(order, s.global_order(epoch))  # a function of seed and epoch


def test_shard_local_shuffle_is_named_and_reaches_make_loader(tmp_path):
    with pytest.raises(ConfigError, match="shuffle must be one of"):
        make_sampler("uniform", 10, shuffle="blocks")
    images = _images(48)
    (tmp_path / "s").mkdir()
    for k in range(3):
        _write_tar(tmp_path / "s" / f"shard-{k}.tar", images[16 * k : 16 * k + 16], 16 * k)
    with hotset.make_loader(
        str(tmp_path / "s"), batch_size=8, cache_fraction=0.0, num_workers=0,
        store="memory", sampler_options={"shuffle": "shards", "shuffle_block": 8},
    ) as loader:  # fmt: skip
        batches = [ids.numpy() for _, _, ids in loader]
    assert np.array_equal(np.sort(np.concatenate(batches)), np.arange(48))
    assert all(np.unique(b // 16).size == 1 for b in batches)  # each batch one shard


@settings(max_examples=40, deadline=None)
@given(
    losses=st.lists(st.sampled_from([0.1, 0.5, 0.5, 2.0, 3.0]), min_size=1, max_size=30),
    unseen=st.integers(0, 5),
)
def test_iis_percentiles_are_the_losses_stable_ranks(losses, unseen):
    """IIS's importance: each scored loss's place in their stable order over n - 1 (ties
    in id order), never-scored ids 1."""
    n = len(losses) + unseen
    s = make_sampler("iis", n)
    s.feedback(np.arange(len(losses)), np.asarray(losses))
    pct = s.percentiles()
    k = len(losses)
    if k > 1:
        ranks = np.argsort(np.argsort(losses, kind="stable"), kind="stable")
        assert np.allclose(pct[:k], ranks / (k - 1))
    assert np.all(pct[k:] == 1.0)
    block, iis.RANK_BLOCK = iis.RANK_BLOCK, 3  # ranked three at a time: the same
    try:
        assert np.array_equal(s.percentiles(), pct)
    finally:
        iis.RANK_BLOCK = block


def test_iis_ranks_placed_on_two_threads_are_one_loops():
    """``place_ranks`` splits the places in two halves on two threads past 2M ids: every
    id gets its place over n - 1, as one scatter gives."""
    n = 2 * iis.BLOCK + 12345
    assert (n // (2 * iis.RANK_BLOCK)) * iis.RANK_BLOCK >= iis.BLOCK  # two threads
    order = np.random.default_rng(0).permutation(n).astype(np.uint64)
    got = np.full(n, -1.0, np.float32)
    iis.place_ranks(got, order)
    want = np.empty(n, np.float32)
    want[order] = np.arange(n) / (n - 1)
    assert np.array_equal(got, want)


def test_iis_keeps_each_sample_by_one_draw_block_by_block(monkeypatch):
    """An epoch keeps id i where the i-th uniform of one ``rng.random(n)`` call is below
    its percentile to the power ``keep_exponent``, drawn 7 at a time here: the same
    draws."""
    n = 300
    s = make_sampler("iis", n, seed=5, coverage_epochs=None)
    s.feedback(np.arange(n), np.random.default_rng(1).random(n))
    pct = s.percentiles()
    keep = np.random.default_rng([5, 1]).random(n, np.float32) < pct**s.keep_exponent
    monkeypatch.setattr(iis, "BLOCK", 7)
    assert np.sort(s.global_order(1)).tolist() == np.flatnonzero(keep).tolist()


def test_iis_hands_the_cache_its_most_important_ids_in_order_once():
    """With every id scored, the epoch's hints carry ``ranked``: the most important half
    of the ids, down, their percentiles distinct; given once (then the cache sorts the
    importances itself, to the same H-list). Not while some ids are unscored (their
    percentiles tie at 1)."""
    n = 1000
    s = make_sampler("iis", n, seed=2)
    s.feedback(np.arange(n - 1), np.random.default_rng(3).integers(0, 5, n - 1) / 4)
    assert "ranked" not in s.cache_hints(1)  # one id unscored
    s.feedback(np.array([n - 1]), np.array([0.5]))
    h = s.cache_hints(2)
    ranked, pct = h["ranked"], h["importance"]
    assert ranked.size == n // 2 and (np.diff(pct[ranked]) < 0).all()
    assert pct[ranked].min() > np.delete(pct, ranked).max()
    assert "ranked" not in s.cache_hints(2) and s.cache_hints(2)["importance"] is pct
