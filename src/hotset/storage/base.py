"""The Storage interface: the read-only truth a dataset lives in."""

from __future__ import annotations

import copy
import hmac
import os
from abc import ABC, abstractmethod
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import fsspec
import numpy as np
import xxhash

from hotset.errors import ConfigError
from hotset.io.reader import BatchReader, NodeSlots, Retry, reader_of
from hotset.io.requests import CostModel
from hotset.storage.manifest import Manifest, content_key

#: bytes of the digest a cache entry carries when keys name locations (``seal``)
TAG = 16


def _tag(key: str, data: bytes) -> bytes:
    return xxhash.xxh3_128_digest(data, seed=int(key[:16], 16))


def seal(key: str, data: bytes) -> bytes:
    """A cache entry for a sample whose key names where it lives: a digest of its bytes
    (XXH3-128 seeded by the sample's key: 30 times BLAKE2b's speed; the key is no secret
    either way, so it tells an entry of another sample or a damaged one, not a forgery
    by someone who may write to the store) taken at first read, then the bytes."""
    return _tag(key, data) + data


def unseal(key: str, entry: bytes) -> bytes | None:
    """The bytes of ``entry`` if it is the one ``seal(key, ...)`` made, else None (a
    corrupted entry, or one written under another sample's key)."""
    data = entry[TAG:]
    return data if len(entry) >= TAG and hmac.compare_digest(entry[:TAG], _tag(key, data)) else None


#: reads in flight per process by default: an object store (an async filesystem: HTTP,
#: S3, GCS) answers dozens of requests at once, each waiting on the network; a local
#: disk or mount gains little beyond a few
REMOTE_CONCURRENCY, LOCAL_CONCURRENCY = 32, 8


def concurrency_for(fs: fsspec.AbstractFileSystem, given: int | None) -> int:
    """``given`` reads in flight, or the default for ``fs``'s kind of storage."""
    if given is None:
        return REMOTE_CONCURRENCY if getattr(fs, "async_impl", False) else LOCAL_CONCURRENCY
    if not isinstance(given, int | np.integer) or given < 1:
        raise ConfigError(f"concurrency must be an int >= 1, got {given!r}")
    return int(given)


