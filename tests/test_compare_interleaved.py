"""``hotset compare`` runs its systems interleaved, an epoch of each in turn, so that the
machine's load falls on all alike (run one after another, a load that rose during one
system's turn was read as that system's cost)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hotset.compare import interleaved


def _run(name: int, epochs: int, log: list[tuple[int, int]]):
    for epoch in range(epochs):
        log.append((name, epoch))
        yield
    return {"name": name, "epochs": epochs}


@given(st.lists(st.integers(0, 6), min_size=1, max_size=6))
def test_each_run_goes_an_epoch_at_a_time_in_turn(lengths):
    log: list[tuple[int, int]] = []
    rows = interleaved([_run(k, n, log) for k, n in enumerate(lengths)])
    assert rows == [{"name": k, "epochs": n} for k, n in enumerate(lengths)]  # in order
    assert sorted(log) == [(k, e) for k, n in enumerate(lengths) for e in range(n)]
    # no run starts epoch e+1 before every run that has an epoch e has run it
    for at, (_, epoch) in enumerate(log):
        behind = [(k, epoch - 1) for k, n in enumerate(lengths) if epoch >= 1 and n >= epoch]
        assert all(b in log[:at] for b in behind)
    # and the runs take turns leading a round: no run is always first
    firsts = [next(k for k, e in log if e == epoch) for epoch in range(min(lengths))]
    if len(lengths) > 1 and min(lengths) > 1:
        assert len(set(firsts)) > 1
