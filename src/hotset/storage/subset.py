"""A storage that shows a subset of another one (jobs on overlapping parts of a dataset)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hotset.errors import ConfigError
from hotset.storage.base import Storage
from hotset.storage.wrapper import StorageWrapper


class SubsetStorage(StorageWrapper):
    """Samples ``indices`` of ``inner``, renumbered ``0 .. len(indices) - 1``; keys stay the
    inner ones, so a cache keyed by content shares entries with the full dataset."""

    def __init__(self, inner: Storage, indices: Sequence[int] | np.ndarray) -> None:
        idx = np.asarray(indices, np.int64)
        if idx.ndim != 1 or idx.size == 0 or idx.min() < 0 or idx.max() >= len(inner):
            raise ConfigError(f"subset indices must be a non-empty 1-D array in [0, {len(inner)})")
        super().__init__(inner)
        self.indices = idx
        self.manifest = inner.manifest.take(idx, f"{inner.manifest.name}[{idx.size}]")

    def read(self, i: int) -> bytes:
        return self.inner.read(int(self.indices[i]))

    def read_many(self, ids: Sequence[int]) -> list[bytes]:
        return self.inner.read_many(self.indices[np.asarray(ids, np.int64)].tolist())

    def on_disk(self, ids: np.ndarray) -> np.ndarray:
        return self.inner.on_disk(self.indices[np.asarray(ids, np.int64)])

    def kept(self, ids: Sequence[int]) -> list[bytes | None]:
        return self.inner.kept(self.indices[np.asarray(ids, np.int64)].tolist())

    def describe(self, i: int) -> str:
        return self.inner.describe(int(self.indices[i]))

    @property
    def extents(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        inner = self.inner.extents
        return None if inner is None else tuple(a[self.indices] for a in inner)
