"""iCACHE's dynamic packaging (HPCA'23 section III-C, Figure 6): a packaging thread
writes L-samples into package files of >= 1 MB; a loading thread reads whole packages
into the L-cache when the policy asks for one.

A package file is ``MAGIC``, an 8-byte little-endian header length, a JSON header
``[{"id", "key", "offset", "size"}, ...]`` and the samples' cache entries back to back
(``Storage.to_entry``: the bytes, or for location keys the bytes with their digest).
Loading checks every entry against its key, so a package can never put wrong bytes into
the cache. A package loads from the entries the packaging thread just wrote where it
still has them (its bytes are not read twice); otherwise the loading thread reads the
file and pays one request of the package's size on the storage (``Storage.charge``): one
large read instead of many small ones.

The simulator's feeder (``policy.icache.InstantPackages``) makes the same decisions with
no bytes, many packages at a time (``ICachePolicy.l_load_many``).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import threading
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from hotset.errors import ConfigError, CorruptSampleError
from hotset.storage.base import Storage
from hotset.storage.manifest import content_key
from hotset.store import lease
from hotset.store.base import Store

if TYPE_CHECKING:
    from hotset.distributed import RankGroup

log = logging.getLogger(__name__)

MAGIC = b"HOTSETPKG1\n"


def write_package(path: str | os.PathLike, entries: list[tuple[int, str, bytes]]) -> int:
    """Write ``(id, key, bytes)`` entries as one package (atomically); returns its size."""
    header, offset = [], 0
    for i, key, data in entries:
        header.append({"id": int(i), "key": key, "offset": offset, "size": len(data)})
        offset += len(data)
    head = json.dumps(header).encode()
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".package-")  # 0600, a new file
    with os.fdopen(fd, "wb") as f:
        f.write(MAGIC + len(head).to_bytes(8, "little") + head)
        for _, _, data in entries:
            f.write(data)
    os.replace(tmp, path)  # (replaces a name: never writes through a link)
    return len(MAGIC) + 8 + len(head) + offset


def read_package(
    path: str | os.PathLike, check: Callable[[str, bytes], bytes | None] | None = None
) -> list[tuple[int, str, bytes]]:
    """The ``(id, key, entry)`` entries of a package file, each checked against its key
    by ``check`` (a storage's ``from_entry``; default: the key is the content digest)."""
    check = check or (lambda key, data: data if content_key(data) == key else None)
    blob = Path(path).read_bytes()
    if not blob.startswith(MAGIC):
        raise ConfigError(f"{path} is not a hotset package")
    n = int.from_bytes(blob[len(MAGIC) : len(MAGIC) + 8], "little")
    start = len(MAGIC) + 8
    header = json.loads(blob[start : start + n])
    base = start + n
    out = []
    for e in header:
        data = blob[base + e["offset"] : base + e["offset"] + e["size"]]
        if check(e["key"], data) is None:
            raise CorruptSampleError(
                e["id"], str(path), "package entry does not match its key", e["key"]
            )
        out.append((e["id"], e["key"], data))
    return out


class PackageSource(Protocol):
    """What the package threads ask of the policy (``ICachePolicy``), planner lock held."""

    def l_wants_package(self) -> bool: ...

    def l_fresh(self) -> int: ...

    def l_next_package(self, exclude=(), prefer=None) -> np.ndarray: ...

    def l_make_room(self, ids, beside_pins: bool = False) -> tuple[np.ndarray, np.ndarray]: ...

    def l_commit(self, ids, loaded=None) -> None: ...


@dataclass(frozen=True)
class PlannedLoads:
    """Packages the plan being made loads (``Packager(threads=False)``): ``ids`` to put
    after the plan's own writes, ``victims`` (L residents) to delete first, and the
    ``entries`` ``(id, key, entry)`` to put (rank 0's; the others' are empty)."""

    ids: np.ndarray
    victims: np.ndarray
    entries: tuple


class Packager:
    """The packaging and loading threads of one job (started on the first ``poll``).

    ``directory`` is the writable package location beside the storage (default: a
    temporary directory, removed by ``close``); ``ahead`` packages are kept ready; at most
    ``keep_files`` package files are kept, and their samples are reused by later packages
    instead of being read from storage again. Packages written under an older H-list are
    not loaded (``epoch_started``): packages are rebuilt as the H-list changes.

    ``threads=False`` packages in the planner's thread, as soon as the policy asks, and
    the plan being made loads them (``poll`` returns a :class:`PlannedLoads`): its worker
    deletes the room's residents and puts the package after the plan's own writes, the
    policy counts it loaded at once, and the plan's report says what did not land, as
    for its admissions. Slower planning, but what the L-cache holds then depends only on
    the plans, so two runs with the same seed serve the same samples, with DataLoader
    workers too.

    ``deleting`` (planner lock held): which ids plans in flight delete; a package loads
    none of them (the plan's worker could delete it after the package's put).

    ``ranks`` (a data-parallel job, ``threads=False``): every rank composes the same
    packages and makes the same room; rank 0 alone reads and writes them and carries
    them in its shard of the plan, and its report, exchanged with the step's feedback,
    tells every rank what did not land: no collective of their own.
    """

    def __init__(
        self,
        storage: Storage,
        store: Store,
        policy: PackageSource,
        lock: threading.RLock,
        directory: str | os.PathLike | None = None,
        ahead: int = 2,
        keep_files: int = 8,
        threads: bool = True,
        deleting: Callable[[np.ndarray], np.ndarray] | None = None,
        ranks: RankGroup | None = None,
    ) -> None:
        self.storage, self.store, self.policy, self.lock = storage, store, policy, lock
        self.deleting = deleting
        if ranks is not None and threads:
            raise ConfigError("packages for several ranks are made in the planner's thread")
        self.leads = ranks is None or ranks.rank == 0  # reads and writes packages
        # the samples' bytes go where only this user can read them: a directory of the
        # user's own (made 0700), writable by nobody else, no link another user owns on
        # the way (``store/lease.py``)
        self._remove_dir = None
        if directory is None:  # our own, in the private directory: it goes with us
            made, held = lease.private_temp_dir("hotset-packages-")
            self._remove_dir = weakref.finalize(self, _remove_own_dir, made, os.getpid(), held)
            self.dir = Path(made)
        else:
            self.dir = Path(directory)
            try:
                self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            except OSError as exc:
                raise ConfigError(f"package_dir {self.dir} is not writable: {exc}") from exc
            lease.check_own_dir(str(self.dir))
        self.ahead, self.keep_files = int(ahead), int(keep_files)
        self.threads = bool(threads)
        self._counters = {
            "packages_written": 0,
            "packages_loaded": 0,
            "package_bytes_loaded": 0,
            "package_storage_reads": 0,  # samples the packaging thread read from storage
            "package_storage_bytes": 0,
            "package_file_reads": 0,  # packages loaded from their file, not as written
            "package_file_bytes": 0,
        }
        self.errors = 0
        self._cv = threading.Condition()
        self._ready: deque[tuple[Path, np.ndarray, int, list]] = deque()
        self._files: deque[Path] = deque()
        self._index: dict[int, tuple[Path, int, int]] = {}  # id -> (file, offset, size)
        self._need = False
        self._stop = False
        self._generation = 0
        self._serial = 0
        self._threads: list[threading.Thread] = []

    def counters(self) -> dict:
        return dict(self._counters)

    # -- planner side (planner lock held) ---------------------------------------------
    def poll(self) -> PlannedLoads | None:
        if not self.threads:
            return self._planned_loads() if self.policy.l_wants_package() else None
        if not self._threads:
            self._start()
        if self.policy.l_wants_package():
            with self._cv:
                self._need = True
                self._cv.notify_all()

    def epoch_started(self) -> None:
        with self._cv:
            self._generation += 1
            self._ready.clear()
            self._cv.notify_all()
        if self.threads:  # (else the epoch's first plan loads what is wanted)
            self.poll()

    def _start(self) -> None:
        for target in (self._pack_loop, self._load_loop):
            t = threading.Thread(target=target, name=f"hotset-{target.__name__[1:]}", daemon=True)
            t.start()
            self._threads.append(t)

    # -- packaging thread --------------------------------------------------------------
    def _read_entries(self, ids: list[int]) -> list[tuple[int, str, bytes]]:
        """Bytes for ``ids``: from existing package files where indexed, else storage."""
        keys = self.storage.keys
        got: dict[int, bytes] = {}
        for i in ids:
            where = self._index.get(i)
            if where is None:
                continue
            path, offset, size = where
            try:
                with open(path, "rb") as f:
                    f.seek(offset)
                    data = f.read(size)
            except OSError:
                continue
            if self.storage.from_entry(keys[i], data) is not None:
                got[i] = data
        rest = [i for i in ids if i not in got]
        read = self.storage.read_many(rest)
        self._counters["package_storage_reads"] += len(rest)
        self._counters["package_storage_bytes"] += sum(len(d) for d in read)
        pack = self.storage.to_entry
        got.update((i, pack(keys[i], d)) for i, d in zip(rest, read, strict=True))
        return [(i, keys[i], got[i]) for i in ids]

    def _write(self, ids: np.ndarray) -> tuple[Path, int, list[tuple[int, str, bytes]]]:
        entries = self._read_entries(ids.tolist())
        self._serial += 1
        path = self.dir / f"pkg-{os.getpid()}-{self._serial:06d}.bin"
        size = write_package(path, entries)
        head = size - sum(len(d) for _, _, d in entries)
        offset = head
        for i, _, data in entries:
            self._index[i] = (path, offset, len(data))
            offset += len(data)
        self._keep(path)
        self._counters["packages_written"] += 1
        return path, size, entries

    def _record(self, ids: np.ndarray) -> tuple[None, int, None]:
        """A rank that does not write packages: the index rank 0's ``_write`` keeps (its
        ids steer the next package's composition), without the bytes."""
        self._serial += 1
        path = self.dir / f"remote-{self._serial:06d}"
        for i in ids.tolist():
            self._index[i] = (path, 0, 0)
        self._keep(path)
        return None, 0, None

    def _keep(self, path: Path) -> None:
        self._files.append(path)
        while len(self._files) > self.keep_files:
            old = self._files.popleft()
            self._index = {i: w for i, w in self._index.items() if w[0] != old}
            old.unlink(missing_ok=True)

    def _pack_loop(self) -> None:
        while True:
            with self._cv:
                while not self._stop and len(self._ready) >= self.ahead:
                    self._cv.wait()
                if self._stop:
                    return
                generation = self._generation
                exclude = [i for _, ids, _, _ in self._ready for i in ids.tolist()]
            with self.lock:
                ids = self.policy.l_next_package(exclude, prefer=np.fromiter(self._index, np.int64))
            if not ids.size:
                with self._cv:
                    self._cv.wait(0.05)
                continue
            try:
                path, size, entries = self._write(ids)
            except Exception as exc:  # noqa: BLE001 - a bad sample must not stop training
                self.errors += 1
                log.warning("packaging failed, L-samples stay uncached: %s", exc)
                with self._cv:
                    self._cv.wait(0.5)
                continue
            with self._cv:
                if generation == self._generation:
                    self._ready.append((path, ids, size, entries))
                    self._cv.notify_all()

    # -- loading thread ----------------------------------------------------------------
    def _load_loop(self) -> None:
        while True:
            with self._cv:
                while not self._stop and not (self._need and self._ready):
                    self._cv.wait()
                if self._stop:
                    return
                path, ids, size, entries = self._ready.popleft()
                self._need = False
                self._cv.notify_all()
            self._load(path, size, ids, entries)

    def _planned_loads(self) -> PlannedLoads:
        """Packages composed in the planner's thread while the policy wants them, room
        made and counted loaded, for the plan being made to put (rank 0's shard of it,
        with ranks: every rank composes the same, rank 0 alone reads and writes)."""
        # what the plan puts (by id: its entry, if written) and deletes first; a later
        # package's room taken from an earlier one's is neither put nor deleted
        loads: dict[int, tuple | None] = {}
        victims: list[int] = []
        while self.policy.l_wants_package():
            ids = self.policy.l_next_package(prefer=np.fromiter(self._index, np.int64))
            if not ids.size:
                break
            fresh = self.policy.l_fresh()
            written: list = []
            if self.leads:
                try:
                    _, size, written = self._write(ids)
                    self._counters["packages_loaded"] += 1
                    self._counters["package_bytes_loaded"] += size
                except Exception as exc:  # noqa: BLE001 - a bad sample must not stop training
                    self.errors += 1
                    log.warning("packaging failed, L-samples stay uncached: %s", exc)
                    self._record(ids)  # (as every other rank: the next package alike)
            else:
                self._record(ids)
            out, ids = self.policy.l_make_room(self._loadable(ids), beside_pins=True)
            self.policy.l_commit(ids)  # (its worker reports what did not land)
            for v in out.tolist():
                if v in loads:
                    del loads[v]
                else:
                    victims.append(v)
            entry = {e[0]: e for e in written}
            loads.update((i, entry.get(i)) for i in ids.tolist())
            if self.policy.l_fresh() <= fresh:
                break  # nothing fits: again at the next poll
        return PlannedLoads(
            np.fromiter(loads, np.int64, len(loads)), np.array(victims, np.int64),
            tuple(e for e in loads.values() if e is not None),
        )  # fmt: skip

    def _load(
        self, path: Path, size: int, ids: np.ndarray, entries: list | None = None
    ) -> list[int] | None:
        """Put a package's samples into the store and the L-cache together (under the
        planner lock: a planner reconciling with the store never sees the one changed
        without the other): its ``entries`` as written, or else read from ``path``. The
        ids that landed (None: the package could not be read)."""
        if entries is None:
            try:
                entries = read_package(path, self.storage.from_entry)
                self.storage.charge(size)
                self._counters["package_file_reads"] += 1
                self._counters["package_file_bytes"] += size
            except Exception as exc:  # noqa: BLE001 - the L-cache just stays emptier
                self.errors += 1
                log.warning("loading package %s failed: %s", path, exc)
                return None
        with self.lock:
            victims, ids = self.policy.l_make_room(self._loadable(ids))
            loaded: list[int] = []
            try:
                loaded = self._put(entries, ids, victims, size)
            except Exception as exc:  # noqa: BLE001 - the L-cache just stays emptier
                self.errors += 1
                log.warning("loading package %s failed: %s", path, exc)
            finally:
                self.policy.l_commit(ids, loaded=loaded)
                if self.threads and self.policy.l_wants_package():
                    with self._cv:
                        self._need = True
        return loaded

    def _loadable(self, ids: np.ndarray) -> np.ndarray:
        """``ids`` less those plans in flight delete (planner lock held)."""
        return ids if self.deleting is None else ids[~self.deleting(ids)]

    def _put(self, entries, ids: np.ndarray, victims: np.ndarray, size: int) -> list[int]:
        """The store side of a load: the victims deleted, the package's accepted samples
        put; returns the ids that landed."""
        keys = self.storage.keys
        if victims.size:
            self.store.delete_many([keys[i] for i in victims.tolist()])
        accepted = set(ids.tolist())
        good = {k: d for i, k, d in entries if i in accepted and keys[i] == k}
        _, refused = self.store.put(good)
        held = good.keys() - set(refused)
        self._counters["packages_loaded"] += 1
        self._counters["package_bytes_loaded"] += size
        return [i for i, k, _ in entries if k in held]

    def close(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        for t in self._threads:
            t.join(timeout=10)
        self._threads = []
        if self._remove_dir is not None:
            self._remove_dir()


def _remove_own_dir(path: str, pid: int, held: int) -> None:
    """Remove a packager's own temporary directory, from the process that made it only: a
    forked worker's copy of the packager must not take its parent's files."""
    if os.getpid() == pid:
        shutil.rmtree(path, ignore_errors=True)
        os.close(held)