class Storage(ABC):
    """A dataset of ``len(storage)`` samples, each with a global key, a size and a label.

    ``read_many`` reads concurrently; subclasses implement ``read`` and may override
    ``read_many`` when the backend has a better batched call.
    """

    manifest: Manifest
    concurrency: int = 8
    #: keys are digests of the bytes (``content_key``: a hit is checked by digesting it,
    #: and jobs on overlapping datasets share entries); otherwise a key names where the
    #: sample lives and each cache entry carries a digest taken at first read (``seal``),
    #: its ``size`` counting those ``TAG`` bytes
    content_keyed: bool = True
    #: for samples that are records of fields (tar groups, table rows): the fields a
    #: batch's inputs and targets come from (``collate.split_sample``)
    input_field: str | tuple[str, ...] | None = None
    target_field: str | tuple[str, ...] | None = None
    #: the largest gap between two samples of one object that a range request reads
    #: through rather than making two requests (``io/requests.CostModel.merge_gap``)
    merge_gap: int = 0
    #: where set, the cost model whose latency the planner measures online
    #: (``io/requests.LatencyFit``) and whose gap it hands to the workers with each plan
    cost: CostModel | None = None

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

    @property
    def extents(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """Where samples are byte ranges of larger objects (tar shards): per sample its
        object, start and end byte (``io/readahead.py`` plans requests by them); None
        where each sample is a request of its own."""
        return None

    def key(self, i: int) -> str:
        return self.manifest.keys[i]

    def size(self, i: int) -> int:
        return int(self.manifest.sizes[i])

    def label(self, i: int) -> int:
        return int(self.manifest.labels[i])

    def describe(self, i: int) -> str:
        """Where sample ``i`` lives, for error messages."""
        return self.manifest.paths[i]

    def to_entry(self, key: str, data: bytes) -> bytes:
        """What the cache holds for the sample of ``key`` whose bytes are ``data``."""
        return data if self.content_keyed else seal(key, data)

    def from_entry(self, key: str, entry: bytes) -> bytes | None:
        """The sample's bytes from its cache entry, or None when the entry is not the
        sample's (it is then never served)."""
        if self.content_keyed:
            return entry if content_key(entry) == key else None
        return unseal(key, entry)

    @abstractmethod
    def read(self, i: int) -> bytes:
        """The bytes of sample ``i``; raises a :class:`~hotset.errors.SampleError` naming it."""

    @property
    def retries(self) -> int:
        """Reads this process tried again after a transient failure (``io/reader.py``)."""
        return 0

    #: calls made to list and index the storage (at its opening) that were tried again
    index_retries: int = 0

    @property
    def sources(self) -> tuple[str, ...]:
        """The objects the samples are read from, where they name the dataset (a tar
        set's shards); empty elsewhere."""
        return ()

    @property
    def disk_capacity(self) -> int:
        """The node's disk tier's byte budget (``storage/on_disk.py``); 0: none. With a
        tier, read-ahead stages there: what a read puts in the tier is what a later
        batch takes (``kept``), and the RAM store holds the cache alone."""
        return 0

    def kept(self, ids: Sequence[int]) -> list[bytes | None]:
        """The samples of ``ids`` the node's disk tier holds, read from it (checked
        against their digests), None for the others; never the source."""
        return [None] * len(ids)

    @property
    def disk_counts(self) -> tuple[int, int, int]:
        """This process's samples read from the node's disk tier instead of the source,
        their bytes, and the tier's failures (writes the full disk refused, I/O errors):
        ``storage/on_disk.py``."""
        return 0, 0, 0

    @property
    def requests(self) -> int | None:
        """Requests this process made to the storage (a range request may serve several
        samples), where the storage counts them."""
        return None

    @property
    def wire_bytes(self) -> int | None:
        """Bytes those requests moved (the gaps a range read through included)."""
        return None

    @property
    def in_flight_s(self) -> float:
        """Seconds this process's requests held a slot that the node's processes share
        (``node_concurrency``, an emulated link's), summed: each request's own time, its
        wait for the slot left out. 0 where there are no such slots."""
        return 0.0

    def with_wire(self, wire) -> Storage | None:
        """A copy of this storage whose every request passes through ``wire`` (a function
        of the request: ``ThrottledStorage``'s emulated network); None where its reads
        are not requests it makes itself. This storage is left as it is (another job may
        read it unthrottled)."""
        return None

    def on_disk(self, ids: np.ndarray) -> np.ndarray:
        """Which of ``ids`` the node's disk tier holds now (``storage/on_disk.py``; none
        without a tier): read-ahead leaves those to be read where they are."""
        return np.zeros(len(ids), bool)

    def demoted(self, keys: Sequence[str]) -> None:  # noqa: B027 - optional hook
        """The cache's policy evicted these samples from memory: the disk tier keeps
        them before those it never admitted (``storage/on_disk.py``)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release what this process holds open for reading (the disk tier's files)."""

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


class FsspecStorage(Storage):
    """A storage read through fsspec (``url``, ``storage_options``) by this process's
    :class:`~hotset.io.reader.BatchReader`: one batched call per batch, ``concurrency``
    requests in flight, retried as ``retry`` says; ``requests`` and ``retries`` count
    this process's. Each process (each DataLoader worker) has its own filesystem
    instance and connections. ``node_concurrency``: at most that many requests in flight
    across all the processes that read this storage (its DataLoader workers share the
    slots, so one worker's burst of reads uses the slots the others leave idle); None:
    ``concurrency`` per process, with no bound across them."""

    url: str
    storage_options: dict
    retry: Retry
    _fs: fsspec.AbstractFileSystem
    _node_slots: NodeSlots | None = None

    def _bound_node(self, node_concurrency: int | None) -> None:
        if node_concurrency is None:
            return
        if not isinstance(node_concurrency, int | np.integer) or node_concurrency < 1:
            raise ConfigError(f"node_concurrency must be an int >= 1, got {node_concurrency!r}")
        self._node_slots = NodeSlots(int(node_concurrency))

    @property
    def reader(self) -> BatchReader:
        def make() -> BatchReader:
            fs = self._fs
            if fs.__dict__.get("_pid", os.getpid()) != os.getpid():  # an async one, forked
                fs = fsspec.core.url_to_fs(self.url, **self.storage_options)[0]
            wire = self.__dict__.get("_wire") or self._node_slots
            return BatchReader(fs, self.concurrency, self.retry, wire)

        return reader_of(self, make)

    @property
    def retries(self) -> int:
        return self.reader.retries

    @property
    def requests(self) -> int:
        return self.reader.requests

    @property
    def wire_bytes(self) -> int:
        return self.reader.bytes

    @property
    def in_flight_s(self) -> float:
        return 0.0 if self._node_slots is None else self._node_slots.in_flight_s

    def with_wire(self, wire) -> Storage | None:
        if getattr(self._fs, "async_impl", False):
            return None
        clone = copy.copy(self)
        for k in ("_batch_reader", "_batch_reader_pid", "_reader_pool", "_reader_pid"):
            clone.__dict__.pop(k, None)  # its own reader, wired
        clone._wire = wire
        return clone

    def read(self, i: int) -> bytes:
        return self.read_many([i])[0]

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        state.pop("_batch_reader", None)
        state.pop("_batch_reader_pid", None)
        return state
