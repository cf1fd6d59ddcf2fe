"""Misses -> range requests: the samples that share an object (a tar shard) are read in
as few requests as pay off.

Two samples of one object are read by one request when the bytes between them cost less
to transfer than a request costs to make: ``gap / bandwidth < latency``, so the gap worth
merging is ``latency * bandwidth`` (``CostModel.merge_gap``), the bandwidth being each
request's share where ``in_flight`` requests share the link. Adjacent samples (gap 0)
are always one request; samples far apart are never merged.

The latency is measured online (``LatencyFit``): from each batch's requests, the bytes
they moved and the seconds they took, less the bytes' transfer time at the model's
bandwidth, so that the gap follows what a request really costs this client (its own
CPU included), not what it waited for a slot other workers held; the user's
``CostModel`` is the prior and the bound.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

_NONE = np.empty(0, np.int64)


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


class LatencyFit:
    """The latency per request, measured apart from queueing: per batch, a request's
    share of the batch's read time, ``seconds * min(requests, concurrency) / requests``
    (``concurrency`` of them in flight), or each request's own time where that is
    measured (``NodeSlots.in_flight_s``), less its bytes' transfer time over the whole
    link (``prior``'s bandwidth); the latency is a low quantile (``quantile``) of the last
    ``window`` batches' figures. Time a request spends waiting for a slot or for the link
    that other processes hold (the node's workers share them) only ever adds to a batch's
    figure, so the batches that waited least tell the link's own latency; a transfer
    charged at a share of the link would make a large read look faster than the latency
    alone.
    ``model`` is ``prior`` with that latency, held within ``bound`` times the prior's (a
    bandwidth lower than the prior's reads as latency, and a gap grown on it would move
    more bytes: the bound stops that from feeding itself)."""

    def __init__(self, prior: CostModel, concurrency: int, window: int = 64,
                 quantile: float = 0.2, bound: float = 8.0) -> None:  # fmt: skip
        self.prior, self.concurrency = prior, max(int(concurrency), 1)
        self.quantile, self.bound = float(quantile), float(bound)
        self.latency_s = prior.latency_ms / 1000.0
        self._seen = np.zeros(max(int(window), 1))  # the last batches' figures, a ring
        self.batches = 0

    def observe(
        self, requests: int, nbytes: int, seconds: float, in_flight_s: float = 0.0
    ) -> None:
        """One batch's figure: ``requests`` that moved ``nbytes`` in ``seconds``;
        ``in_flight_s``: the requests' own seconds, summed (0: not measured)."""
        if requests <= 0 or seconds <= 0:
            return
        link = self.prior.bandwidth_mb_s * 1e6
        own = in_flight_s or seconds * min(requests, self.concurrency)
        per = own / requests - nbytes / requests / link
        cap = self.bound * self.prior.latency_ms / 1000.0
        self._seen[self.batches % self._seen.size] = min(max(per, 0.0), cap)
        self.batches += 1
        seen = self._seen[: min(self.batches, self._seen.size)]
        self.latency_s = float(np.quantile(seen, self.quantile))

    @property
    def model(self) -> CostModel:
        return CostModel(self.latency_s * 1000.0, self.prior.bandwidth_mb_s, self.prior.in_flight)

    def counters(self) -> dict:
        """The measured cost of a request, and the gap it makes."""
        model = self.model
        return {"request_latency_ms": model.latency_ms, "merge_gap": model.merge_gap}


@dataclass
class Group:
    """One range request: ``[start, end)`` of ``object``, serving the samples at
    ``members`` (positions in the caller's list)."""

    object: int
    start: int
    end: int
    members: list[int] = field(default_factory=list)


def coalesce_ranges(
    objects: np.ndarray, starts: np.ndarray, ends: np.ndarray, gap: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Vectorised coalescing: ``(group of each range, and per group its object, start,
    end)``; two ranges of one object share a group when at most ``gap`` bytes lie between
    them (overlapping and repeated ranges are read once). Groups are numbered by object,
    then offset."""
    objects, starts, ends = (np.asarray(a, np.int64) for a in (objects, starts, ends))
    if not objects.size:
        return _NONE, _NONE, _NONE, _NONE
    order = np.lexsort((starts, objects))
    o, s, e = objects[order], starts[order], ends[order]
    # the furthest end so far within each object: objects ascend, so a running maximum of
    # (object, end) packed in one int64 never crosses from one object into the next
    reach = np.maximum.accumulate((o << 40) | e) & ((1 << 40) - 1)
    new = np.ones(o.size, bool)
    new[1:] = (o[1:] != o[:-1]) | (s[1:] > reach[:-1] + gap)
    group_sorted = np.cumsum(new) - 1
    group = np.empty_like(group_sorted)
    group[order] = group_sorted
    first = np.flatnonzero(new)
    last = np.append(first[1:], o.size) - 1
    return group, o[first], s[first], reach[last]


def coalesce(objects: np.ndarray, starts: np.ndarray, ends: np.ndarray, gap: int) -> list[Group]:
    """The fewest range requests that read every ``[starts[k], ends[k])`` of
    ``objects[k]``, merging two ranges of one object when at most ``gap`` bytes lie
    between them (``coalesce_ranges``), as :class:`Group` s."""
    group, g_obj, g_start, g_end = coalesce_ranges(objects, starts, ends, gap)
    groups = [Group(int(o), int(s), int(e)) for o, s, e in zip(g_obj, g_start, g_end, strict=True)]
    for k in np.argsort(group, kind="stable").tolist():
        groups[group[k]].members.append(k)
    return groups
