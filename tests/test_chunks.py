"""Quiver's coordinated eviction: chunks, two resident, mark then evict when unused."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hotset.service.chunks import ChunkCache


def make(n: int = 30, chunk: int = 10) -> ChunkCache:
    """Chunks 0, 1, 2 = ids 0-9, 10-19, 20-29: one registration per chunk-sized dataset
    (each is shuffled within itself)."""
    cc = ChunkCache(capacity_bytes=2 * chunk)
    for _ in range(n // chunk):
        cc.add_ids(np.ones(chunk, np.int64))
    return cc


def test_chunks_are_cut_in_a_shuffled_order():
    """A class-sorted manifest (ids 0-99 class 0, 100-199 class 1, ...) still gives every
    chunk most classes: a minibatch read from a chunk is not one class."""
    cc = ChunkCache(capacity_bytes=2 * 200, seed=3)
    cc.add_ids(np.ones(1000, np.int64))
    assert len(cc.members) == 5 and all(len(m) == 200 for m in cc.members)
    for m in cc.members:
        assert len({i // 100 for i in m}) >= 8
    assert sorted(i for m in cc.members for i in m) == list(range(1000))
    assert all(cc.chunk_of[i] == c for c, m in enumerate(cc.members) for i in m)


def test_a_marked_chunk_takes_no_new_readers_and_goes_when_its_last_reader_is_done():
    cc = make()  # chunks 0, 1, 2 of 10 ids each, two slots
    for job, lo, hi in ((1, 0, 10), (2, 10, 20), (3, 20, 30), (4, 0, 10)):
        cc.start_epoch(job, np.arange(lo, hi))
    ids, hits, admit, _ = cc.batch(1, 4)  # opens chunk 0
    assert set(ids) <= set(range(10)) and sorted(admit) == sorted(ids) and not any(hits)
    assert set(cc.batch(2, 4)[0]) <= set(range(10, 20))  # opens chunk 1 in the free slot
    ids, hits, admit, evict = cc.batch(3, 5)  # needs chunk 2, both slots in use:
    assert cc.resident[0].marked and not evict  # the oldest is marked, not evicted,
    assert set(ids) <= set(range(20, 30)) and not admit and not any(hits)  # read uncached
    ids, hits, admit, _ = cc.batch(4, 5)  # a marked chunk takes no new reader
    assert not admit and not any(hits) and cc.resident[0].readers == {1}
    ids, hits, admit, evict = cc.batch(1, 6)  # its reader goes on, and when it is done ...
    assert set(ids) <= set(range(10)) and set(admit) <= set(range(10))
    assert sorted(evict) == list(range(10))  # ... the chunk goes, all its entries at once
    assert 0 not in cc.resident
    ids, hits, admit, evict = cc.batch(3, 5)  # now chunk 2 comes in for job 3
    assert 2 in cc.resident and set(admit) == set(ids) <= set(range(20, 30))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.sets(st.integers(0, 59), min_size=1), min_size=1, max_size=4),
    st.lists(st.tuples(st.integers(0, 3), st.integers(1, 9)), max_size=80),
    st.integers(3, 20),
)
def test_never_evicts_a_chunk_in_use_and_each_job_reads_its_ids_once(datasets, steps, chunk):
    cc = ChunkCache(capacity_bytes=2 * chunk)
    cc.add_ids(np.ones(60, np.int64))
    read = {j: [] for j in range(len(datasets))}
    in_use = {j: set() for j in range(len(datasets))}  # chunks each job reads cached
    for j, d in enumerate(datasets):
        cc.start_epoch(j, np.array(sorted(d)))
    for j, n in steps:
        if j >= len(datasets):
            continue
        cached_before = cc.cached
        ids, hits, admit, evict = cc.batch(j, n)
        for i, h in zip(ids, hits, strict=True):
            assert not h or i in cached_before  # a hit was admitted by an earlier plan
            if h or i in admit:
                in_use[j].add(cc.chunk_of[i])
        read[j] += ids
        left = {cc.chunk_of[i] for i in set(datasets[j]) - set(read[j])}
        in_use[j] &= left  # a job done with a chunk no longer uses it
        for i in evict:
            assert all(cc.chunk_of[i] not in in_use[k] for k in in_use)  # nobody reads it
        assert len(cc.resident) <= 2 and len(cc.cached) <= 2 * chunk
        assert len(read[j]) == len(set(read[j])) and set(read[j]) <= datasets[j]
        if len(read[j]) == len(datasets[j]):
            assert cc.batch(j, 1)[0] == []  # the epoch is over
