"""Arrays of sample ids: the dtype that holds them."""

from __future__ import annotations

import numpy as np


def index_dtype(n: int) -> type[np.signedinteger]:
    """The dtype of ids ``0 .. n - 1``: int32 where they fit (half the bytes per id of
    int64, which matters at 14M ids), else int64."""
    return np.int32 if n - 1 <= np.iinfo(np.int32).max else np.int64
