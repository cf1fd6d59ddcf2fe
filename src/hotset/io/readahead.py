"""Read-ahead: the misses of the batches to come, read with the misses of this one.

Where samples are byte ranges of larger objects (tar shards: ``Storage.extents``), a
batch's misses are read as range requests of their objects (``requests.coalesce``). The
epoch's order is drawn at its start, so the planner knows which samples of those same
objects later batches will ask for: reading them in the same requests costs no request
(only bytes, and a merge only spans a gap that costs less than a request,
``CostModel.merge_gap``); read later, each would cost one. Those *staged* samples wait in
the store, under keys of their own (``STAGE``), outside the cache's budget and policy,
until the batch that needs them takes them (and deletes them). The bytes staged and not
yet consumed never exceed ``budget_bytes``; the nearest batches' samples are staged first,
from ``lead`` batches on (default: the next).

A read of an object stages its samples for the next *window* of the order only: the
positions ahead that hold ``WINDOW`` times the samples the budget holds among those the
cache does not (counted in the order, so that the cached ids first, as SHADE orders an
epoch, do not stretch a window into the misses behind them). With one read of each
object per window, and the objects' reads spread evenly over the epoch, each object
holds half a window of its samples on average, so twice would fill the budget; the
batches planned and not yet consumed hold theirs too, and of 1.2-2 times, 1.6 read each
object least often in a simulated epoch (``tests/test_readahead.py``). An object's first
read of an epoch stages a share of a window (between ``FIRST_SHARE`` and 1, by the golden
ratio), so that the objects' later reads do not all fall on the same batches. In a
paper's random order each object is then read about ``epoch / window`` times an epoch
(not once for each batch that finds room in the budget); in ``order="blocks"`` a block is
one read.

DataLoader workers run neighbouring batches at the same time, so a worker whose batch an
earlier plan stages for reads its own misses first and then waits for the staged ones,
woken as they land (``io/arrivals.py``): a shard is read once for the batches in flight,
not once by each worker running one.

A plan may also read ahead a few objects (``prefetch``, the reader's requests in flight)
that none of its own misses touches: those the nearest later batches need first, whose
samples no plan stages yet. Reads are then spread over the plans before the batches that
need them, instead of all falling on one batch while the workers running the next ones
wait.

A merged request also reads samples nobody asked for, between the wanted ones: those are
offered to the cache policy (``Policy.offer``), admitted only if it wants them, never
forced in. None of this is in the five papers: it is hotset's (issue "Requests, not
samples"), on by default where a storage has extents, ``readahead_bytes=0`` turns it off.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from hotset.io.requests import coalesce_ranges

#: the prefix of a staged sample's store key (never a sample key: those are hex digests)
STAGE = "stage:"

_NONE = np.empty(0, np.int64)
#: the golden ratio's fraction: spreads the objects' first windows evenly
_PHASE = 0.6180339887498949
#: a window, in the positions the read-ahead budget holds (module docstring)
WINDOW = 1.6
#: the most positions a window is counted on (every k-th of a longer one)
WINDOW_PROBES = 8192
#: the least share of a window an object's first read of the epoch stages (a block of
#: ``order="blocks"`` is then staged whole by one read)
FIRST_SHARE = 0.3
#: ``_last_for`` of an entry whose deletion no plan carries yet
_HELD = np.iinfo(np.int64).max


class Staging(NamedTuple):
    """A plan's part of the read-ahead (``BatchPlan``'s fields of the same names):
    later batches' misses its worker reads and stages, those earlier plans staged for it
    and the plans in flight that stage them, the staged entries its worker deletes; and
    (``free``) what its requests read through that nobody asked for."""

    stage: np.ndarray
    staged: np.ndarray
    staged_by: tuple[int, ...]
    unstage: np.ndarray
    free: np.ndarray


#: the part of a plan made without read-ahead
NOTHING_STAGED = Staging(_NONE, _NONE, (), _NONE, _NONE)


class ReadAhead:
    """Plans, per batch, which later misses to stage (``plan``) and hands each batch the
    samples staged for it (``take``); ``consumed`` frees a batch's share of the budget.

    ``extents``: per sample its object, start and end byte; ``sizes``: the bytes each
    staged sample holds in the store; ``gap``: the largest gap a request reads through;
    ``lead``: the nearest batch (after the one planned) that a plan stages for;
    ``prefetch``: objects a plan may read for later batches beside its own misses';
    ``on_disk``: which of some ids the node's disk tier holds (``Storage.on_disk``):
    those are read where they are, never staged."""

    def __init__(
        self,
        extents: tuple[np.ndarray, np.ndarray, np.ndarray],
        sizes: np.ndarray,
        gap: int,
        budget_bytes: int,
        lead: int = 1,
        prefetch: int = 0,
        on_disk: Callable[[np.ndarray], np.ndarray] | None = None,
    ) -> None:
        self.objects, self.starts, self.ends = (np.asarray(a, np.int64) for a in extents)
        self.sizes = np.asarray(sizes, np.int64)
        self.gap, self.budget, self.lead = int(gap), int(budget_bytes), max(int(lead), 1)
        self.prefetch = max(int(prefetch), 0)
        self._mean_size = max(float(self.sizes.mean()) if self.sizes.size else 1.0, 1.0)
        n_obj = int(self.objects.max()) + 1 if self.objects.size else 0
        # each object's samples by offset: the ones a merged range reads through
        self._by_offset = np.lexsort((self.starts, self.objects))
        self._obj_ptr = np.searchsorted(self.objects[self._by_offset], np.arange(n_obj + 1))
        self._n_obj = n_obj
        # per id, the batches it is staged for that have not taken it yet
        self._uses = np.zeros(self.objects.size, np.int32)
        # per id, the last batch it is staged for, whose worker deletes its staging entry
        # after taking it: it is not staged again before that batch is consumed
        self._last_for = np.full(self.objects.size, -1, np.int64)
        self._done = 0  # batches before this one are consumed
        self.outstanding = 0  # bytes staged whose last batch has not been consumed
        self._order, self._step = _NONE, 1
        self._pos, self._pos_ptr = _NONE, _NONE
        self._for: dict[int, list[np.ndarray]] = {}  # batch -> ids staged for it
        self._producer: dict[int, list[int]] = {}  # batch -> the plans (seq) staging for it
        self._held: dict[int, int] = {}  # batch -> the staged bytes its worker deletes
        self._last_use: dict[int, list[np.ndarray]] = {}  # batch -> the ids it deletes
        # ids staged for several batches, by the last of them: deleted by the first plan
        # made after it is consumed (an earlier one of them may run after it)
        self._deferred: dict[int, list[np.ndarray]] = {}
        self._drops: list[np.ndarray] = []  # those whose last batch is consumed
        # per object, the window its first read of the epoch stages (a share of a whole
        # one): the objects' reads then fall evenly over the epoch, not all at once
        golden = np.modf((np.arange(n_obj) + 1) * _PHASE)[0]
        self._phase = FIRST_SHARE + (1 - FIRST_SHARE) * golden
        self._opened = np.zeros(n_obj, bool)  # objects read this epoch
        self._on_disk = on_disk or (lambda ids: np.zeros(len(ids), bool))

    def start_epoch(self, order: np.ndarray, step: int) -> None:
        """A new epoch's order (``step`` ids per global batch); nothing is staged."""
        self.reset()
        self._order, self._step = np.asarray(order, np.int64), int(step)
        objs = self.objects[self._order]
        self._pos = np.argsort(objs, kind="stable")  # the order's positions, by object
        self._pos_ptr = np.searchsorted(objs[self._pos], np.arange(self._n_obj + 1))

    @property
    def staged(self) -> np.ndarray:
        """Per id, whether it is staged for a batch not yet planned."""
        return self._uses > 0

    def reset(self) -> None:
        """Forget what is staged (an epoch over or abandoned; the loader deletes it)."""
        self._uses[:] = 0
        self._last_for[:] = -1
        self._done = 0
        self.outstanding = 0
        for state in (self._for, self._producer, self._held, self._last_use, self._deferred):
            state.clear()
        self._drops.clear()
        self._opened[:] = False

    def _window(self, after: int, resident: Callable[[np.ndarray], np.ndarray]) -> int:
        """The positions of the order from ``after`` on that a read of an object stages
        for: as many as hold ``WINDOW`` times the samples the budget holds among those
        the cache does not hold (the module's docstring says why), counted in the order
        itself: where the hits come first (SHADE's), a window at the epoch's start would
        otherwise reach deep into its misses and fill the budget with them. Where the
        epoch ends first, the whole epoch (an object's first read stages from its first
        use on). Where that overflows the nearest come first."""
        want = WINDOW * self.budget / self._mean_size
        span = int(4 * want) + self._step
        ahead = self._order[after : after + span]
        stride = max(1, ahead.size // WINDOW_PROBES)  # a large window: counted from a sample
        misses = np.cumsum(~resident(ahead[::stride])) * stride
        if ahead.size < span and (not misses.size or misses[-1] < want):
            return max(self._order.size, self._step)
        return max(int(np.searchsorted(misses, want)) * stride, self._step)

    def take(self, index: int) -> tuple[np.ndarray, list[int], np.ndarray]:
        """For batch ``index``: the ids staged for it and the plans (seq) that staged
        them, which its worker takes from the store; and the staged entries its worker
        deletes: those staged for it alone (after taking them), and those staged for
        several batches whose last one is consumed."""
        if self._drops:
            drops = np.concatenate(self._drops)
            self._drops.clear()
            self._last_for[drops] = index  # free again once this batch is consumed
            self._held[index] = self._held.get(index, 0) + int(self.sizes[drops].sum())
            self._last_use.setdefault(index, []).append(drops)
        parts = self._for.pop(index, None)
        ids = np.unique(np.concatenate(parts)) if parts else _NONE
        self._uses[ids] -= 1
        last = self._last_use.pop(index, None)
        return ids, self._producer.pop(index, []), np.concatenate(last) if last else _NONE

    def consumed(self, index: int) -> None:
        """Batch ``index`` reached the training loop: the entries its worker deleted are
        gone, and those staged for several batches up to it are for the next plan to
        delete."""
        self.outstanding -= self._held.pop(index, 0)
        self._done = max(self._done, index + 1)
        shared = self._deferred.pop(index, None)
        if shared:
            ids = np.concatenate(shared)
            self._last_for[ids] = _HELD
            self._drops.append(ids)

    def for_plan(
        self, index: int, misses: np.ndarray, gap: int, oldest: int,
        resident: Callable[[np.ndarray], np.ndarray], seq: int,
    ) -> Staging:  # fmt: skip
        """Plan ``seq`` for batch ``index``, whose worker reads ``misses``: what it
        takes (``take``) and what it stages (``plan``), at the request gap ``gap`` (-1:
        keep); the plans staging for it that are still in flight (``oldest`` on)."""
        if gap >= 0:
            self.gap = gap
        staged, producers, unstage = self.take(index)
        stage, free = self.plan(index, np.setdiff1d(misses, staged), resident, seq)
        return Staging(stage, staged, tuple(p for p in producers if p >= oldest), unstage, free)

    def plan(
        self,
        index: int,
        misses: np.ndarray,
        resident: Callable[[np.ndarray], np.ndarray],
        seq: int,
    ) -> tuple[np.ndarray, np.ndarray]:
        """For batch ``index`` (plan ``seq``), whose worker reads ``misses`` from
        storage: the later batches' samples to read with them and stage, and the samples
        the merged requests read through that nobody asked for (to offer to the policy).
        ``resident``: which of some ids the cache holds (those are not staged). With
        ``prefetch``, the plan also reads up to that many objects that no miss of its own
        touches, those the nearest later batches need first (``_upcoming``)."""
        misses = np.unique(np.asarray(misses, np.int64))
        if misses.size:
            misses = misses[~self._on_disk(misses)]
        room = self.budget - self.outstanding
        if not self._order.size or not (misses.size or self.prefetch):
            return _NONE, _NONE
        if room <= 0:  # nothing more staged; what the requests read through is still free
            return _NONE, self._read_through(misses)
        after = (index + self.lead) * self._step
        if not misses.size and not self._unstaged(after, room).size:
            return _NONE, _NONE  # (the disk tier serves what comes next)
        width = self._window(after, resident)
        extra = self._upcoming(after, misses, resident, room, width)
        objs = np.union1d(np.unique(self.objects[misses]), extra)
        if not objs.size:
            return _NONE, _NONE
        now = index * self._step
        pos = np.sort(np.concatenate([self._later(o, after, now, width) for o in objs.tolist()]))
        self._opened[objs] = True
        cand, first = np.unique(self._order[pos], return_index=True)
        # a miss drawn again later is staged for those batches too: its bytes are read now
        keep = self._free(cand)
        cand, cand_pos = cand[keep], pos[first[keep]]
        cand, cand_pos = self._anchored(misses, extra, cand, cand_pos)
        if cand.size:
            keep = ~resident(cand)
            cand, cand_pos = cand[keep], cand_pos[keep]
            keep = ~self._on_disk(cand)
            cand, cand_pos = cand[keep], cand_pos[keep]
            nearest = np.argsort(cand_pos, kind="stable")
            fits = np.cumsum(self.sizes[cand[nearest]]) <= room
            nearest = nearest[fits]
            cand, cand_pos = self._anchored(misses, extra, cand[nearest], cand_pos[nearest])
        self._stage(cand, cand_pos, pos, seq)
        return cand, self._read_through(np.concatenate([misses, cand]))

    def _free(self, ids: np.ndarray) -> np.ndarray:
        """Which of ``ids`` may be staged: staged for no batch, and no entry of theirs
        left for a batch not yet consumed to delete."""
        return (self._uses[ids] == 0) & (self._last_for[ids] < self._done)

    def _later(self, obj: int, after: int, now: int, width: int) -> np.ndarray:
        """``obj``'s positions in the order from ``after`` on (ascending) that a read of
        it at position ``now`` stages: a window from ``now``; at its first read of the
        epoch, a share of one from its first use (an object read ahead of a block is
        staged for the whole block)."""
        mine = self._pos[self._pos_ptr[obj] : self._pos_ptr[obj + 1]]
        mine = mine[np.searchsorted(mine, after) :]
        if not mine.size:
            return mine
        if self._opened[obj]:
            return mine[: np.searchsorted(mine, now + width)]
        return mine[: np.searchsorted(mine, mine[0] + self._phase[obj] * width)]

    def _upcoming(
        self,
        after: int,
        misses: np.ndarray,
        resident: Callable[[np.ndarray], np.ndarray],
        room: int,
        width: int,
    ) -> np.ndarray:
        """Up to ``prefetch`` objects, in the order the batches from position ``after``
        on first need them, holding an id that is neither staged, cached, nor in an object
        ``misses`` already read: as far on as ``room`` could stage (``width``: a
        window)."""
        ids = self._unstaged(after, room)
        if not ids.size:
            return _NONE
        objs = self.objects[ids[~resident(ids)]]
        objs = objs[~np.isin(objs, self.objects[misses])]
        found, first = np.unique(objs, return_index=True)
        found = found[np.argsort(first, kind="stable")][: 4 * self.prefetch]
        # an object read ahead is read for its whole window at once: only those whose
        # windows fit half the room (the misses' own staging comes first)
        pending = np.array([self._pending_bytes(o, after, width) for o in found.tolist()],
                           np.int64)  # fmt: skip
        fits = np.cumsum(pending) <= room // 2
        return np.sort(found[fits][: self.prefetch])

    def _unstaged(self, after: int, room: int) -> np.ndarray:
        """The ids of the order from position ``after`` on, as far as ``room`` could
        stage, that ``prefetch`` may read ahead: neither staged nor on the node's disk."""
        if not self.prefetch:
            return _NONE
        ids = self._order[after : after + max(self._step, int(room / self._mean_size))]
        ids = ids[self._free(ids)]
        return ids[~self._on_disk(ids)] if ids.size else ids

    def _pending_bytes(self, obj: int, after: int, width: int) -> int:
        """The bytes of ``obj``'s samples in its window from ``after`` on that nobody
        stages."""
        ids = np.unique(self._order[self._later(obj, after, after, width)])
        return int(self.sizes[ids[self._uses[ids] == 0]].sum())

    def _anchored(
        self, misses: np.ndarray, extra: np.ndarray, cand: np.ndarray, cand_pos: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """The candidates that fall in a request made anyway: a miss's, or one of the
        ``extra`` objects read ahead."""
        if not cand.size:
            return cand, cand_pos
        ids = np.concatenate([misses, cand])
        group = coalesce_ranges(self.objects[ids], self.starts[ids], self.ends[ids], self.gap)[0]
        anchored = np.zeros(int(group.max()) + 1, bool)
        anchored[group[: misses.size]] = True
        keep = anchored[group[misses.size :]] | np.isin(self.objects[cand], extra)
        return cand[keep], cand_pos[keep]

    def _stage(self, ids: np.ndarray, first: np.ndarray, pos: np.ndarray, seq: int) -> None:
        """Stage ``ids`` (first needed at positions ``first``) for every batch that needs
        them among the positions ``pos`` (ascending) within the budget's horizon of their
        first: an id drawn again (importance sampling) is read once for them all."""
        if not ids.size:
            return
        by_id = np.argsort(ids)
        sorted_ids = ids[by_id]
        at = np.searchsorted(sorted_ids, self._order[pos])
        at = np.minimum(at, sorted_ids.size - 1)
        mine = sorted_ids[at] == self._order[pos]
        horizon = int(self.budget / self._mean_size) + self._step
        mine &= pos < first[by_id][at] + horizon
        batches = -(-self._order.size // self._step)
        pairs = np.unique(self._order[pos[mine]] * batches + pos[mine] // self._step)
        use_ids, use_batch = pairs // batches, pairs % batches  # by id, then batch
        np.add.at(self._uses, use_ids, 1)
        last = np.ones(use_ids.size, bool)  # each id's last batch
        last[:-1] = use_ids[1:] != use_ids[:-1]
        first_use = np.ones(use_ids.size, bool)
        first_use[1:] = use_ids[1:] != use_ids[:-1]
        ends, end_ids, alone = use_batch[last], use_ids[last], first_use[last]
        self._last_for[end_ids] = ends
        self.outstanding += int(self.sizes[end_ids].sum())
        for b in np.unique(use_batch).tolist():
            self._for.setdefault(b, []).append(use_ids[use_batch == b])
            self._producer.setdefault(b, []).append(seq)
        for b in np.unique(ends).tolist():
            mine = ends == b
            freed = end_ids[mine & alone]  # its batch deletes it
            self._last_use.setdefault(b, []).append(freed)
            self._held[b] = self._held.get(b, 0) + int(self.sizes[freed].sum())
            self._deferred.setdefault(b, []).append(end_ids[mine & ~alone])

    def _read_through(self, ids: np.ndarray) -> np.ndarray:
        """The samples inside the ranges that reading ``ids`` requests, other than
        ``ids``."""
        _, g_obj, g_start, g_end = coalesce_ranges(
            self.objects[ids], self.starts[ids], self.ends[ids], self.gap
        )
        out = []
        for o, s, e in zip(g_obj.tolist(), g_start.tolist(), g_end.tolist(), strict=True):
            mine = self._by_offset[self._obj_ptr[o] : self._obj_ptr[o + 1]]
            lo = np.searchsorted(self.starts[mine], s)
            hi = np.searchsorted(self.starts[mine], e)
            inside = mine[lo:hi]
            out.append(inside[self.ends[inside] <= e])
        free = np.concatenate(out) if out else _NONE
        return free[~np.isin(free, ids) & (self._uses[free] == 0)]
