"""A training job's side of the service: ``hotset.connect(address).make_loader(...)``.

The job registers its dataset by content keys, then its ``batch_sampler`` (a
:class:`RemotePlanner`) asks the service for each batch's plan; DataLoader workers
execute the plans against the service's shared store exactly as in the single-job path.
If the service stops answering, the rest of the epoch is read from storage (each sample
still once) and the event is counted in ``service_failures``.

When the service asks for it (benefit-aware allocation, iCACHE's multi-job handling) the
planner times the epoch's first minibatches without and then with the cache and reports
the benefit (``benefit.py``), and sends the losses it gets from ``feedback`` along with
its next plan request (still one request per batch).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator

import numpy as np
import torch
import zmq

from hotset.codecs import decode_sample
from hotset.distributed import RankGroup, detect_ranks
from hotset.errors import ConfigError, ServiceError, ServiceUnavailable, UnknownJob
from hotset.loader import CachedDataset, HotsetLoader
from hotset.plan import BatchPlan, shard
from hotset.service.address import check_ipc_owner, default_address
from hotset.service.auth import client_keys, connect_curve
from hotset.service.benefit import Benefit, BenefitProbe
from hotset.service.protocol import Payload, decode, encode
from hotset.storage.base import Storage
from hotset.storage.columns import key_column
from hotset.storage.on_disk import DiskTierStorage
from hotset.store import make_store
from hotset.store.disk import DiskTier
from hotset.store.sealed import SealedStore
from hotset.store.shared import SharedStore

log = logging.getLogger(__name__)


class ServiceClient:
    """Request/reply with the service over ZeroMQ, with a timeout on every call."""

    def __init__(
        self,
        address: str,
        timeout_s: float = 10.0,
        curve: bool | None = None,
        key_file: str | None = None,
    ) -> None:
        """``curve``/``key_file``: as the service's (``auth.py``): on ``tcp://`` the
        client connects with the keys in the service's key file."""
        if timeout_s <= 0:
            raise ConfigError(f"timeout_s must be > 0, got {timeout_s}")
        self.address = address
        self.timeout_s = float(timeout_s)
        self.curve, self.key_file = curve, key_file
        self._ctx = zmq.Context.instance()
        self._sock: zmq.Socket | None = None
        self._lock = threading.Lock()

    def _socket(self) -> zmq.Socket:
        if self._sock is None:
            s = self._ctx.socket(zmq.REQ)
            ms = int(self.timeout_s * 1000)
            for opt, v in ((zmq.RCVTIMEO, ms), (zmq.SNDTIMEO, ms), (zmq.LINGER, 0)):
                s.setsockopt(opt, v)
            keys = client_keys(self.address, self.curve, self.key_file)  # re-read: new keys
            if keys:
                connect_curve(s, keys)
            s.connect(self.address)
            self._sock = s
        return self._sock

    def call(self, op: str, header: dict | None = None, payload: Payload | None = None):
        """Send one request; returns the reply's (header, payload)."""
        with self._lock:
            sock = self._socket()
            try:
                sock.send_multipart(encode({"op": op, **(header or {})}, payload))
                frames = sock.recv_multipart()
            except zmq.Again:
                sock.close(0)  # a REQ socket that missed its reply cannot be reused
                self._sock = None
                raise ServiceUnavailable(
                    f"hotset service at {self.address} did not answer {op!r} "
                    f"within {self.timeout_s:g} s"
                ) from None
        reply, data = decode(frames)
        if "error" in reply:
            error = UnknownJob if reply.get("code") == "UnknownJob" else ServiceError
            raise error(f"hotset service: {reply['error']}")
        return reply, data

    def clone(self) -> ServiceClient:
        """Another client of the same service, with its own socket."""
        return ServiceClient(self.address, self.timeout_s, self.curve, self.key_file)

    def hello(self) -> dict:
        return self.call("hello")[0]

    def stats(self) -> dict:
        return self.call("stats")[0]

    def stop(self) -> None:
        """Ask the service to stop (after answering)."""
        self.call("stop")

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._sock.close(0)
                self._sock = None

    def make_loader(
        self,
        storage: Storage,
        *,
        batch_size: int,
        name: str | None = None,
        num_workers: int = 2,
        decode: Callable[[bytes], np.ndarray | torch.Tensor] = decode_sample,
        transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
        on_error: str = "raise",
        wait_s: float = 0.5,
        progress: bool = False,
        distributed: bool | None = None,
        **dataloader_kwargs,
    ) -> HotsetLoader:
        """A loader for this job, planned by the service, over its shared store (and the
        node's disk tier, where the service was started with one).
        ``wait_s``: how long a worker waits for a sample another job is fetching.
        ``distributed`` (default: when ``torch.distributed`` is initialised with several
        ranks): the ranks are one job: rank 0 registers it and asks for each global batch
        (``batch_size`` per rank), every rank serves its shard (same batch counts)."""
        ranks = detect_ranks(distributed)
        info = self.hello()
        if ranks is not None and not info.get("pooled") and ranks.hosts() > 1:
            raise ConfigError(
                "a job's ranks share the service's node-local store: one node (a service "
                "started with --store-url redis://... pools its store across nodes)"
            )

        def store_of(info: dict) -> SealedStore:
            capacity = int(info["capacity_bytes"])
            if info.get("pooled"):  # the service's Redis namespace, joined
                return SealedStore(make_store(info["store"], capacity))
            return SealedStore(SharedStore(capacity, path=info["store"], join=True))

        if info.get("disk_dir"):  # the node's disk tier, as the service names it
            storage = DiskTierStorage(storage, DiskTier(info["disk_dir"], info["disk_bytes"]))
        dataset = CachedDataset(
            storage, store_of(info), decode=decode, transform=transform, on_error=on_error,
        )  # fmt: skip

        def new_store(info: dict) -> None:  # a restarted service's: next epoch's workers
            dataset.store = store_of(info)

        planner = RemotePlanner(
            self, storage, batch_size, name=name, wait_s=wait_s, on_new_store=new_store,
            ranks=ranks,
        )  # fmt: skip
        return HotsetLoader(
            dataset, planner, num_workers=num_workers, progress=progress, **dataloader_kwargs
        )


