"""The Storage interface: the read-only truth a dataset lives in."""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from hotset.storage.manifest import Manifest


class Storage(ABC):
    """A dataset of ``len(storage)`` samples, each with a global key, a size and a label.

    ``read_many`` reads concurrently; subclasses implement ``read`` and may override
    ``read_many`` when the backend has a better batched call.
    """

    manifest: Manifest
    concurrency: int = 8

    def __len__(self) -> int:
        return len(self.manifest)

    @property
    def keys(self) -> Sequence[str]:
        return self.manifest.keys

    @property
    def sizes(self) -> np.ndarray:
        return self.manifest.sizes

    @property
    def labels(self) -> np.ndarray:
        return self.manifest.labels

    @property
    def classes(self) -> list[str]:
        return self.manifest.classes

    def key(self, i: int) -> str:
        return self.manifest.keys[i]

    def size(self, i: int) -> int:
        return int(self.manifest.sizes[i])

    def label(self, i: int) -> int:
        return int(self.manifest.labels[i])

    def describe(self, i: int) -> str:
        """Where sample ``i`` lives, for error messages."""
        return self.manifest.paths[i]

    @abstractmethod
    def read(self, i: int) -> bytes:
        """The bytes of sample ``i``; raises a :class:`~hotset.errors.SampleError` naming it."""

    @property
    def retries(self) -> int:
        """Reads this process tried again after a transient failure (``io/reader.py``)."""
        return 0

    def charge(self, nbytes: int) -> None:  # noqa: B027 - only emulated storage pays
        """Account for one extra request of ``nbytes`` made beside this storage (an iCACHE
        package read): free here, a latency and transfer time on emulated remote storage."""

    def read_many(self, ids: Sequence[int]) -> list[bytes]:
        """The bytes of each id, in order, read with up to ``concurrency`` reads in flight."""
        ids = [int(i) for i in ids]
        if len(ids) <= 1 or self.concurrency <= 1:
            return [self.read(i) for i in ids]
        return list(self._pool().map(self.read, ids))

    def _pool(self) -> ThreadPoolExecutor:
        """This process's reader threads (made on first use, so each worker has its own)."""
        pool = self.__dict__.get("_reader_pool")
        if pool is None or self.__dict__.get("_reader_pid") != os.getpid():
            pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="hotset-read")
            self.__dict__.update(_reader_pool=pool, _reader_pid=os.getpid())
        return pool

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.pop("_reader_pool", None)
        state.pop("_reader_pid", None)
        return state
