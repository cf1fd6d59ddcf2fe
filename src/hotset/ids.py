"""Arrays of sample ids: the dtype that holds them."""

from __future__ import annotations

import numpy as np


def index_dtype(n: int) -> type[np.signedinteger]:
    """The dtype of ids ``0 .. n - 1``: int32 where they fit (half the bytes per id of
    int64, which matters at 14M ids), else int64."""
    return np.int32 if n - 1 <= np.iinfo(np.int32).max else np.int64


def first_seen(ids: np.ndarray, bound: int) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(ids, return_index=True)`` for ids in ``0 .. bound - 1``, without a
    sort: each id's first position by ``np.minimum.at`` over a ``bound``-long column
    (about 9x faster at 14M shuffled ids)."""
    dtype = index_dtype(max(bound, ids.size) + 1)
    first = np.full(bound, ids.size, dtype)
    np.minimum.at(first, ids, np.arange(ids.size, dtype=dtype))
    unique = np.flatnonzero(first < ids.size)
    return unique, first[unique]
