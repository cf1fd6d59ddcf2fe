"""``io/arrivals.py``: a worker waiting for another worker's write is woken by it, and a
write that lands between its look and its wait is never lost."""

from __future__ import annotations

import multiprocessing

from hotset.io.arrivals import Arrivals


def _land_later(arrivals: Arrivals, go) -> None:
    go.wait(30)
    arrivals.landed()


def test_a_waiter_is_woken_by_a_write_in_another_process():
    arrivals = Arrivals()
    ctx = multiprocessing.get_context("fork")
    go = ctx.Event()
    writer = ctx.Process(target=_land_later, args=(arrivals, go))
    writer.start()
    seen = arrivals.seen()
    go.set()
    assert arrivals.wait(seen, timeout=60.0)  # woken, not timed out
    assert arrivals.seen() == seen + 1
    writer.join(30)


def test_a_write_before_the_wait_is_not_lost():
    arrivals = Arrivals()
    seen = arrivals.seen()
    arrivals.landed()  # between the look and the wait
    assert arrivals.wait(seen, timeout=60.0)
    assert not arrivals.wait(arrivals.seen(), timeout=0.01)  # nothing new: times out
