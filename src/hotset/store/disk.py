"""The disk tier: a node-wide cache of samples' bytes in a directory on local disk (NVMe),
kept across jobs, runs and restarts and shared by every process that opens it.

Layout (``docs/design.md`` says why; ``benchmarks/disk_tier.py`` measures it):

* ``DIR/hotset-disk/seg-N``: append-only segment files. Each writing process appends to a
  segment of its own (an exclusive ``flock`` while it writes), so the node's workers and
  jobs fill the tier at once, each with one sequential ``pwrite`` per batch; a hit is one
  ``pread`` of one contiguous extent.
* ``DIR/hotset-disk/index``: LMDB, per key its segment, offset, length and XXH3-128
  digest. Index transactions are small and short (a reservation before the data is
  written, the entries after), so the single LMDB writer never holds a batch's I/O.

Every hit is checked against its digest (a torn or overwritten extent is a miss, its
entry dropped, ``corrupt`` counted); keys name the source's identity (a content digest,
or the object's URL, size and version with the sample's place), so an entry of a source
rewritten since is never looked up again and ages out.

The byte budget counts what the tier takes on disk: every segment's bytes (those a
killed writer left unindexed included) and the index's pages. When a put would pass it,
the oldest segments not being written are evicted whole, CLOCK-fashion (second chance):
the entries read since they were written are appended again (their hit bit cleared),
the others dropped. What stays is what the node's jobs read again, which for an
importance sampler (SHADE, iCACHE's IIS, SpiderCache) are the samples it rates highest.

A put that cannot land (the filesystem full, an I/O error) stores nothing and is counted
in ``failures``: the caller reads the source. A process killed mid-write leaves bytes no
entry points at (reclaimed with their segment) and never an entry to unwritten bytes.
The directory follows the stores' ownership rules (``lease.py``): the user's own,
writable by nobody else, no link another user owns on the way; files 0600, opened
without following links.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import shutil
import struct
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import lmdb
import numpy as np
import xxhash

from hotset.errors import ConfigError
from hotset.store import lease

log = logging.getLogger(__name__)

SUBDIR = "hotset-disk"
#: an entry: segment, offset, length, XXH3-128 digest of the bytes
_ENTRY = struct.Struct("<QQI16s")
_SEG = struct.Struct(">Q")  # segment ids sort as numbers (oldest first)
_NEXT, _SEG_BYTES = b"next_segment", b"segment_bytes"
_EVICTIONS = b"evictions"  # segments evicted so far: a reader's handles to check
#: a segment's most bytes; small tiers use smaller ones (at least 32 a tier)
SEGMENT_MAX = 64 << 20
SEGMENT_MIN = 1 << 20
_OPEN_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
_OPEN_WRITE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
#: reads at once that go to threads (those not already in the page cache)
READ_THREADS = 8
#: hit bits a process collects before it writes them (CLOCK's bits need not be exact)
HOT_BATCH = 256


#: an entry's digest of its bytes
digest = xxhash.xxh3_128_digest


def segment_bytes(capacity_bytes: int) -> int:
    """The size a segment is closed at: 1/32 of the tier, within [1, 64] MiB."""
    return max(SEGMENT_MIN, min(SEGMENT_MAX, capacity_bytes // 32))


def _seg_key(seg: int, key: bytes = b"") -> bytes:
    return _SEG.pack(seg) + key


class DiskTier:
    """The disk tier in ``directory`` (made 0700 if missing), at most ``capacity_bytes``
    on disk. ``get_many`` and ``put`` are safe from any number of processes at once; the
    object can be handed to DataLoader workers (each opens its own handles)."""

    def __init__(self, directory: str | os.PathLike[str], capacity_bytes: int) -> None:
        if int(capacity_bytes) < 2 * SEGMENT_MIN:
            raise ConfigError(
                f"disk_bytes={capacity_bytes}: a disk tier needs at least {2 * SEGMENT_MIN} "
                "bytes"
            )
        self.capacity_bytes = int(capacity_bytes)
        self.directory = _own_directory(os.fspath(directory))
        self.path = lease.own_private_dir(os.path.join(self.directory, SUBDIR))
        self.seg_max = segment_bytes(self.capacity_bytes)
        self._map_size = max(1 << 30, self.capacity_bytes // 8)  # the index's
        # counters of this process
        self.hits = self.misses = self.corrupt = self.failures = self.refused = 0
        self.hit_bytes = self.written_bytes = self.evicted = 0
        self._pid = -1
        _forget_if_replaced(self.path)  # (removed and made again since this process looked)
        self._remove_orphans()

    # -- handles (one set per process: LMDB's must not cross a fork) -------------------
    @property
    def _ix(self) -> _Index:
        """This process's index handles (shared by its tiers of this directory)."""
        self._here()
        return _index(self.path, self._map_size)

    def _here(self) -> None:
        """Per-process state of this object: a forked worker makes its own."""
        if self._pid != _PID:
            self._pid = _PID
            self._fds: dict[int, int] = {}
            self._writing: tuple[int, int, int] | None = None  # segment, fd, bytes written
            self._pool: ThreadPoolExecutor | None = None
            self._nowait = hasattr(os, "RWF_NOWAIT")
            self._hot: set[bytes] = set()  # read since their bits were last written
            self._put_lock = threading.Lock()
            # handles: a process's threads read at once (iCACHE's feeder beside the
            # loader); one closed while another reads would be a miss, or another file.
            # A read marks itself in flight (a list's append and pop: atomic) before it
            # looks a handle up, and a handle leaves ``_fds`` before ``_inflight`` is
            # looked at: a handle a read holds is never closed (opening and closing take
            # the lock)
            self._fd_lock = threading.Lock()
            self._inflight: list[None] = []
            self._retired: list[int] = []  # handles to close once none is
            self._evictions: bytes | None = b"-"  # the tier's evictions at the last look

    def _fd(self, seg: int) -> int:
        """``seg``'s read handle in this process, opened if need be (the caller in
        flight)."""
        fd = self._fds.get(seg)
        if fd is not None:
            return fd
        with self._fd_lock:
            fd = self._fds.get(seg)
            if fd is not None:
                return fd
            fd = os.open(os.path.join(self.path, f"seg-{seg}"), _OPEN_READ)
            # samples are read in a random order: the kernel's read-ahead would read (and
            # a RWF_NOWAIT probe start reading) pages no hit asked for
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
            if len(self._fds) >= 256:  # close the oldest handle
                self._retire(next(iter(self._fds)))
            self._fds[seg] = fd
        return fd

    def _retire(self, seg: int) -> None:
        """Close ``seg``'s handle once no read of this process is in flight (lock held)."""
        fd = self._fds.pop(seg, None)
        if fd is not None:
            self._retired.append(fd)
        self._close_retired()

    def _close_retired(self) -> None:
        """Close the retired handles if no read of this process is in flight (lock held)."""
        if not self._inflight:
            while self._retired:
                os.close(self._retired.pop())

    # -- reads -------------------------------------------------------------------------
    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """Each key's bytes, checked against their digest, or None."""
        if not keys:
            return []
        if self._pid != _PID:
            self._here()
        try:
            ix = _INDEXES.get(self.path) or _index(self.path, self._map_size)
            with ix.env.begin() as txn:
                get, entries, hot_db, hot = txn.get, ix.entries, ix.hot, self._hot
                evictions = get(_EVICTIONS, db=ix.meta)
                if evictions != self._evictions:
                    self._drop_stale_handles(txn, ix, evictions)
                wanted = []  # (place in keys, key, segment, offset, length, digest)
                cold = []  # keys read whose hit bit is not set yet
                for n, key in enumerate(keys):
                    kb = key.encode()
                    entry = get(kb, db=entries)
                    if entry is not None:
                        wanted.append((n, kb, *_ENTRY.unpack(entry)))
                        if kb not in hot and get(kb, db=hot_db) is None:
                            cold.append(kb)
        except lmdb.Error as exc:
            self.failures += 1
            log.debug("disk tier %s: %s", self.path, exc)
            return [None] * len(keys)
        out: list[bytes | None] = [None] * len(keys)
        self._inflight.append(None)
        try:
            reads = []  # (place in keys, handle, offset, length, digest)
            for n, _, seg, off, length, dig in wanted:
                with contextlib.suppress(OSError):  # (its segment evicted since: a miss)
                    reads.append((n, self._fd(seg), off, length, dig))
            if len(reads) == 1:  # (one read: here, neither probed nor handed to a thread)
                n, *read = reads[0]
                out[n] = self._pread(*read)
            else:
                self._read(reads, out)
        finally:
            self._inflight.pop()
            if self._retired:
                with self._fd_lock:
                    self._close_retired()
        bad, nbytes = [], 0
        for n, kb, *_ in wanted:
            if out[n] is None:
                bad.append(kb)
            else:
                nbytes += len(out[n])
        self.hits += len(wanted) - len(bad)
        self.misses += len(keys) - len(wanted) + len(bad)
        self.hit_bytes += nbytes
        if cold:
            hot.update(cold)
        if bad:
            hot.difference_update(bad)
        if bad or len(hot) >= HOT_BATCH:
            self._write_txn(lambda txn: self._mark(txn, bad))
        return out

    def _drop_stale_handles(self, txn, ix: _Index, evictions: bytes | None) -> None:
        """Close the handles of segments evicted since the last look (``evictions``: the
        tier's count now; an unlinked file keeps its blocks while a handle is open)."""
        self._evictions = evictions
        with self._fd_lock:
            for seg in [s for s in self._fds if txn.get(_SEG.pack(s), db=ix.segs) is None]:
                self._retire(seg)

    def _read(self, reads: list[tuple], out: list[bytes | None]) -> None:
        """Fill ``out[n]`` for each of several ``(n, fd, offset, length, digest)``: those
        in the page cache read here (``RWF_NOWAIT``), the rest on threads (a cold disk
        answers several at once; those after the first not cached go unprobed)."""
        later, probe = [], self._nowait
        for n, fd, off, length, dig in reads:
            if probe:
                buf = bytearray(length)
                try:
                    if os.preadv(fd, [buf], off, os.RWF_NOWAIT) == length:
                        out[n] = self._checked(bytes(buf), dig)
                        continue
                except BlockingIOError:
                    probe = False  # (a cold disk: the rest go to threads unprobed)
                except OSError as exc:
                    if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                        continue
                    self._nowait = probe = False  # (a filesystem without it)
            later.append((n, fd, off, length, dig))
        if len(later) == 1:  # (one read: no hand-off to a thread)
            n, *read = later[0]
            out[n] = self._pread(*read)
        elif later:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(READ_THREADS, thread_name_prefix="hotset-disk")
            for n, data in self._pool.map(lambda t: (t[0], self._pread(*t[1:])), later):
                out[n] = data

    def _pread(self, fd: int, off: int, length: int, dig: bytes) -> bytes | None:
        try:
            data = os.pread(fd, length, off)
        except OSError as exc:  # (the disk's error: counted, the source serves)
            self.failures += 1
            log.debug("disk tier %s: %s", self.path, exc)
            return None
        return self._checked(data, dig)

    def _checked(self, data: bytes, dig: bytes) -> bytes | None:
        if digest(data) == dig:
            return data
        self.corrupt += 1
        return None

    def _mark(self, txn, bad: list[bytes] = ()) -> None:
        """Set the hit bits of the entries read since the last time (a write transaction
        per ``HOT_BATCH`` of them, or with a put, not one a read), drop ``bad``."""
        hot = list(self._hot)  # (a copy: another thread of this process may add to it)
        for k in hot:
            if txn.get(k, db=self._ix.entries) is not None:
                txn.put(k, b"", db=self._ix.hot)
        self._hot.difference_update(hot)
        for k in bad:
            self._drop(txn, k)

    def _drop(self, txn, key: bytes) -> None:
        entry = txn.get(key, db=self._ix.entries)
        if entry is not None:
            txn.delete(key, db=self._ix.entries)
            txn.delete(_seg_key(_ENTRY.unpack(entry)[0], key), db=self._ix.members)
        txn.delete(key, db=self._ix.hot)

    def touch(self, keys: Sequence[str]) -> None:
        """Give ``keys`` their second chance (set their hit bits, a batch at a time)."""
        self._here()
        self._hot.update(k.encode() for k in keys)
        if len(self._hot) >= HOT_BATCH:
            self._write_txn(self._mark)

    def contains(self, key: str) -> bool:
        return bool(self.contains_many([key])[0][0])

    def contains_many(self, keys: Sequence[str]) -> tuple[np.ndarray, bytes | None]:
        """Which of ``keys`` the tier holds now (none where its index cannot be read),
        and its count of evictions so far: entries leave the tier only by eviction (a
        corrupt one aside), so a key held stays held while the count stays."""
        self._here()
        try:
            with self._ix.env.begin() as txn:
                get, db = txn.get, self._ix.entries
                held = np.array([get(k.encode(), db=db) is not None for k in keys], bool)
                return held, get(_EVICTIONS, db=self._ix.meta)
        except lmdb.Error as exc:
            self.failures += 1
            log.debug("disk tier %s: %s", self.path, exc)
            return np.zeros(len(keys), bool), None

    # -- writes ------------------------------------------------------------------------
    def put(self, items: Mapping[str, bytes]) -> int:
        """Keep what fits (the oldest segments evicted to make room); returns how many
        new entries landed. Keys already held are skipped (another job wrote them)."""
        self._here()
        with self._put_lock:  # (one writer a segment: a process's threads take turns)
            return self._put(items)

    def _put(self, items: Mapping[str, bytes]) -> int:
        try:
            with self._ix.env.begin() as txn:
                new = {k.encode(): v for k, v in items.items()
                       if txn.get(k.encode(), db=self._ix.entries) is None}  # fmt: skip
        except lmdb.Error:
            self.failures += 1
            return 0
        if not new:
            return 0
        nbytes = sum(len(v) for v in new.values())
        if nbytes > self.seg_max:  # one segment a put: split it
            keys, stored, part, size = list(new), 0, {}, 0
            for k in keys:
                if part and size + len(new[k]) > self.seg_max:
                    stored += self._put_segment(part)
                    part, size = {}, 0
                part[k] = new[k]
                size += len(new[k])
            return stored + self._put_segment(part)
        return self._put_segment(new)

    def _put_segment(self, new: dict[bytes, bytes]) -> int:
        nbytes = sum(len(v) for v in new.values())
        seg, fd, off = self._segment(nbytes)
        if seg < 0:
            return 0
        survivors: dict[bytes, bytes] = {}
        ok = self._write_txn(lambda txn: self._reserve(txn, seg, nbytes, survivors))
        if not ok:
            self.refused += len(new)
            return 0
        if survivors:  # what eviction keeps is written with this batch
            new = {**survivors, **new}
        values = list(new.values())
        blob = b"".join(values)
        try:
            written = os.pwrite(fd, blob, off)
        except OSError as exc:
            written = -1
            if exc.errno != errno.ENOSPC:
                log.warning("disk tier %s: writing failed: %s", self.path, exc)
        if written != len(blob):  # the disk is full (or failing): nothing of it is kept
            self.failures += 1
            self._close_segment()
            return 0
        self._writing = (seg, fd, off + len(blob))
        entries, pos = [], off
        for k, v in zip(new, values, strict=True):
            entries.append((k, _ENTRY.pack(seg, pos, len(v), digest(v))))
            pos += len(v)
        stored = self._write_txn(lambda txn: self._index(txn, seg, entries), 0)
        self.written_bytes += len(blob)
        if self._writing[2] >= self.seg_max:
            self._close_segment()
        return max(0, stored - len(survivors))

    def _segment(self, nbytes: int) -> tuple[int, int, int]:
        """This process's open segment with room for ``nbytes`` (a new one if needed);
        segment -1 if none could be made."""
        if self._writing is not None and self._writing[2] + nbytes <= self.seg_max:
            return self._writing
        self._close_segment()

        def allocate(txn) -> int:
            seg = int(txn.get(_NEXT, db=self._ix.meta))
            txn.put(_NEXT, str(seg + 1).encode(), db=self._ix.meta)
            txn.put(_SEG.pack(seg), b"0", db=self._ix.segs)
            return seg

        seg = self._write_txn(allocate, -1)
        if seg < 0:
            return -1, -1, 0
        try:
            fd = os.open(os.path.join(self.path, f"seg-{seg}"), _OPEN_WRITE, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # (a new file: never held)
        except OSError as exc:
            self.failures += 1
            log.warning("disk tier %s: cannot make a segment: %s", self.path, exc)
            return -1, -1, 0
        self._writing = (seg, fd, 0)
        return self._writing

    def _close_segment(self) -> None:
        if self._writing is not None:
            os.close(self._writing[1])  # (its flock goes with it: evictable now)
            self._writing = None

    def _reserve(self, txn, seg: int, nbytes: int, survivors: dict[bytes, bytes]) -> bool:
        """Count ``nbytes`` more for ``seg``, evicting the oldest idle segments while the
        tier would be over its budget (CLOCK: entries read since written survive, their
        bytes read into ``survivors`` to be written again with the batch). False: no
        room, even with every idle segment evicted."""
        self._mark(txn)  # (what this process read since: before eviction looks at the bits)
        used = int(txn.get(_SEG_BYTES, db=self._ix.meta))
        index = self._index_bytes()
        room = self.capacity_bytes - index
        victims = txn.cursor(db=self._ix.segs)
        victims.first()
        kept = evicted = 0  # the survivors' bytes; segments evicted
        while used + nbytes + kept > room and victims.key():
            victim = _SEG.unpack(victims.key())[0]
            if victim == seg or self._busy(victim):
                victims.next()
                continue
            used -= int(victims.value())
            victims.delete()  # (moves to the next)
            kept += self._evict(txn, victim, survivors)
            evicted += 1
        if evicted:
            evictions = int(txn.get(_EVICTIONS, db=self._ix.meta) or 0) + evicted
            txn.put(_EVICTIONS, str(evictions).encode(), db=self._ix.meta)
        while survivors and used + nbytes + kept > room:
            kept -= len(survivors.popitem()[1])  # no room for every second chance
        total = nbytes + kept
        if used + total > room:
            txn.put(_SEG_BYTES, str(used).encode(), db=self._ix.meta)
            return False
        mine = _SEG.pack(seg)
        txn.put(mine, str(int(txn.get(mine, db=self._ix.segs) or 0) + total).encode(),
                db=self._ix.segs)  # fmt: skip
        txn.put(_SEG_BYTES, str(used + total).encode(), db=self._ix.meta)
        return True

    def _busy(self, seg: int) -> bool:
        """Whether a live process still writes segment ``seg`` (holds its flock)."""
        try:
            fd = os.open(os.path.join(self.path, f"seg-{seg}"), _OPEN_READ)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return False
        except BlockingIOError:
            return True
        finally:
            os.close(fd)

    def _evict(self, txn, seg: int, survivors: dict[bytes, bytes]) -> int:
        """Drop segment ``seg``'s entries, reading those with their hit bit into
        ``survivors`` (bit cleared), and remove its file; returns the bytes they keep."""
        prefix = _SEG.pack(seg)
        cursor = txn.cursor(db=self._ix.members)
        keys = []
        if cursor.set_range(prefix):
            for k in cursor.iternext(values=False):
                if not k.startswith(prefix):
                    break
                keys.append(bytes(k[len(prefix) :]))
        kept = 0
        try:  # (a handle of its own: the process's may be closed by its other threads)
            fd = os.open(os.path.join(self.path, f"seg-{seg}"), _OPEN_READ)
        except OSError:  # (its file gone: nothing to keep)
            fd = None
        for k in keys:
            entry = txn.get(k, db=self._ix.entries)
            if fd is not None and entry is not None and txn.get(k, db=self._ix.hot) is not None:
                data = self._pread(fd, *_ENTRY.unpack(entry)[1:])
                if data is not None:
                    survivors[k] = data
                    kept += len(data)
            self._drop(txn, k)
        if fd is not None:
            os.close(fd)
        self.evicted += len(keys)
        with self._fd_lock:
            self._retire(seg)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(self.path, f"seg-{seg}"))
        return kept

    def _index(self, txn, seg: int, entries: list[tuple[bytes, bytes]]) -> int:
        """Record the entries written to ``seg`` (those another process indexed meanwhile
        are left as they are); returns how many landed."""
        if txn.get(_SEG.pack(seg), db=self._ix.segs) is None:
            return 0  # (never: a segment being written is not evicted)
        stored = 0
        for k, entry in entries:
            if txn.get(k, db=self._ix.entries) is None:
                txn.put(k, entry, db=self._ix.entries)
                txn.put(_seg_key(seg, k), b"", db=self._ix.members)
                stored += 1
        return stored

    def _index_bytes(self) -> int:
        info, stat = self._ix.env.info(), self._ix.env.stat()
        return (info["last_pgno"] + 1) * stat["psize"]

    def _write_txn(self, fn, fallback=False):
        try:
            with self._ix.env.begin(write=True) as txn:
                return fn(txn)
        except lmdb.Error as exc:  # the map or the disk full: counted, the source serves
            self.failures += 1
            log.debug("disk tier %s: %s", self.path, exc)
            return fallback

    def _remove_orphans(self) -> None:
        """Segment files no index entry counts (a writer killed between its reservation
        and its file, or an eviction cut short): removed when nobody writes them."""
        with self._ix.env.begin() as txn:
            live = {_SEG.unpack(k)[0] for k in txn.cursor(db=self._ix.segs).iternext(values=False)}
        for name in os.listdir(self.path):
            if name.startswith("seg-") and name[4:].isdigit():
                seg = int(name[4:])
                if seg not in live and not self._busy(seg):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(self.path, name))

    # -- what it holds -----------------------------------------------------------------
    @property
    def used_bytes(self) -> int:
        """Bytes the tier takes on disk: its segments and its index."""
        self._here()
        with self._ix.env.begin() as txn:
            return int(txn.get(_SEG_BYTES, db=self._ix.meta)) + self._index_bytes()

    def __len__(self) -> int:
        self._here()
        with self._ix.env.begin() as txn:
            return txn.stat(self._ix.entries)["entries"]

    def counters(self) -> dict[str, int]:
        return {
            "disk_hits": self.hits, "disk_misses": self.misses, "disk_corrupt": self.corrupt,
            "disk_failures": self.failures, "disk_refused": self.refused,
            "disk_hit_bytes": self.hit_bytes, "disk_written_bytes": self.written_bytes,
            "disk_evicted": self.evicted,
        }  # fmt: skip

    def close(self) -> None:
        """Release this object's handles (the process's index stays open for its other
        users); the tier's files stay for the next job."""
        if self._pid != os.getpid():
            return
        if self._hot:
            self._write_txn(self._mark)
        self._close_segment()
        with self._fd_lock:
            for seg in list(self._fds):
                self._retire(seg)
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None
        self._pid = -1

    def __getstate__(self) -> dict:
        state = {k: v for k, v in self.__dict__.items()
                 if k not in ("_fds", "_writing", "_pool", "_nowait", "_evictions", "_hot",
                              "_put_lock", "_fd_lock", "_inflight", "_retired")}
        state["_pid"] = -1  # the receiving process makes its own
        return state


