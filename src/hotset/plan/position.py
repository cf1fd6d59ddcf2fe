"""Where a planner stands in an epoch, as its saved state records it."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import numpy as np

from hotset.plan.batch import EMPTY, BatchPlan

#: consumed plans a planner keeps beside those in flight, for a state taken with
#: ``trained`` behind the batches served (a trainer that fetches ahead)
KEPT_PLANS = 8


class EpochPosition:
    """The epoch being planned (``epoch``), its ``order`` as drawn at its start (and
    ``ready``, which makes an order the sampler shuffles as it is read final up to a
    position), the ids that pad it to whole ranks (``pad``), its batches handed to the
    training loop (``consumed``), its latest plans (``made``: those in flight and the
    last ``KEPT_PLANS`` consumed); a loaded state's rest of an epoch (``resume``: epoch,
    order, consumed) and the plans it serves again as made (``replay``)."""

    def __init__(self, batch_size: int, world: int, drop_last: bool) -> None:
        self.batch_size, self.world, self.drop_last = batch_size, world, drop_last
        self.epoch, self.order, self.pad, self.consumed = -1, EMPTY, 0, 0
        self.ready: Callable[[int], object] | None = None
        self.made: deque[BatchPlan] = deque()
        self.resume: tuple[int, np.ndarray, int] | None = None
        self.replay: list[BatchPlan] = []
        self.loaded = False  # a state was loaded: the next reconciliation refills

    def batches(self, order: np.ndarray) -> int:
        """Global batches in an epoch of ``order``."""
        return -(-order.size // (self.batch_size * self.world))

    def batches_left(self, epoch: int, drawn: int) -> int:
        """A rank's batches in ``epoch`` of ``drawn`` ids (the global list's length with
        ranks: padded by wrapping, or cut, to whole shards); in a loaded state's epoch,
        those left of it."""
        if self.resumes(epoch):
            _, order, consumed = self.resume
            return self.batches(order) - consumed
        if self.world > 1:
            drawn = drawn // self.world if self.drop_last else -(-drawn // self.world)
        return drawn // self.batch_size if self.drop_last else -(-drawn // self.batch_size)

    def resumes(self, epoch: int) -> bool:
        """Whether ``epoch`` is a loaded state's, not yet begun."""
        return self.resume is not None and self.resume[0] == epoch

    def begin(self, epoch: int, order: np.ndarray, first: int, ready) -> None:
        self.resume = None
        self.made.clear()
        self.epoch, self.order, self.consumed, self.ready = epoch, order, first, ready

    def consumed_one(self, in_flight: int) -> None:
        self.consumed += 1
        while len(self.made) > in_flight + KEPT_PLANS:
            self.made.popleft()

    def saved(
        self, epoch: int, trained: int | None
    ) -> tuple[int, np.ndarray, int, int, list[BatchPlan]]:
        """(epoch, order, consumed, pad, plans made ahead) as a state taken now saves
        them: an epoch ``set_epoch`` named but not begun starts afresh, and after an
        epoch's last batch the next epoch does; ``trained``: at most that many of the
        epoch's batches count as consumed."""
        order, consumed = self.order, self.consumed
        if self.ready is not None:
            self.ready(order.size)
        if trained is not None:
            consumed = min(consumed, int(trained))
        made, pad = [p for p in self.made if p.index >= consumed], self.pad
        if self.resumes(epoch):
            _, order, consumed = self.resume  # loaded, not yet served: as loaded
            made = self.replay
        elif self.epoch != epoch:
            order, consumed, pad = EMPTY, 0, 0  # set_epoch moved on: not begun
        elif consumed >= self.batches(order):
            epoch, order, consumed, pad = epoch + 1, EMPTY, 0, 0  # over: the next is due
        if not order.size or (made and made[0].index != consumed):
            made = []  # (fetched ahead of ``trained`` further than kept: planned again)
        return epoch, order, consumed, pad, made

    def load(self, epoch: int, order: np.ndarray, consumed: int, replay: list, pad: int):
        self.replay, self.pad, self.loaded = replay, pad, True
        if order.size:
            self.resume = (epoch, order, consumed)
