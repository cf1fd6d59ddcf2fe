"""BatchPlan: what a worker does for one batch, a rank's shard of it, and its report back."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import numpy as np

from hotset.distributed import owners

#: no ids (read-only: shared by every plan that has none)
EMPTY = np.empty(0, np.int64)
EMPTY.flags.writeable = False


def _empty() -> np.ndarray:
    return EMPTY


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


def plan_fields(plan: BatchPlan) -> dict:
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
        loads=plan.loads if lead else EMPTY,
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
