"""Remote tar shards read whole, in shard order, into a local spool, each indexed as it
lands: what a first epoch that streams the shards (``first_epoch.py``) reads.

A shard is one request (a few of ``INDEX_BLOCK`` when it is larger than
``WHOLE_SHARD_BYTES``), written to a file of the spool and indexed from there
(``index_shard``); its index goes to the user's index cache exactly as ``TarStorage``
keeps it, so the loader made after the epoch reads no shard again to index it. The first
shard is read alone, so that its bytes have the link to themselves and the first batch
waits for it only; then ``ahead`` shards are read at once. Each request is retried as
``retry`` says; a shard that cannot be read is a ``ShardError`` naming it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hotset.errors import ShardError
from hotset.io.reader import Retry, remote_call
from hotset.storage.tar import (
    INDEX_BLOCK,
    WHOLE_SHARD_BYTES,
    cached_shard_index,
    fingerprint,
    index_file,
    index_shard,
    load_index,
    locate_shards,
    shard_indexed,
    shard_records,
)
from hotset.store import lease

#: shards read at once after the first (each a request in flight, and a file spooled)
AHEAD = 8
#: requests in flight while the shards' sizes and versions are asked for
INFO_THREADS = 32


@dataclass(frozen=True)
class SpooledShard:
    """Shard ``index`` of the set, spooled at ``path``; its samples are ids ``first_id``
    on (those of the shards before it come first), ``arrays`` its index
    (``shard_arrays``)."""

    index: int
    url: str
    path: Path
    first_id: int
    arrays: dict[str, np.ndarray]

    def __len__(self) -> int:
        return len(self.arrays["start"])


class ShardSpool:
    """The shards ``url`` names (as ``TarStorage`` takes them), iterated in shard order
    as each lands in a spool directory (made under ``directory``, which must be the
    user's own and writable by nobody else, default the user's private directory under
    the temporary one; removed by ``close``, or by the next spool after a kill -9).
    ``release(i)`` removes shard ``i``'s file once its samples are served. ``requests``,
    ``bytes`` and ``retries`` count what crossed the link. ``keep``: called with each
    shard's records, by key, as it lands (the disk tier keeps them)."""

    def __init__(
        self,
        url: str | Sequence[str],
        storage_options: dict | None = None,
        retry: Retry | None = None,
        ahead: int = AHEAD,
        directory: str | None = None,
        keep: Callable[[dict[str, bytes]], object] | None = None,
    ) -> None:
        self.retry = retry or Retry()
        self.keep = keep
        options = dict(storage_options or {})
        self.fs, self.urls, self._paths = locate_shards(url, options, self.retry)
        self.ahead = max(1, int(ahead))
        self.requests = self.bytes = self.retries = 0
        self._lock = threading.Lock()
        with ThreadPoolExecutor(min(INFO_THREADS, len(self.urls))) as pool:
            self._infos = list(pool.map(self._info, range(len(self.urls))))
        held = None
        if directory is None:
            made, held = lease.private_temp_dir("hotset-spool-")
        else:
            lease.check_own_dir(directory)
            made = tempfile.mkdtemp(prefix="hotset-spool-", dir=directory)
        self.dir = Path(made)
        self._pool = ThreadPoolExecutor(self.ahead, thread_name_prefix="hotset-spool")
        self._cleanup = weakref.finalize(self, _remove, self._pool, self.dir, held)

    @property
    def remote(self) -> bool:
        return "file" not in self.fs.protocol

    def indexed(self) -> bool:
        """Whether every shard's index, as the shard is now, is in the index cache."""
        return all(
            shard_indexed(u, fingerprint(info))
            for u, info in zip(self.urls, self._infos, strict=True)
        )

    def __iter__(self) -> Iterator[SpooledShard]:
        n = len(self.urls)
        pending = deque([self._pool.submit(self._fetch, 0)])
        following, first_id = 1, 0
        for s in range(n):
            path, arrays = pending.popleft().result()  # (the first: before any other starts)
            while following < n and len(pending) < self.ahead:
                pending.append(self._pool.submit(self._fetch, following))
                following += 1
            shard = SpooledShard(s, self.urls[s], path, first_id, arrays)
            first_id += len(shard)
            yield shard

    def release(self, i: int) -> None:
        """Shard ``i``'s samples are served: its file goes."""
        self.path(i).unlink(missing_ok=True)

    def path(self, i: int) -> Path:
        return self.dir / f"{i:06d}.tar"

    def close(self) -> None:
        """Stop reading and remove the spool."""
        self._cleanup()

    def _count(self, requests: int = 0, nbytes: int = 0, retries: int = 0) -> None:
        with self._lock:
            self.requests += requests
            self.bytes += nbytes
            self.retries += retries

    def _call(self, i: int, call):
        return remote_call(self.fs, self.urls[i], call, self.retry, lambda: self._count(retries=1))

    def _info(self, i: int) -> dict:
        info = self._call(i, lambda: self.fs.info(self._paths[i]))
        self._count(requests=1)
        return info

    def _fetch(self, i: int) -> tuple[Path, dict[str, np.ndarray]]:
        """Shard ``i`` read into its spool file, and its index (kept in the cache)."""
        url, src, dst = self.urls[i], self._paths[i], self.path(i)
        info = self._infos[i]
        size = info.get("size")

        def whole() -> int:
            dst.unlink(missing_ok=True)  # (an attempt cut short: tried again from the start)
            if size is None or size <= WHOLE_SHARD_BYTES:
                data = self.fs.cat_file(src)
                with os.fdopen(lease.create_private_file(dst), "wb") as out:
                    out.write(data)
                self._count(requests=1, nbytes=len(data))
                return len(data)
            got = 0
            with self.fs.open(src, "rb", block_size=INDEX_BLOCK, cache_type="none") as f, \
                    os.fdopen(lease.create_private_file(dst), "wb") as out:  # fmt: skip
                while block := f.read(INDEX_BLOCK):
                    out.write(block)
                    got += len(block)
                    self._count(requests=1, nbytes=len(block))
            return got

        got = self._call(i, whole)
        if size is not None and got != size:
            raise ShardError(url, "cut off", f"{got} of {size} bytes came")
        with open(dst, "rb") as f:
            samples = index_shard(f, url)
        version = fingerprint(info)
        arrays = load_index(
            cached_shard_index(url, version, lambda: index_file(url, samples, version))
        )
        if self.keep is not None:  # (the disk tier: the shard is not read again)
            self.keep(shard_records(dst.read_bytes(), arrays))
        return dst, arrays


def _remove(pool: ThreadPoolExecutor, directory: Path, held: int | None) -> None:
    pool.shutdown(wait=False, cancel_futures=True)
    shutil.rmtree(directory, ignore_errors=True)
    if held is not None:
        os.close(held)
