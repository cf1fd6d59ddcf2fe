"""The plans in flight: handed to the workers, not yet consumed by the training loop.

With a data plane the ids a plan serves from the store and those it writes stay pinned
(never evicted, so never deleted under a worker) until the loader reports the plan
consumed. A plan that hits an id an earlier plan in flight is still writing, or writes
while earlier plans in flight free room, tells its worker to wait up to ``wait_s`` for
them; a write of an id an earlier plan in flight deletes is dropped (the two workers may
run in either order). Without a data plane (the simulator) each plan counts as executed
when it is made.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import numpy as np

from hotset.plan.batch import EMPTY, PlanReport
from hotset.policy.base import Policy


class InFlight:
    """Per id, the last plan that writes / deletes it, as its seq less ``base`` (2 B per
    id with ``dtype`` int16; -1: before ``base``, which moves up as plans are reconciled):
    in flight if at least the oldest in flight. ``plans``: (seq, the ids it pinned) of each
    plan handed out and not consumed. ``unreconciled``: the oldest plan whose report is
    still to reconcile (the ranks exchange them later), or None."""

    def __init__(
        self, policy: Policy, executes: bool, held_per_plan: int, wait_s: float,
        dtype: type = np.int16, unreconciled: Callable[[], int | None] = lambda: None,
    ) -> None:  # fmt: skip
        self.policy, self.executes, self.wait_s = policy, executes, float(wait_s)
        self.held_per_plan = held_per_plan  # the ids a plan holds (a global batch)
        self.unreconciled = unreconciled
        self.plans: deque[tuple[int, np.ndarray]] = deque()
        tracked = policy.num_samples if executes else 0
        self.writer = np.full(tracked, -1, dtype)
        self.deleter = np.full(tracked, -1, dtype)
        self.base = 0
        self.last_delete = -1  # the last plan that deleted anything
        self.seq = 0  # the next plan's

    def oldest(self) -> int:
        """The oldest plan in flight (where none is, the next one's seq)."""
        return self.plans[0][0] if self.plans else self.seq

    def deleted(self, ids: np.ndarray) -> np.ndarray:
        """Mask of ``ids`` that a plan in flight deletes (the policy's lock held)."""
        return self.deleter[ids] >= self.oldest() - self.base

    def reconcile(self, seq: int, report: PlanReport) -> int:
        """The policy learns what plan ``seq`` really did (what a later plan writes is
        that plan's to report); returns how many residents it forgot (the lock held)."""
        lost = np.concatenate([report.lost, report.absent])
        lost = lost[self.writer[lost] <= seq - self.base]
        return len(self.policy.reconcile(report.stored, lost))

    def track(
        self, reads: np.ndarray, admitted: np.ndarray, fetch: np.ndarray, deletes: np.ndarray
    ) -> tuple[float, np.ndarray, np.ndarray, int]:
        """A new plan that serves ``reads`` from the store, writes ``admitted`` and
        ``fetch`` and deletes ``deletes``: pinned until consumed; a write of an id an
        earlier plan in flight deletes is dropped and the policy forgets it. Returns how
        long its worker waits for earlier plans in flight, the writes it keeps, and how
        many residents the policy forgot. The policy's ``in_flight_ids`` keeps the most
        ids that earlier plans in flight held while one was planned."""
        if not self.executes:
            self.policy.reconcile(np.concatenate([admitted, fetch]), EMPTY)
            return 0.0, admitted, fetch, 0
        if self.seq - self.base > np.iinfo(self.writer.dtype).max:
            self._rebase()
        in_flight = self.oldest() - self.base  # as the columns count
        writes = np.concatenate([admitted, fetch])
        blocked = self.deleter[writes] >= in_flight
        forgotten = 0
        if blocked.any():
            forgotten = len(self.policy.discard(writes[blocked]))
            admitted, fetch = (a[self.deleter[a] < in_flight] for a in (admitted, fetch))
            writes = writes[~blocked]
        seq, self.seq = self.seq, self.seq + 1
        pins = np.concatenate([reads, writes])
        self.policy.pin(pins, +1)
        self.plans.append((seq, pins))
        held = (len(self.plans) - 1) * self.held_per_plan  # beside this one
        if held > self.policy.in_flight_ids:  # (the same on every rank: a DataLoader hands
            self.policy.in_flight_ids = held  # out and consumes plans in program order)
        # its worker may have to wait for earlier workers: for the reads they write, or for
        # the room their deletions free before its own writes fit
        wait = (self.writer[reads] >= in_flight).any()
        wait = self._mark(seq, writes, deletes) or wait
        return (self.wait_s if wait else 0.0), admitted, fetch, forgotten

    def track_loads(self, loads: np.ndarray, victims: np.ndarray) -> float:
        """The packages the plan just tracked puts (``loads``, room made by deleting
        ``victims``): pinned and marked as its writes and deletions; how long its worker
        may wait for the room earlier plans in flight free."""
        seq, pins = self.plans[-1]
        self.policy.pin(loads, +1)
        self.plans[-1] = (seq, np.concatenate([pins, loads]))
        return self.wait_s if self._mark(seq, loads, victims) else 0.0

    def _mark(self, seq: int, writes: np.ndarray, deletes: np.ndarray) -> bool:
        """Plan ``seq`` writes ``writes`` and deletes ``deletes``; whether its writes may
        wait for the room that earlier plans in flight free."""
        room = bool(writes.size) and self.last_delete >= self.oldest()
        self.writer[writes] = seq - self.base
        self.deleter[deletes] = seq - self.base
        if deletes.size:
            self.last_delete = seq
        return room

    def consumed(self) -> int | None:
        """Release the oldest plan in flight (the lock held); its seq, or None if none."""
        if not self.plans:
            return None
        seq, pins = self.plans.popleft()
        self.policy.pin(pins, -1)
        return seq

    def release_all(self) -> None:
        """Plans handed out and never consumed (an abandoned epoch) hold nothing now."""
        while self.plans:
            self.policy.pin(self.plans.popleft()[1], -1)

    def _rebase(self) -> None:
        """Make room for the next plan's seq in the columns: count from the oldest plan
        that can still be asked about (in flight, or its report still to reconcile);
        those before it read -1. Where that does not move (2^15 plans unreconciled) the
        columns widen to int32."""
        floor = self.oldest()
        pending = self.unreconciled()
        if pending is not None:
            floor = min(floor, pending)
        shift = floor - self.base
        if shift <= 0:
            self.writer = self.writer.astype(np.int32)
            self.deleter = self.deleter.astype(np.int32)
            return
        for a in (self.writer, self.deleter):
            if shift > np.iinfo(a.dtype).max:  # none is in flight: all before the floor
                a.fill(-1)
            else:
                np.maximum(a, shift - 1, out=a)  # those before the floor: -1
                a -= shift
        self.base = floor
