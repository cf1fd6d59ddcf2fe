"""iCACHE's H-cache admissions for a batch compiled (numba) on a ``CompiledHeap``'s
array: the loop of ``ICachePolicy._admit_h_in_turn`` with ``_admit_h`` and
``_replace_least`` inlined, where no rebuild runs (one heap; during a rebuild the
Python loop serves, with its shadow heap). The same steps as the Python ones
(``heapq``'s algorithms, in ``compiled_heap``; a push that leaves more stale entries than
``KeyedHeap.compact`` allows rebuilds the heap as ``_heap_of_members`` does), so the same
decisions and the same heap, entry for entry; ``load`` compiles it."""

from __future__ import annotations

import numpy as np

from hotset.policy import compiled_heap as ch

PLACES = NONE, H, FRESH, USED = 0, 1, 2, 3  # an id's place in ``ICachePolicy._where``


def members(h, live, bits):
    """``KeyedHeap._heap_of_members``: the heap made again of the members' keys alone,
    ascending; its length."""
    m = 0
    for i in range(live.size):
        if live[i] >= 0:
            h[m] = np.int64(live[i]) << bits | i
            m += 1
    h[:m].sort()
    return m


def least(h, n, live, bits):
    """``_least_level``: (the heap's length with its stale top entries dropped, the
    least important resident's level or -1)."""
    n = ch.drop_stale(h, n, live, bits)
    return n, (h[0] >> bits if n > 0 else -1)


def admit_in_turn(h, n, live, count, slack, bits, where, is_h, level, sizes, pins, ids,
                  rest, cap, used, top, hits, take, turned, evicted, parked, popped):  # fmt: skip
    """The loop of ``_admit_h_in_turn`` over the batch's positions ``rest`` (``top``: the
    least important level at its start), the heap ``h[:n]`` of ``count`` members with
    their levels ``live``; ``where`` and the outputs written in place (``take``: the
    ids admitted, ``turned``: positions of L-misses, ``evicted``, and ``parked``: pinned
    tops held out of the heap). Returns (``n``, ``count``, the H-cache's used bytes, how
    many taken, turned, evicted and parked, and whether the heap was rebuilt: then the
    entries held out before the batch are back in it, as ``KeyedHeap._parked`` cleared,
    and the parked are those since)."""
    mask = (1 << bits) - 1
    nt = ntu = ne = npk = 0
    rebuilt = False
    for x in range(rest.size):
        p = rest[x]
        i = ids[p]
        if where[i] == H:
            hits[p] = True
            continue
        hits[p] = False
        if not is_h[i]:
            turned[ntu] = p
            ntu += 1
            continue
        s = sizes[i]
        q = np.int64(level[i])
        if used + s > cap:
            if s > cap or q <= top:
                continue  # refused at once
            if top >= 0:  # ``top``: the heap's first entry, current
                j = h[0] & mask
                if pins[j] == 0 and used - sizes[j] + s <= cap:  # ``_replace_least``
                    h[0] = q << bits | i
                    ch.siftup(h, n, 0)
                    live[j] = -1  # (its place in ``where`` and the list: ``_evicted``)
                    where[j] = NONE
                    evicted[ne] = j
                    ne += 1
                    live[i] = q
                    where[i] = H
                    used += s - sizes[j]
                    take[nt] = i
                    nt += 1
                    n, top = least(h, n, live, bits)
                    continue
        # ``_admit_h(i)``: room made by the least important residents, each below ``q``
        if s <= cap:
            npop, before = 0, used
            while used + s > cap:
                n = ch.drop_stale(h, n, live, bits)
                if n == 0 or h[0] >> bits >= q:
                    break
                k = h[0]
                j = k & mask
                n = ch.pop(h, n)
                if pins[j] != 0:  # a plan in flight holds it: resident, held out
                    parked[npk] = k
                    npk += 1
                    continue
                live[j] = -1
                count -= 1
                popped[npop] = k
                npop += 1
                used -= sizes[j]
            if used + s > cap:  # no room could be made: every one popped goes back
                used = before
                for y in range(npop):
                    k = popped[y]
                    live[k & mask] = k >> bits
                    count += 1
                    n = ch.push(h, n, k)
                    if n > 2 * count + slack:
                        n, npk, rebuilt = members(h, live, bits), 0, True
            else:
                for y in range(npop):
                    j = popped[y] & mask
                    where[j] = NONE
                    evicted[ne] = j
                    ne += 1
                where[i] = H
                used += s
                live[i] = q
                count += 1
                n = ch.push(h, n, q << bits | i)
                if n > 2 * count + slack:
                    n, npk, rebuilt = members(h, live, bits), 0, True
                take[nt] = i
                nt += 1
        n, top = least(h, n, live, bits)
    return n, count, used, nt, ntu, ne, npk, rebuilt


_ready = False


def load() -> bool:
    """Compile the loop (after ``compiled_heap``'s steps, which it calls) and run it once
    with the types iCACHE passes (int32 levels, int8 places); whether it is compiled."""
    global _ready
    if not _ready and ch.jit_all(globals(), ("members", "least", "admit_in_turn")):
        # one resident (id 2, level 1) replaced by id 1 (level 3); id 3 then refused
        h, live = np.array([6, 0, 0, 0, 0, 0]), np.array([-1, -1, 1, -1], np.int32)
        where, three = np.array([0, 0, 1, 0], np.int8), np.full(4, 3, np.int32)
        out = [np.zeros(4, np.int64) for _ in range(5)]
        hot, sizes, ids = (ch.frozen(a) for a in (  # (read-only, as iCACHE passes them)
            np.ones(4, np.bool_), np.ones(4, np.int64), np.array([1, 3])))
        admit_in_turn(h, 1, live, 1, 0, 2, where, hot, three, sizes, np.zeros(4, np.int32),
                      ids, np.arange(2), 1, 1, 1, np.zeros(2, np.bool_), *out)  # fmt: skip
        _ready = True
    return _ready
