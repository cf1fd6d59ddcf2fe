"""Reads from a storage that can fail for a moment: one call per batch, retried.

A batch's reads are one call: an async filesystem (HTTP, S3, GCS through fsspec) gets
them as one ``cat_ranges`` with up to ``concurrency`` in flight on the process's
connection pool; a synchronous one (local files, NFS) as reads on this process's threads,
a share of the batch per thread. Local reads that return faster than a hand-off between
threads (page-cached files: ~20 us each, where a thread costs 70-120 us of GIL hand-offs,
``benchmarks/sample_path_cpu.py``) are made in the calling thread with plain ``open``;
the DataLoader's workers read in parallel anyway.
A transient failure (a time-out, a dropped connection, a 5xx, 408 or 429 answer) is
retried with exponential backoff and full jitter, up to ``Retry.attempts`` in all; a
missing file or a refusal is final at once. What still fails is returned as its
exception, for the caller to name the sample; ``failure_kind`` says what it was. Calls
other than reads (a listing, an index) are retried by the same rule (``remote_call``).

A server that ignores ``Range`` (``python -m http.server``) answers a range request with
the whole object: the reader then slices the range out of it, reads each object once per
call from then on, and warns once with what that costs.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import fsspec
from fsspec.implementations.local import LocalFileSystem

from hotset.errors import ShardError

log = logging.getLogger("hotset")

T = TypeVar("T")

FINAL = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)


@dataclass(frozen=True)
class Retry:
    """``attempts`` in all per read; the wait before attempt k+1 is uniform in
    ``[0, min(max_s, base_s * 2**k)]`` (exponential backoff, full jitter)."""

    attempts: int = 4
    base_s: float = 0.05
    max_s: float = 2.0

    def delay(self, attempt: int) -> float:
        return random.uniform(0.0, min(self.max_s, self.base_s * 2**attempt))


def transient(exc: BaseException) -> bool:
    """Whether a read that failed with ``exc`` may succeed if tried again."""
    if isinstance(exc, FINAL):
        return False
    status = _status(exc)
    if status is not None:
        return status >= 500 or status in (408, 429)
    return isinstance(exc, OSError | TimeoutError) or type(exc).__module__.startswith(
        ("aiohttp", "botocore", "aiobotocore", "gcsfs")
    )


def _status(exc: BaseException) -> int | None:
    status = getattr(exc, "status", None)  # an HTTP answer (aiohttp, s3fs)
    if not isinstance(status, int) and type(exc).__module__.startswith("gcsfs"):
        status = getattr(exc, "code", None)  # gcsfs's HttpError
    return status if isinstance(status, int) else None


def _named(exc: BaseException, *names: str) -> bool:
    return any(n in c.__name__ for c in type(exc).__mro__ for n in names)


def failure_kind(exc: BaseException) -> str:
    """What a remote call's failure was, in a user's words: ``not found``, ``forbidden``,
    ``unreachable``, ``timed out``, ``cut off`` (a connection reset or an answer shorter
    than announced) or ``failed``."""
    status = _status(exc)
    if isinstance(exc, FileNotFoundError) or status in (404, 410):
        return "not found"
    if isinstance(exc, PermissionError) or status in (401, 403):
        return "forbidden"
    if isinstance(exc, TimeoutError) or _named(exc, "Timeout"):
        return "timed out"
    if isinstance(exc, ConnectionRefusedError) or _named(
        exc, "ClientConnectorError", "EndpointConnectionError", "gaierror"
    ):
        return "unreachable"
    if isinstance(exc, ConnectionResetError) or _named(
        exc, "ClientPayloadError", "ContentLengthError", "IncompleteRead", "ServerDisconnected"
    ):
        return "cut off"
    return "failed"


def _attempts(exc: BaseException, retry: Retry) -> str:
    return f" after {retry.attempts} attempts" if transient(exc) else ""


def read_failure(exc: BaseException, retry: Retry) -> str:
    """Why a read failed, for a sample's error: its kind, the attempts made, the cause."""
    return f"read {failure_kind(exc)}{_attempts(exc, retry)}: {exc!r}"


