"""Read-ahead (``io/readahead.py``): later batches' misses read in the requests a batch
makes anyway. Planned alone (hypothesis over shard layouts, gaps, budgets and orders) it
never adds a request, never holds more than its budget, and every staged sample is taken
by the batch that asks for it; end to end over tar shards with workers it serves the
right bytes in far fewer requests, and the samples read through are admitted only where
the policy wants them."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import hotset
from hotset.io.readahead import STAGE, ReadAhead
from hotset.io.requests import coalesce_ranges

sys.path.insert(0, str(Path(__file__).parent))
from test_sources import _chw, _images, _write_tar  # noqa: E402


def _requests(extents, ids, gap) -> int:
    objects, starts, ends = (a[ids] for a in extents)
    return int(coalesce_ranges(objects, starts, ends, gap)[1].size)


@st.composite
def layouts(draw):
    """Samples packed into shards back to back (with padding between some), an order
    that may repeat ids (importance sampling draws with replacement)."""
    n_obj = draw(st.integers(1, 5))
    per = draw(st.lists(st.integers(1, 30), min_size=n_obj, max_size=n_obj))
    objects, starts, ends = [], [], []
    for o, k in enumerate(per):
        at = 0
        for _ in range(k):
            size = draw(st.integers(1, 400))
            at += draw(st.sampled_from([0, 0, 100, 3000]))
            objects.append(o), starts.append(at), ends.append(at + size)
            at += size
    n = len(objects)
    order = np.array(draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=3 * n)))
    return (np.array(objects), np.array(starts), np.array(ends)), order


@settings(max_examples=150, deadline=None)
@given(layouts(), st.integers(0, 2000), st.integers(0, 6000), st.integers(1, 8),
       st.integers(1, 3), st.floats(0, 0.8), st.integers(0, 2**31 - 1))  # fmt: skip
def test_readahead_adds_no_request_keeps_its_budget_and_serves_each_stage_once(
    layout, gap, budget, step, lead, cached_share, seed
):
    extents, order = layout
    n = extents[0].size
    rng = np.random.default_rng(seed)
    sizes = extents[2] - extents[1] + 16
    cached = rng.random(n) < cached_share  # what the cache holds (never staged)
    ra = ReadAhead(extents, sizes, gap, budget, lead)
    ra.start_epoch(order, step)
    batches = -(-order.size // step)
    waiting: dict[int, set] = {}  # staged id -> batch it was staged for
    for b in range(batches):
        ids = order[b * step : (b + 1) * step]
        staged, producer = ra.take(b)
        assert producer <= b - lead or not staged.size  # for batches lead or more ahead
        assert all(waiting.pop(int(i)) == b for i in staged)
        assert set(staged.tolist()) <= set(ids.tolist())  # staged for a batch that asks
        reads = np.setdiff1d(ids[~cached[ids]], staged)
        stage, free = ra.plan(b, reads, lambda a: cached[a], seq=b)
        if not reads.size:
            assert not stage.size and not free.size
            ra.consumed(b)
            continue
        # read with this batch's misses, the staged samples cost no request (one may
        # even bridge two)
        together = np.concatenate([reads, stage])
        assert _requests(extents, together, gap) <= _requests(extents, reads, gap)
        assert not cached[stage].any() and not np.isin(stage, reads).any()
        for i in stage.tolist():
            assert i not in waiting
            later = np.flatnonzero(order == i)
            waiting[i] = int(later[later >= (b + lead) * step][0] // step)  # its next batch
        assert ra.outstanding <= budget
        # the samples read through lie inside those requests and are no one's
        assert not np.isin(free, together).any()
        assert _requests(extents, np.concatenate([together, free]), gap) <= _requests(
            extents, together, gap
        )
        ra.consumed(b)
    assert not waiting and ra.outstanding == 0 and not ra.staged.any()


@pytest.fixture
def shards(tmp_path, monkeypatch):
    monkeypatch.setenv("HOTSET_CACHE_DIR", str(tmp_path / "cache"))
    images = _images(240)
    for s in range(4):
        _write_tar(tmp_path / f"shard-{s}.tar", images[s * 60 : (s + 1) * 60], s * 60)
    return str(tmp_path / "shard-{0..3}.tar"), images


def _epochs(url, images, policy, readahead, epochs=2):
    """Serve ``epochs`` epochs; every sample must be the source's. Returns the counters
    and the most bytes the store held after a batch."""
    peak = 0
    storage = hotset.TarStorage(url, merge_gap=64 << 10)
    with hotset.make_loader(
        storage, batch_size=16, policy=policy, cache_fraction=0.2, num_workers=2, seed=3,
        readahead_bytes=readahead,
    ) as loader:  # fmt: skip
        capacity = loader.planner.policy.capacity_bytes
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            for inputs, targets, ids in loader:
                for k, i in enumerate(ids.tolist()):
                    assert torch.equal(inputs[k], _chw(images[i])), f"sample {i}"
                    assert int(targets[k]) == i % 3
                peak = max(peak, loader.dataset.store.used_bytes)
            if loader.planner.readahead is not None:  # every staged sample was taken
                assert loader.planner.readahead.outstanding == 0
        loader._drop_staged()
        assert loader.dataset.store.list_keys(STAGE) == []
        return loader.counters(), peak, capacity


@pytest.mark.parametrize("policy", ["lru", "minio"])
def test_readahead_serves_the_right_bytes_in_fewer_requests(shards, policy):
    url, images = shards
    plain, _, _ = _epochs(url, images, policy, 0)
    budget = 40_000
    ahead, peak, capacity = _epochs(url, images, policy, budget)
    assert plain["readahead_staged"] == 0
    assert ahead["readahead_served"] > 0 and ahead["corrupt_hits"] == 0
    assert ahead["storage_requests"] < 0.6 * plain["storage_requests"]
    assert peak <= capacity + budget
    if policy == "lru":  # LRU evicts to admit: it takes nothing it was not asked for
        assert ahead["offered"] == 0 and ahead["prefetched"] == 0
    else:  # MinIO takes what fits its free room, as it takes a miss
        assert ahead["offered"] > 0 and ahead["prefetched"] == ahead["offered"]


def test_readahead_is_off_where_samples_are_files(fmnist_dir):
    with hotset.make_loader(fmnist_dir, batch_size=16, cache_fraction=0.2,
                            num_workers=0, store="memory") as loader:  # fmt: skip
        assert loader.planner.readahead is None
    with pytest.raises(hotset.ConfigError, match="readahead_bytes"):
        hotset.make_loader(fmnist_dir, batch_size=16, cache_fraction=0.2, readahead_bytes=-1)
