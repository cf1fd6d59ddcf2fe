"""Misses -> range requests: the samples that share an object (a tar shard) are read in
as few requests as pay off.

Two samples of one object are read by one request when the bytes between them cost less
to transfer than a request costs to make: ``gap / bandwidth < latency``, so the gap worth
merging is ``latency * bandwidth`` (``CostModel.merge_gap``), the bandwidth being each
request's share where ``in_flight`` requests share the link. Adjacent samples (gap 0)
are always one request; samples far apart are never merged.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class CostModel:
    """What a request costs: ``latency_ms`` to make it, plus its bytes at its share of
    ``bandwidth_mb_s`` (the link's, shared by ``in_flight`` requests). Defaults: an
    object store in the same region."""

    latency_ms: float = 10.0
    bandwidth_mb_s: float = 100.0
    in_flight: int = 1

    @property
    def merge_gap(self) -> int:
        """The largest gap (bytes) that costs less to read through than a request."""
        return int(self.latency_ms / 1000.0 * self.bandwidth_mb_s * 1e6 / max(self.in_flight, 1))

    def cost_s(self, requests: int, nbytes: int) -> float:
        share = self.bandwidth_mb_s * 1e6 / max(self.in_flight, 1)
        return requests * self.latency_ms / 1000.0 + nbytes / share


@dataclass
class Group:
    """One range request: ``[start, end)`` of ``object``, serving the samples at
    ``members`` (positions in the caller's list)."""

    object: int
    start: int
    end: int
    members: list[int] = field(default_factory=list)


def coalesce(objects: np.ndarray, starts: np.ndarray, ends: np.ndarray, gap: int) -> list[Group]:
    """The fewest range requests that read every ``[starts[k], ends[k])`` of
    ``objects[k]``, merging two ranges of one object when at most ``gap`` bytes lie
    between them (overlapping and repeated ranges are read once)."""
    objects, starts, ends = (np.asarray(a, np.int64) for a in (objects, starts, ends))
    groups: list[Group] = []
    for k in np.lexsort((starts, objects)).tolist():
        o, s, e = int(objects[k]), int(starts[k]), int(ends[k])
        last = groups[-1] if groups else None
        if last is not None and last.object == o and s <= last.end + gap:
            last.end = max(last.end, e)
            last.members.append(k)
        else:
            groups.append(Group(o, s, e, [k]))
    return groups
