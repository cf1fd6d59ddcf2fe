"""``RefCntPolicy``'s loops compiled (numba) on a ``CompiledHeap``'s array: its merge of
a batch's newcomers with the residents (``merge``, the loop of ``RefCntPolicy._merge``),
the victims it checks (``lowest``, ``put_back``) and the top made current
(``current_top``). The same steps as the Python ones (``heapq``'s algorithms, in
``compiled_heap``), so the same decisions and the same heaps, entry for entry; ``load``
compiles them, at a policy's construction."""

from __future__ import annotations

import numpy as np

from hotset.policy import compiled_heap as ch

PINNED = 1 << 32  # (``refcnt.PINNED``: a pinned resident outranks any count)


def current_top(h, n, live, refs, pins, bits):
    """``refcnt._current_top`` on ``h[:n]``: stale tops dropped, a top whose count or pin
    went up re-keyed, until the top is current; the new length."""
    mask = (1 << bits) - 1
    while n > 0:
        k = h[0]
        j = k & mask
        keyed = k >> bits
        now = refs[j] + PINNED if pins[j] != 0 else refs[j]
        if live[j] != keyed:
            n = ch.pop(h, n)
        elif now != keyed:
            live[j] = now
            h[0] = now << bits | j  # heapreplace
            ch.siftup(h, n, 0)
        else:
            break
    return n


def put_back(h, n, live, bits, keys):
    """``RefCntPolicy._put_back``: popped ``keys`` are residents again; the new length."""
    mask = (1 << bits) - 1
    for k in keys:
        live[k & mask] = k >> bits
        n = ch.push(h, n, k)
    return n


def lowest(h, n, live, refs, pins, bits, sizes, need, most, out):
    """``RefCntPolicy._lowest``: the lowest keys popped into ``out`` (each made current
    first) until they free ``need`` bytes; (the new length, how many), the count -1 with
    nothing popped where the heap runs out or a key above ``most`` comes first."""
    mask = (1 << bits) - 1
    freed = m = 0
    while freed < need:
        n = current_top(h, n, live, refs, pins, bits)
        if n == 0 or h[0] >> bits > most:
            return put_back(h, n, live, bits, out[:m]), -1
        k = h[0]
        n = ch.pop(h, n)
        live[k & mask] = -1
        out[m] = k
        m += 1
        freed += sizes[k & mask]
    return n, m


def heapify(x, n):  # heapq.heapify of x[:n]
    for pos in range(n // 2 - 1, -1, -1):
        ch.siftup(x, n, pos)


def merge(h, n, live, refs, pins, bits, sizes, cap, used, mine, m, end, tail, at, keys,
          counts, was_hit, tail_sizes, apart, gone, turned, admitted):  # fmt: skip
    """The loop of ``RefCntPolicy._merge`` over the batch's reads ``tail`` (positions;
    their ids ``at``, keys, counts after the read, whether each was a hit, sizes), the
    residents in ``h[:n]`` and this batch's newcomers in ``mine[:m]`` (heapified here,
    ``end`` its sentinel). Writes the victims' keys in turn (``~key`` for a resident's)
    to ``gone``, the hits evicted before their turn to ``turned`` and, not ``apart``,
    the admitted ids to ``admitted``. Returns (``n``, ``m``, the used bytes, the
    victims popped from the residents less the newcomers pushed into them, and how many
    gone, turned and admitted)."""
    mask = (1 << bits) - 1
    heapify(mine, m)
    ng = nt = na = residents = 0
    for x in range(tail.size):
        i, k, r, s = at[x], keys[x], counts[x], tail_sizes[x]
        if was_hit[x]:
            was = live[i]
            r = refs[i]
            if r > 0:
                r -= 1  # this read consumes one reference, in its turn
                refs[i] = r
            lv = r + PINNED if pins[i] != 0 else r
            if was >= 0:
                if was != lv:
                    live[i] = lv
                    n = ch.push(h, n, lv << bits | i)
                continue
            turned[nt] = tail[x]
            nt += 1
            if r <= 0 or s > cap:
                continue
            k = lv << bits | i
        if used + s > cap:
            mark = ng
            while True:  # the lower of the two tops, while it is worth no more than i
                b = mine[0]
                if n > 0 and h[0] < b:
                    t = h[0]
                    j = t & mask
                    key = t >> bits
                    now = refs[j] + PINNED if pins[j] != 0 else refs[j]
                    if live[j] != key or now != key:
                        n = current_top(h, n, live, refs, pins, bits)
                        continue  # (stale, or its count went up: looked at again)
                    if key > r:
                        break
                    n = ch.pop(h, n)
                    live[j] = -1
                    residents += 1
                    gone[ng] = ~t
                    ng += 1
                elif b == end or b >> bits > r:
                    break
                else:
                    j = b & mask
                    m = ch.pop(mine, m)
                    gone[ng] = b
                    ng += 1
                used -= sizes[j]
                if used + s <= cap:
                    break
            if used + s > cap:  # the rest is worth more than i: what it took goes back
                for q in range(mark, ng):
                    t = gone[q]
                    if t < 0:
                        t = ~t
                        live[t & mask] = t >> bits
                        n = ch.push(h, n, t)
                        residents -= 1
                    else:
                        m = ch.push(mine, m, t)
                    used += sizes[t & mask]
                ng = mark
                continue
        used += s
        if apart:
            m = ch.push(mine, m, k)
        else:
            live[i] = k >> bits
            n = ch.push(h, n, k)
            residents -= 1
            admitted[na] = i
            na += 1
    return n, m, used, residents, ng, nt, na


_ready = False


def load() -> bool:
    """Compile these loops (after ``compiled_heap``'s steps, which they call) and run
    each that the policy calls once, with the types it calls them with (a first call
    with others would compile, or load from numba's cache, in a batch); whether they
    are compiled."""
    global _ready
    if not _ready and ch.jit_all(globals(), ("current_top", "put_back", "lowest", "heapify",
                                             "merge")):  # fmt: skip
        one, none = np.ones(4, np.int64), np.zeros(4, np.int32)
        sizes = ch.frozen(one)  # (read-only, as the policy passes them)
        h, live = np.array([5, 0, 0, 0]), np.array([1, -1, -1, -1])
        n, _ = lowest(h, 1, live, one, none, 2, sizes, 1, 9, np.zeros(2, np.int64))
        n = put_back(h, n, live, 2, np.zeros(0, np.int64))
        e = np.zeros(0, np.int64)
        merge(h, n, live, one, none, 2, sizes, 2, 0, np.array([8, 0]), 1, 8, e, e, e, e,
              np.zeros(0, np.bool_), e, True, e, e, e)  # fmt: skip
        _ready = True
    return _ready
