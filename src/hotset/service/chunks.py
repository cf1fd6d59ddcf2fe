"""Quiver's coordinated eviction (FAST'20, "Co-ordinated eviction"): the registered ids
are cut, in a shuffled order, into chunks of half the cache, and at most two chunks are
resident (double buffering). Jobs read the resident chunks by substitution (any unread id
of theirs there, in random order); a job that has read all it can there opens the next
chunk it needs. When both slots are taken the chunk loaded first is *marked*: it takes no
new readers, and is evicted (all its entries at once, like ``unlink``) only when its last
reader has released it. Meanwhile the job reads its other samples straight from storage.

A job is a reader of a chunk from its first read there until it has read all its ids in
that chunk this epoch (or it moves to a new epoch, or leaves).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np

from hotset.errors import ConfigError


@dataclass
class Chunk:
    index: int
    ids: set[int]
    admitted: set[int] = field(default_factory=set)  # ids already in the store
    readers: set[int] = field(default_factory=set)
    marked: bool = False
    loaded_at: int = 0


class ChunkCache:
    """Chunks over global ids, two resident slots, per-job unread sets per epoch."""

    def __init__(self, capacity_bytes: int, slots: int = 2, seed: int = 0) -> None:
        if slots < 2:
            raise ConfigError(f"slots must be >= 2 (double buffering), got {slots}")
        self.chunk_bytes = max(1, capacity_bytes // slots)
        self.slots = slots
        self.chunk_of: list[int] = []  # global id -> chunk index
        self.members: list[set[int]] = []
        self._fill = 0  # bytes in the last chunk being cut
        self.resident: dict[int, Chunk] = {}
        self.unread: dict[int, dict[int, list[int]]] = {}  # job -> chunk -> unread, shuffled
        self.evicted_chunks = 0
        self._clock = 0
        self._rng = random.Random(seed)

    def add_ids(self, sizes: np.ndarray) -> None:
        """New global ids (in order) with their byte sizes: cut into chunks in a shuffled
        order, so a chunk is a random sample of the dataset (an ImageFolder manifest is
        sorted by class: cut in order, every chunk, and so every minibatch read by
        substitution from it, would hold one class)."""
        sizes = np.asarray(sizes, np.int64)
        first = len(self.chunk_of)
        chunk = np.empty(sizes.size, np.int64)
        order = list(range(sizes.size))
        self._rng.shuffle(order)
        for j in order:
            s = int(sizes[j])
            if not self.members or (self._fill and self._fill + s > self.chunk_bytes):
                self.members.append(set())
                self._fill = 0
            self.members[-1].add(first + j)
            chunk[j] = len(self.members) - 1
            self._fill += s
        self.chunk_of.extend(chunk.tolist())

    # -- jobs ----------------------------------------------------------------------------
    def start_epoch(self, job: int, ids: np.ndarray) -> list[int]:
        """The job reads ``ids`` this epoch; returns ids evicted as it let go of the last
        epoch's chunks."""
        evicted = self.release(job)
        by_chunk: dict[int, list[int]] = {}
        for i in np.asarray(ids, np.int64).tolist():
            by_chunk.setdefault(self.chunk_of[i], []).append(i)
        for lst in by_chunk.values():
            self._rng.shuffle(lst)  # popped from the end: a uniform order within a chunk
        self.unread[job] = by_chunk
        return evicted

    def release(self, job: int) -> list[int]:
        """The job stops reading (epoch over, restart or leaving): its chunks lose it as a
        reader. Returns the ids of chunks evicted as a result."""
        self.unread.pop(job, None)
        out = []
        for c in list(self.resident.values()):
            if job in c.readers:
                c.readers.discard(job)
                out += self._maybe_evict(c)
        return out

    def _maybe_evict(self, c: Chunk) -> list[int]:
        if c.marked and not c.readers:
            del self.resident[c.index]
            self.evicted_chunks += 1
            return sorted(c.admitted)
        return []

    # -- reading -------------------------------------------------------------------------
    def _readable(self, job: int) -> list[Chunk]:
        """Resident chunks the job may read: those it already reads, and unmarked ones."""
        return [c for c in self.resident.values() if job in c.readers or not c.marked]

    def _open_next(self, job: int) -> list[int]:
        """Bring in the chunk holding most of the job's unread ids. With both slots taken,
        first mark a resident chunk (one nobody reads, else the oldest): it goes now if
        unused, else when its last reader is done. Returns the ids evicted now."""
        mine = self.unread[job]
        wanted = [k for k in mine if k not in self.resident and mine[k]]
        if not wanted:
            return []
        evicted: list[int] = []
        if len(self.resident) >= self.slots:
            unmarked = [c for c in self.resident.values() if not c.marked]
            if unmarked:
                victim = min(unmarked, key=lambda c: (bool(c.readers), c.loaded_at))
                victim.marked = True  # no new readers from now on
                evicted = self._maybe_evict(victim)
        if len(self.resident) < self.slots:
            k = max(wanted, key=lambda k: (len(mine[k]), -k))
            self._clock += 1
            self.resident[k] = Chunk(k, self.members[k], loaded_at=self._clock)
        return evicted

    def batch(self, job: int, n: int) -> tuple[list[int], list[bool], list[int], list[int]]:
        """The job's next ``n`` ids: (ids, hit per id, ids to admit, ids to evict)."""
        mine = self.unread.get(job)
        if mine is None:
            raise ConfigError(f"job {job} has no epoch started")
        ids: list[int] = []
        hits: list[bool] = []
        admit: list[int] = []
        evict: list[int] = []
        for _ in range(2):  # read what is resident; open a chunk once if that is not enough
            for c in self._readable(job):
                pool = mine.get(c.index)
                while pool and len(ids) < n:
                    i = pool.pop()
                    c.readers.add(job)
                    ids.append(i)
                    hits.append(i in c.admitted)
                    if i not in c.admitted:
                        c.admitted.add(i)
                        admit.append(i)
                if c.index in mine and not mine[c.index]:
                    del mine[c.index]
                    c.readers.discard(job)
                    evict += self._maybe_evict(c)
            if len(ids) >= n:
                break
            evict += self._open_next(job)
        while len(ids) < n and mine:  # nothing readable left: from storage, not cached
            ks = list(mine)
            k = self._rng.choices(ks, weights=[len(mine[k]) for k in ks])[0]
            ids.append(mine[k].pop())
            hits.append(False)
            if not mine[k]:
                del mine[k]
        order = list(range(len(ids)))
        self._rng.shuffle(order)  # a random batch, as sampling promises
        return [ids[k] for k in order], [hits[k] for k in order], admit, evict

    @property
    def cached(self) -> set[int]:
        return set().union(*(c.admitted for c in self.resident.values()))
