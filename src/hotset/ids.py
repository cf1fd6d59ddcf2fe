"""Arrays of sample ids: the dtype that holds them."""

from __future__ import annotations

import numpy as np


def index_dtype(n: int) -> type[np.signedinteger]:
    """The dtype of ids ``0 .. n - 1``: int32 where they fit (half the bytes per id of
    int64, which matters at 14M ids), else int64."""
    return np.int32 if n - 1 <= np.iinfo(np.int32).max else np.int64


#: positions a block-wise pass takes at a time: its temporaries stay small and are
#: reused, where one array of n is fresh memory (14M ids: 112 MB to fault in)
BLOCK = 1 << 20
#: +inf's bits as float64: every float64 at or below them (as uint64) is +0.0 .. +inf
INF_BITS = 0x7FF0000000000000


def ids_within(ids: np.ndarray, n: int) -> bool:
    """Whether ``ids`` are integer ids of ``0 .. n - 1`` (true where there are none)."""
    return ids.dtype.kind in "iu" and (ids.size == 0 or (ids.min() >= 0 and ids.max() < n))


def as_ids(ids) -> np.ndarray:
    """``ids`` as an integer array, without a copy where they are one (a job's int32 ids
    stay int32: no 14M int64 copy)."""
    ids = np.asarray(ids)
    return ids if ids.dtype.kind in "iu" else ids.astype(np.int64)


def distinct_index(ids: np.ndarray, otherwise):
    """How to index a column at ``ids`` once each: a slice where they are a range
    (ascending, distinct, contiguous), ``ids`` where ascending and distinct (one check
    of n), else ``otherwise`` (they may repeat: ``np.add.at``'s case)."""
    if not ids.size or not (ids.size == 1 or bool((ids[1:] > ids[:-1]).all())):
        return otherwise
    lo, hi = int(ids[0]), int(ids[-1]) + 1
    return slice(lo, hi) if hi - lo == ids.size else ids


def nonzero_as(mask: np.ndarray, dtype: type, block: int = BLOCK) -> np.ndarray:
    """``np.flatnonzero(mask).astype(dtype)``, block by block: no int64 array of the
    mask's true entries before the cast (14M ids: 45 against 50-200 ms here, most of
    the difference the first touch of that array)."""
    out = np.empty(int(np.count_nonzero(mask)), dtype)
    done = 0
    for start in range(0, mask.size, block):
        at = np.flatnonzero(mask[start : start + block])
        at += start
        out[done : done + at.size] = at
        done += at.size
    return out


def nonzero_at(mask: np.ndarray, ranks: np.ndarray, dtype: type, block: int = BLOCK) -> np.ndarray:
    """``np.flatnonzero(mask)[ranks]`` for ``ranks`` ascending, as ``dtype``, block by
    block: without the array of every true position (a few of 14M ids that tie)."""
    out = np.empty(ranks.size, dtype)
    done = seen = 0
    for start in range(0, mask.size, block):
        if done == ranks.size:
            break
        part = mask[start : start + block]
        count = int(np.count_nonzero(part))
        upto = int(np.searchsorted(ranks, seen + count))  # the ranks in this block
        if upto > done:
            at = np.flatnonzero(part)[ranks[done:upto] - seen]
            out[done:upto] = at + start
            done = upto
        seen += count
    return out


