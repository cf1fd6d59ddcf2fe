"""What the service keeps of each registered job and dataset, whatever its sampling mode
(:mod:`hotset.service.modes`), for the :class:`~hotset.service.coordinator.JobCoordinator`."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from hotset.service.benefit import Benefit

_NONE = np.zeros(0, np.int64)


class IdQueue:
    """Sampled ids of one epoch not yet planned, in order: the runs the sampler gave
    (numpy arrays), a batch taken from the front at a time (no Python object per id)."""

    __slots__ = ("_runs", "_size")

    def __init__(self) -> None:
        self._runs: deque[np.ndarray] = deque()
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def extend(self, ids: np.ndarray) -> None:
        ids = np.asarray(ids, np.int64)
        if ids.size:
            self._runs.append(ids)
            self._size += ids.size

    def take(self, n: int | None) -> np.ndarray:
        """The first ``n`` ids (all of them: ``None``; fewer where fewer are queued),
        taken off the queue."""
        n = self._size if n is None else max(0, min(n, self._size))
        out, got = [], 0
        while got < n:
            run = self._runs[0]
            if run.size <= n - got:
                out.append(self._runs.popleft())
            else:
                out.append(run[: n - got])
                self._runs[0] = run[n - got :]
            got += out[-1].size
        self._size -= n
        return out[0] if len(out) == 1 else np.concatenate([_NONE, *out])


@dataclass
class DatasetShare:
    """A registered dataset (a distinct set of samples) and its partition of the cache."""

    nbytes: int
    part: int
    jobs: set[int] = field(default_factory=set)


@dataclass
class Job:
    """What the service keeps of a job whatever its sampling mode."""

    name: str
    batch_size: int
    pid: int | None = None
    host: str = ""
    unique: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # sorted gids
    local_of: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    gids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # per local id
    dataset: str = ""
    part: int = 0  # its dataset's partition of the cache
    benefit: Benefit | None = None  # the latest measurement
    saving: float | None = None  # the latest conclusive one's ``saving``
    epoch: int = -1  # the epoch being planned
    sampling_epoch: int = -1  # the epoch the sampler fills (it may run ahead)
    queues: dict[int, IdQueue] = field(default_factory=dict)  # epoch -> sampled, not planned
    inflight: deque = field(default_factory=deque)  # (seq, gids) planned, not yet consumed
    seq: int = 0  # non-empty plans handed out so far
    batches: int = 0
    last_seen: float = 0.0
    reads: int = 0
    hits: int = 0
    resumed_epoch: int = -1  # the epoch it re-registered in, having read ``served`` of it
    served: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    def keep(self, epoch: int, ids: np.ndarray) -> np.ndarray:
        """``ids`` less those it read of ``epoch`` before it re-registered."""
        if epoch != self.resumed_epoch or not self.served.size:
            return ids
        return ids[~np.isin(ids, self.served)]

    def queued(self) -> int:
        return sum(len(q) for q in self.queues.values())

    def local(self, gids: np.ndarray) -> np.ndarray:
        """Local indices of ``gids`` (a key listed twice in a manifest maps to its first)."""
        return self.local_of[np.searchsorted(self.unique, gids)].astype(np.int64)