#: the disk tier's share of its filesystem's free space when no ``disk_bytes`` is given
DEFAULT_DISK_SHARE = 0.75
#: where a node's disk tier is configured when ``disk_dir`` is not given
DISK_DIR_ENV = "HOTSET_DISK_DIR"


def open_disk_tier(
    disk_dir: str | os.PathLike[str] | None, disk_bytes: int | None
) -> DiskTier | None:
    """The node's disk tier at ``disk_dir`` (or ``$HOTSET_DISK_DIR``), of ``disk_bytes``
    (default: ``DEFAULT_DISK_SHARE`` of its filesystem's free space, as LitData's node
    cache takes); None if neither names a directory."""
    if disk_dir is None:
        disk_dir = os.environ.get(DISK_DIR_ENV) or None
        if disk_dir is None:
            if disk_bytes is not None:
                raise ConfigError(f"disk_bytes={disk_bytes} without disk_dir: name the directory")
            return None
    if disk_bytes is None:
        where = os.path.abspath(os.fspath(disk_dir))
        while not os.path.exists(where):
            where = os.path.dirname(where)
        st = os.statvfs(where)
        disk_bytes = int(DEFAULT_DISK_SHARE * st.f_bavail * st.f_frsize)
    return DiskTier(disk_dir, int(disk_bytes))


