"""A storage shown through another: what it does not change is the inner storage's."""

from __future__ import annotations

import copy
from collections.abc import Sequence

import numpy as np

from hotset.io.requests import CostModel
from hotset.storage.base import Storage


class StorageWrapper(Storage):
    """Forwards to ``inner`` everything about how reads are made: requests, retries,
    bytes on the wire, the cost model, the gap read through and the samples' extents.
    A subclass sets ``manifest`` and reads through ``inner``."""

    def __init__(self, inner: Storage) -> None:
        self.inner = inner
        self.concurrency = inner.concurrency
        self.content_keyed = inner.content_keyed
        self.input_field, self.target_field = inner.input_field, inner.target_field

    def describe(self, i: int) -> str:
        return self.inner.describe(i)

    @property
    def cost(self) -> CostModel | None:
        return self.inner.cost

    @property
    def merge_gap(self) -> int:
        return self.inner.merge_gap

    @merge_gap.setter
    def merge_gap(self, gap: int) -> None:
        self.inner.merge_gap = gap

    @property
    def wire_bytes(self) -> int | None:
        return self.inner.wire_bytes

    @property
    def in_flight_s(self) -> float:
        return self.inner.in_flight_s

    @property
    def extents(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        return self.inner.extents

    def charge(self, nbytes: int) -> None:
        self.inner.charge(nbytes)

    def close(self) -> None:
        self.inner.close()

    def demoted(self, keys: Sequence[str]) -> None:
        self.inner.demoted(keys)

    def on_disk(self, ids: np.ndarray) -> np.ndarray:
        return self.inner.on_disk(ids)

    def with_wire(self, wire) -> Storage | None:
        inner = self.inner.with_wire(wire)
        if inner is None:
            return None
        clone = copy.copy(self)
        clone.inner = inner
        return clone

    @property
    def retries(self) -> int:
        return self.inner.retries

    @property
    def index_retries(self) -> int:  # type: ignore[override]
        return self.inner.index_retries

    @property
    def disk_counts(self) -> tuple[int, int, int]:
        return self.inner.disk_counts

    @property
    def disk_capacity(self) -> int:
        return self.inner.disk_capacity

    def kept(self, ids: Sequence[int]) -> list[bytes | None]:
        return self.inner.kept(ids)

    @property
    def sources(self) -> tuple[str, ...]:
        return self.inner.sources

    @property
    def requests(self) -> int | None:
        return self.inner.requests
