"""RefCnt (JOADER 3.2): evict the element that the fewest jobs will still read.

``refs[i]`` counts the future reads of ``i``: whoever schedules the jobs adds one per
job that will read ``i`` (``add_references`` at each job's epoch start) and takes back
the references of a job that leaves; every access is a read and consumes one. A miss is
admitted by evicting the residents with the lowest counts, as long as each has fewer
references than the newcomer or as many (ties go to the newcomer, the more recent): an
element nobody reads again is never cached, and never displaces one that somebody will.

``pin`` holds ids whose planned reads have not run yet (a multi-job service plans ahead
of its workers): a pinned id is never evicted, so a planned hit is still there when the
worker reads it.
"""

from __future__ import annotations

import numpy as np

from hotset.policy.base import Policy, register_policy

PINNED = np.int64(1) << 40  # a pinned resident outranks any reference count


@register_policy
class RefCntPolicy(Policy):
    name = "refcnt"

    def __init__(self, capacity_bytes, sizes, seed: int = 0, refs=None):
        """``refs``: an array to share with other RefCnt policies (one count of future
        reads for several partitions of one cache)."""
        super().__init__(capacity_bytes, sizes, seed)
        self.refs = np.zeros(self.num_samples, np.int64) if refs is None else refs
        self._pos: dict[int, int] = {}  # id -> index in _ids
        self._ids = np.zeros(self.num_samples, np.int64)  # residents in [:len(_pos)]

    @property
    def _resident(self):
        return self._pos

    def new_partition(self, capacity_bytes: int, sizes: np.ndarray) -> RefCntPolicy:
        """A partition sharing this one's counts of references and pins."""
        part = RefCntPolicy(capacity_bytes, sizes, self.seed, refs=self.refs)
        self.share_pins(part)
        return part

    def add_references(self, ids, delta: int = 1) -> None:
        """``delta`` future reads of each of ``ids`` (negative: a job left)."""
        np.add.at(self.refs, np.asarray(ids, np.int64), int(delta))
        np.maximum(self.refs, 0, out=self.refs)

    def _evict(self, k: int) -> int:
        pos, res = self._pos, self._ids
        j = int(res[k])
        last = len(pos) - 1
        if k != last:
            res[k] = res[last]
            pos[int(res[k])] = k
        del pos[j]
        return j

    def shrink_to(self, capacity_bytes: int) -> list[int]:
        """Evict the unpinned residents with the fewest references until the rest fit (a
        pinned one stays: it is evicted by a later admission once its read has run)."""
        self.capacity_bytes = int(capacity_bytes)
        live = self._ids[: len(self._pos)]
        order = live[np.argsort(self.refs[live], kind="stable")]
        out = []
        for j in order[self.pinned[order] == 0].tolist():
            if self.used <= self.capacity_bytes:
                break
            self._evict(self._pos[j])
            self.used -= self._sizes[j]
            out.append(j)
        return out

    def _on_hit(self, p: int, i: int) -> bool:
        refs = self.refs
        refs[i] = refs[i] - 1 if refs[i] > 0 else 0  # this read consumes one reference
        return i in self._pos

    def _wants(self, p: int, i: int) -> bool:
        return self.refs[i] > 0  # nobody reads it again: never cached

    def _victim(self, p: int, i: int) -> int:
        """The unpinned resident with the fewest references, if it has no more than the
        newcomer (ties go to the newcomer, the more recent)."""
        res, refs, pinned = self._ids, self.refs, self.pinned
        live = res[: len(self._pos)]
        k = int(np.argmin(refs[live] + PINNED * (pinned[live] > 0)))
        if pinned[res[k]] or refs[res[k]] > refs[i]:
            return -1
        return self._evict(k)

    def _remove(self, i: int) -> None:
        self._evict(self._pos[i])

    def _insert(self, p: int, i: int) -> None:
        self._pos[i] = len(self._pos)
        self._ids[self._pos[i]] = i

    def _restore(self, victims: list[int]) -> None:
        for j in victims:
            self._insert(-1, j)