class OpeningFill:
    """Whether opening a loader reads a remote shard whole to keep it on ``tier`` (a tar
    storage's ``wants``, asked with the shard's first key and its bytes): its samples not
    held yet, and its bytes within the room the tier had free at the first ask. A shard
    read whole past that room would only evict one kept before it, and the first epoch
    would read both again."""

    def __init__(self, tier: DiskTier) -> None:
        self.tier = tier
        self._room: int | None = None
        self._lock = threading.Lock()  # (shards are indexed on threads)

    def __call__(self, first_key: str, nbytes: int) -> bool:
        if self.tier.contains(first_key):
            return False
        with self._lock:
            if self._room is None:
                self._room = self.tier.capacity_bytes - self.tier.used_bytes
            if nbytes > self._room:
                return False
            self._room -= nbytes
            return True


class _Index(NamedTuple):
    env: lmdb.Environment
    entries: object  # key -> entry
    members: object  # segment + key: the segment's entries
    segs: object  # segment -> its bytes reserved
    hot: object  # keys read since written (CLOCK's bit)
    meta: object
    inode: int  # the index directory's, when opened


#: this process's index of each tier directory (LMDB forbids opening one twice in a
#: process; several DiskTier objects may name it)
_INDEXES: dict[str, _Index] = {}