def connect(
    address: str | None = None,
    timeout_s: float = 10.0,
    curve: bool | None = None,
    key_file: str | None = None,
) -> ServiceClient:
    """A client of the ``hotset serve`` at ``address`` (default: this user's private
    socket), checked with a first request that carries nothing; an ``ipc://`` socket
    another user owns is refused before any data is sent. On ``tcp://`` it authenticates
    with the service's key file (``key_file``, default: the one the service wrote in this
    user's private directory; ``curve=False`` for a service started without CURVE)."""
    client = ServiceClient(address or default_address(), timeout_s, curve, key_file)
    client_keys(client.address, curve, key_file, wait_s=timeout_s)  # a service starting
    client.hello()
    check_ipc_owner(client.address)
    return client


class RemotePlanner:
    """A ``batch_sampler`` whose plans come from the service (one request per batch): the
    multi-job :class:`~hotset.plan.PlanSource`."""

    wants_embeddings = False  # the service samples by losses alone
    owns_cache = False  # the service decides what the shared store holds
    readahead = None  # the service's plans stage nothing

    def __init__(
        self,
        client: ServiceClient,
        storage: Storage,
        batch_size: int,
        name: str | None = None,
        wait_s: float = 0.5,
        heartbeat_s: float | None = None,
        on_new_store: Callable[[dict], None] | None = None,
        ranks: RankGroup | None = None,
    ) -> None:
        """``on_new_store``: called with the service's ``hello`` when a restarted service
        has its store elsewhere (the loader's next workers open it). ``ranks``: a
        data-parallel job: rank 0 talks to the service for all of them."""
        self.client = client
        self.storage = storage
        self.ranks = ranks
        self.world = 1 if ranks is None else ranks.world
        self.leader = ranks is None or ranks.rank == 0
        self.batch_size = int(batch_size) * self.world  # the job's global batch
        self.wait_s = float(wait_s)
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.on_new_store = on_new_store
        self._keys = key_column(storage.keys)  # sent packed when they are digests
        self._mine = self._keys.distinct()  # a local id per distinct key
        self.store_path = client.hello()["store"]
        self.benefits: list[Benefit] = []  # what it measured and reported, by epoch
        self._losses: list[tuple[np.ndarray, np.ndarray]] = []  # feedback not yet sent
        self.epoch = 0
        self.planned = 0  # non-empty plans received
        self.done = 0  # batches the loader consumed (their reads ran)
        self.planning_s = 0.0
        self.feedback_s = 0.0
        self.failures = 0  # outages: the rest of an epoch was read from storage
        self.rejoins = 0  # registrations after the first (service restarted, or timed out)
        self._lost = False  # the service was unreachable: register again at the next epoch
        self._absent: list[np.ndarray] = []  # planned hits the store lacked, to report
        reply = self._register() if self.leader else None
        if ranks is not None:
            reply = ranks.broadcast(reply, call="the service's registration")
            if not self.leader:
                self._adopt(reply)
        self._stop = threading.Event()
        self._beat = threading.Thread(
            target=self._heartbeat,
            # beats well inside the service's job timeout, and its own call timeout
            args=(heartbeat_s or min(client.timeout_s / 4, float(reply["job_timeout_s"]) / 3),),
            name=f"hotset-heartbeat-{self.job}",
            daemon=True,
        )
        if self.leader:
            self._beat.start()

    def _register(self, epoch: int = 0, served: np.ndarray | None = None) -> dict:
        """Register (again: a restarted service, or a time-out) at ``epoch``, of which
        the local ids ``served`` were already read; plans then follow the new job id."""
        header = {"name": self.name, "batch_size": self.batch_size, "pid": os.getpid(),
                  "host": socket.gethostname(), "epoch": int(epoch)}  # fmt: skip
        payload = {"keys": self._keys, "sizes": np.asarray(self.storage.sizes, np.int64)}
        if served is not None and served.size:
            payload["served"] = served.astype(np.int64)
        reply, _ = self.client.call("register", header, payload)
        self._adopt(reply)
        return reply

    def _adopt(self, reply: dict) -> None:
        """The registration's answer (a rank other than 0 gets rank 0's)."""
        self.job, self.instance = int(reply["job"]), str(reply["instance"])
        self._base = self.planned  # the new job's plan 0 is this planner's plan ``_base``
        self.samples_per_epoch = int(reply["samples_per_epoch"])
        self.probe = BenefitProbe(int(reply["probe_batches"]), int(reply["probe_every"]))
        self._wants_losses = bool(reply["wants_losses"])  # the service samples by them
        self._losses = []

    def _rejoin(self, epoch: int, served: np.ndarray) -> bool:
        """Register again in ``epoch``, of which the local ids where ``served`` is set
        were read; whether it worked (else the epoch goes on from storage). A service
        with its store elsewhere is handed to ``on_new_store``."""
        try:
            info = self.client.hello()
            self._register(epoch, np.flatnonzero(served))
        except ServiceError:
            return False
        self.rejoins += 1
        self._lost = False
        if info["store"] != self.store_path:
            self.store_path = info["store"]
            if self.on_new_store is not None:
                self.on_new_store(info)
        log.warning("registered again with the hotset service as job %d, in epoch %d with "
                    "%d samples read", self.job, epoch, int(served.sum()))  # fmt: skip
        return True

    def _heartbeat(self, every_s: float) -> None:
        beat = self.client.clone()  # its own socket
        try:
            while not self._stop.wait(every_s):
                with contextlib.suppress(ServiceError):  # plan requests report outages
                    beat.call("heartbeat", {"job": self.job, "instance": self.instance})
        finally:
            beat.close()

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return -(-self.samples_per_epoch // self.batch_size)

    def _request(self, epoch: int, index: int, probing: bool) -> tuple[dict, Payload]:
        """The plan request for the epoch's batch ``index``, with what is to report."""
        header = {"job": self.job, "instance": self.instance, "epoch": epoch,
                  "done": max(self.done - self._base, 0)}  # fmt: skip
        if probing:
            header["cache"] = not self.probe.uncached(index)
        benefit = self.probe.report()
        if benefit is not None:
            self.benefits.append(benefit)
            header["benefit"] = [benefit.t_uncached, benefit.t_cached, benefit.hit]
        payload: Payload = {}
        if self._losses:
            ids, losses = zip(*self._losses, strict=True)
            payload = {"fb_ids": np.concatenate(ids), "fb_losses": np.concatenate(losses)}
            self._losses = []
        if self._absent:
            payload["absent"] = np.unique(np.concatenate(self._absent))
            self._absent = []
        return header, payload

    def __iter__(self) -> Iterator[BatchPlan]:
        if self.ranks is None:
            yield from self._plans()
            return
        plans = self._plans() if self.leader else None  # rank 0 asks, every rank shards
        while (
            plan := self.ranks.broadcast(
                next(plans, None) if plans else None, call="the service's next plan"
            )
        ) is not None:
            yield shard(plan, self.ranks.rank, self.world)

    def _plans(self) -> Iterator[BatchPlan]:
        """The job's (global) plans of the epoch, from the service or from storage."""
        epoch = self.epoch
        served = np.zeros(len(self.storage), bool)
        self.done = self.planned  # a new pass: earlier plans ran or were dropped
        if self._lost and not self._rejoin(epoch, served):
            self.failures += 1
            yield from self._uncached(epoch, served)
            return
        probing = self.probe.start_epoch(epoch) and len(self) >= 4 * self.probe.batches
        index = 0
        while True:
            start = time.perf_counter()
            try:
                reply, p = self.client.call("plan", *self._request(epoch, index, probing))
            except ServiceError as exc:
                if served[self._mine].all():
                    return  # nothing left of the epoch
                if self._rejoin(epoch, served):  # it forgot us, or restarted
                    probing = False
                    continue
                self.failures += 1
                self._lost = True
                log.warning("%s; the rest of epoch %d is read from storage", exc, epoch)
                yield from self._uncached(epoch, served)
                return
            finally:
                self.planning_s += time.perf_counter() - start
            ids = p["local"]
            if ids.size == 0:
                return
            self.planned += 1
            index += 1
            self.probe.planned(float(np.mean(p["hit"])))
            served[ids] = True
            yield BatchPlan(
                epoch=epoch, index=int(reply["index"]), ids=ids, hits=p["hit"],
                admitted=p["admit"], evict_keys=tuple(p["evict_keys"]), wait_s=self.wait_s,
            )  # fmt: skip

    def _uncached(self, epoch: int, served: np.ndarray) -> Iterator[BatchPlan]:
        rest = self._mine[~served[self._mine]]
        rest = np.random.default_rng([self.job, epoch]).permutation(rest)
        for lo in range(0, rest.size, self.batch_size):
            yield BatchPlan.uncached(rest[lo : lo + self.batch_size], epoch)

    def batch_consumed(self, report=None) -> None:
        """The loader got one more batch: its plan's reads have run (the service may now
        evict what it read); its planned hits the store lacked (gone, or dropped as
        corrupt) go to the service with the next request, which forgets them."""
        absent = np.empty(0, np.int64) if report is None else report.absent
        if self.ranks is not None:  # every rank's reads of it ran: the service may evict
            absent = np.concatenate(self.ranks.all_gather(absent, call="a plan's report"))
        if absent.size:
            self._absent.append(absent)
        self.done += 1
        self.probe.consumed()

    def feedback(self, ids, losses, embeddings=None) -> None:
        """Losses of a trained batch (local ids): sent with the next plan request when the
        service samples by importance."""
        if not self._wants_losses:
            return
        start = time.perf_counter()
        mine = [(np.asarray(ids, np.int64), np.asarray(losses, np.float64))]
        if self.ranks is not None:  # rank 0 sends every rank's
            mine = [x for got in self.ranks.all_gather(mine, call="feedback") for x in got]
        if self.leader:
            self._losses += mine
        self.feedback_s += time.perf_counter() - start

    def report_accuracy(self, accuracy: float) -> None:
        """Nothing: the service's sampling does not watch accuracy."""

    def drain(self, timeout: float = 60.0) -> None:
        """Nothing: losses travel with the next plan request."""

    def reconcile_store(self, dataset) -> bool:
        """Nothing: the service reconciles the shared store."""
        return False

    def flush(self) -> None:
        """Nothing: each rank's plans come from the service."""

    def counters(self) -> dict:
        return {
            "planning_s": self.planning_s,
            "feedback_s": self.feedback_s,
            "service_failures": self.failures,
            "service_rejoins": self.rejoins,
        }

    def state_dict(self, trained: int | None = None) -> dict:
        """The epoch to resume at and the control plane's timers and failures (a job of
        the service resumes at an epoch's start: ``trained`` changes nothing)."""
        return {"epoch": self.epoch, **self.counters()}

    def resumed_batches(self) -> int:
        return 0  # (a job of the service resumes at an epoch's start)

    def load_state_dict(self, state: dict) -> None:
        self.set_epoch(int(state["epoch"]))
        self.planning_s = float(state["planning_s"])
        self.feedback_s = float(state["feedback_s"])
        self.failures = int(state["service_failures"])
        self.rejoins = int(state.get("service_rejoins", 0))

    def close(self) -> None:
        """Leave the service: it releases this job's references."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self.ranks is not None:
            self.ranks.close()
        if not self.leader:
            return
        self._beat.join(timeout=1.0)
        try:
            self.client.call("leave", {"job": self.job, "instance": self.instance})
        except UnknownJob:
            pass  # the service already forgot it
        except ServiceError as exc:
            log.warning("could not leave the service cleanly: %s", exc)
