"""``order="blocks"`` (``sampling/blocks.py``): each system's epoch, the same ids as its
paper draws them, read by blocks of shards. As a property: the multiset is kept and each
shard's ids sit in as few windows as its count allows; end to end over tar shards with
workers: every sample is served once an epoch with its own bytes, and each shard is read
by one request an epoch where the paper order makes many."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import hotset
from hotset.plan import Planner
from hotset.policy.base import make_policy
from hotset.sampling.base import make_sampler
from hotset.sampling.blocks import block_order, epoch_rng

sys.path.insert(0, str(Path(__file__).parent))
from test_sources import _chw, _images, _write_tar  # noqa: E402


@settings(max_examples=200, deadline=None)
@given(
    per=st.lists(st.integers(1, 40), min_size=1, max_size=12),
    block=st.integers(1, 100),
    repeats=st.booleans(),
    seed=st.integers(0, 2**31),
)
def test_a_block_order_keeps_the_draw_and_packs_each_shard(per, block, repeats, seed):
    objects = np.repeat(np.arange(len(per)), per)
    rng = np.random.default_rng(seed)
    n = objects.size
    order = rng.integers(0, n, n) if repeats else rng.permutation(n)  # with or without
    out = block_order(order, objects, block, np.random.default_rng(seed + 1))
    assert np.array_equal(np.sort(out), np.sort(order))  # the same ids, as often
    window = np.arange(n) // block
    for o in np.unique(objects[order]):
        mine = window[objects[out] == o]
        count = mine.size
        # a shard's ids are contiguous before the shuffle within windows: they span at
        # most the windows that many consecutive positions can touch
        assert mine.max() - mine.min() + 1 <= -(-count // block) + 1


def test_every_system_reads_its_own_draw_by_blocks(tmp_path, monkeypatch):
    """The planner's epoch under ``order="blocks"`` is the sampler's draw reordered (the
    same ids as often), for an importance sampler as for uniform; a policy that needs the
    future is told the next epoch in the order it will be served."""
    monkeypatch.setenv("HOTSET_CACHE_DIR", str(tmp_path / "cache"))
    images = _images(120)
    for s in range(4):
        _write_tar(tmp_path / f"shard-{s}.tar", images[s * 30 : (s + 1) * 30], s * 30)
    storage = hotset.TarStorage(str(tmp_path / "shard-{0..3}.tar"))
    for sampler, policy in (("uniform", "belady"), ("shade", "app")):
        orders = {}
        for order in ("paper", "blocks"):
            smp = make_sampler(sampler, len(storage), seed=5)
            pol = make_policy(policy, 4000, sizes=storage.sizes, seed=5)
            planner = Planner(smp, pol, 8, storage=storage, order=order, block_size=30)
            orders[order] = np.concatenate([p.ids for p in planner])
            if policy == "belady":
                rng = epoch_rng(5, 1)
                ahead = block_order(smp.epoch_order(1), storage.extents[0], 30, rng)
                if order == "blocks":  # the next epoch as it will be served
                    assert pol._seq[orders[order].size :] == ahead.tolist()
        assert np.array_equal(np.sort(orders["blocks"]), np.sort(orders["paper"]))
        assert not np.array_equal(orders["blocks"], orders["paper"])
        switches = {k: int((np.diff(storage.extents[0][v]) != 0).sum()) for k, v in orders.items()}
        assert switches["blocks"] < switches["paper"]  # read shard after shard


def test_blocks_need_shards():
    from hotset.errors import ConfigError

    with pytest.raises(ConfigError, match="order must be one of"):
        hotset.make_loader("nowhere", batch_size=4, cache_fraction=0.1, order="shards")
    with pytest.raises(ConfigError, match="block_size must be an int >= 1"):
        hotset.make_loader("nowhere", batch_size=4, cache_fraction=0.1, order="blocks",
                           block_size=0)  # fmt: skip


def test_blocks_refused_where_samples_are_files(fmnist_dir):
    from hotset.errors import ConfigError

    with pytest.raises(ConfigError, match="order='blocks'.*file per sample"):
        hotset.make_loader(fmnist_dir, batch_size=16, cache_fraction=0.2, num_workers=0,
                           store="memory", order="blocks")  # fmt: skip


@pytest.mark.parametrize("system", ["lru", "shade"])
def test_blocks_read_each_shard_once_an_epoch_and_serve_the_right_bytes(
    tmp_path, monkeypatch, system
):
    """8 shards of 30 samples, 2 workers, read-ahead enough for a block: with
    ``order="blocks"`` every shard is one request an epoch (its samples staged for the
    batches that follow, which wait for them instead of reading it again), every served
    sample is its own bytes, and uniform serves each sample once an epoch; the paper order
    makes several requests a shard (its read-ahead, half the dataset, stages only so far).
    SHADE's first epoch is a uniform permutation, its second a draw with replacement."""
    monkeypatch.setenv("HOTSET_CACHE_DIR", str(tmp_path / "cache"))
    images = _images(240)
    for s in range(8):
        _write_tar(tmp_path / f"shard-{s}.tar", images[s * 30 : (s + 1) * 30], s * 30)
    url = str(tmp_path / "shard-{0..7}.tar")
    requests = {}
    for order in ("paper", "blocks"):
        storage = hotset.TarStorage(url, merge_gap=1 << 20)  # a shard is one request
        with hotset.make_loader(
            storage, batch_size=10, system=system, capacity_bytes=0, num_workers=2, seed=1,
            readahead_bytes=storage.manifest.total_bytes // 2, order=order, block_size=60,
        ) as loader:  # fmt: skip
            per_epoch = []
            for epoch in range(2):
                loader.set_epoch(epoch)
                before, served = loader.counters()["storage_requests"], []
                for inputs, targets, ids in loader:
                    for k, i in enumerate(ids.tolist()):
                        assert torch.equal(inputs[k], _chw(images[i])), f"sample {i}"
                        assert int(targets[k]) == i % 3
                    served += ids.tolist()
                    if system == "shade":
                        loader.feedback(ids, torch.rand(len(ids)))
                if system == "lru":
                    assert sorted(served) == list(range(240))
                per_epoch.append(loader.counters()["storage_requests"] - before)
            c = loader.counters()
            assert c["corrupt_hits"] == 0
        requests[order] = per_epoch
    assert requests["blocks"][0] == 8, requests  # one request a shard an epoch
    assert min(requests["paper"]) > 8, requests
    if system == "lru":
        assert requests["blocks"] == [8, 8], requests
    else:  # SHADE draws with replacement: an id drawn again after its batch took it from
        # the staging area is read again (no cache here to hold it)
        assert sum(requests["blocks"]) < sum(requests["paper"]), requests
