"""A wake-up shared by the node's DataLoader workers: a worker that waits for entries
another worker is writing (a planned hit still being admitted, samples read ahead for its
batch) sleeps until a write lands, instead of polling the store.

Writers call ``landed()`` after each write (or deletion that frees room); a waiter takes
``seen()`` *before* it looks in the store and then ``wait(seen, timeout)``: a write that
lands between the look and the wait has already moved the count, so the wait returns at
once and no wake-up is lost. A plan that stages samples for later batches says when it is
done (``finished(seq)``, whatever it staged): a batch waiting for them stops waiting then,
instead of at a time-out, and reads from storage what did not come. Made in the loader's
process and inherited by its workers (``fork``, or pickled while a worker is spawned).
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterable

#: plans remembered as finished, by ``seq`` modulo this (far more than are ever in flight)
RING = 4096


class Arrivals:
    """A count of writes, the plans that finished staging, and a condition to wait on
    them, across processes."""

    def __init__(self) -> None:
        ctx = multiprocessing.get_context()
        self._count = ctx.Value("q", 0, lock=False)
        self._done = ctx.Array("q", [-1] * RING, lock=False)  # per slot, the last seq
        self._cond = ctx.Condition()

    def seen(self) -> int:
        """The writes so far (to hand to ``wait``)."""
        return int(self._count.value)

    def landed(self) -> None:
        """A write landed: wake every waiter."""
        with self._cond:
            self._count.value += 1
            self._cond.notify_all()

    def finished(self, seq: int) -> None:
        """Plan ``seq`` has staged all it will (wakes every waiter)."""
        with self._cond:
            self._done[seq % RING] = max(self._done[seq % RING], seq)
            self._count.value += 1
            self._cond.notify_all()

    def all_finished(self, seqs: Iterable[int]) -> bool:
        """Whether every plan of ``seqs`` has finished staging."""
        return all(self._done[s % RING] >= s for s in seqs)

    def wait(self, seen: int, timeout: float) -> bool:
        """Sleep until a write lands after ``seen`` was taken, at most ``timeout`` seconds;
        whether one did."""
        if timeout <= 0:
            return self._count.value != seen
        with self._cond:
            return self._cond.wait_for(lambda: self._count.value != seen, timeout)