def remote_call(
    fs: fsspec.AbstractFileSystem,
    url: str,
    call: Callable[[], T],
    retry: Retry,
    count: Callable[[], None] | None = None,
) -> T:
    """``call()`` (a listing, an index read) on the object or prefix ``url``, tried again
    after a transient failure as ``retry`` says (``count()`` at each new attempt); its
    failure raised as ``ShardError`` naming ``url`` and its ``failure_kind``. fsspec's
    HTTP answers every failed listing as not found: a one-byte read of ``url`` says which
    failure it was (none: a transient one)."""
    for attempt in range(retry.attempts):
        try:
            return call()
        except ShardError:
            raise
        except Exception as exc:
            cause: BaseException | None = exc
            if isinstance(exc, FileNotFoundError) and "http" in fs.protocol:
                try:
                    fs.cat_file(fs._strip_protocol(url), start=0, end=1)
                    cause = None  # it is there: the listing failed for a moment
                except Exception as probe:  # noqa: BLE001 - it names the failure
                    cause = probe
            final = cause is not None and not transient(cause)
            if final or attempt + 1 == retry.attempts:
                cause = cause or exc
                detail = f"{cause!r}{_attempts(cause, retry)}"
                raise ShardError(url, failure_kind(cause), detail) from cause
            if count is not None:
                count()
            time.sleep(retry.delay(attempt))
    raise AssertionError("unreachable")  # (the loop returns or raises)


class BatchReader:
    """Reads of whole files, or of ``[start, end)`` ranges of them, on ``fs``; ``requests``
    counts the requests made, ``bytes`` what they returned and ``retries`` those tried
    again (in this process)."""

    def __init__(
        self,
        fs: fsspec.AbstractFileSystem,
        concurrency: int = 8,
        retry: Retry | None = None,
        wire: Callable[[Callable[[], bytes]], bytes] | None = None,
    ) -> None:
        """``wire``: what a synchronous request passes through (``ThrottledStorage``'s
        emulated latency, bandwidth and in-flight limit, paid per request)."""
        self.fs, self.concurrency, self.retry = fs, max(int(concurrency), 1), retry or Retry()
        self.wire = wire
        self.retries = self.requests = self.bytes = 0
        self._pool: ThreadPoolExecutor | None = None
        self._local = isinstance(fs, LocalFileSystem) and wire is None
        self._read_s = 0.0  # a local read's time, smoothed: whether threads pay off
        self.whole_objects = False  # the server ignores Range: read whole objects

    def read(
        self,
        paths: Sequence[str],
        starts: Sequence[int | None] | None = None,
        ends: Sequence[int | None] | None = None,
    ) -> list[bytes | BaseException]:
        """Each path's bytes (``starts``/``ends``: of that range), or the exception that
        ended its last attempt."""
        none = [None] * len(paths)
        starts, ends = starts or none, ends or none
        out: list[bytes | BaseException] = [b""] * len(paths)
        todo = list(range(len(paths)))
        for attempt in range(self.retry.attempts):
            again = []
            once = self._ranges(
                [paths[i] for i in todo], [starts[i] for i in todo], [ends[i] for i in todo]
            )
            for i, got in zip(todo, once, strict=True):
                out[i] = got
                if isinstance(got, BaseException) and transient(got):
                    again.append(i)
            if not again or attempt + 1 == self.retry.attempts:
                break
            self.retries += len(again)
            time.sleep(self.retry.delay(attempt))
            todo = again
        return out

    def _ranges(self, paths: list[str], starts: list, ends: list) -> list[bytes | BaseException]:
        """One attempt at each range; from a server that ignores ``Range``, each object
        read whole once and the ranges sliced from it."""
        if self.whole_objects:
            unique = list(dict.fromkeys(paths))
            got = dict(zip(unique, self._once(unique, [None] * len(unique), [None] * len(unique)),
                           strict=True))  # fmt: skip
            return [got[p] if isinstance(got[p], BaseException) else got[p][a or 0 : b]
                    for p, a, b in zip(paths, starts, ends, strict=True)]  # fmt: skip
        out = self._once(paths, starts, ends)
        for k, (got, a, b) in enumerate(zip(out, starts, ends, strict=True)):
            if isinstance(got, bytes) and b is not None and len(got) > b - (a or 0):
                self._ignores_range(paths[k], len(got), b - (a or 0))
                out[k] = got[a or 0 : b]  # (the answer was the whole object)
        return out

    def _ignores_range(self, path: str, got: int, asked: int) -> None:
        if not self.whole_objects:
            log.warning(
                "%s: the server ignores Range requests (asked for %d bytes, got the whole "
                "object, %d): hotset reads each object whole once per batch from now on, "
                "which moves far more bytes than the samples need; serve the data from a "
                "server that answers Range (nginx, an object store)", path, asked, got,
            )  # fmt: skip
        self.whole_objects = True

    def _once(self, paths: list[str], starts: list, ends: list) -> list[bytes | BaseException]:
        out = self._requests(paths, starts, ends)
        self.requests += len(paths)
        self.bytes += sum(len(got) for got in out if isinstance(got, bytes))
        return out

    def _requests(self, paths: list[str], starts: list, ends: list) -> list[bytes | BaseException]:
        if self.wire is None and getattr(self.fs, "async_impl", False):  # one call, all in flight
            return self.fs.cat_ranges(paths, starts, ends, batch_size=self.concurrency,
                                      on_error="return")  # fmt: skip
        threads = min(self.concurrency, len(paths))
        if self._local and self._read_s < THREADS_PAY_S:
            threads = 1
        if threads == 1:
            return self._some(paths, starts, ends)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="hotset-read")
        # a share of the batch per thread (not a task per read), in order
        parts = [slice(k, None, threads) for k in range(threads)]
        done = list(self._pool.map(lambda s: self._some(paths[s], starts[s], ends[s]), parts))
        out: list = [None] * len(paths)
        for part, got in zip(parts, done, strict=True):
            out[part] = got
        return out

    def _some(self, paths: list[str], starts: list, ends: list) -> list[bytes | BaseException]:
        t = time.perf_counter()
        out = list(map(self._one, paths, starts, ends))
        if self._local:
            self._read_s += 0.2 * ((time.perf_counter() - t) / max(len(paths), 1) - self._read_s)
        return out

    def _one(self, path: str, start: int | None, end: int | None) -> bytes | BaseException:
        try:
            if self.wire is not None:
                return self.wire(lambda: self.fs.cat_file(path, start=start, end=end))
            if self._local:
                return _read_local(path, start, end)
            return self.fs.cat_file(path, start=start, end=end)
        except Exception as exc:  # noqa: BLE001 - returned, for the caller to name
            return exc


