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
import secrets
import signal
import time

import zmq

from hotset.errors import ConfigError, HotsetError, UnknownJob
from hotset.service.address import default_address, refuse_live
from hotset.service.auth import connect_curve, serve_curve, server_keys
from hotset.service.benefit import Benefit
from hotset.service.coordinator import JobCoordinator
from hotset.service.protocol import decode, encode
from hotset.store.sealed import sealed_id
from hotset.store.shared import SharedStore

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 256 << 20  # a register of ~5M sample keys; larger: the peer is dropped


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
        **coordinator_options,
    ) -> None:
        """``curve``: authenticate and encrypt with ZeroMQ CURVE (``auth.py``; default:
        on for ``tcp://``, off for ``ipc://``), keys in ``key_file`` (default: a 0600 file
        in the user's private directory, written at first start)."""
        if not 0.0 <= slack < 1.0:
            raise ConfigError(f"slack must be in [0, 1), got {slack}")
        self.address = address = address or default_address()
        self._ctx = zmq.Context.instance()
        self.key_file, keys = server_keys(address, curve, key_file)
        refuse_live(address, self._ctx, secure=lambda s: keys and connect_curve(s, keys))
        self.store = SharedStore(capacity_bytes, path=store_path)
        if len(self.store):  # an earlier run's entries (killed): the new plan knows none
            log.warning("clearing %d entries an earlier service left in %s", len(self.store),
                        self.store.path)  # fmt: skip
            self.store.clear()
        self.instance = secrets.token_hex(8)  # job ids of an earlier run are not ours
        # the policy plans for a little less than the store holds: workers of different
        # jobs apply deletes and puts out of order, and the slack absorbs it
        self.coordinator = JobCoordinator(int(capacity_bytes * (1 - slack)), **coordinator_options)
        self.reap_every_s = reap_every_s
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.MAXMSGSIZE, int(max_message_bytes))  # bounded messages
        self._auth = serve_curve(self._sock, keys) if keys else None
        try:
            self._sock.bind(address)
        except zmq.ZMQError as exc:
            self._sock.close(0)
            if self._auth:
                self._auth.stop()
            self.store.close(destroy=store_path is None)
            raise ConfigError(f"cannot listen on {address}: {exc}") from exc
        self.stopped = False

    def handle(self, header: dict, payload: dict) -> tuple[dict, dict]:
        """One request -> one reply (errors become ``{"error": message}``)."""
        co = self.coordinator
        op = header.get("op")
        if header.get("instance", self.instance) != self.instance:
            raise UnknownJob(f"job {header.get('job')} was registered with an earlier run of "
                             "the service")  # fmt: skip
        if op == "hello":
            return {
                "store": self.store.path,
                "capacity_bytes": self.store.capacity_bytes,
                "instance": self.instance,
            }, {}
        if op == "register":
            job = co.register(
                header["name"], payload["keys"], payload["sizes"], int(header["batch_size"]),
                header.get("pid"), header.get("host", ""), int(header.get("epoch", 0)),
                payload.get("served"),
            )  # fmt: skip
            return {
                "instance": self.instance,
                "job": job,
                "samples_per_epoch": co.samples_per_epoch(job),
                "probe_batches": co.probe_batches,
                "probe_every": co.probe_every,
                "wants_losses": co.mode.wants_losses,
                "job_timeout_s": co.job_timeout_s,
            }, {}
        if op == "plan":
            job_id = int(header["job"])
            if "fb_ids" in payload:
                co.feedback(job_id, payload["fb_ids"], payload["fb_losses"])
            if "benefit" in header:
                co.report_benefit(job_id, Benefit(*header["benefit"]))
            p = co.plan(job_id, int(header["epoch"]), header.get("done"), header.get("cache", True))
            job = co.jobs[job_id]
            out = {
                "local": job.local(p["gids"]),
                "hit": p["hit"],
                "admit": job.local(p["admit"]),
                "evict_keys": [sealed_id(k) for k in p["evict_keys"]],
            }
            return {"epoch": p["epoch"], "index": p["index"]}, out
        if op == "heartbeat":
            co.seen(int(header["job"]))
            return {}, {}
        if op == "leave":
            co.leave(int(header["job"]))
            return {}, {}
        if op == "stats":
            return co.stats(), {}
        if op == "stop":
            self.stopped = True
            return {}, {}
        return {"error": f"unknown request {op!r}"}, {}

    def serve_forever(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        last_reap = time.monotonic()
        log.info("hotset service on %s, store %s", self.address, self.store.path)
        try:
            while not self.stopped:
                if poller.poll(int(self.reap_every_s * 1000)):
                    ident, *frames = self._sock.recv_multipart()
                    if len(frames) < 2 or frames[0]:  # not a REQ envelope: nothing to answer
                        continue
                    empty, frames = frames[0], frames[1:]
                    try:
                        reply, payload = self.handle(*decode(frames))
                    except HotsetError as exc:
                        reply, payload = {"error": str(exc), "code": type(exc).__name__}, {}
                    except Exception as exc:  # noqa: BLE001 - a bad request must not stop it
                        log.exception("request failed")
                        reply, payload = {"error": f"{type(exc).__name__}: {exc}"}, {}
                    self._sock.send_multipart([ident, empty, *encode(reply, payload)])
                if time.monotonic() - last_reap >= self.reap_every_s:
                    for job in self.coordinator.reap():
                        log.warning("job %s removed (%s)", job, self.coordinator.removed[-1][1])
                    last_reap = time.monotonic()
        finally:
            self._sock.close(0)
            if self._auth:
                self._auth.stop()

    def close(self, destroy_store: bool = False) -> None:
        self.store.close(destroy=destroy_store)


def serve(
    address: str | None = None,
    capacity_bytes: int = 1 << 30,
    store_path: str | None = None,
    announce: bool = False,
    **options,
) -> None:
    """Run the service until SIGTERM, Ctrl-C or a ``stop`` request; a store it created
    (no ``store_path``) is removed on the way out."""
    service = CacheService(address, capacity_bytes, store_path, **options)
    signal.signal(signal.SIGTERM, lambda *_: setattr(service, "stopped", True))
    if announce:
        keys = f", CURVE keys {service.key_file}" if service.key_file else ""
        print(f"hotset service on {service.address}, store {service.store.path}{keys}",
              flush=True)  # fmt: skip
    try:
        service.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
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
