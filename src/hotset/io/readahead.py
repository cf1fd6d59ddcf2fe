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
from ``lead`` batches on: DataLoader workers run neighbouring batches at the same time
(batch ``b + num_workers`` runs on ``b``'s worker, after it), so samples staged for a
nearer batch would mostly arrive after it had read them itself.

A merged request also reads samples nobody asked for, between the wanted ones: those are
offered to the cache policy (``Policy.offer``), admitted only if it wants them, never
forced in. None of this is in the five papers: it is hotset's (issue "Requests, not
samples"), on by default where a storage has extents, ``readahead_bytes=0`` turns it off.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from hotset.io.requests import coalesce_ranges

#: the prefix of a staged sample's store key (never a sample key: those are hex digests)
STAGE = "stage:"

_NONE = np.empty(0, np.int64)


class ReadAhead:
    """Plans, per batch, which later misses to stage (``plan``) and hands each batch the
    samples staged for it (``take``); ``consumed`` frees a batch's share of the budget.

    ``extents``: per sample its object, start and end byte; ``sizes``: the bytes each
    staged sample holds in the store; ``gap``: the largest gap a request reads through;
    ``lead``: the nearest batch (after the one planned) that a plan stages for."""

    def __init__(
        self,
        extents: tuple[np.ndarray, np.ndarray, np.ndarray],
        sizes: np.ndarray,
        gap: int,
        budget_bytes: int,
        lead: int = 1,
    ) -> None:
        self.objects, self.starts, self.ends = (np.asarray(a, np.int64) for a in extents)
        self.sizes = np.asarray(sizes, np.int64)
        self.gap, self.budget, self.lead = int(gap), int(budget_bytes), max(int(lead), 1)
        n_obj = int(self.objects.max()) + 1 if self.objects.size else 0
        # each object's samples by offset: the ones a merged range reads through
        self._by_offset = np.lexsort((self.starts, self.objects))
        self._obj_ptr = np.searchsorted(self.objects[self._by_offset], np.arange(n_obj + 1))
        self._n_obj = n_obj
        self.staged = np.zeros(self.objects.size, bool)  # staged, its batch not planned yet
        self.outstanding = 0  # bytes staged whose batch has not been consumed
        self._order, self._step = _NONE, 1
        self._pos, self._pos_ptr = _NONE, _NONE
        self._for: dict[int, list[np.ndarray]] = {}  # batch -> ids staged for it
        self._producer: dict[int, int] = {}  # batch -> the last plan (seq) staging for it
        self._held: dict[int, int] = {}  # batch -> bytes staged for it, until consumed

    def start_epoch(self, order: np.ndarray, step: int) -> None:
        """A new epoch's order (``step`` ids per global batch); nothing is staged."""
        self.reset()
        self._order, self._step = np.asarray(order, np.int64), int(step)
        objs = self.objects[self._order]
        self._pos = np.argsort(objs, kind="stable")  # the order's positions, by object
        self._pos_ptr = np.searchsorted(objs[self._pos], np.arange(self._n_obj + 1))

    def reset(self) -> None:
        """Forget what is staged (an epoch over or abandoned; the loader deletes it)."""
        self.staged[:] = False
        self.outstanding = 0
        self._for.clear()
        self._producer.clear()
        self._held.clear()

    def take(self, index: int) -> tuple[np.ndarray, int]:
        """The ids staged for batch ``index`` and the last plan (seq) that staged one
        (-1 if none): its worker takes them from the store."""
        parts = self._for.pop(index, None)
        if not parts:
            return _NONE, -1
        ids = np.unique(np.concatenate(parts))
        self.staged[ids] = False
        return ids, self._producer.pop(index)

    def consumed(self, index: int) -> None:
        """Batch ``index`` reached the training loop: what was staged for it is gone."""
        self.outstanding -= self._held.pop(index, 0)

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
        ``resident``: which of some ids the cache holds (those are not staged)."""
        misses = np.unique(np.asarray(misses, np.int64))
        room = self.budget - self.outstanding
        if not misses.size or not self._order.size:
            return _NONE, _NONE
        if room <= 0:  # nothing more staged; what the requests read through is still free
            return _NONE, self._read_through(misses)
        after = (index + self.lead) * self._step
        pos = []  # each missed object's later positions in the order (ascending)
        for a, b in self._slices(misses):
            mine = self._pos[a:b]
            pos.append(mine[np.searchsorted(mine, after) :])
        pos = np.sort(np.concatenate(pos)) if pos else _NONE
        cand, first = np.unique(self._order[pos], return_index=True)
        keep = ~np.isin(cand, misses) & ~self.staged[cand]
        cand, cand_pos = cand[keep], pos[first[keep]]
        cand, cand_pos = self._with_misses(misses, cand, cand_pos)
        if cand.size:
            keep = ~resident(cand)
            cand, cand_pos = cand[keep], cand_pos[keep]
            nearest = np.argsort(cand_pos, kind="stable")
            fits = np.cumsum(self.sizes[cand[nearest]]) <= room
            nearest = nearest[fits]
            cand, cand_pos = self._with_misses(misses, cand[nearest], cand_pos[nearest])
        self._stage(cand, cand_pos // self._step, seq)
        return cand, self._read_through(np.concatenate([misses, cand]))

    def _slices(self, ids: np.ndarray) -> list[tuple[int, int]]:
        """Per object of ``ids``, its slice of the order's positions."""
        objs = np.unique(self.objects[ids])
        return list(zip(self._pos_ptr[objs].tolist(), self._pos_ptr[objs + 1].tolist(),
                        strict=True))  # fmt: skip

    def _with_misses(
        self, misses: np.ndarray, cand: np.ndarray, cand_pos: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """The candidates that fall in a request a miss makes anyway."""
        if not cand.size:
            return cand, cand_pos
        ids = np.concatenate([misses, cand])
        group = coalesce_ranges(self.objects[ids], self.starts[ids], self.ends[ids], self.gap)[0]
        anchored = np.zeros(int(group.max()) + 1, bool)
        anchored[group[: misses.size]] = True
        keep = anchored[group[misses.size :]]
        return cand[keep], cand_pos[keep]

    def _stage(self, ids: np.ndarray, batches: np.ndarray, seq: int) -> None:
        if not ids.size:
            return
        self.staged[ids] = True
        nbytes = self.sizes[ids]
        self.outstanding += int(nbytes.sum())
        for b in np.unique(batches).tolist():
            mine = batches == b
            self._for.setdefault(b, []).append(ids[mine])
            self._producer[b] = seq
            self._held[b] = self._held.get(b, 0) + int(nbytes[mine].sum())

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
        return free[~np.isin(free, ids) & ~self.staged[free]]
