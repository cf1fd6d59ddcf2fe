"""Arrays of ids (``hotset.ids``): registration's first occurrences without a sort."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hotset.ids import first_seen, index_dtype


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 50).flatmap(lambda b: st.tuples(
    st.just(b), st.lists(st.integers(0, b - 1), max_size=80))))  # fmt: skip
def test_first_seen_is_np_unique_with_first_positions(case):
    bound, ids = case
    ids = np.asarray(ids, np.int32)
    unique, first = first_seen(ids, bound)
    want_unique, want_first = np.unique(ids, return_index=True)
    assert unique.tolist() == want_unique.tolist() and first.tolist() == want_first.tolist()


def test_ids_fit_the_smallest_dtype_that_holds_them():
    assert index_dtype(2**31) is np.int32 and index_dtype(2**31 + 1) is np.int64
