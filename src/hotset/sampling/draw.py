"""The weighted draw with replacement that SHADE and SpiderCache make each epoch, at
14M-id scale: O(n) memory passes on two threads, its result a function of the generator
alone (every piece has a generator of its own, ``rng.spawn``), never of the threads'
timing. (A bucketed two-thread permutation was tried for the uniform orders and was no
faster than ``rng.permutation``: 0.58 s against 0.53 s at 14M ids.)
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from hotset.errors import ConfigError
from hotset.ids import index_dtype
from hotset.sampling.ahead import OrderAhead
from hotset.sampling.draw_kernel import cumsum_inplace, search_sorted

#: draws per piece of :func:`draw_weighted` at most (pieces run on two threads)
DRAW_PIECE = 1 << 22
#: queries per sorted search of :func:`sorted_search`
SEARCH_BLOCK = 1 << 11
#: ids a lazy shuffle (:func:`shuffle_next`) puts in their random place at a time
SHUFFLE_BLOCK = 4096


def shuffle_next(
    pool: np.ndarray, c: int, rng: np.random.Generator, block: int = SHUFFLE_BLOCK
) -> int:
    """Put at ``pool[c : c + block]`` a uniform ordered draw without replacement from
    ``pool[c:]`` (what as many steps of Fisher-Yates give): the drawn ids move into the
    block in their drawn order, the block's others into the places they left. Returns
    where the drawn prefix now ends. Called block by block as a reader takes ids, it
    shuffles the whole pool without a permutation of it up front (14M ids: 0.6-1.2 s
    at an epoch start)."""
    end = min(pool.size, c + block)
    at = c + rng.choice(pool.size - c, end - c, replace=False)
    drawn = pool[at]
    inside = at < end
    left = np.ones(end - c, bool)
    left[at[inside] - c] = False
    pool[at[~inside]] = pool[c:end][left]
    pool[c:end] = drawn
    return end


def subset(n: int, m: int, rng: np.random.Generator) -> np.ndarray:
    """``m`` distinct values of ``0 .. n - 1`` drawn uniformly, ascending. Where ``m`` is
    a small share of ``n``, without an O(n) pass: the positions of a Bernoulli(p)
    process drawn by its geometric gaps (p a little above m / n), drawn again in the
    rare case they are fewer than ``m``, then ``m`` of them at random; every position
    plays the same part, so every m-subset is as likely (``rng.choice(n, m,
    replace=False)`` permutes all of ``n`` there: 0.35 s for 1.4M of 12.6M ids)."""
    if 4 * m >= n:
        return np.sort(rng.choice(n, m, replace=False))
    p = min(1.0, (m + 6 * m**0.5 + 10) / n)
    while True:
        at = np.cumsum(rng.geometric(p, int(p * n + 6 * (p * n) ** 0.5 + 10))) - 1
        while at[-1] < n - 1:  # the process up to n (rarely not drawn far enough at once)
            at = np.concatenate([at, at[-1] + np.cumsum(rng.geometric(p, m // 4 + 10))])
        at = at[at < n]
        if at.size >= m:
            return np.sort(at[rng.choice(at.size, m, replace=False)])


class ShuffledAsRead:
    """An epoch's order put in its random order block by block as a reader reaches it
    (:func:`shuffle_next`): ``ids`` holds it, final up to where :meth:`ready` was asked
    to make it. Each part between consecutive ``ends`` (e.g. SHADE's hits, then its
    misses) is shuffled within itself. The blocks and the generator's draws do not
    depend on how far each call reads, so the order is a function of the ids and the
    generator alone: reading it batch by batch gives what ``ready(size)`` gives, a
    uniform permutation of each part. An epoch then starts without a permutation of
    all its ids (14M: 0.4-1 s). ``block``: ids put in place at a time. ``filling``: a
    thread still drawing ``ids[fill_from:]`` (``OrderAhead``; ``fill_from`` is where a
    part starts: SHADE's misses, drawn while its hits are read); the order waits for it
    there, not before."""

    def __init__(
        self, ids: np.ndarray, rng: np.random.Generator, ends: list[int] | None = None,
        block: int = SHUFFLE_BLOCK, filling: OrderAhead | None = None, fill_from: int = 0,
    ) -> None:  # fmt: skip
        self.ids, self.size = ids, int(ids.size)
        self._rng, self._block = rng, int(block)
        self._ends = [e for e in (ends or []) if 0 < e < self.size] + [self.size]
        self._done = 0  # ids[:_done] are final
        self._lock = threading.Lock()
        self._filling, self._fill_from = filling, int(fill_from)

    def drawn(self) -> None:
        """Wait for the ids still being drawn (``filling``)."""
        if self._filling is not None:
            self._filling.result()
            self._filling = None

    def __getstate__(self) -> dict:
        """Its state, its ids drawn, without the lock (a copy, a checkpoint)."""
        self.drawn()
        return {k: v for k, v in vars(self).items() if k != "_lock"}

    def __setstate__(self, state: dict) -> None:
        ids, ends, done = state.get("ids"), state.get("_ends"), state.get("_done")
        if not (isinstance(ids, np.ndarray) and ids.ndim == 1 and ids.dtype.kind == "i"
                and state.get("size") == ids.size
                and isinstance(state.get("_rng"), np.random.Generator)
                and isinstance(ends, list) and all(isinstance(e, int) for e in ends)
                and ends == sorted(set(ends)) and ends[-1:] == [ids.size] and ends[0] >= 0
                and isinstance(done, int) and 0 <= done <= ids.size
                and isinstance(state.get("_block"), int) and state["_block"] >= 1):  # fmt: skip
            raise ConfigError("a saved order shuffled as it is read is not one: its ids, "
                              "parts or position do not fit together")  # fmt: skip
        vars(self).update(state)
        self._lock = threading.Lock()
        self._filling = None

    def ready(self, stop: int) -> np.ndarray:
        """``ids``, final at least up to position ``stop``."""
        with self._lock:
            stop = min(int(stop), self.size)
            if stop > self._fill_from:
                self.drawn()
            while self._done < stop:
                end = next(e for e in self._ends if e > self._done)
                start = max([e for e in self._ends if e <= self._done], default=0)
                part = self.ids[start:end]  # a view: shuffled in place
                self._done = start + shuffle_next(part, self._done - start, self._rng, self._block)
        return self.ids

    def whole(self) -> np.ndarray:
        """The whole order, final."""
        return self.ready(self.size)


def final(order: np.ndarray | ShuffledAsRead) -> np.ndarray:
    """An order as an array, final (an order shuffled as it is read, finished)."""
    return order.whole() if isinstance(order, ShuffledAsRead) else order


def sorted_search(
    a: np.ndarray, v: np.ndarray, block: int = SEARCH_BLOCK, out: np.ndarray | None = None
) -> np.ndarray:
    """``np.searchsorted(a, v, side="right")`` for sorted ``v``, block by block: each
    block of ``block`` queries searches only the slice of ``a`` its first and last
    query bound. numpy's search restarts every query from the end of ``a`` (24 steps
    and as many cache misses at 14M ids); here the slice stays in cache (4.2M queries in
    14M: 172 to 134 ms). ``out``: where to write the positions (an integer array of
    ``v``'s size that holds them)."""
    out = np.empty(v.size, np.intp) if out is None else out
    if search_sorted(a, v, out):  # (compiled: each answer walked to from the one before)
        return out
    starts = np.arange(0, v.size, block)
    lo = np.searchsorted(a, v[starts], side="right")
    hi = np.searchsorted(a, v[np.minimum(starts + block, v.size) - 1], side="right")
    for s, i, j in zip(starts.tolist(), lo.tolist(), hi.tolist(), strict=True):
        # a[:i] <= every query of the block < a[j:]
        np.add(np.searchsorted(a[i:j], v[s : s + block], side="right"), i, out=out[s : s + block])
    return out


def draw_weighted(
    rng: np.random.Generator, p: np.ndarray, n: int, out: np.ndarray | None = None,
    overwrite: bool = False, shuffle: bool = True,
) -> np.ndarray:  # fmt: skip
    """``n`` ids drawn with replacement, id ``i`` with probability ``p[i]`` (weights
    need not sum to 1): the distribution of ``rng.choice(len(p), n, p=p)`` (and
    ``torch.multinomial``'s), in O(n) memory passes, as ``index_dtype(len(p))``.
    ``rng.choice`` looks up every draw in the cumulative array at random (cache misses:
    24 s at 10M ids); here the uniforms come sorted (normalised sums of exponentials),
    so the look-ups walk the array once (:func:`sorted_search`), and a shuffle restores
    a random order. The draws are made in an even number of equal pieces of at most
    ``DRAW_PIECE`` on two threads (numpy releases the GIL), each with a generator of its
    own (``rng.spawn``, so the result does not depend on the threads' timing): i.i.d.
    pieces make one i.i.d. draw. ``out``: where to write them (``n`` ids); ``overwrite``:
    ``p``, a float64 array of the caller's, may hold the cumulative sums (no second
    array of ``len(p)``: 112 MB at 14M ids). ``shuffle=False``: each piece is left in
    ascending order, for a caller that shuffles the draw later (:class:`ShuffledAsRead`)."""
    if overwrite and p.dtype == np.float64 and p.flags.writeable:
        cdf = cumsum_inplace(p)
    else:
        cdf = np.cumsum(p, dtype=np.float64)
    out = np.empty(n, index_dtype(len(p))) if out is None else out
    pieces = 2 * -(-n // (2 * DRAW_PIECE)) if n > DRAW_PIECE else 1
    size = -(-n // pieces) if n else 1
    starts = range(0, n, size)
    rngs = rng.spawn(len(starts))

    def piece(k: int) -> None:
        lo, g = starts[k], rngs[k]
        ids = out[lo : lo + size]
        gaps = g.standard_exponential(ids.size + 1)  # the piece's one temporary
        u = np.cumsum(gaps[:-1], out=gaps[:-1])
        u *= cdf[-1] / (u[-1] + gaps[-1])
        sorted_search(cdf, u, out=ids)
        if shuffle:
            g.shuffle(ids)

    if len(starts) > 1:
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(piece, range(len(starts))))
    elif n:
        piece(0)
    np.minimum(out, len(p) - 1, out=out)
    return out