#: a local read slower than this (a cold disk, a network mount) is worth a thread
THREADS_PAY_S = 200e-6


def _read_local(path: str, start: int | None, end: int | None) -> bytes:
    """A local file's bytes (of ``[start, end)``), without fsspec's file object."""
    with open(path, "rb", buffering=0) as f:
        if start:
            f.seek(start)
        return f.read() if end is None else f.read(end - (start or 0))


class NodeSlots:
    """At most ``n`` requests in flight across every process that shares this object
    (a DataLoader's workers inherit it, as they inherit the storage): each request waits
    for a slot, so a worker with many reads to make uses the slots that idle workers
    leave, where a fixed share per worker would leave them unused. A ``wire`` for
    :class:`BatchReader`. ``in_flight_s``: the seconds this process's requests held a
    slot, summed (each request's own time; the wait for a slot is queueing)."""

    def __init__(self, n: int) -> None:
        self.n = int(n)
        self._slots = multiprocessing.get_context().BoundedSemaphore(self.n)
        self._lock = threading.Lock()
        self.in_flight_s = 0.0

    def __call__(self, request: Callable[[], T]) -> T:
        with self._slots:
            start = time.perf_counter()
            try:
                return request()
            finally:
                held = time.perf_counter() - start
                with self._lock:
                    self.in_flight_s += held

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_lock": None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _lock=threading.Lock())


def reader_of(owner: object, make) -> BatchReader:
    """``owner``'s reader in this process (made by ``make()`` on first use and again in
    each worker process: connection pools and threads never cross a fork)."""
    state = owner.__dict__
    if state.get("_batch_reader_pid") != os.getpid():
        state.update(_batch_reader=make(), _batch_reader_pid=os.getpid())
    return state["_batch_reader"]
