"""Runs of DSA's rounds drawn at once in numpy, as one round at a time draws them.

A bucket of ``DependentSampling`` is an ``array`` of ids, each id's slot kept in ``pos``.
A draw (Algorithm 2's uniform element) reads the id at a uniform slot and then either
removes it (the bucket's last id takes its slot: ``_clear``'s swap-remove) or puts
another id in its place (an element that now needs only the other job). A run of draws
is made in a few numpy passes where no draw reads a slot that an earlier draw of the
run wrote (a slot drawn twice, or a removal's last slot drawn before): the ids read and
the bucket left are then those of the draws one at a time. Otherwise the run is made one
draw at a time (``take_in_turn``, the reference).

Line 9's decision of the first job ("takes I with probability |I| / |R|") depends on
how many of the run's earlier rounds took I: ``first_takes`` finds the run's decisions
as a fixed point of numpy passes.
"""

from __future__ import annotations

from array import array

import numpy as np

from hotset.ids import distinct

#: a put of ``take``: the draw removes the id it reads
REMOVE = -1


def take_in_turn(bucket: array, pos, slots: np.ndarray, puts: np.ndarray) -> np.ndarray:
    """The ids at ``slots`` read one draw at a time, each then removed (``puts`` < 0)
    or replaced by its put; ``pos`` follows every id moved or put."""
    read = []
    for r, x in zip(slots.tolist(), puts.tolist(), strict=True):
        read.append(bucket[r])
        if x >= 0:
            bucket[r] = x
            pos[x] = r
        else:
            last = bucket.pop()
            if r < len(bucket):
                bucket[r] = last
                pos[last] = r
    return np.array(read, np.int64)


def take_at_once(
    bucket: array, pos: np.ndarray, slots: np.ndarray, puts: np.ndarray
) -> np.ndarray | None:
    """``take_in_turn`` in numpy passes, or ``None`` (nothing done) where a draw reads a
    slot an earlier one wrote: a slot drawn twice, or the last slot of a removal drawn
    (and so written) before it. Without either, each draw reads the bucket's id as the
    run found it, and each removal's last id is the run's first; no slot written lies
    past the bucket's final end (it would be a later removal's last slot)."""
    removes = puts < 0
    last = len(bucket) - 1 - (np.cumsum(removes) - removes)  # each draw's last slot
    moves = removes & (slots != last)
    # the removals' last slots differ from each other: a value twice is a slot drawn
    # twice or a last slot drawn (one sort of the run; np.isin's table spans the bucket)
    if not distinct(np.concatenate([slots, last[moves]])):
        return None
    ids = np.frombuffer(bucket, pos.dtype)
    read = ids[slots].astype(np.int64)
    put = ~removes
    ids[slots[put]] = puts[put]
    pos[puts[put]] = slots[put]
    moved = ids[last[moves]]
    ids[slots[moves]] = moved
    pos[moved] = slots[moves]
    del ids, moved  # the bucket exports no buffer: it may shrink
    del bucket[len(bucket) - int(removes.sum()) :]
    return read


def take(
    bucket: array, pos: np.ndarray, slots: np.ndarray, puts: np.ndarray | None = None
) -> np.ndarray:
    """A run of draws (all removals where ``puts`` is ``None``): ``take_at_once`` where
    it holds, else ``take_in_turn``. ``pos`` is of the bucket's item type."""
    puts = np.full(slots.size, REMOVE, np.int64) if puts is None else puts
    read = take_at_once(bucket, pos, slots, puts)
    return take_in_turn(bucket, memoryview(pos), slots, puts) if read is None else read


def first_takes(u: np.ndarray, lefts: np.ndarray, have: int) -> np.ndarray:
    """Line 9 for the first job over a run of rounds: round ``t`` takes I where
    ``u[t] * lefts[t] < have - (takes before t)`` (``u`` uniform, ``lefts`` what the job
    has left then, ``have`` |I| at the run's start; each take reads one of I). Found by
    iterating from the expected count: each pass fixes at least the first round the
    last pass got wrong (its count before is right), so the passes end, at the rounds
    taken in turn; a decision changes only where ``u * lefts`` lies within the run's
    length of ``have``, so two or three passes do."""
    took = u * lefts < have - np.arange(u.size) * (have / lefts[0])
    while True:
        before = np.cumsum(took) - took
        again = u * lefts < have - before
        if (again == took).all():
            return again
        took = again
