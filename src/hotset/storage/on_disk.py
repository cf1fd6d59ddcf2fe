"""A storage read through the node's disk tier (``store/disk.py``): a sample the tier
holds is read from local disk, checked against its digest; the others from the source,
then kept in the tier for the next epoch, run and job on the node."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hotset.errors import ConfigError
from hotset.storage.base import Storage
from hotset.storage.torch_dataset import DatasetStorage
from hotset.storage.wrapper import StorageWrapper
from hotset.store.disk import DiskTier


class DiskTierStorage(StorageWrapper):
    """``inner``'s samples, kept in ``tier`` as they are read. Its keys are the tier's:
    they name the source's identity (a content digest, or where the sample lives with
    its object's size and version), so a kept entry is never another sample's."""

    def __init__(self, inner: Storage, tier: DiskTier) -> None:
        if isinstance(inner, DatasetStorage):
            raise ConfigError(
                "disk_dir: a torch Dataset's samples have no source identity (a file, its "
                "size and version) to keep them on disk by between runs: leave disk_dir "
                "out, or give make_loader the files' path or URL"
            )
        super().__init__(inner)
        self.tier = tier
        self.manifest = inner.manifest
        self._held: np.ndarray | None = None  # per id, known held (``on_disk``)
        self._evictions: bytes | None = None  # the tier's evictions when it was known

    @property
    def disk_counts(self) -> tuple[int, int, int]:
        return self.tier.hits, self.tier.hit_bytes, self.tier.failures

    @property
    def disk_capacity(self) -> int:
        return self.tier.capacity_bytes

    def kept(self, ids: Sequence[int]) -> list[bytes | None]:
        return self.tier.get_many(list(self.manifest.keys.take([int(i) for i in ids])))

    def close(self) -> None:
        self.tier.close()
        self.inner.close()

    def on_disk(self, ids: np.ndarray) -> np.ndarray:
        """Asks the tier's index for the ids not known held; what it holds is known until
        the tier evicts (a wrong "held" would only leave a sample to be read from the
        source when the tier lacks it, never serve other bytes)."""
        ids = np.asarray(ids, np.int64)
        if self._held is None:
            self._held = np.zeros(len(self.manifest), bool)
        ask = ids[~self._held[ids]]
        held, evictions = self.tier.contains_many(list(self.manifest.keys.take(ask)))
        if evictions != self._evictions:  # the known ones may have left: ask again
            self._held[:] = False
            if ask.size < ids.size:
                ask = ids
                held, evictions = self.tier.contains_many(list(self.manifest.keys.take(ask)))
            self._evictions = evictions
        self._held[ask[held]] = True
        return self._held[ids]

    def demoted(self, keys: Sequence[str]) -> None:
        """The RAM tier's victims are the next by the system's measure (SHADE's lowest
        score in memory, LRU's least recent, ...): they get the disk tier's second chance,
        which the samples the policy never admitted do not."""
        self.tier.touch(keys)

    def read(self, i: int) -> bytes:
        return self.read_many([i])[0]

    def read_many(self, ids: Sequence[int]) -> list[bytes]:
        """The tier's samples from disk, the rest from ``inner`` in one call (then kept)."""
        ids = [int(i) for i in ids]
        keys = list(self.manifest.keys.take(ids))
        got = self.tier.get_many(keys)
        missed = [n for n, v in enumerate(got) if v is None]
        if missed:
            for n, data in zip(missed, self.inner.read_many([ids[n] for n in missed]),
                               strict=True):  # fmt: skip
                got[n] = data
            self.tier.put({keys[n]: got[n] for n in missed})
        return got  # type: ignore[return-value]
