"""iCACHE's loops compiled (numba). The H-cache's admissions for a batch on a
``CompiledHeap``'s array: the loop of ``ICachePolicy._admit_h_in_turn`` with
``_admit_h`` and ``_replace_least`` inlined, where no rebuild runs (one heap; during a
rebuild the Python loop serves, with its shadow heap). The same steps as the Python ones
(``heapq``'s algorithms, in ``compiled_heap``; a push that leaves more stale entries than
``KeyedHeap.compact`` allows rebuilds the heap as ``_heap_of_members`` does), so the same
decisions and the same heap, entry for entry. The L-cache's walk of an order for its
victims (``candidates``, ``ICachePolicy._l_candidates``) and the walks of packages
loaded in turn (``settle_in_turn``, ``ICachePolicy._walks_in_turn``). ``load`` compiles
them."""

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


def candidates(ids, at, start, end, where, least, unused, pinned, sizes, nbytes, out):
    """``ICachePolicy._l_candidates``: the live entries of the order ``ids[start:end]``
    (``at``: each id's last entry; live while an id's place in ``where`` is ``least`` or
    later) that are unpinned (``unused``: and unused), in order, written to ``out`` until
    their bytes reach ``nbytes`` (the one that crosses it the last). Returns (where the
    walk may start next time: past the entries at the front that are dead, or
    ``unused``: not live and unused; how many were written)."""
    if nbytes <= 0:
        return start, 0
    while start < end:
        i = ids[start]
        if at[i] == start and where[i] >= least and (not unused or where[i] == FRESH):
            break
        start += 1
    got, k = 0, 0
    for p in range(start, end):
        if got >= nbytes:
            break
        i = ids[p]
        if at[i] == p and where[i] >= least and pinned[i] == 0 and (
            not unused or where[i] == FRESH
        ):
            out[k] = i
            k += 1
            got += sizes[i]
    return start, k


def settle_in_turn(s0, m0, s1, m1, ids, served, pins, sizes, lasts, cum, used, cap, victims):
    """The walks of ``ICachePolicy._settle_in_turn``: the packages ``ids[.. lasts[0]],
    ..`` (their bytes summed up in ``cum``) each make room in turn from the used stream
    ``s0[:m0]``, then the unused ``s1[:m1]``; then each package's unpinned ids join the
    end of the stream of their kind (``served``: used). Writes the victims to ``victims``;
    returns how many, and their bytes."""
    k0 = k1 = nv = 0
    freed = first = 0
    for t in range(lasts.size):
        last = lasts[t]
        need = cum[last] - (cum[first - 1] if first else 0)
        over, got = used + need - cap, 0
        while got < over and k0 < m0:
            victims[nv] = s0[k0]
            got += sizes[s0[k0]]
            nv += 1
            k0 += 1
        while got < over and k1 < m1:
            victims[nv] = s1[k1]
            got += sizes[s1[k1]]
            nv += 1
            k1 += 1
        used += need - got
        freed += got
        for x in range(first, last + 1):
            if pins[ids[x]] == 0:
                if served[ids[x]]:
                    s0[m0] = ids[x]
                    m0 += 1
                else:
                    s1[m1] = ids[x]
                    m1 += 1
        first = last + 1
    return nv, freed


_ready = False


def load() -> bool:
    """Compile the loops (after ``compiled_heap``'s steps, which they call) and run each
    once with the types iCACHE passes (int32 levels, int8 places, the orders' int32 ids:
    below 2**31 ids); whether they are compiled."""
    global _ready
    names = ("members", "least", "admit_in_turn", "candidates", "settle_in_turn")
    if not _ready and ch.jit_all(globals(), names):
        # one resident (id 2, level 1) replaced by id 1 (level 3); id 3 then refused
        h, live = np.array([6, 0, 0, 0, 0, 0]), np.array([-1, -1, 1, -1], np.int32)
        where, three = np.array([0, 0, 1, 0], np.int8), np.full(4, 3, np.int32)
        out = [np.zeros(4, np.int64) for _ in range(5)]
        hot, sizes, ids = (ch.frozen(a) for a in (  # (read-only, as iCACHE passes them)
            np.ones(4, np.bool_), np.ones(4, np.int64), np.array([1, 3])))
        admit_in_turn(h, 1, live, 1, 0, 2, where, hot, three, sizes, np.zeros(4, np.int32),
                      ids, np.arange(2), 1, 1, 1, np.zeros(2, np.bool_), *out)  # fmt: skip
        order, at = ch.frozen(np.array([0, 1], np.int32)), ch.frozen(np.array([0, 1], np.int32))
        candidates(order, at, 0, 2, ch.frozen(where), USED, True, ch.frozen(three), sizes, 1,
                   out[0])  # fmt: skip
        two = np.zeros(2, np.int64)
        settle_in_turn(two, 1, np.zeros(2, np.int64), 0, ids, ch.frozen(np.zeros(4, np.bool_)),
                       ch.frozen(three), sizes, np.array([0]), ch.frozen(two + 1), 1, 1, out[1])
        _ready = True
    return _ready
