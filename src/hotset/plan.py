"""BatchPlan and the Planner that joins a sampler and a policy (the control plane).

The planner is the only component that decides admissions and evictions, so it knows
exactly what the store should hold. It runs where the ``batch_sampler`` of a DataLoader
runs (the training process); each plan travels to a worker as the "index" PyTorch hands
to ``Dataset.__getitems__``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from hotset.distributed import RankGroup, owners
from hotset.errors import ConfigError, HotsetError, RankError
from hotset.importance.tiers import most_important
from hotset.io.readahead import ReadAhead
from hotset.io.requests import LatencyFit
from hotset.policy.base import Policy
from hotset.sampling.base import Sampler
from hotset.sampling.blocks import block_order, check_order, epoch_rng
from hotset.sampling.draw import ShuffledAsRead

if TYPE_CHECKING:
    from hotset.storage.base import Storage
    from hotset.store.base import Store

log = logging.getLogger(__name__)

_EMPTY = np.empty(0, np.int64)
_EMPTY.flags.writeable = False


def _empty() -> np.ndarray:
    return _EMPTY


#: consumed plans a planner keeps beside those in flight, for a state taken with
#: ``trained`` behind the batches served (a trainer that fetches ahead)
KEPT_PLANS = 8


@dataclass(frozen=True, kw_only=True)
class BatchPlan:
    """One batch: the ids to serve in order, which of them to take from the store
    (``hits``), and what the worker must put into / delete from the store afterwards.
    Fields are named as :class:`~hotset.policy.base.AccessResult`'s.

    With a substituting policy ``ids`` are the samples served, ``requested`` what the
    sampler drew and ``substituted`` marks the positions served by a substitute (a cached
    sample in place of a missed one). ``fetch`` lists ids to read and put that nobody
    requested.

    From the multi-job service: ``evict_keys`` are entries to delete as the store files
    them (sealed: they may belong to another job's dataset, whose digests it never
    sees), and ``wait_s`` how long a worker waits for a planned hit that another job is
    still fetching (co-operative misses) before reading storage. The single-job planner
    uses it too, for what earlier plans still in flight write or free.

    Read-ahead (``io/readahead.py``): ``stage`` lists later batches' samples to read with
    this batch's misses and put into the staging area, ``staged`` those an earlier plan
    staged for this batch, to take from it (and delete) instead of reading storage;
    ``staged_by`` the plans (``seq``) still in flight that stage them: its worker reads its
    own misses first, then waits until those plans' workers have staged, woken as each
    finishes. ``unstage``: staged entries its worker deletes (those staged for this batch
    alone; those a sample drawn again was staged under for several batches, once the last
    of them is consumed).

    iCACHE's packages (``packages.PlannedLoads``): ``loads`` are put after the plan's own
    writes, from ``package``'s entries as written, their room among ``evicted``.
    """

    epoch: int
    index: int
    ids: np.ndarray  # int64, the order the batch is served in
    hits: np.ndarray  # bool per id: planned store hit
    admitted: np.ndarray = field(default_factory=_empty)  # int64 ids to put after reading
    evicted: np.ndarray = field(default_factory=_empty)  # int64 ids to delete
    substituted: np.ndarray | None = None  # bool per id: a substitute for the requested id
    requested: np.ndarray | None = None
    fetch: np.ndarray = field(default_factory=_empty)
    evict_keys: tuple[str, ...] = ()
    wait_s: float = 0.0
    stage: np.ndarray = field(default_factory=_empty)
    staged: np.ndarray = field(default_factory=_empty)
    merge_gap: int = -1  # the gap to read through (the measured cost model's), -1: keep
    seq: int = -1  # the planner's number for this plan
    staged_by: tuple[int, ...] = ()  # the plans in flight that stage for this one
    unstage: np.ndarray = field(default_factory=_empty)  # staged entries it deletes
    loads: np.ndarray = field(default_factory=_empty)  # package ids put after its writes
    package: tuple = ()  # their (id, key, entry) triples (rank 0's shard alone)

    def __len__(self) -> int:
        return int(self.ids.size)

    @classmethod
    def uncached(cls, ids, epoch: int = -1, index: int = -1) -> BatchPlan:
        """A plan that reads ``ids`` from storage and leaves the store alone."""
        ids = np.asarray(ids, np.int64)
        return cls(epoch=epoch, index=index, ids=ids, hits=np.zeros(ids.size, bool))


def _plan_fields(plan: BatchPlan) -> dict:
    """``plan`` as a state holds it (``BatchPlan(**fields)`` makes it again)."""
    return {f.name: getattr(plan, f.name) for f in fields(plan)}


def shard(plan: BatchPlan, rank: int, world: int) -> BatchPlan:
    """Rank ``rank``'s part of a global plan: positions ``rank, rank + world, ...`` (an
    epoch's order is padded to whole ranks, ``Planner._start_epoch``; the rest of one
    resumed on another number of ranks may end in a batch whose first ranks take one
    sample more). It writes the admissions and fetches it ``owners``, after applying
    all of the plan's deletions (every rank does: deleting is idempotent, and a rank's
    writes then never find the store full of what a slower rank has yet to delete, which
    would make what the cache holds depend on the ranks' timing); rank 0 puts the
    packages it loads. A hit on what another
    rank writes in this very plan is read from storage instead (that write may not have
    landed)."""
    pos = np.arange(rank, plan.ids.size, world)
    ids = plan.ids[pos]
    written = np.concatenate([plan.admitted, plan.fetch])
    ours = owners(written, plan.ids, world) == rank
    k = plan.admitted.size
    lead = rank == 0  # (iCACHE's packages: rank 0 writes them)
    return replace(
        plan,
        ids=ids,
        hits=plan.hits[pos] & ~np.isin(ids, written[~ours]),
        admitted=plan.admitted[ours[:k]],
        fetch=plan.fetch[ours[k:]],
        loads=plan.loads if lead else _EMPTY,
        package=plan.package if lead else (),
        substituted=None if plan.substituted is None else plan.substituted[pos],
        requested=None if plan.requested is None else plan.requested[pos],
    )


@dataclass(frozen=True, kw_only=True)
class PlanReport:
    """What the data plane did with one plan: ``stored`` — its admissions and fetches now
    in the store; ``lost`` — those that are not (refused by the budget, a store failure,
    unreadable); ``absent`` — planned hits the store did not hold (or held wrong bytes);
    ``causes`` — why samples were skipped; ``requests``, ``wire_bytes``, ``storage_s`` —
    the storage requests it made, the bytes they moved and the seconds it waited for them
    (``in_flight_s``: the requests' own seconds, summed, where the storage measures them).
    Reports come back in the plans' order."""

    stored: np.ndarray = field(default_factory=_empty)
    lost: np.ndarray = field(default_factory=_empty)
    absent: np.ndarray = field(default_factory=_empty)
    causes: list[str] = field(default_factory=list)
    requests: int = 0
    wire_bytes: int = 0
    storage_s: float = 0.0
    in_flight_s: float = 0.0


@runtime_checkable
class PlanSource(Protocol):
    """What a :class:`~hotset.loader.HotsetLoader` talks to: the ``batch_sampler`` that
    yields an epoch's plans, and where everything the training loop reports goes. The
    single-job :class:`Planner` and the service's ``RemotePlanner`` are the two."""

    #: whether ``feedback`` needs the batch's embeddings (graph importance)
    wants_embeddings: bool
    #: whether it alone decides what this loader's store namespace holds (then the loader
    #: has it reconcile with the store's contents at epoch boundaries, ``reconcile_store``)
    owns_cache: bool
    #: the job's ranks (``distributed.Ranks``; the loader waits on their barrier before it
    #: reconciles the store), or None for one process
    ranks: Any
    #: the read-ahead of later batches' misses, or None (the loader then has no staged
    #: bytes to drop at an epoch's start)
    readahead: Any

    def set_epoch(self, epoch: int) -> None: ...

    def resumed_batches(self) -> int:
        """The batches of the current epoch consumed before a mid-epoch resume (0: none)."""

    def __iter__(self) -> Iterator[BatchPlan]: ...

    def __len__(self) -> int: ...

    def feedback(
        self, ids: np.ndarray, losses: np.ndarray, embeddings: np.ndarray | None = None
    ) -> None:
        """Per-sample losses (and embeddings) of the ids a batch served."""

    def report_accuracy(self, accuracy: float) -> None:
        """Validation accuracy after an epoch."""

    def batch_consumed(self, report: PlanReport | None = None) -> None:
        """The loader handed one more batch to the training loop: its plan has run, and
        ``report`` says what really happened."""

    def reconcile_store(self, dataset) -> bool:
        """Where it ``owns_cache``, at an epoch boundary: forget the residents
        ``dataset``'s store lacks and delete the entries it should not hold (False: the
        store could not be listed)."""

    def flush(self) -> None:
        """Apply what is pending (ranks' reports and feedback) before an epoch boundary."""

    def drain(self, timeout: float = 60.0) -> None:
        """Wait for background work on fed-back batches to finish."""

    def counters(self) -> dict:
        """Control-plane counters (planning and feedback seconds, ...)."""

    def close(self) -> None:
        """Stop background work, leave a service."""

    def state_dict(self, trained: int | None = None) -> dict:
        """What is needed to continue after a restart (``trained``: at most that many of
        the epoch's batches count as consumed)."""

    def load_state_dict(self, state: dict) -> None: ...


#: the planner's counters, saved with its state
COUNTERS = (
    "planning_s", "feedback_s", "phantoms", "sync_fixes", "sync_s", "sync_calls", "offered",
    "refilled",
)  # fmt: skip
#: residents read back from the source a call, after a state is loaded on a cold store
REFILL_BATCH = 256


class Planner:
    """Iterable of :class:`BatchPlan` for the sampler's current epoch; a ``batch_sampler``
    and the single-job :class:`PlanSource`.

    ``planning_s`` accumulates the time spent deciding (sampler + policy), the control
    plane's whole cost. For a policy that ``needs_future`` the planner hands it this epoch's
    and the next epoch's order at each epoch start, unless ``feed_future=False`` (the
    caller gave it a longer future itself, as the simulator does).

    ``storage`` and ``store``: where the data plane executes the plans. With a store, the
    ids a plan serves from the store (hits and substitutes) and those it writes stay
    pinned (never evicted, so never deleted under a worker) until the loader reports it
    consumed (``batch_consumed``), and the report is reconciled at once: what the store
    lacks after all is forgotten by the policy (``phantoms``), fetches that landed are
    confirmed. A plan that hits an id an earlier plan in flight is still writing, or writes
    while earlier plans in flight free room, tells its worker to wait up to ``wait_s`` for
    them; a write of an id an earlier plan in flight deletes is dropped (the two workers
    may run in either order). Without a store (the simulator) each plan counts
    as executed when yielded. The policy's feeder (``Policy.make_feeder``, iCACHE's
    package threads) works under ``package_dir``. ``lock`` guards the policy: a feeder
    thread that changes the cache takes it too.

    ``readahead_bytes``: where the storage has extents (tar shards), the misses of later
    batches that fall in a batch's range requests are read with it and staged, up to
    that many bytes at once (``io/readahead.py``); the samples those requests read
    through are offered to the policy (``offered`` counts those it took), for the next
    batches on (a worker reads its own misses first, then waits for the plans staging for
    its batch to finish, woken as each does); each plan also reads ahead up to the
    storage's ``concurrency`` shards that the next batches need first. Not with ranks.

    ``order="blocks"``: each epoch as the sampler draws it, then read by blocks of shards
    (``sampling/blocks.py``, ``block_size`` ids a block; hotset's option): needs a
    storage whose samples are ranges of larger objects (``extents``).
    """

    owns_cache = True
    #: the type of the per-id columns that track plans in flight (2 B per id)
    tracking_dtype = np.int16

    def __init__(
        self,
        sampler: Sampler,
        policy: Policy,
        batch_size: int,
        drop_last: bool = False,
        feed_future: bool = True,
        storage: Storage | None = None,
        store: Store | None = None,
        package_dir: str | None = None,
        wait_s: float = 0.2,
        ranks: RankGroup | None = None,
        sync_every: int = 1,
        readahead_bytes: int = 0,
        order: str = "paper",
        block_size: int = 2048,
    ) -> None:
        """``ranks``: a data-parallel job's ranks (``distributed.py``): the sampler draws
        the global list (made with ``num_replicas=1``), every rank plans the same global
        batches and serves its shard of each; the batches' reports and the feedback are
        exchanged together, in one collective every ``sync_every`` steps."""
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
        if policy.needs_scores:
            if sampler.board is None:
                raise ConfigError(
                    f"policy {policy.name!r} needs importance scores; sampler {sampler.name!r} "
                    "has none: use an importance sampler such as 'shade'"
                )
            policy.attach_scores(sampler.board)
        self.lock = threading.RLock()
        self.sampler = sampler
        self.policy = policy
        deleting = self.deleted_in_flight if store is not None else None
        self.feeder = policy.make_feeder(
            self.lock, storage, store, package_dir, deleting, ranks=ranks
        )
        self.batch_size = int(batch_size)
        self.drop_last = drop_last
        self.feed_future = feed_future
        self.executes = store is not None  # plans run elsewhere and are reported back
        self.wait_s = float(wait_s)
        # plans handed out, not consumed: (seq, the ids it pinned)
        self._inflight: deque[tuple[int, np.ndarray]] = deque()
        # this epoch's latest global plans: those in flight and the last ``KEPT_PLANS``
        # consumed (a state saves those after its batches and serves them again, as made)
        self._made: deque[BatchPlan] = deque()
        self._replay: list[BatchPlan] = []  # a loaded state's, served before planning more
        # per id, the last plan that wrote / deleted it, as its seq - _base (2 B per id;
        # -1: before _base, which moves up as plans are reconciled): in flight if >= the
        # oldest in flight
        tracked = policy.num_samples if self.executes else 0
        self._writer = np.full(tracked, -1, self.tracking_dtype)
        self._deleter = np.full(tracked, -1, self.tracking_dtype)
        self._base = 0
        self._last_delete = -1  # the last plan that deleted anything
        self._seq = 0
        self._order = _EMPTY  # the epoch being planned, as drawn at its start
        # where the sampler shuffles it as it is read: makes it final up to a position
        self._ready: Callable[[int], object] | None = None
        self._order_epoch = -1  # which epoch that is
        self._consumed = 0  # its batches the loader handed to the training loop
        self._resume: tuple[int, np.ndarray, int] | None = None  # epoch, order, consumed
        self._pad = 0  # ids the order of ``_order`` or ``_resume`` ends in that pad it
        self.phantoms = 0  # residents forgotten: the store lacked them, or never would hold them
        self.refilled = 0  # residents read back from the source after a state was loaded
        self._loaded = False  # a state was loaded: the next reconciliation refills
        self.sync_fixes = 0  # disagreements with the store found at epoch boundaries
        self.planning_s = 0.0  # deciding plans: sampler draws + policy accesses
        self.feedback_s = 0.0  # scoring feedback: importance + score board + policy re-keying
        if sync_every < 1:
            raise ConfigError(f"sync_every must be >= 1 step, got {sync_every}")
        if ranks is not None and sampler.num_replicas != 1:
            raise ConfigError("with ranks=, the sampler draws the global list: num_replicas=1")
        self.ranks = ranks
        self.world = 1 if ranks is None else ranks.world
        if ranks is not None:
            sampler.plan_with_ranks(ranks.rank, ranks.world)
        self.sync_every = int(sync_every)
        self._feedback: list[tuple] = []  # this rank's feedback not yet exchanged
        self._reports: list[tuple[int, PlanReport]] = []  # and its batches' reports
        self.sync_s = 0.0  # exchanging feedback and reports between ranks
        self.sync_calls = 0  # collectives that did
        self.offered = 0  # samples read through by a range request that the policy took
        extents = storage.extents if storage is not None and self.executes else None
        cost = storage.cost if storage is not None and self.executes else None
        # the latency a request costs, measured from this job's reports (not with ranks:
        # each rank measures its own, and their plans must not differ)
        self.latency = None
        if cost is not None and ranks is None:
            self.latency = LatencyFit(cost, storage.concurrency)
        check_order(order, block_size)
        self.order, self.block_size = order, int(block_size)
        self._objects = None  # each id's shard, for the block order
        if order == "blocks":
            if storage is None or storage.extents is None:
                raise ConfigError(
                    "order='blocks' reads an epoch shard by shard: it needs samples that are "
                    "ranges of larger objects (tar shards), and this storage keeps a file "
                    "per sample"
                )
            self._objects = np.asarray(storage.extents[0])
        # a disk tier below the store (not with ranks: each node's tier holds its own)
        tiered = ranks is None and storage is not None and storage.disk_capacity
        self._disk = storage if tiered else None
        self.readahead = None
        if readahead_bytes < 0:
            raise ConfigError(f"readahead_bytes must be >= 0, got {readahead_bytes}")
        if extents is not None and readahead_bytes and ranks is None:
            self.readahead = ReadAhead(
                extents, storage.sizes, storage.merge_gap, readahead_bytes,
                prefetch=storage.concurrency, on_disk=storage.on_disk,
            )

    @property
    def wants_embeddings(self) -> bool:
        return self.sampler.needs_embeddings

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def feedback(
        self, ids: np.ndarray, losses: np.ndarray, embeddings: np.ndarray | None = None
    ) -> None:
        """Per-sample losses (and, for graph importance, embeddings) of the ids a batch
        served: to the sampler's scores, then to a policy that keys on them."""
        if not self.sampler.learns_from_feedback:
            return
        if self.ranks is not None:  # every rank learns every rank's feedback, in rank order
            self._feedback.append((ids, losses, embeddings))
            if len(self._feedback) >= self.sync_every:
                self._exchange()
            return
        self._learn(ids, losses, embeddings)

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
        """All ranks' batch reports and feedback since the last exchange, in one
        collective, applied by every rank alike: the reports of each batch (every rank's
        shard) in batch order, then the feedback in rank order, then what a rank's sampler
        did for all (``Sampler.shared``: SpiderCache's scores). Each rank calls it at the
        same step (``sync_every`` feedbacks, or reports where the sampler takes none),
        and at each epoch's boundaries."""
        start = time.perf_counter()
        gathered = self.ranks.all_gather(
            (self._reports, self._feedback, self.sampler.shared()), call="the feedback sync"
        )
        self._reports, self._feedback = [], []
        self.sync_s += time.perf_counter() - start
        self.sync_calls += 1
        counts = {len(g[0]) for g in gathered}
        if len(counts) != 1:
            raise RankError(
                f"ranks reported {sorted(counts)} batches between two exchanges: every rank "
                "must iterate the loader alike"
            )
        for k in range(counts.pop()):
            seq = gathered[0][0][k][0]
            reports = [g[0][k][1] for g in gathered]
            self._reconcile(seq, PlanReport(
                stored=np.concatenate([r.stored for r in reports]),
                lost=np.concatenate([r.lost for r in reports]),
                absent=np.concatenate([r.absent for r in reports]),
            ))  # fmt: skip
        for _, items, _ in gathered:
            for ids, losses, embeddings in items:
                self._learn(ids, losses, embeddings)
        start = time.perf_counter()
        self._scores_changed(self.sampler.apply_shared([g[2] for g in gathered]))
        self.feedback_s += time.perf_counter() - start

    def report_accuracy(self, accuracy: float) -> None:
        """Validation accuracy (with ranks: the mean of every rank's, a collective)."""
        if self.ranks is not None:
            every = self.ranks.all_gather(float(accuracy), call="report_accuracy")
            accuracy = float(np.mean(every))
        self.sampler.report_accuracy(float(accuracy))

    def batch_consumed(self, report: PlanReport | None = None) -> None:
        """Release the oldest plan in flight and reconcile the policy with its report."""
        if not self._inflight:
            return
        self._consumed += 1
        seq, pins = self._inflight.popleft()
        while len(self._made) > len(self._inflight) + KEPT_PLANS:
            self._made.popleft()
        with self.lock:
            self.policy.pin(pins, -1)
        if self.readahead is not None:
            self.readahead.consumed(self._consumed - 1)
        if report is None:
            return
        if self.latency is not None:
            self.latency.observe(report.requests, report.wire_bytes, report.storage_s,
                                 report.in_flight_s)  # fmt: skip
        if self.ranks is None:
            self._reconcile(seq, report)
            return
        self._reports.append((seq, report))  # every rank's shard, exchanged with feedback
        due = self.sync_every * (2 if self.sampler.learns_from_feedback else 1)
        if len(self._reports) >= due:  # (twice as many: feedback is not coming)
            self._exchange()

    def _reconcile(self, seq: int, report: PlanReport) -> None:
        """The policy learns what plan ``seq`` really did."""
        with self.lock:
            lost = np.concatenate([report.lost, report.absent])
            # one a later plan writes is its to report
            lost = lost[self._writer[lost] <= seq - self._base]
            self.phantoms += len(self.policy.reconcile(report.stored, lost))

    def _oldest(self) -> int:
        """The oldest plan in flight (where none is, the next one's seq)."""
        return self._inflight[0][0] if self._inflight else self._seq

    def deleted_in_flight(self, ids: np.ndarray) -> np.ndarray:
        """Mask of ``ids`` that a plan in flight deletes (lock held)."""
        return self._deleter[ids] >= self._oldest() - self._base

    def _rebase(self) -> None:
        """Make room for the next plan's seq in ``_writer`` and ``_deleter``: count from
        the oldest plan that can still be asked about (in flight, or its report still to
        reconcile); those before it read -1. Where that does not move (2^15 plans
        unreconciled) the columns widen to int32."""
        floor = self._oldest()
        if self._reports:
            floor = min(floor, self._reports[0][0])
        shift = floor - self._base
        if shift <= 0:
            self._writer = self._writer.astype(np.int32)
            self._deleter = self._deleter.astype(np.int32)
            return
        for a in (self._writer, self._deleter):
            if shift > np.iinfo(a.dtype).max:  # none is in flight: all before the floor
                a.fill(-1)
            else:
                np.maximum(a, shift - 1, out=a)  # those before the floor: -1
                a -= shift
        self._base = floor

    def _release_all(self) -> None:
        """Plans handed out and never consumed (an abandoned epoch) hold nothing now,
        and nothing is staged (the loader deletes what is)."""
        with self.lock:
            while self._inflight:
                self.policy.pin(self._inflight.popleft()[1], -1)
        if self.readahead is not None:
            self.readahead.reset()

    def flush(self) -> None:
        """Exchange what is pending between ranks (a collective; at epoch boundaries)."""
        if self.ranks is not None and (self._reports or self._feedback):
            self._exchange()

    def sync_with_store(self, held: np.ndarray) -> np.ndarray:
        """Reconcile at an epoch boundary (no plan in flight): forget the residents the
        store lacks, and return the store's entries the policy does not hold (left by an
        earlier job, or by a plan abandoned mid-flight) for the loader to delete."""
        with self.lock:
            cached = self.policy.cached_ids()
            writing = self.policy.writing_ids()  # the feeder's loads in flight: theirs
            # what the plans a loaded state serves again write: theirs to put (a killed
            # job's workers may have put them, or not)
            again = [a for p in self._replay for a in (p.admitted, p.fetch, p.loads)]
            forgotten = self.policy.discard(
                np.setdiff1d(np.setdiff1d(cached, held), np.concatenate([_EMPTY, *again]))
            )
            extra = np.setdiff1d(np.setdiff1d(held, cached), writing)
            self.sync_fixes += len(forgotten) + extra.size
            return extra

    def reconcile_store(self, dataset) -> bool:
        """Reconcile with what ``dataset``'s store holds at an epoch boundary (every rank
        at once): rank 0 (or the one job) lists it, every rank forgets the residents it
        lacks (``sync_with_store``) and the lister deletes the entries the plan does not
        hold. All under the lock: a package the feeder loads meanwhile would be in the
        policy but not in the listing (forgotten while the store keeps it), or found
        extra and deleted. False where the store could not be listed."""
        lister = self.ranks is None or self.ranks.rank == 0
        with self.lock:
            held = None
            if lister:
                try:
                    held = dataset.ids_of(dataset.store.list_keys())
                except HotsetError as exc:
                    log.debug("cannot reconcile with the store: %s", exc)
            if lister and held is not None and self._loaded:
                held = self._refill(dataset, held)
            self._loaded = False
            if self.ranks is not None:
                held = self.ranks.broadcast(held, call="the store's listing")
            if held is None:
                return False
            extra = self.sync_with_store(held)
            if lister and extra.size:
                log.info("deleting %d store entries the plan does not hold", extra.size)
                dataset.store.delete_many([dataset.keys[i] for i in extra.tolist()])
            return True

    def _refill(self, dataset, held: np.ndarray) -> np.ndarray:
        """After a state is loaded, the residents its policy holds that the store lacks
        (the killed job's cache was its own, or lost some) are read from the source and
        put back, so that the plans, which depend on what is cached (SHADE's sampler
        draws its cached important samples again), are the uninterrupted run's: the same
        samples. Those that cannot be read or put are forgotten as before. Returns what
        the store holds now (lock held)."""
        again = [a for p in self._replay for a in (p.admitted, p.fetch, p.loads)]
        missing = np.setdiff1d(np.setdiff1d(self.policy.cached_ids(), held),
                               np.concatenate([_EMPTY, *again]))  # fmt: skip
        storage, keys, back = dataset.storage, dataset.keys, [held]
        for lo in range(0, missing.size, REFILL_BATCH):
            ids = missing[lo : lo + REFILL_BATCH].tolist()
            try:
                read = dict(zip(ids, storage.read_many(ids), strict=True))
            except HotsetError:  # (a sample that cannot be read: the others still are)
                read = {}
                for i in ids:
                    with contextlib.suppress(HotsetError):
                        read[i] = storage.read(i)
            _, out = dataset.store.put({keys[i]: storage.to_entry(keys[i], v)
                                        for i, v in read.items()})  # fmt: skip
            refused = set(out)
            back.append(np.array([i for i in read if keys[i] not in refused], np.int64))
            self.refilled += back[-1].size
        return np.unique(np.concatenate(back))

    def drain(self, timeout: float = 60.0) -> None:
        self.sampler.drain(timeout)

    def counters(self) -> dict:
        out = {k: getattr(self, k) for k in COUNTERS}
        if self.latency is not None:  # the measured cost of a request, and the gap it makes
            out["request_latency_ms"] = self.latency.model.latency_ms
            out["merge_gap"] = self.latency.model.merge_gap
        out.update(self.sampler.counters())
        if self.feeder is not None:
            out.update(self.feeder.counters())
        if self.ranks is not None:  # every collective the planner made, exchanges included
            out["collectives"] = self.ranks.calls
        return out

    def close(self) -> None:
        """Stop the feeder's and the sampler's background threads; release the ranks'
        group."""
        if self.feeder is not None:
            self.feeder.close()
        self.sampler.close()
        if self.ranks is not None:
            self.ranks.close()

    def state_dict(self, trained: int | None = None) -> dict:
        """Where training stands: the epoch, its order as drawn (for how many ranks, and
        the ids that pad it to them) and how many of its batches were consumed, the
        sampler's and the policy's state, the counters, and
        the plans made for its later batches (DataLoader workers' prefetch): their
        decisions are in the policy's state, so after a restart they are served again as
        made, not planned a second time from what they admitted (their read-ahead left
        out: the staging area starts empty). Taken at
        any point, it resumes to what an uninterrupted run would still serve: an epoch
        ``set_epoch`` named but not begun starts afresh (not with the last epoch's order),
        and after an epoch's last batch the next epoch does. ``trained``: at most that
        many of the epoch's batches count as consumed (a trainer that fetched ahead)."""
        with self.lock:
            epoch, order, consumed = self.sampler.epoch, self._order, self._consumed
            if self._ready is not None:
                self._ready(order.size)
            if trained is not None:
                consumed = min(consumed, int(trained))
            made = [p for p in self._made if p.index >= consumed]
            pad = self._pad
            if self._resume is not None and self._resume[0] == epoch:
                _, order, consumed = self._resume  # loaded, not yet served: as loaded
                made = self._replay
            elif self._order_epoch != epoch:
                order, consumed, pad = _EMPTY, 0, 0  # set_epoch moved on: not begun
            elif consumed >= self._batches(order):
                epoch, order, consumed, pad = epoch + 1, _EMPTY, 0, 0  # over: the next is due
            if not order.size or (made and made[0].index != consumed):
                made = []  # (fetched ahead of ``trained`` further than kept: planned again)
            return {
                "epoch": epoch,
                "order": order.copy(),
                "consumed": consumed,
                # (the ranks and per-rank batch it was cut for, and the ids that pad it)
                "world": self.world,
                "batch_size": self.batch_size,
                "padded": pad,
                # (a package's bytes stay out: a resumed worker reads them from the source)
                "made": [{**_plan_fields(p), "package": ()} for p in made],
                "sampler": self.sampler.state_dict(),
                "policy": self.policy.state_dict(),
                "counters": {k: getattr(self, k) for k in COUNTERS},
            }

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state``: the next ``__iter__`` serves exactly the rest of the
        saved epoch, in its order."""
        order, consumed, replay, pad = self._checked(state)
        with self.lock:
            self._release_all()
            self.sampler.load_state_dict(state["sampler"])
            self.policy.load_state_dict(state["policy"])
            if self.policy.needs_scores:
                self.policy.attach_scores(self.sampler.board)
            for k, v in state["counters"].items():
                setattr(self, k, v)
            self._replay, self._pad = replay, pad
            if order.size:
                self._resume = (int(state["epoch"]), order, consumed)
            self._loaded = True

    def _checked(self, state: dict) -> tuple[np.ndarray, int, list[BatchPlan], int]:
        """The state's order, consumed batches, saved plans and padding, checked against
        each other and the dataset before any of it is used: an edited or forged state is
        a ``ConfigError`` naming what does not fit, never samples skipped, repeated or out
        of range. The plans' package bytes are dropped (a resumed worker reads those
        samples from the source). A state of another number of ranks, or of another per-rank
        batch size, is re-cut (``_recut``)."""

        def bad(what: str) -> ConfigError:
            return ConfigError(f"this state cannot be loaded: {what} (was it edited, or "
                               "saved by another program?)")  # fmt: skip

        n = self.sampler.num_samples

        def ids_of(value, what: str) -> np.ndarray:
            a = np.asarray(value)
            if a.ndim != 1 or (a.size and a.dtype.kind not in "iu"):
                raise bad(f"{what} is not a list of sample ids")
            a = a.astype(np.int64)
            if a.size and (a.min() < 0 or a.max() >= n):
                raise bad(f"{what} names ids outside the dataset's {n} samples")
            return a

        order = ids_of(state["order"], "its order")
        consumed, world, pad = state["consumed"], state["world"], state["padded"]
        batch = state["batch_size"]
        if not isinstance(world, int | np.integer) or world < 1:
            raise bad(f"world={world!r} is not a number of ranks")
        if not isinstance(batch, int | np.integer) or batch < 1:
            raise bad(f"batch_size={batch!r} is not a batch size")
        step = int(batch) * int(world)
        if not isinstance(consumed, int | np.integer) or not (
            0 <= consumed <= -(-order.size // step)
        ):  # fmt: skip
            raise bad(f"consumed={consumed!r} is not a batch count of its order")
        if not isinstance(pad, int | np.integer) or not 0 <= pad < world or pad > order.size:
            raise bad(f"padded={pad!r} is not a padding of its order for {world} ranks")
        if (world, batch) != (self.world, self.batch_size):
            rest, pad = self._recut(order[int(consumed) * step : order.size - int(pad)])
            return rest, 0, [], pad
        names, replay = {f.name for f in fields(BatchPlan)}, []
        for k, saved in enumerate(state.get("made", ())):
            if not isinstance(saved, dict) or not set(saved) <= names:
                raise bad(f"saved plan {k} is not a plan")
            plan = BatchPlan(**{**saved, "package": ()})
            plan = replace(plan, **{
                f: ids_of(getattr(plan, f), f"saved plan {k}'s {f}")
                for f in ("ids", "admitted", "evicted", "fetch", "loads", "stage", "staged")
            })  # fmt: skip
            at = int(consumed) + k
            drawn = plan.ids if plan.requested is None else ids_of(plan.requested, "requested")
            hits = np.asarray(plan.hits)
            if (plan.index != at or hits.dtype != bool or hits.shape != plan.ids.shape
                    or not np.array_equal(drawn, order[at * step : (at + 1) * step])):  # fmt: skip
                raise bad(f"saved plan {k} is not batch {at} of its order")
            replay.append(plan)
        return order, int(consumed), replay, int(pad)

    def _recut(self, rest: np.ndarray) -> tuple[np.ndarray, int]:
        """What a job of other ranks had not served of its epoch (``rest``, in its order,
        its padding left out), as this job's order from its first batch: served once
        across these ranks (the last batch's first ranks may take one sample more,
        ``shard``), cut to whole batches with ``drop_last``, and padded by wrapping only
        where the last batch would leave a rank without a sample. The plans the other job
        made ahead are made again (their decisions are in the policy's state: the store's
        listing, at the epoch's start, corrects what they had not done). Returns the
        order and the ids that pad it."""
        step = self.batch_size * self.world
        if self.drop_last:
            return rest[: (rest.size // step) * step].copy(), 0
        last = rest.size % step
        short = self.world - last if 0 < last < self.world else 0
        return np.concatenate([rest, np.resize(rest, short)]), short

    def _batches(self, order: np.ndarray) -> int:
        """Global batches in an epoch of ``order``."""
        return -(-order.size // (self.batch_size * self.world))

    def __len__(self) -> int:
        """This rank's batches per epoch (the same on every rank); after a state loaded
        mid-epoch, the batches left of that epoch."""
        if self._resume is not None and self._resume[0] == self.sampler.epoch:
            _, order, consumed = self._resume
            return self._batches(order) - consumed
        n = len(self.sampler)  # the global list's length with ranks
        if self.world > 1:  # padded by wrapping, or cut, to whole shards
            n = n // self.world if self.drop_last else -(-n // self.world)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def resumed_batches(self) -> int:
        """The batches of the current epoch consumed before a mid-epoch resume (0: none)."""
        if self._resume is not None and self._resume[0] == self.sampler.epoch:
            return int(self._resume[2])
        return 0

    def _cached_for_sampler(self) -> np.ndarray:
        """What a cache-aware sampler is told the cache holds: the policy's residents,
        and with a disk tier the samples it holds among the most important that both
        tiers' budgets fit (``importance/tiers.py``)."""
        cached = self.policy.cached_ids()
        board = self.sampler.board
        if self._disk is None or board is None or self.sampler.cache_tiers != "both":
            return cached
        budget = self.policy.capacity_bytes + self._disk.disk_capacity
        top = most_important(board.score, self._disk.sizes, budget)
        return np.union1d(cached, top[self._disk.on_disk(top)])

    def _start_epoch(self, epoch: int) -> tuple[np.ndarray, Callable[[int], object] | None]:
        """The epoch's order, with the cache told what the sampler knows at its start;
        and, where the sampler shuffles the order as it is read (``order_as_read``),
        what makes it final up to a position (``None``: final)."""
        if self.sampler.cache_aware:
            self.sampler.set_cached(self._cached_for_sampler())
        needs_future = self.policy.needs_future and self.feed_future
        ready = None
        if self.sampler.num_replicas > 1:
            order = self._arranged(self.sampler.epoch_order(epoch), epoch)
        else:
            order = self.sampler.order_as_read(epoch)
            if isinstance(order, ShuffledAsRead):
                padded = not self.drop_last and order.size % self.world
                whole = needs_future or self.readahead is not None or self._objects is not None
                if padded or whole:
                    order = order.whole()  # each reads the whole epoch now
                else:
                    order, ready = order.ids, order.ready
            order = self._arranged(order, epoch)
        hints = self.sampler.cache_hints(epoch)
        if hints:
            with self.lock:
                self.policy.apply_hints(hints)
        if self.feeder is not None:
            self.feeder.epoch_started()
        step = self.batch_size * self.world  # a global batch: every rank's batch
        if self.drop_last:
            order = order[: (order.size // step) * step]  # a view: still shuffled as read
        self._pad = 0 if self.drop_last else -order.size % self.world
        if self._pad:  # as DistributedSampler: pad by wrapping
            order = np.concatenate([order, np.resize(order, self._pad)])
        if needs_future:
            # The future as far as it is planned: this epoch and the next one.
            ahead = self._arranged(self.sampler.epoch_order(epoch + 1), epoch + 1)
            self.policy.set_future(np.concatenate([order, ahead]))
        return order, ready

    def _arranged(self, order: np.ndarray, epoch: int) -> np.ndarray:
        """``order`` as the sampler drew it, or read by blocks of shards (``order``)."""
        if self._objects is None:
            return order
        rng = epoch_rng(self.sampler.seed, epoch)
        return block_order(order, self._objects, self.block_size, rng)

    def _plan(self, epoch: int, index: int, ids: np.ndarray) -> BatchPlan:
        with self.lock:
            hints = self.sampler.take_hints()
            if hints:
                self.policy.apply_hints(hints)
            r = self.policy.access(ids)
            served = ids if r.served is None else r.served
            fetch = _EMPTY if r.fetch is None else r.fetch
            stage = staged = unstage = _EMPTY
            staged_by: tuple[int, ...] = ()  # earlier plans in flight staging for this one
            gap = -1 if self.latency is None else self.latency.model.merge_gap
            if self.readahead is not None:
                if gap >= 0:
                    self.readahead.gap = gap
                staged, producers, unstage = self.readahead.take(index)
                staged_by = tuple(p for p in producers if p >= self._oldest())  # in flight
                reads = np.setdiff1d(np.concatenate([served[~r.hits], fetch]), staged)
                stage, free = self.readahead.plan(index, reads, self._resident, self._seq)
                offered = self.policy.offer(free) if free.size else _EMPTY
                self.offered += offered.size
                fetch = np.concatenate([fetch, offered])
            seq = self._seq
            wait_s, admitted, fetch = self._track(served[r.hits], r.admitted, fetch, r.evicted)
            hits = r.hits
            if admitted.size < r.admitted.size:  # a write dropped: a later position of this
                dropped = np.setdiff1d(r.admitted, admitted)  # batch that planned it as a
                hits = hits & ~np.isin(served, dropped)  # hit reads it with the miss instead
            loads = self.feeder.poll() if self.feeder is not None else None
            evicted = r.evicted
            if loads is not None:  # packages this plan puts (iCACHE in the planner's thread)
                wait_s = max(wait_s, self._track_loads(loads.ids, loads.victims))
                evicted = np.concatenate([evicted, loads.victims])
        substituting = r.served is not None
        return BatchPlan(
            wait_s=wait_s,
            epoch=epoch,
            index=index,
            ids=served,
            hits=hits,
            admitted=admitted,
            evicted=evicted,
            substituted=r.substituted,
            requested=ids if substituting else None,
            fetch=fetch,
            stage=stage,
            staged=staged,
            merge_gap=gap,
            seq=seq,
            staged_by=staged_by,
            unstage=unstage,
            loads=_EMPTY if loads is None else loads.ids,
            package=() if loads is None else loads.entries,
        )

    def _again(self, made: BatchPlan) -> BatchPlan:
        """A plan a saved run made and never consumed, served as made: the policy's saved
        state holds its admissions and evictions already; tracked as a new plan, its
        read-ahead left out (its misses are read, not taken from a staging area that
        ``__iter__``'s loader emptied)."""
        with self.lock:
            seq = self._seq
            wait_s, admitted, fetch = self._track(
                made.ids[made.hits], made.admitted, made.fetch, made.evicted
            )
            wait_s = max(wait_s, self._track_loads(made.loads, _EMPTY))
        return replace(made, wait_s=wait_s, admitted=admitted, fetch=fetch, seq=seq,
                       stage=_EMPTY, staged=_EMPTY, staged_by=(), unstage=_EMPTY)  # fmt: skip

    def _resident(self, ids: np.ndarray) -> np.ndarray:
        """Which of ``ids`` the cache holds (lock held)."""
        return self.policy.resident_mask(ids)

    def _track(
        self, reads: np.ndarray, admitted: np.ndarray, fetch: np.ndarray, deletes: np.ndarray
    ) -> tuple[float, np.ndarray, np.ndarray]:
        """A new plan that serves ``reads`` from the store, writes ``admitted`` and
        ``fetch`` and deletes ``deletes``. With a data plane: pin what it reads and writes
        until it is consumed; a write of an id that an earlier plan in flight deletes is
        dropped (its worker might delete it after this one's put) and the policy forgets
        it; returns how long its worker should wait for reads that earlier plans in flight
        are still writing, and the writes it keeps; the policy's ``in_flight_ids`` keeps
        the most ids that earlier plans in flight held while one was planned. Without:
        it counts as executed."""
        if not self.executes:
            self.policy.reconcile(np.concatenate([admitted, fetch]), _EMPTY)
            return 0.0, admitted, fetch
        if self._seq - self._base > np.iinfo(self._writer.dtype).max:
            self._rebase()
        oldest = self._oldest()
        in_flight = oldest - self._base  # as the columns count
        writes = np.concatenate([admitted, fetch])
        blocked = self._deleter[writes] >= in_flight
        if blocked.any():
            self.phantoms += len(self.policy.discard(writes[blocked]))
            admitted, fetch = (a[self._deleter[a] < in_flight] for a in (admitted, fetch))
            writes = writes[~blocked]
        seq, self._seq = self._seq, self._seq + 1
        pins = np.concatenate([reads, writes])
        self.policy.pin(pins, +1)
        self._inflight.append((seq, pins))
        held = (len(self._inflight) - 1) * self.batch_size * self.world  # beside this one
        if held > self.policy.in_flight_ids:  # (the same on every rank: a DataLoader hands
            self.policy.in_flight_ids = held  # out and consumes plans in program order)
        # its worker may have to wait for earlier workers: for the reads they write, or for
        # the room their deletions free before its own writes fit
        wait = (self._writer[reads] >= in_flight).any()
        wait = self._mark(seq, writes, deletes) or wait
        return (self.wait_s if wait else 0.0), admitted, fetch

    def _mark(self, seq: int, writes: np.ndarray, deletes: np.ndarray) -> bool:
        """Plan ``seq`` (in flight) writes ``writes`` and deletes ``deletes``, as the
        columns count; whether its writes may wait for the room that earlier plans in
        flight free."""
        room = bool(writes.size) and self._last_delete >= self._oldest()
        self._writer[writes] = seq - self._base
        self._deleter[deletes] = seq - self._base
        if deletes.size:
            self._last_delete = seq
        return room

    def _track_loads(self, loads: np.ndarray, victims: np.ndarray) -> float:
        """The packages the plan just tracked puts (``loads``, room made by deleting
        ``victims``): pinned and marked as its writes and deletions; how long its worker
        may wait for the room earlier plans in flight free."""
        seq, pins = self._inflight[-1]
        self.policy.pin(loads, +1)
        self._inflight[-1] = (seq, np.concatenate([pins, loads]))
        return self.wait_s if self._mark(seq, loads, victims) else 0.0

    def __iter__(self) -> Iterator[BatchPlan]:
        self._release_all()
        self.flush()  # the last epoch's tail: learnt before this epoch is drawn
        start = time.perf_counter()
        epoch = self.sampler.epoch
        first, ready = 0, None
        replay, self._replay = deque(self._replay), []
        if self._resume is not None and self._resume[0] == epoch:  # the rest of a saved epoch
            _, order, first = self._resume
            if self.policy.needs_future and self.feed_future:  # (the plans made are in it)
                rest = order[(first + len(replay)) * self.batch_size * self.world :]
                ahead = self._arranged(self.sampler.epoch_order(epoch + 1), epoch + 1)
                self.policy.set_future(np.concatenate([rest, ahead]))
        else:
            order, ready = self._start_epoch(epoch)
            replay.clear()  # (a state of another epoch)
        self._resume = None
        self._made.clear()
        self._order, self._consumed, self._order_epoch = order, first, epoch
        self._ready = ready
        step = self.batch_size * self.world
        if self.readahead is not None:
            self.readahead.start_epoch(order, step)
        self.planning_s += time.perf_counter() - start
        for index in range(first, self._batches(order)):
            lo = index * step
            start = time.perf_counter()
            if ready is not None:
                ready(lo + step)
            if replay and replay[0].index == index:
                plan = self._again(replay.popleft())
            else:
                ids = np.asarray(order[lo : lo + step], np.int64)  # an order may be int32
                plan = self._plan(epoch, index, ids)
            self._made.append(plan)
            if self.ranks is not None:  # this rank's shard of the global plan
                plan = shard(plan, self.ranks.rank, self.world)
            self.planning_s += time.perf_counter() - start
            yield plan