def _index(path: str, map_size: int) -> _Index:
    ix = _INDEXES.get(path)
    if ix is not None:
        return ix
    index = os.path.join(path, "index")
    if not os.path.isdir(index):
        lease.own_private_dir(index)
    lease.check_own_dir(index, private=True)
    lease.check_lmdb_files(index)

    def open_env() -> lmdb.Environment:
        return lmdb.open(index, map_size=map_size, max_dbs=5, mode=0o600, sync=False,
                         metasync=False, readahead=False, max_readers=1024)  # fmt: skip

    try:
        env = open_env()
    except (lmdb.CorruptedError, lmdb.InvalidError, lmdb.VersionMismatchError) as exc:
        # a damaged index (a crash of the machine): the tier starts anew
        log.warning("disk tier %s: its index cannot be opened (%s); starting it anew",
                    path, exc)  # fmt: skip
        shutil.rmtree(path)
        lease.own_private_dir(path)
        lease.own_private_dir(index)
        env = open_env()
    dbs = [env.open_db(name) for name in (b"entries", b"members", b"segments", b"hot", b"meta")]
    ix = _INDEXES[path] = _Index(env, *dbs, os.stat(index).st_ino)
    with env.begin(write=True) as txn:  # a new tier
        if txn.get(_NEXT, db=ix.meta) is None:
            txn.put(_NEXT, b"0", db=ix.meta)
            txn.put(_SEG_BYTES, b"0", db=ix.meta)
    return ix


