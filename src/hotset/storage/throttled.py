"""ThrottledStorage: the one explicit place where slow remote storage is emulated."""

from __future__ import annotations

import multiprocessing
import time

import numpy as np

from hotset.errors import ConfigError
from hotset.io.reader import NodeSlots
from hotset.io.requests import CostModel
from hotset.storage.base import Storage


class ThrottledStorage(Storage):
    """Wraps a storage so that it sits behind one emulated link: each request costs
    ``latency_ms``, then its bytes cross a ``bandwidth_mb_s`` that every request in
    flight shares, with at most ``concurrency`` requests in flight across *all* processes
    that share this object (DataLoader workers inherit the same OS semaphore and link
    clock), like an NFS mount or an object store behind one network link.

    The bandwidth is the link's, not each stream's: bytes are charged in the order they
    reach the link, each transfer starting when its latency has passed and the bytes ahead
    of it have crossed (a token bucket across processes), so 8 requests of 1 MB at
    100 MB/s take 80 ms in all, not 10. ``bandwidth_mb_s=0`` means unlimited bandwidth.

    ``client_cpu_ms``: CPU the reading process spends on each request before it is sent,
    burnt in the reading thread, as an object store's client spends it (signing,
    building and parsing each request; s3fs/botocore measured about 4 ms per request on
    2 shared cores, nginx through fsspec's HTTP client about 0.3 ms: docs/benchmarks.md).
    0 (the default) charges time only, as a sleep does.
    """

    def __init__(
        self,
        inner: Storage,
        latency_ms: float = 2.0,
        bandwidth_mb_s: float = 100.0,
        concurrency: int = 4,
        client_cpu_ms: float = 0.0,
    ) -> None:
        if latency_ms < 0:
            raise ConfigError(f"latency_ms must be >= 0, got {latency_ms}")
        if bandwidth_mb_s < 0:
            raise ConfigError(f"bandwidth_mb_s must be >= 0, got {bandwidth_mb_s}")
        if concurrency < 1:
            raise ConfigError(f"concurrency must be >= 1, got {concurrency}")
        if client_cpu_ms < 0:
            raise ConfigError(f"client_cpu_ms must be >= 0, got {client_cpu_ms}")
        self.client_cpu_s = client_cpu_ms / 1000.0
        self.inner = inner
        self.manifest = inner.manifest
        self.content_keyed = inner.content_keyed
        self.input_field, self.target_field = inner.input_field, inner.target_field
        self.latency_s = latency_ms / 1000.0
        self.bytes_per_s = bandwidth_mb_s * 1e6
        self.concurrency = int(concurrency)
        context = multiprocessing.get_context()
        self._slots = NodeSlots(self.concurrency)
        # when the link has carried every byte charged so far (time.monotonic, which
        # every process on the machine shares)
        self._link_free = context.Value("d", 0.0)
        # a storage that makes its own requests (one per file, or a range of a shard for
        # several samples) pays per request, where they are made; others per read here
        self._wired = inner.with_wire(self._through)

    @property
    def retries(self) -> int:
        return (self.inner if self._wired is None else self._wired).retries

    @property
    def index_retries(self) -> int:  # type: ignore[override]
        return self.inner.index_retries

    @property
    def requests(self) -> int | None:
        return (self.inner if self._wired is None else self._wired).requests

    def describe(self, i: int) -> str:
        return self.inner.describe(i)

    @property
    def extents(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        # ranges only pay off where the inner storage makes the requests (wired)
        return None if self._wired is None else self.inner.extents

    @property
    def cost(self) -> CostModel | None:
        return None if self._wired is None else self._wired.cost

    @property
    def merge_gap(self) -> int:
        return 0 if self._wired is None else self._wired.merge_gap

    @merge_gap.setter
    def merge_gap(self, gap: int) -> None:
        if self._wired is not None:
            self._wired.merge_gap = gap

    @property
    def wire_bytes(self) -> int | None:
        return (self.inner if self._wired is None else self._wired).wire_bytes

    @property
    def in_flight_s(self) -> float:
        return self._slots.in_flight_s

    def _pay(self, nbytes: int, start: float) -> None:
        """Hold a request that began at ``start`` (``time.monotonic``) until its latency
        has passed and its ``nbytes`` have crossed the shared link."""
        done = start + self.latency_s
        if self.bytes_per_s and nbytes:
            with self._link_free.get_lock():
                done = max(done, self._link_free.value) + nbytes / self.bytes_per_s
                self._link_free.value = done
        remaining = done - time.monotonic()
        if remaining > 0:
            time.sleep(remaining)

    def _client_cpu(self) -> None:
        """The client's CPU for one request: this thread busy (``time.thread_time``)."""
        if self.client_cpu_s:
            end = time.thread_time() + self.client_cpu_s
            while time.thread_time() < end:
                pass

    def _through(self, request) -> bytes:
        """One request on the emulated wire: the client's CPU, a slot, then latency and
        transfer time."""
        self._client_cpu()
        return self._slots(lambda: self._paid(request))

    def _paid(self, request) -> bytes:
        start = time.monotonic()
        data = request()
        self._pay(len(data), start)
        return data

    def read_many(self, ids) -> list[bytes]:
        if self._wired is not None:
            return self._wired.read_many(ids)
        return super().read_many(ids)

    def read(self, i: int) -> bytes:
        if self._wired is not None:
            return self._wired.read(i)
        return self._through(lambda: self.inner.read(i))

    def charge(self, nbytes: int) -> None:
        self._client_cpu()
        self._slots(lambda: self._pay(nbytes, time.monotonic()))