def first_seen(ids: np.ndarray, bound: int) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(ids, return_index=True)`` for ids in ``0 .. bound - 1``, without a
    sort: each id's first position by ``np.minimum.at`` over a ``bound``-long column
    (about 9x faster at 14M shuffled ids)."""
    dtype = index_dtype(max(bound, ids.size) + 1)
    first = np.full(bound, ids.size, dtype)
    np.minimum.at(first, ids, np.arange(ids.size, dtype=dtype))
    unique = np.flatnonzero(first < ids.size)
    return unique, first[unique]


def distinct(ids: np.ndarray) -> bool:
    """Whether no value of ``ids`` comes twice (one sort of a copy: a batch's ids)."""
    if ids.size < 2:
        return True
    order = np.sort(ids)
    return not bool((order[1:] == order[:-1]).any())


def first_positions(ids: np.ndarray) -> np.ndarray:
    """Where each distinct value of ``ids`` first comes, ascending: ``ids[first_positions
    (ids)]`` lists them in the order they come (a batch's distinct ids; a sort of the
    batch, where :func:`first_seen` takes a column of all ids)."""
    return np.sort(np.unique(ids, return_index=True)[1])


def stable_order(values: np.ndarray, block: int = 1 << 18) -> np.ndarray:
    """``np.argsort(values, kind="stable")`` for float ``values`` (as uint64), about 4x
    faster at 14M: each value's bits, turned to order as the floats do, keep their top
    ``64 - b`` bits above the value's position (``b`` bits, enough for ``n``), and numpy
    sorts these keys as plain integers (:func:`sorted_by_top_bits`). Values equal in
    those top bits tie, in position order: exact for values that come from float32 (a
    training loss); float64 values closer than ``2**(b - 52)`` relative tie (``2**-28``
    at 14M; near zero, subnormals within ``2**b`` of the smallest one). -0.0 equals 0.0
    and NaNs go last, as in numpy's sort. Beyond ``2**29`` values: ``np.argsort``."""
    n = values.size
    b = max(1, (n - 1).bit_length())
    if b > 29:  # fewer than 35 bits left: float32's sign, exponent and fraction
        return np.argsort(values, kind="stable").astype(np.uint64)
    out = sorted_by_top_bits(values, b, block)
    out &= np.uint64((1 << b) - 1)
    return out


def sorted_by_top_bits(values: np.ndarray, b: int, block: int = 1 << 18) -> np.ndarray:
    """Each of ``values`` (uint64 as they are, floats by their bits turned to order as
    the floats do: -0.0 as 0.0, NaNs last) as its top ``64 - b`` bits above its
    position, sorted: ``& (2**b - 1)`` gives the positions in order of those top bits,
    ties in position order. The keys are made ``block`` values at a time in buffers of
    that size: the only array of ``n`` is the result (14M values: no 112 MB
    temporaries to fault in)."""
    n = values.size
    floats = values.dtype.kind == "f"
    out = np.empty(n, np.uint64)
    block = max(1, min(int(block), n))
    keys, flip = np.empty(block), np.empty(block, np.uint64)
    nan = np.empty(block, bool)
    place = np.arange(block, dtype=np.uint64)
    shift, sign = np.uint64(b), np.uint64(1 << 63)
    # float64 from +0.0 to +inf (losses): the bits order as the floats do, and the keys
    # are the bits with the sign bit set (as the flip sets it) and the low ``b`` cleared
    plain = values.dtype == np.float64 and n and values.view(np.uint64).max() <= INF_BITS
    top = np.uint64(~((1 << b) - 1) & ((1 << 64) - 1))
    for start in range(0, n, block):
        m = min(block, n - start)
        f, u = flip[:m], out[start : start + m]
        if plain:
            np.bitwise_and(values[start : start + m].view(np.uint64), top, out=u)
            np.add(place[:m], np.uint64(start) | sign, out=f)
            u |= f
            continue
        if floats:
            k = keys[:m]
            np.add(values[start : start + m], 0.0, out=k)  # -0.0 becomes 0.0
            k[np.isnan(k, out=nan[:m])] = np.nan  # one NaN, positive: above +inf
            bits = k.view(np.uint64)
            np.right_shift(bits, np.uint64(63), out=f)
            np.negative(f, out=f)  # negatives: every bit flipped; the rest: the sign bit set
            f |= sign
            np.bitwise_xor(bits, f, out=u)
            u >>= shift
        else:
            np.right_shift(values[start : start + m], shift, out=u)
        u <<= shift
        np.add(place[:m], np.uint64(start), out=f)
        u |= f
    out.sort()
    return out
