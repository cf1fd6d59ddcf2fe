"""Arrays of ids (``hotset.ids``): registration's first occurrences without a sort, IIS's
stable order of losses by one integer sort."""

from __future__ import annotations

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from hotset.ids import (
    distinct,
    first_seen,
    ids_within,
    index_dtype,
    nonzero_as,
    nonzero_at,
    sorted_by_top_bits,
    stable_order,
)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 50).flatmap(lambda b: st.tuples(
    st.just(b), st.lists(st.integers(0, b - 1), max_size=80))))  # fmt: skip
def test_first_seen_is_np_unique_with_first_positions(case):
    bound, ids = case
    ids = np.asarray(ids, np.int32)
    unique, first = first_seen(ids, bound)
    want_unique, want_first = np.unique(ids, return_index=True)
    assert unique.tolist() == want_unique.tolist() and first.tolist() == want_first.tolist()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(-5, 40), max_size=60))
def test_distinct_says_whether_no_id_comes_twice(ids):
    ids = np.asarray(ids, np.int64)
    assert distinct(ids) == (np.unique(ids).size == ids.size)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.booleans(), max_size=200), st.integers(1, 40))
def test_nonzero_as_is_flatnonzero_cast_block_by_block(mask, block):
    mask = np.asarray(mask, bool)
    got = nonzero_as(mask, np.int32, block)
    assert got.dtype == np.int32 and got.tolist() == np.flatnonzero(mask).tolist()


def test_ids_fit_the_smallest_dtype_that_holds_them():
    assert index_dtype(2**31) is np.int32 and index_dtype(2**31 + 1) is np.int64


FLOAT32 = st.floats(width=32, allow_nan=True, allow_infinity=True)
NEAR_ZERO = [0.0, 5e-324, -5e-324, 1e-310]  # subnormals: ulps of 2**-1074
#: NaNs of both signs and two payloads
NANS = np.array([0x7FC00000, 0xFFC00000, 0x7FC00123], np.uint32).view(np.float32).tolist()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(FLOAT32, st.sampled_from([0.0, -0.0, 1.5, -1.5, *NANS])), max_size=300))
def test_stable_order_is_the_stable_argsort_of_float32_values(values):
    """Losses come as float32: ties (repeats, -0.0 and 0.0, NaNs of any sign) keep their
    positions' order, as numpy's stable argsort leaves them."""
    values = np.asarray(values, np.float32).astype(np.float64)
    want = np.argsort(values, kind="stable").tolist()
    assert stable_order(values).tolist() == want
    assert stable_order(values, block=7).tolist() == want  # keys made 7 at a time


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.floats(-1e300, 1e300), st.sampled_from(NEAR_ZERO)), min_size=1,
                max_size=300))
@example([5e-324, 0.0])  # CI's first draw: a subnormal ties with zero
def test_stable_order_of_float64_values_differs_only_between_near_ties(values):
    """float64 values: where the order differs from the stable argsort, the values differ
    in their last ``b`` bits only (``b``: the bits of the positions): by less than
    ``2**(b - 52)`` of their size, or ``2**b`` of the smallest subnormal near zero."""
    values = np.asarray(values, np.float64)
    got = values[stable_order(values, block=5).astype(np.int64)]
    want = values[np.argsort(values, kind="stable")]
    b = max(1, (values.size - 1).bit_length())
    bound = np.maximum(np.abs(got), np.abs(want)) * 2.0 ** (b - 51) + 2.0 ** (b - 1074)
    assert np.all(np.abs(got - want) <= bound)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.floats(0, width=32), st.sampled_from([0.0, 1e-45, np.inf])),
                min_size=1, max_size=300))  # fmt: skip
def test_keys_of_float64_losses_are_those_their_bits_flipped_make(values):
    """float64 values from +0.0 to +inf (losses) take the keys' short path (their bits as
    they are): the same keys as the flipped bits of float32 values give."""
    values = np.asarray(values, np.float32)
    b = max(1, (values.size - 1).bit_length())
    want = sorted_by_top_bits(values, b, 7).tolist()  # float32: the bits flipped
    assert sorted_by_top_bits(values.astype(np.float64), b, 7).tolist() == want


@settings(max_examples=150, deadline=None)
@given(st.lists(st.booleans(), max_size=200), st.integers(1, 9), st.data())
def test_nonzero_at_is_flatnonzero_at_ranks_block_by_block(mask, block, data):
    mask = np.array(mask, bool)
    count = int(mask.sum())
    ranks = np.array(sorted(data.draw(st.sets(st.integers(0, max(0, count - 1)), max_size=count))),
                     np.int64) if count else np.zeros(0, np.int64)  # fmt: skip
    got = nonzero_at(mask, ranks, np.int32, block)
    assert got.dtype == np.int32 and got.tolist() == np.flatnonzero(mask)[ranks].tolist()


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(-3, 12), max_size=10), st.integers(0, 10))
def test_ids_within_is_every_id_in_0_to_n(ids, n):
    """The range check storages, the score board and SpiderCache's received scores share."""
    arr = np.asarray(ids, np.int64)
    assert ids_within(arr, n) == all(0 <= i < n for i in ids)
    assert not ids_within(arr.astype(np.float64), n) or not ids  # ids are integers