def _forget_if_replaced(path: str) -> None:
    """Close this process's index of ``path`` if the directory was removed and made
    again since it was opened: it would write into the removed files."""
    ix = _INDEXES.get(path)
    if ix is None:
        return
    try:
        same = os.stat(os.path.join(path, "index")).st_ino == ix.inode
    except FileNotFoundError:
        same = False
    if not same:
        ix.env.close()
        del _INDEXES[path]


def _close_before_fork() -> None:
    """Close the indexes before a fork (the parent reopens them on next use, the child
    opens its own)."""
    for ix in _INDEXES.values():
        ix.env.close()
    _INDEXES.clear()


def _forked() -> None:
    global _PID
    _PID = os.getpid()


#: this process's id (a forked child's set at the fork: no system call a read)
_PID = os.getpid()
os.register_at_fork(before=_close_before_fork, after_in_child=_forked)


def _own_directory(path: str) -> str:
    """``path`` made (0700) if missing, else checked: the user's own, writable by nobody
    else, no link another user owns on the way (``lease.check_own_dir``)."""
    path = os.path.abspath(path)
    lease.check_ancestors(path)
    if not os.path.lexists(path):
        try:
            os.makedirs(path, mode=0o700)
        except FileExistsError:
            pass  # another process made it meanwhile (a job's ranks, two runs): checked below
        except OSError as exc:
            raise ConfigError(f"disk_dir={path}: cannot create it: {exc}") from exc
    lease.check_own_dir(path)
    return os.path.realpath(path)
