"""The Planner that joins a sampler and a policy (the control plane), as a pipeline over
the stages of this package: the epoch's order (``epoch.py``), the policy's decisions,
read-ahead (``io/readahead.py``), the plans in flight (``inflight.py``), the ranks'
exchange (``ranks.py``), the store's reconciliation (``store_sync.py``) and the saved
state (``state.py``).

The planner is the only component that decides admissions and evictions, so it knows
exactly what the store should hold. It runs where the ``batch_sampler`` of a DataLoader
runs (the training process); each plan travels to a worker as the "index" PyTorch hands
to ``Dataset.__getitems__``.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from hotset.distributed import RankGroup
from hotset.errors import ConfigError
from hotset.io.readahead import NOTHING_STAGED, ReadAhead
from hotset.io.requests import LatencyFit
from hotset.plan.batch import EMPTY, BatchPlan, PlanReport, plan_fields, shard
from hotset.plan.epoch import EpochOrder
from hotset.plan.inflight import InFlight
from hotset.plan.position import EpochPosition
from hotset.plan.ranks import RankSync
from hotset.plan.state import checked
from hotset.plan.store_sync import StoreSync
from hotset.policy.base import Policy
from hotset.sampling.base import Sampler

if TYPE_CHECKING:
    from hotset.storage.base import Storage
    from hotset.store.base import Store

#: the planner's counters, saved with its state
COUNTERS = (
    "planning_s", "feedback_s", "phantoms", "sync_fixes", "sync_s", "sync_calls", "offered",
    "refilled",
)  # fmt: skip
#: the next epoch's order is drawn in the background (``Sampler.prepare``) from the last
#: 1/TAIL of an epoch's batches
TAIL = 4


class Planner:
    """Iterable of :class:`BatchPlan` for the sampler's current epoch; a ``batch_sampler``
    and the single-job :class:`~hotset.plan.source.PlanSource`. ``planning_s``: the time
    spent deciding (sampler + policy), the control plane's whole cost.

    ``storage`` and ``store``: where the data plane executes the plans (``inflight.py``:
    ``wait_s``), each report reconciled at once (``phantoms``: residents the store lacked
    after all); without a store (the simulator) a plan counts as executed when yielded.
    ``feed_future=False``: a policy that ``needs_future`` is given it by the caller.
    ``package_dir``: where the policy's feeder works (iCACHE's packages); ``lock`` guards
    the policy. ``readahead_bytes`` (``io/readahead.py``), ``order`` and ``block_size``
    (``epoch.py``), ``ranks`` and ``sync_every`` (``ranks.py``): the stages' options.
    """

    owns_cache = True
    #: the type of the per-id columns that track plans in flight (2 B per id)
    tracking_dtype = np.int16

    def __init__(
        self, sampler: Sampler, policy: Policy, batch_size: int, drop_last: bool = False,
        feed_future: bool = True, storage: Storage | None = None, store: Store | None = None,
        package_dir: str | None = None, wait_s: float = 0.2, ranks: RankGroup | None = None,
        sync_every: int = 1, readahead_bytes: int = 0, order: str = "paper",
        block_size: int = 2048,
    ) -> None:  # fmt: skip
        _check(sampler, policy, batch_size, ranks, sync_every, readahead_bytes)
        if policy.needs_scores:
            policy.attach_scores(sampler.board)
        self.lock = threading.RLock()
        self.sampler, self.policy = sampler, policy
        self.batch_size, self.drop_last = int(batch_size), drop_last
        self.ranks, self.world = ranks, 1 if ranks is None else ranks.world
        self.sync = None if ranks is None else RankSync(ranks, sync_every)
        executes = store is not None  # plans run elsewhere and are reported back
        self.inflight = InFlight(
            policy, executes, self.batch_size * self.world, wait_s, self.tracking_dtype,
            unreconciled=lambda: None if self.sync is None else self.sync.oldest_report(),
        )  # fmt: skip
        deleting = self.inflight.deleted if executes else None
        self.feeder = policy.make_feeder(self.lock, storage, store, package_dir, deleting,
                                         ranks=ranks)  # fmt: skip
        if ranks is not None:
            sampler.plan_with_ranks(ranks.rank, ranks.world)
        self.store_sync = StoreSync(policy, self.lock, ranks)
        # the storage this job reads alone (with ranks, each node's disk tier holds its own)
        alone = storage if executes and ranks is None else None
        self.latency, self.readahead = _io_stages(alone, readahead_bytes)
        disk = alone if alone is not None and alone.disk_capacity else None
        self.epochs = EpochOrder(sampler, policy, self.lock, self.batch_size * self.world,
                                 self.world, drop_last, feed_future, order, block_size,
                                 storage, disk, whole=self.readahead is not None)  # fmt: skip
        self.at = EpochPosition(self.batch_size, self.world, drop_last)
        for k in COUNTERS:  # (``phantoms``: residents forgotten, the store lacked them)
            setattr(self, k, 0)

    @property
    def wants_embeddings(self) -> bool:
        return self.sampler.needs_embeddings

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def feedback(
        self, ids: np.ndarray, losses: np.ndarray, embeddings: np.ndarray | None = None
    ) -> None:
        """Per-sample losses (and, for graph importance, embeddings) of the ids a batch
        served: to the sampler's scores, then to a policy that keys on them (with ranks,
        every rank learns every rank's, in rank order)."""
        self.feedback_of_ranks([(ids, losses, embeddings)])

    def feedback_of_ranks(self, items: list[tuple]) -> None:
        """One batch's ``feedback`` of each rank this planner plans for (``ranks.here``:
        a node's ranks, ``NodeRanks``), in their order."""
        if not self.sampler.learns_from_feedback:
            return
        if self.sync is None:
            self._learn(*items[0])
        elif self.sync.add_feedback(items):
            self._exchange()

    def _learn(self, ids, losses, embeddings) -> None:
        start = time.perf_counter()
        self.sampler.feedback(ids, losses, embeddings)
        self._scores_changed(ids)
        self.feedback_s += time.perf_counter() - start

    def _scores_changed(self, ids) -> None:
        """The policy re-keys ``ids``, whose scores the sampler may have changed."""
        if self.policy.needs_scores and np.size(ids):
            with self.lock:
                self.policy.scores_updated(ids)

    def _exchange(self) -> None:
        """The ranks' collective (``RankSync.exchange``), applied alike on every rank:
        the reports, then the feedback, then what a rank's sampler did for all."""
        start = time.perf_counter()
        reports, feedback, shared = self.sync.exchange(self.sampler.shared())
        self.sync_s += time.perf_counter() - start
        self.sync_calls += 1
        for seq, report in reports:
            self._reconcile(seq, report)
        for ids, losses, embeddings in feedback:
            self._learn(ids, losses, embeddings)
        start = time.perf_counter()
        self._scores_changed(self.sampler.apply_shared(shared))
        self.feedback_s += time.perf_counter() - start

    def report_accuracy(self, accuracy: float) -> None:
        """Validation accuracy (with ranks: the mean of every rank's, a collective)."""
        self.accuracy_of_ranks([accuracy])

    def accuracy_of_ranks(self, values: list[float]) -> None:
        """``report_accuracy`` of each rank this planner plans for."""
        self.sampler.report_accuracy(values[0] if self.sync is None else self.sync.mean(values))

    def batch_consumed(self, report: PlanReport | None = None) -> None:
        """Release the oldest plan in flight and reconcile the policy with its report."""
        self.consumed_of_ranks(None if report is None else [report])

    def consumed_of_ranks(self, reports: list[PlanReport] | None) -> None:
        """``batch_consumed`` with the report of each rank this planner plans for."""
        with self.lock:
            seq = self.inflight.consumed()
        if seq is None:
            return
        self.at.consumed_one(len(self.inflight.plans))
        if self.readahead is not None:
            self.readahead.consumed(self.at.consumed - 1)
        if reports is None:
            return
        if self.sync is not None:
            if self.sync.add_report(seq, reports, self.sampler.learns_from_feedback):
                self._exchange()
            return
        report = reports[0]
        if self.latency is not None:
            self.latency.observe(report.requests, report.wire_bytes, report.storage_s,
                                 report.in_flight_s)  # fmt: skip
        self._reconcile(seq, report)

    def _reconcile(self, seq: int, report: PlanReport) -> None:
        """The policy learns what plan ``seq`` really did."""
        with self.lock:
            self.phantoms += self.inflight.reconcile(seq, report)

    def _release_all(self) -> None:
        """Plans handed out and never consumed (an abandoned epoch) hold nothing now."""
        with self.lock:
            self.inflight.release_all()
        if self.readahead is not None:
            self.readahead.reset()

    def flush(self) -> None:
        """Exchange what is pending between ranks (a collective; at epoch boundaries)."""
        if self.sync is not None and self.sync.pending():
            self._exchange()

    def reconcile_store(self, dataset) -> bool:
        """Reconcile with what ``dataset``'s store holds at an epoch boundary
        (``store_sync.py``); False where the store could not be listed."""
        ok, fixes, refilled = self.store_sync.reconcile(dataset, self.at.replay, self.at.loaded)
        self.at.loaded = False
        self.sync_fixes, self.refilled = self.sync_fixes + fixes, self.refilled + refilled
        return ok

    def drain(self, timeout: float = 60.0) -> None:
        self.sampler.drain(timeout)

    def counters(self) -> dict:
        out = {k: getattr(self, k) for k in COUNTERS}
        out.update(self.sampler.counters())
        if self.latency is not None:
            out.update(self.latency.counters())
        if self.feeder is not None:
            out.update(self.feeder.counters())
        if self.ranks is not None:  # every collective the planner made, exchanges included
            out["collectives"] = self.ranks.calls
        return out

    def close(self) -> None:
        """Stop the feeder's and the sampler's threads; release the ranks' group."""
        if self.feeder is not None:
            self.feeder.close()
        self.sampler.close()
        if self.ranks is not None:
            self.ranks.close()

    def state_dict(self, trained: int | None = None) -> dict:
        """Where training stands (``EpochPosition.saved``: the epoch, its order for how
        many ranks of which batch, its batches consumed, the plans made ahead, whose
        decisions are in the policy's state: served again as made, without read-ahead),
        the sampler's and the policy's state and the counters. ``trained``: at most that
        many of the epoch's batches count as consumed (a trainer that fetched ahead)."""
        with self.lock:
            epoch, order, consumed, pad, made = self.at.saved(self.sampler.epoch, trained)
            return {
                "epoch": epoch, "order": order.copy(), "consumed": consumed,
                "world": self.world, "batch_size": self.batch_size, "padded": pad,
                # (a package's bytes stay out: a resumed worker reads them from the source)
                "made": [{**plan_fields(p), "package": ()} for p in made],
                "sampler": self.sampler.state_dict(), "policy": self.policy.state_dict(),
                "counters": {k: getattr(self, k) for k in COUNTERS},
            }  # fmt: skip

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state`` (checked first, ``state.checked``): the next
        ``__iter__`` serves exactly the rest of the saved epoch, in its order."""
        order, consumed, replay, pad = checked(state, self.sampler.num_samples, self.world,
                                               self.batch_size, self.drop_last)  # fmt: skip
        with self.lock:
            self._release_all()
            self.sampler.load_state_dict(state["sampler"])
            self.policy.load_state_dict(state["policy"])
            if self.policy.needs_scores:
                self.policy.attach_scores(self.sampler.board)
            for k, v in state["counters"].items():
                setattr(self, k, v)
            self.at.load(int(state["epoch"]), order, consumed, replay, pad)

    def __len__(self) -> int:
        """This rank's batches per epoch (after a state loaded mid-epoch, left of it)."""
        return self.at.batches_left(self.sampler.epoch, len(self.sampler))

    def resumed_batches(self) -> int:
        """The batches of the current epoch consumed before a mid-epoch resume (0: none)."""
        return int(self.at.resume[2]) if self.at.resumes(self.sampler.epoch) else 0

    def _plan(self, epoch: int, index: int, ids: np.ndarray) -> BatchPlan:
        """Batch ``index``: the policy's decisions, its read-ahead, tracked in flight,
        with the packages the feeder has ready."""
        with self.lock:
            hints = self.sampler.take_hints()
            if hints:
                self.policy.apply_hints(hints)
            r = self.policy.access(ids)
            served = ids if r.served is None else r.served
            fetch = EMPTY if r.fetch is None else r.fetch
            gap = -1 if self.latency is None else self.latency.model.merge_gap
            ra = NOTHING_STAGED
            if self.readahead is not None:
                misses = np.concatenate([served[~r.hits], fetch])
                ra = self.readahead.for_plan(index, misses, gap, self.inflight.oldest(),
                                             self.policy.resident_mask, self.inflight.seq)
                offered = self.policy.offer(ra.free) if ra.free.size else EMPTY
                self.offered += offered.size
                fetch = np.concatenate([fetch, offered])
            seq = self.inflight.seq
            wait_s, admitted, fetch, forgotten = self.inflight.track(
                served[r.hits], r.admitted, fetch, r.evicted)
            self.phantoms += forgotten
            hits = r.hits
            if admitted.size < r.admitted.size:  # a write dropped: a later position of this
                dropped = np.setdiff1d(r.admitted, admitted)  # batch that planned it as a
                hits = hits & ~np.isin(served, dropped)  # hit reads it with the miss instead
            loads = self.feeder.poll() if self.feeder is not None else None
            evicted = r.evicted
            if loads is not None:  # packages this plan puts (iCACHE in the planner's thread)
                wait_s = max(wait_s, self.inflight.track_loads(loads.ids, loads.victims))
                evicted = np.concatenate([evicted, loads.victims])
        return BatchPlan(
            wait_s=wait_s, epoch=epoch, index=index, ids=served, hits=hits,
            admitted=admitted, evicted=evicted, substituted=r.substituted,
            requested=None if r.served is None else ids, fetch=fetch, stage=ra.stage,
            staged=ra.staged, merge_gap=gap, seq=seq, staged_by=ra.staged_by,
            unstage=ra.unstage, loads=EMPTY if loads is None else loads.ids,
            package=() if loads is None else loads.entries,
        )  # fmt: skip

    def _again(self, made: BatchPlan) -> BatchPlan:
        """A plan a saved run made and never consumed, served as made: the policy's saved
        state holds its admissions and evictions already; tracked as a new plan, its
        read-ahead left out (the staging area starts empty)."""
        with self.lock:
            seq = self.inflight.seq
            wait_s, admitted, fetch, forgotten = self.inflight.track(
                made.ids[made.hits], made.admitted, made.fetch, made.evicted)
            self.phantoms += forgotten
            wait_s = max(wait_s, self.inflight.track_loads(made.loads, EMPTY))
        return replace(made, wait_s=wait_s, admitted=admitted, fetch=fetch, seq=seq,
                       stage=EMPTY, staged=EMPTY, staged_by=(), unstage=EMPTY)  # fmt: skip

    def __iter__(self) -> Iterator[BatchPlan]:
        self._release_all()
        self.flush()  # the last epoch's tail: learnt before this epoch is drawn
        start = time.perf_counter()
        epoch = self.sampler.epoch
        step = self.batch_size * self.world
        first, ready = 0, None
        replay, self.at.replay = deque(self.at.replay), []
        if self.at.resumes(epoch):  # the rest of a saved epoch
            _, order, first = self.at.resume
            if self.epochs.needs_future:  # (the plans made are in it)
                self.epochs.set_future(order[(first + len(replay)) * step :], epoch)
        else:
            order, ready, self.at.pad = self.epochs.start(epoch, self.feeder)
            replay.clear()  # (a state of another epoch)
        self.at.begin(epoch, order, first, ready)
        if self.readahead is not None:
            self.readahead.start_epoch(order, step)
        self.planning_s += time.perf_counter() - start
        batches = self.at.batches(order)
        tail = batches - max(1, (batches - first) // TAIL)  # the next epoch drawn from here
        for index in range(first, batches):
            lo = index * step
            start = time.perf_counter()
            if index == tail:
                self.sampler.prepare(epoch + 1)
            if ready is not None:
                ready(lo + step)
            if replay and replay[0].index == index:
                plan = self._again(replay.popleft())
            else:
                ids = np.asarray(order[lo : lo + step], np.int64)  # an order may be int32
                plan = self._plan(epoch, index, ids)
            self.at.made.append(plan)
            if not self.inflight.executes:  # (no report comes: consumed as it is handed out)
                self.at.consumed_one(0)
            if self.ranks is not None and not self.ranks.node:  # this rank's shard
                plan = shard(plan, self.ranks.rank, self.world)
            self.planning_s += time.perf_counter() - start
            yield plan


def _io_stages(
    storage: Storage | None, readahead_bytes: int
) -> tuple[LatencyFit | None, ReadAhead | None]:
    """The fit of a request's latency from the reports, and the read-ahead, over the
    storage a job reads alone (None: no data plane, or ranks, which measure each their
    own while their plans must not differ)."""
    if storage is None:
        return None, None
    fit = None if storage.cost is None else LatencyFit(storage.cost, storage.concurrency)
    if storage.extents is None or not readahead_bytes:
        return fit, None
    return fit, ReadAhead(storage.extents, storage.sizes, storage.merge_gap, readahead_bytes,
                          prefetch=storage.concurrency, on_disk=storage.on_disk)  # fmt: skip


def _check(sampler: Sampler, policy: Policy, batch_size: int, ranks: RankGroup | None,
           sync_every: int, readahead_bytes: int) -> None:  # fmt: skip
    """A ``ConfigError`` naming what in a planner's parts does not fit together."""
    if batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
    if policy.num_samples < sampler.num_samples:
        raise ConfigError(
            f"policy covers {policy.num_samples} ids, sampler draws from {sampler.num_samples}"
        )
    if policy.needs_future and not sampler.order_known_ahead:
        raise ConfigError(
            f"policy {policy.name!r} needs the future access order, which sampler "
            f"{sampler.name!r} decides only as training goes; use the uniform sampler"
        )
    if policy.needs_scores and sampler.board is None:
        raise ConfigError(
            f"policy {policy.name!r} needs importance scores; sampler {sampler.name!r} "
            "has none: use an importance sampler such as 'shade'"
        )
    if sync_every < 1:
        raise ConfigError(f"sync_every must be >= 1 step, got {sync_every}")
    if ranks is not None and sampler.num_replicas != 1:
        raise ConfigError("with ranks=, the sampler draws the global list: num_replicas=1")
    if readahead_bytes < 0:
        raise ConfigError(f"readahead_bytes must be >= 0, got {readahead_bytes}")
