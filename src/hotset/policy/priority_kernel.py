"""``PriorityPolicy._access``'s loop compiled (numba) on a ``CompiledHeap``'s array:
the same steps, so the same decisions and the same heap, a batch in one call
(``load`` compiles it, at a policy's construction)."""

from __future__ import annotations

import numpy as np

from hotset.policy import compiled_heap as ch


def _admit(h, n, live, sizes, pins, use_pins, ids, qs, may, cap, used, bits, ties,
           hit, admitted, evicted, parked, victims):  # fmt: skip
    """The loop over the batch (``h[:n]`` the heap, ``live`` the members' levels, both
    changed in place). A position is a hit where its id is a member at its turn: a
    resident at the batch's start not evicted before it, or admitted at an earlier
    position (the Python loop's ``turn``, reached by walking every position). Returns
    (the heap's length, the used bytes, the change of the member count, and how many
    ids were admitted, evicted and parked)."""
    mask = (1 << bits) - 1
    count = na = ne = npk = 0
    for p in range(ids.size):
        i = ids[p]
        if live[i] >= 0:
            hit[p] = True
            continue
        hit[p] = False
        s = sizes[i]
        q = qs[p]
        if used + s > cap:
            if not may[p]:
                continue
            n = ch.drop_stale(h, n, live, bits)
            if n == 0:
                continue  # nothing to evict: not admitted
            top = h[0]
            v = top >> bits
            if v > q or (v == q and not ties):
                continue  # the newcomer is the least important: not admitted
            j = top & mask
            if used - sizes[j] + s <= cap and not (use_pins and pins[j] != 0):
                h[0] = q << bits | i  # the top alone makes the room: its entry's place
                ch.siftup(h, n, 0)
                live[j] = -1
                used -= sizes[j]
                evicted[ne] = j
                ne += 1
            else:  # ``top``: the least important resident, current, below i's level
                nv, before = 0, used
                while True:
                    n = ch.pop(h, n)
                    j = top & mask
                    if use_pins and pins[j] != 0:  # a plan in flight reads/writes it:
                        parked[npk] = top  # resident, out of the heap till released
                        npk += 1
                    else:
                        live[j] = -1
                        count -= 1
                        victims[nv] = top
                        nv += 1
                        used -= sizes[j]
                        if used + s <= cap:
                            break
                    n = ch.drop_stale(h, n, live, bits)
                    if n == 0:
                        break
                    top = h[0]
                    v = top >> bits
                    if v > q or (v == q and not ties):
                        break  # the rest is worth more than i
                if used + s > cap:  # refused: every one taken goes back
                    used = before
                    for k in range(nv):
                        live[victims[k] & mask] = victims[k] >> bits
                        n = ch.push(h, n, victims[k])
                    count += nv
                    continue
                n = ch.push(h, n, q << bits | i)
                count += 1
                for k in range(nv):
                    evicted[ne] = victims[k] & mask
                    ne += 1
        else:
            n = ch.push(h, n, q << bits | i)
            count += 1
        live[i] = q
        used += s
        admitted[na] = i
        na += 1
    return n, used, count, na, ne, npk


_NO_PINS = np.zeros(0, np.int32)
_ready = False


def load() -> bool:
    """Compile the loop (``compiled_heap.compile_steps``) and run it once on a batch of
    two; whether it is compiled."""
    global _ready
    if not _ready and ch.jit_all(globals(), ("_admit",)):
        heap = ch.CompiledHeap(4)
        heap.add(np.arange(2), np.arange(2))
        one = np.ones(4, np.int64)
        admit(heap, one, None, np.array([2, 3]), np.array([5, 5]), np.ones(2, bool), 2, 2, False)
        _ready = True
    return _ready


def admit(heap: ch.CompiledHeap, sizes: np.ndarray, pins: np.ndarray | None, ids: np.ndarray,
          qs: np.ndarray, may: np.ndarray, cap: int, used: int, ties: bool):  # fmt: skip
    """Decide the batch ``ids`` (levels ``qs``, ``may`` replace) on ``heap`` (its entries,
    levels, count and held entries updated); returns (hits, admitted, evicted, used
    bytes) as arrays and an int, or ``None`` where the compiled loop cannot serve (no
    numba, a key beyond int64) and nothing changed."""
    if not ch.compile_steps() or int(qs.max(initial=0)).bit_length() + heap.bits > 62:
        return None
    h = heap.array(ids.size + 1)  # (a decision adds one entry at most)
    if h is None:
        return None
    sizes, ids, qs, may = (ch.frozen(a) for a in (sizes, ids, qs, may))
    n = heap._n
    hit = np.empty(ids.size, np.bool_)
    admitted = np.empty(ids.size, np.int64)
    # the heap's entries at most, during the batch: buffers kept from batch to batch
    evicted, parked, victims = heap.scratch(n + ids.size + 1)
    heap._n, used, count, na, ne, npk = _admit(
        h, n, heap.levels, sizes, _NO_PINS if pins is None else pins, pins is not None,
        ids, qs, may, cap, used, heap.bits, ties, hit, admitted, evicted, parked, victims,
    )  # fmt: skip
    heap.count += count
    for k in parked[:npk].tolist():
        heap.park(k)
    return hit, admitted[:na], evicted[:ne].copy(), used
