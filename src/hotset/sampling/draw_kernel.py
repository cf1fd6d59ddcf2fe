"""The passes over every id at an importance sampler's epoch start, compiled (numba)
and run without the GIL, so that the planner's other thread (SHADE's misses drawn while
its hits are read) does not stall the one that serves the first batch:

* ``split_weights``: SHADE's weights (PADS, FAST'23 section 4.2.1: each id's score, at
  least 1e-12, times ``repetition`` where the cache holds it) split into the held ids,
  their weights, and the misses' weights (the held ones' zero), in one pass where
  numpy's steps take six;
* ``cumsum_inplace``: a cumulative sum written over its input. numpy's holds the GIL
  where its output is its input (0.1 s at 30M ids);
* ``search_sorted``: the draw's look-ups of its sorted uniforms in the cumulative sums,
  each from the one before (numpy's binary searches, block by block, were a third of
  SHADE's epoch start at 100M ids).

The same values as numpy's steps, which serve where numba is missing. ``load``
compiles them (a sampler's construction)."""

from __future__ import annotations

import threading

import numpy as np

from hotset.ids import nonzero_as


def _split(score, cached, r, w, held, w_held, first):
    """``w[i]``: ``max(score[i], 1e-12)`` (NaN kept, as ``np.maximum`` keeps it) for the
    ids not ``cached``, 0 for the others, which go to ``held`` (their ids: ``first + i``)
    with their weights times ``r`` in ``w_held``."""
    k = 0
    for i in range(score.size):
        s = score[i]
        if s < 1e-12:
            s = 1e-12
        if cached[i]:
            held[k] = first + i
            w_held[k] = s * r
            w[i] = 0.0
            k += 1
        else:
            w[i] = s


def _cumsum(p):
    """``np.cumsum(p, out=p)``: the same additions in the same order."""
    acc = 0.0
    for i in range(p.size):
        acc += p[i]
        p[i] = acc


def _search(a, v, out):
    """``out[k] = np.searchsorted(a, v[k], side="right")`` for ``v`` ascending: each
    answer found by galloping from the one before (a walk that stays in cache)."""
    n = a.size
    j = 0  # the answer for the query before: this one's is no less
    for k in range(v.size):
        q = v[k]
        if j < n and a[j] <= q:
            lo, step = j, 1  # a[lo] <= q
            hi = lo + 1
            while hi < n and a[hi] <= q:
                lo, step = hi, 2 * step
                hi = lo + step
            hi = min(hi, n)  # the first a > q lies in (lo, hi]
            lo += 1
            while lo < hi:
                mid = (lo + hi) >> 1
                if a[mid] <= q:
                    lo = mid + 1
                else:
                    hi = mid
            j = lo
        out[k] = j


_ready = False


def load() -> bool:
    """Compile the passes (without the GIL) and run each once with the types the
    samplers pass; whether they are compiled."""
    global _ready
    from hotset.policy.compiled_heap import njit_all  # (policies import the samplers)

    if not _ready and njit_all(globals(), ("_split", "_cumsum", "_search"), nogil=True):
        w = np.ones(3)
        for dtype in (np.int32, np.int64):  # (index_dtype: below 2**31 ids, or not)
            _split(w, np.ones(3, np.bool_), 1.0, np.empty(3), np.empty(3, dtype), np.empty(3), 0)
            _search(w, w, np.empty(3, dtype))
        _search(w, w, np.empty(3, np.intp))
        _cumsum(w)
        _ready = True
    return _ready


def split_weights(
    score: np.ndarray, cached: np.ndarray, repetition: float, w: np.ndarray, dtype: type
) -> tuple[np.ndarray, np.ndarray]:
    """The held ids (``cached``'s, as ``dtype``) and their weights; the misses' weights
    written in ``w`` (a float64 array of ``score``'s size)."""
    held = np.empty(int(np.count_nonzero(cached)), dtype)
    if _ready:  # each half of the ids on a thread of its own
        w_held, half = np.empty(held.size), score.size // 2
        k = int(np.count_nonzero(cached[:half]))
        second = threading.Thread(target=_split, args=(
            score[half:], cached[half:], float(repetition), w[half:], held[k:], w_held[k:], half))
        second.start()
        _split(score[:half], cached[:half], float(repetition), w[:half], held[:k], w_held[:k], 0)
        second.join()
        return held, w_held
    np.maximum(score, 1e-12, out=w)
    held[:] = nonzero_as(cached, dtype)
    if repetition != 1.0:
        w[held] *= repetition
    w_held = w[held]
    w[held] = 0.0
    return held, w_held


def cumsum_inplace(p: np.ndarray) -> np.ndarray:
    """``p`` (float64) made its cumulative sum."""
    if _ready and p.flags.writeable:
        _cumsum(p)
        return p
    return np.cumsum(p, out=p)


def search_sorted(a: np.ndarray, v: np.ndarray, out: np.ndarray) -> bool:
    """``out[:] = np.searchsorted(a, v, side="right")`` for ``a`` and ``v`` ascending
    float64 numbers; whether it was done (not where numba is missing, or the last
    values are not finite: numpy's order of NaN is the caller's)."""
    finite = all(x.size == 0 or np.isfinite(x[-1]) for x in (a, v))
    if not (_ready and finite and a.dtype == v.dtype == np.float64 and out.dtype.kind == "i"):
        return False
    _search(a, v, out)
    return True
