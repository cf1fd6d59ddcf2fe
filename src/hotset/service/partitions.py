"""One cache, split in partitions that each run their own policy within their own bytes.

The multi-job service keeps one partition for everything (a shared cache) or, under
benefit-aware allocation, one per dataset. A sample has one copy, owned by the partition
that admitted it: a hit is served from whichever partition holds it (and counts there,
e.g. as an LRU refresh), a miss is admitted by the requesting job's partition, and a
partition evicts only its own samples. Partitions are made by ``Policy.new_partition``
of one template policy, which shares what the kind keeps cache-wide (RefCnt's count of
future reads and pins), so references and pins go to the template and need no routing.
"""

from __future__ import annotations

from array import array

import numpy as np

from hotset.errors import ConfigError
from hotset.policy.base import AccessResult, Policy, make_policy


class PartitionedPolicy:
    """Partitions over ids ``0 .. num_ids - 1``, each a policy of kind ``kind``."""

    def __init__(self, kind: str, num_ids: int, seed: int = 0) -> None:
        self._sizes = array("q", bytes(8 * int(num_ids)))  # one column every part shares
        self.sizes = np.frombuffer(self._sizes, np.int64)  # a view of it
        self.owner = np.full(int(num_ids), -1, np.int32)  # -1: not resident
        self.parts: list[Policy] = []
        self.board = None
        # holds nothing (capacity 0); its partitions share its cache-wide state
        self.template = make_policy(kind, 0, sizes=self._sizes, seed=seed)
        self.template.hold_nothing()

    def add_partition(self, capacity_bytes: int) -> int:
        part = self.template.new_partition(capacity_bytes, self._sizes)
        if self.board is not None:
            part.attach_scores(self.board)
        self.parts.append(part)
        return len(self.parts) - 1

    def resize(self, part: int, capacity_bytes: int) -> list[int]:
        """Give partition ``part`` a new capacity; returns the ids it evicted to fit
        (a policy without ``shrink_to`` refuses with a ConfigError)."""
        evicted = self.parts[part].shrink_to(capacity_bytes)
        self.owner[evicted] = -1
        return evicted

    # -- what the coordinator calls ------------------------------------------------------
    def access(self, ids: np.ndarray, part: int) -> AccessResult:
        """Access ``ids`` for a job of partition ``part``."""
        ids = np.asarray(ids, np.int64)
        route = self.owner[ids]
        route[route < 0] = part
        hits = np.zeros(ids.size, bool)
        admitted, evicted = [], []
        for p in dict.fromkeys(route.tolist()):
            sel = route == p
            r = self.parts[p].access(ids[sel])
            hits[sel] = r.hits
            self.owner[r.evicted] = -1
            self.owner[r.admitted] = p
            admitted.append(r.admitted)
            evicted.append(r.evicted)
        adm = np.concatenate(admitted) if admitted else ids[:0]
        ev = np.concatenate(evicted) if evicted else ids[:0]
        return AccessResult(hits, adm[self.owner[adm] >= 0], ev[self.owner[ev] < 0])

    def discard(self, ids: np.ndarray) -> list[int]:
        """Forget residents the store does not hold (gone, or dropped as corrupt)."""
        ids = np.asarray(ids, np.int64)
        ids = ids[self.owner[ids] >= 0]
        out: list[int] = []
        for p in dict.fromkeys(self.owner[ids].tolist()):
            out += self.parts[p].discard(ids[self.owner[ids] == p])
        self.owner[ids] = -1
        return out

    def set_sizes(self, ids: np.ndarray, sizes: np.ndarray) -> None:
        """Sizes of newly registered ids (checked here: the parts share one column, so
        after the first writes it the others see no change to check). Only the ids
        whose size changes go on to the parts: a job on samples already known (a 14M-id
        column read once, not once per part) writes nothing."""
        ids, sizes = np.asarray(ids, np.int64), np.asarray(sizes, np.int64)
        if ids.shape != sizes.shape:
            raise ConfigError(f"set_sizes: {ids.size} ids but {sizes.size} sizes")
        changed = np.flatnonzero(self.sizes[ids] != sizes)
        ids, sizes = ids[changed], sizes[changed]
        bad = np.flatnonzero(self.owner[ids] >= 0)
        if bad.size:
            i, s = int(ids[bad[0]]), int(sizes[bad[0]])
            raise ConfigError(f"sample {i} is cached with {self.sizes[i]} bytes, not {s}")
        for part in (self.template, *self.parts):
            part.set_sizes(ids, sizes)

    def attach_scores(self, board) -> None:
        """Importance scores for the partitions whose policy is keyed by them."""
        self.board = board
        for part in self.parts:
            part.attach_scores(board)

    @property
    def needs_scores(self) -> bool:
        return self.template.needs_scores

    def scores_updated(self, ids: np.ndarray) -> None:
        for part in self.parts:
            part.scores_updated(ids)

    def add_references(self, ids, delta: int = 1) -> None:
        self.template.add_references(ids, delta)  # shared by every partition

    def pin(self, ids, delta: int = 1) -> None:
        self.template.pin(ids, delta)

    def __contains__(self, i: int) -> bool:
        return bool(self.owner[int(i)] >= 0)

    def cached_mask(self, ids: np.ndarray) -> np.ndarray:
        """Whether each of ``ids`` is cached (in any partition)."""
        return self.owner[ids] >= 0

    def __len__(self) -> int:
        return sum(len(p) for p in self.parts)

    @property
    def used(self) -> int:
        return sum(p.used for p in self.parts)

    def capacities(self) -> list[int]:
        return [p.capacity_bytes for p in self.parts]

    def cached_ids(self) -> np.ndarray:
        return np.flatnonzero(self.owner >= 0)
