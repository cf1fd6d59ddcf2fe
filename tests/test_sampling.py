"""Uniform sampler: DistributedSampler semantics on numpy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hotset import ConfigError, make_sampler


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


def test_bad_config_named():
    with pytest.raises(ConfigError, match="rank"):
        make_sampler("uniform", 10, num_replicas=2, rank=2)
    with pytest.raises(ConfigError, match="unknown sampler 'shuffled'"):
        make_sampler("shuffled", 10)
    with pytest.raises(ConfigError, match="num_samples"):
        make_sampler("uniform", 0)
