"""Runs of DSA's draws at once: the same ids read and the same bucket left as the draws
one at a time, and line 9's run of decisions as the rounds in turn make them."""

from __future__ import annotations

from array import array

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hotset.sampling.bucket_draws import first_takes, take, take_at_once, take_in_turn


@st.composite
def runs(draw):
    """A bucket of distinct ids (each id's slot in ``pos``) and a run of draws that never
    empties it: a uniform slot each, then removed or replaced by a new id."""
    size = draw(st.integers(2, 40))
    ids = draw(st.permutations(range(100)))[:size]
    k = draw(st.integers(1, size - 1))
    slots, puts, left, fresh = [], [], size, 100
    for _ in range(k):
        slots.append(draw(st.integers(0, left - 1)))
        if draw(st.booleans()):
            puts.append(-1)
            left -= 1
        else:
            puts.append(fresh)
            fresh += 1
    return ids, np.array(slots, np.int64), np.array(puts, np.int64)


def _bucket(ids):
    bucket = array("i", ids)
    pos = np.zeros(200, np.int32)
    pos[np.array(ids)] = np.arange(len(ids))
    return bucket, pos


def _reads_a_written_slot(size: int, slots: np.ndarray, puts: np.ndarray) -> bool:
    """Whether a draw of the run, made one at a time, reads a slot that an earlier draw
    wrote: the slot it draws, or the last slot a removal moves into its own."""
    written: set[int] = set()
    for r, x in zip(slots.tolist(), puts.tolist(), strict=True):
        if r in written:
            return True
        if x >= 0:
            written.add(r)
            continue
        size -= 1  # the last slot is now ``size``
        if r != size:
            if size in written:
                return True
            written.add(r)
    return False


@settings(max_examples=300, deadline=None)
@given(runs())
def test_a_run_at_once_reads_and_leaves_what_the_draws_in_turn_do(run):
    ids, slots, puts = run
    one, one_pos = _bucket(ids)
    read = take_in_turn(one, memoryview(one_pos), slots, puts)
    many, many_pos = _bucket(ids)
    got = take_at_once(many, many_pos, slots, puts)
    # refused exactly where a draw reads a slot written by the run
    assert (got is None) == _reads_a_written_slot(len(ids), slots, puts)
    if got is None:
        assert many.tolist() == ids  # refused: nothing done
        got = take(many, many_pos, slots, puts)
    assert got.tolist() == read.tolist()
    assert many.tolist() == one.tolist()
    assert many_pos.tolist() == one_pos.tolist()


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 60), st.integers(0, 60), st.data())
def test_first_takes_are_the_rounds_decisions_in_turn(have, extra, data):
    k = data.draw(st.integers(1, have + extra))
    u = np.array(data.draw(st.lists(
        st.floats(0, 1, exclude_max=True) | st.sampled_from([0.0, 0.5, 0.25]),
        min_size=k, max_size=k,
    )))  # fmt: skip
    lefts = have + extra - np.arange(k)
    want, before = [], 0
    for t in range(k):
        took = u[t] * lefts[t] < have - before
        want.append(took)
        before += took
    assert first_takes(u, lefts, have).tolist() == want
