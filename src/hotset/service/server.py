"""``hotset serve``: one process per machine that every training job registers with.

It owns the node-local shared store (LMDB on tmpfs) and the :class:`JobCoordinator`
(cross-job sampling and the shared policy), and answers on a ZeroMQ ROUTER socket. All
control-plane state lives in the one server thread, so no locks are needed; a request
is one batch (never one sample). Jobs whose process is gone or who fall silent are
removed between requests, and their references released.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import secrets
import signal
import threading
import time

import zmq

from hotset.errors import ConfigError, HotsetError, UnknownJob
from hotset.service.address import default_address, hold_address
from hotset.service.auth import serve_curve, server_keys
from hotset.service.benefit import Benefit
from hotset.service.coordinator import IdSpaceFull, JobCoordinator
from hotset.service.messages import Heartbeat, Hello, Leave, Plan, Register, Stats, parse
from hotset.service.protocol import ProtocolError, decode, encode
from hotset.store import Store, make_store
from hotset.store.disk import open_disk_tier
from hotset.store.redis_cluster import SCHEME as CLUSTER
from hotset.store.sealed import sealed_id
from hotset.store.shared import SharedStore

log = logging.getLogger(__name__)


class _Quiet:
    """Failures a peer can cause, logged as one line at most every ``every_s`` seconds
    (with how many were left out): a peer that sends thousands cannot fill the disk. The
    traceback at debug level only."""

    def __init__(self, what: str, every_s: float = 10.0) -> None:
        self.what, self.every_s, self._last, self._left_out = what, every_s, -1e9, 0

    def note(self, exc: BaseException) -> None:
        log.debug("%s", self.what, exc_info=exc)
        now = time.monotonic()
        if now - self._last < self.every_s:
            self._left_out += 1
            return
        more = f" ({self._left_out} more since the last line)" if self._left_out else ""
        log.warning("%s: %s: %s%s", self.what, type(exc).__name__, str(exc)[:200], more)
        self._last, self._left_out = now, 0

MAX_MESSAGE_BYTES = 256 << 20  # a register of ~5M sample keys; larger: refused
#: a request's frames: the ROUTER envelope (identity, empty), a header, at most 3 arrays
MAX_FRAMES = 6
#: the stores a service may pool across nodes
POOLED = ("redis://", "rediss://", "unix://", CLUSTER)


def _open_store(capacity_bytes: int, store_path: str | None, store_url: str | None) -> Store:
    """The service's shared store: LMDB on this node's tmpfs (at ``store_path``, or
    fresh), or the Redis (Cluster) at ``store_url``, pooled across nodes."""
    if store_url is None:
        return SharedStore(capacity_bytes, path=store_path)
    if store_path is not None or not store_url.startswith(POOLED):
        raise ConfigError(
            f"store_url={store_url!r}: give a Redis or Redis Cluster URL "
            f"({', '.join(POOLED)}...), and no store_path beside it"
        )
    return make_store(store_url, capacity_bytes)


def where(store: Store) -> str:
    """What opens ``store`` in a job's process: an LMDB directory, or a URL with the
    Redis namespace."""
    return store.path if isinstance(store, SharedStore) else store.spec


class CacheService:
    """The server: ``CacheService(address, capacity_bytes).serve_forever()``."""

    def __init__(
        self,
        address: str | None = None,
        capacity_bytes: int = 1 << 30,
        store_path: str | None = None,
        reap_every_s: float = 0.5,
        slack: float = 0.05,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        curve: bool | None = None,
        key_file: str | None = None,
        disk_dir: str | None = None,
        disk_bytes: int | None = None,
        store_url: str | None = None,
        **coordinator_options,
    ) -> None:
        """``curve``: authenticate and encrypt with ZeroMQ CURVE (``auth.py``; default:
        on for ``tcp://``, off for ``ipc://``), keys in ``key_file`` (default: a 0600 file
        in the user's private directory, written at first start). ``disk_dir``,
        ``disk_bytes``: the node's disk tier its jobs read through (``store/disk.py``;
        it outlives the service, and a restarted service's jobs find it warm).
        ``store_url``: a Redis or Redis Cluster URL (``redis://``, ``redis+cluster://``)
        for the shared store instead of LMDB on this node's tmpfs: pooled across nodes,
        so a job's ranks may run on several (each job's workers read and write it)."""
        if not 0.0 <= slack < 1.0:
            raise ConfigError(f"slack must be in [0, 1), got {slack}")
        self.address = address = address or default_address()
        tier = open_disk_tier(disk_dir, disk_bytes)  # (checked and sized here, once)
        self.disk = None if tier is None else {"disk_dir": tier.directory,
                                               "disk_bytes": tier.capacity_bytes}  # fmt: skip
        if tier is not None:
            tier.close()
        self._ctx = zmq.Context.instance()
        self.key_file, keys = server_keys(address, curve, key_file)
        self._address_lock = hold_address(address)
        try:
            self.store = _open_store(capacity_bytes, store_path, store_url)
        except BaseException:
            if self._address_lock is not None:
                os.close(self._address_lock)
            raise
        if len(self.store):  # an earlier run's entries (killed): the new plan knows none
            log.warning("clearing %d entries an earlier service left in %s", len(self.store),
                        where(self.store))  # fmt: skip
            self.store.clear()
        self.instance = secrets.token_hex(8)  # job ids of an earlier run are not ours
        # the policy plans for a little less than the store holds: workers of different
        # jobs apply deletes and puts out of order, and the slack absorbs it
        self._options = (int(capacity_bytes * (1 - slack)), coordinator_options)
        self.coordinator = JobCoordinator(self._options[0], **coordinator_options)
        self.reap_every_s = reap_every_s
        self.lock = threading.Lock()  # the coordinator: requests, reaping, a metrics scrape
        self.max_message_bytes = int(max_message_bytes)
        self._failed = _Quiet("a request failed")
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.MAXMSGSIZE, int(max_message_bytes))  # bounded frames
        self._auth = serve_curve(self._sock, keys) if keys else None
        try:
            self._sock.bind(address)
        except zmq.ZMQError as exc:
            self._sock.close(0)
            if self._auth:
                self._auth.stop()
            self.close(destroy_store=store_path is None)
            raise ConfigError(f"cannot listen on {address}: {exc}") from exc
        self.stopped = False

    def handle(self, header: dict, payload: dict) -> tuple[dict, dict]:
        """One request -> one reply (errors become ``{"error": message}``); the request
        is checked against its declared schema (``messages.py``) before any field is
        used."""
        co = self.coordinator
        req = parse(header, payload)
        if req.instance not in (None, self.instance):
            raise UnknownJob(f"job {header.get('job')} was registered with an earlier run of "
                             "the service")  # fmt: skip
        if isinstance(req, Hello):
            return {
                "store": where(self.store),
                "pooled": not isinstance(self.store, SharedStore),
                "capacity_bytes": self.store.capacity_bytes,
                "instance": self.instance,
                **(self.disk or {}),
            }, {}
        if isinstance(req, Register):
            args = (req.name, payload["keys"], payload["sizes"], req.batch_size, req.pid,
                    req.host, req.epoch, payload.get("served"))  # fmt: skip
            try:
                job = co.register(*args)
            except IdSpaceFull as full:
                co = self._grow(full.needed, req.name)
                job = co.register(*args)
            return {
                "instance": self.instance,
                "job": job,
                "samples_per_epoch": co.samples_per_epoch(job),
                "probe_batches": co.probe_batches,
                "probe_every": co.probe_every,
                "wants_losses": co.mode.wants_losses,
                "job_timeout_s": co.job_timeout_s,
            }, {}
        if isinstance(req, Plan):
            if "fb_ids" in payload:
                co.feedback(req.job, payload["fb_ids"], payload["fb_losses"])
            if req.benefit is not None:
                co.report_benefit(req.job, Benefit(*req.benefit))
            p = co.plan(req.job, req.epoch, req.done, req.cache, payload.get("absent"))
            job = co.jobs[req.job]
            out = {
                "local": job.local(p["gids"]),
                "hit": p["hit"],
                "admit": job.local(p["admit"]),
                "evict_keys": [sealed_id(k) for k in p["evict_keys"]],
            }
            return {"epoch": p["epoch"], "index": p["index"]}, out
        if isinstance(req, Heartbeat):
            co.seen(req.job)
            return {}, {}
        if isinstance(req, Leave):
            co.leave(req.job)
            return {}, {}
        if isinstance(req, Stats):
            return co.stats(), {}
        self.stopped = True  # Stop
        return {}, {}

    def _grow(self, needed: int, name: str) -> JobCoordinator:
        """A coordinator of twice the ids or more, to take ``needed`` ids: the id space is
        sized from the data, no flag to remember. The jobs registered rejoin at their next
        request, as after a restart (each finishes its epoch with each sample once), and
        the cache starts again empty (its entries are cleared: no plan names them)."""
        old = self.coordinator
        size = max(2 * old.max_samples, 1 << (needed - 1).bit_length())
        log.warning("job %r needs %d ids: the id space grows from %d to %d; the %d jobs "
                    "registered rejoin, the cache starts again", name, needed,
                    old.max_samples, size, len(old.jobs))  # fmt: skip
        capacity, options = self._options
        self.coordinator = JobCoordinator(capacity, **{**options, "max_samples": size})
        self.coordinator.removed = old.removed
        self.instance = secrets.token_hex(8)  # the jobs' next requests: rejoin
        self.store.clear()
        return self.coordinator

    def serve_forever(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        last_reap = time.monotonic()
        log.info("hotset service on %s, store %s", self.address, where(self.store))
        try:
            while not self.stopped:
                if poller.poll(int(self.reap_every_s * 1000)):
                    ident, *frames = self._receive()
                    if len(frames) < 2 or frames[0]:  # not a REQ envelope: nothing to answer
                        continue
                    empty, frames = frames[0], frames[1:]
                    try:
                        if frames[-1] is None:
                            raise ProtocolError(
                                f"message over {self.max_message_bytes} bytes or "
                                f"{MAX_FRAMES} frames: refused"
                            )
                        with self.lock:
                            reply, payload = self.handle(*decode(frames))
                    except HotsetError as exc:
                        reply, payload = {"error": str(exc), "code": type(exc).__name__}, {}
                    except Exception as exc:  # noqa: BLE001 - a bad request must not stop it
                        self._failed.note(exc)
                        reply, payload = {"error": f"{type(exc).__name__}: {exc}"}, {}
                    self._sock.send_multipart([ident, empty, *encode(reply, payload)])
                if time.monotonic() - last_reap >= self.reap_every_s:
                    try:
                        with self.lock:
                            reaped = self.coordinator.reap()
                        for job in reaped:
                            log.warning("job %s removed (%s)", job,
                                        self.coordinator.removed[-1][1])  # fmt: skip
                    except Exception:  # noqa: BLE001 - the service outlives a bad job record
                        log.exception("reaping jobs failed")
                    last_reap = time.monotonic()
        finally:
            self._sock.close(0)
            if self._auth:
                self._auth.stop()

    def _receive(self) -> list[bytes | None]:
        """One message, frame by frame: frames past ``MAX_FRAMES`` or past
        ``max_message_bytes`` in all are received and dropped, not kept (the last frame
        kept is then ``None``). libzmq has already buffered the message whole (it delivers
        multipart messages atomically); each frame is bounded there by ``MAXMSGSIZE``."""
        frames: list[bytes | None] = []
        size, over = 0, False
        while True:
            frame = self._sock.recv(copy=False)
            size += len(frame)
            over = over or len(frames) >= MAX_FRAMES or size > self.max_message_bytes
            if not over:
                frames.append(frame.bytes)
            if not self._sock.getsockopt(zmq.RCVMORE):
                break
        if over:
            frames = [*frames[:2], None]  # the envelope, to answer the refusal
        return frames

    def figures(self) -> dict[str, dict[str, float]]:
        """The service's figures per job and in all (for a metrics scrape)."""
        from hotset.metrics import service_figures

        with self.lock:
            return service_figures(self.coordinator.stats())

    def close(self, destroy_store: bool = False) -> None:
        self.store.close(destroy=destroy_store)
        if self._address_lock is not None:
            os.close(self._address_lock)  # the address is free for the next service
            self._address_lock = None


def serve(
    address: str | None = None,
    capacity_bytes: int = 1 << 30,
    store_path: str | None = None,
    announce: bool = False,
    metrics_port: int | None = None,
    **options,
) -> None:
    """Run the service until SIGTERM, Ctrl-C or a ``stop`` request; a store it created
    (no ``store_path``) is removed on the way out. ``metrics_port``: Prometheus figures at
    ``http://127.0.0.1:PORT/metrics`` (per job and in all)."""
    service = CacheService(address, capacity_bytes, store_path, **options)
    signal.signal(signal.SIGTERM, lambda *_: setattr(service, "stopped", True))
    metrics = None
    if metrics_port is not None:
        from hotset.metrics import serve_prometheus

        metrics = serve_prometheus(service.figures, metrics_port)
    if announce:
        keys = f", CURVE keys {service.key_file}" if service.key_file else ""
        print(f"hotset service on {service.address}, store {where(service.store)}{keys}",
              flush=True)  # fmt: skip
    try:
        service.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        if metrics is not None:
            metrics.shutdown()
        service.close(destroy_store=store_path is None)


def _run(address: str, capacity_bytes: int, store_path: str | None, options: dict) -> None:
    serve(address, capacity_bytes, store_path, **options)


def start_service(
    address: str | None = None,
    capacity_bytes: int = 1 << 30,
    store_path: str | None = None,
    **options,
) -> mp.Process:
    """``hotset serve`` in a child process (tests, ``compare --jobs``); stop it with
    ``proc.terminate()`` or a ``stop`` request."""
    proc = mp.get_context("spawn").Process(
        target=_run, args=(address, capacity_bytes, store_path, options), daemon=True
    )
    proc.start()
    return proc
