"""The policy base class and registry (one file per policy, as cachetools' caches).

A policy is the control plane's view of the cache: it decides, per sample id, whether an
access hits, whether a missed sample is admitted and which residents are evicted. It
works on integer ids and byte sizes only; it never touches bytes (docs/design.md, "Rules").
The base class runs the miss path (hit -> evict until the miss fits -> put the victims
back or admit) as one loop over a Python list of ids; subclasses supply its steps. That
loop is the whole per-sample cost of the control plane.
"""

from __future__ import annotations

import copy
import threading
from abc import ABC, abstractmethod
from array import array
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol

import numpy as np

from hotset.errors import ConfigError
from hotset.registry import Registry

if TYPE_CHECKING:
    from hotset.importance.scoreboard import ScoreBoard
    from hotset.packages import PlannedLoads
    from hotset.storage.base import Storage
    from hotset.store.base import Store


@dataclass(frozen=True)
class AccessResult:
    """What one batch of accesses did: a hit mask over the ids, and the net admissions and
    evictions the data plane must apply to the store (admit after reading, evict after)."""

    hits: np.ndarray  # bool, one per accessed id
    admitted: np.ndarray  # int64 ids resident after the batch that were put by it
    evicted: np.ndarray  # int64 ids not resident after the batch that must be deleted
    #: substituting policies: the ids served in place of the requested ones (``hits``
    #: then refers to these), and which positions were substituted
    served: np.ndarray | None = None
    substituted: np.ndarray | None = None
    #: ids to read from storage and put although nobody requested them (prefetch)
    fetch: np.ndarray | None = None


class Feeder(Protocol):
    """Fills part of the cache off the batch path (iCACHE's L-cache packages); made by
    :meth:`Policy.make_feeder`, driven by the planner, closed with it."""

    def poll(self) -> PlannedLoads | None:
        """Called after each planned batch (planner lock held): start work if needed, or
        return what that plan is to load (``packages.PlannedLoads``)."""

    def epoch_started(self) -> None:
        """The sampler's hints for a new epoch were applied (e.g. a new H-list)."""

    def counters(self) -> dict:
        """What it did, for the loader's counters."""

    def close(self) -> None:
        """Stop its threads and remove what it created."""


def _read_only_column(sizes: np.ndarray) -> bool:
    """Whether ``sizes`` is a read-only, contiguous int64 column in native byte order (a
    mapped manifest's): shared by a policy rather than copied."""
    return (
        not sizes.flags.writeable
        and sizes.flags.c_contiguous
        and sizes.dtype == np.dtype(np.int64)
        and sizes.ndim == 1
    )


class Policy(ABC):
    """Byte-capacity cache policy over sample ids ``0 .. len(sizes) - 1``.

    Every hook a planner, simulator or service calls is declared here with a working
    default (docs/extending.md). A policy that admits on a miss by evicting victims
    implements the miss path's steps (``_insert``, and as it needs ``_on_hit``,
    ``_victim``, ``_restore``, ``_wants``, ``_prepare``) and the base ``_access`` runs
    them; a vectorised or substituting policy overrides ``access`` instead.
    """

    name: ClassVar[str]
    #: policies that need the planned access sequence (``set_future``) before accesses
    needs_future: ClassVar[bool] = False
    #: policies that read importance scores (``attach_scores`` with a ScoreBoard)
    needs_scores: ClassVar[bool] = False

    def __init__(self, capacity_bytes: int, sizes: np.ndarray | Sequence[int], seed: int = 0):
        """``sizes``: bytes per id, copied; an ``array("q")`` is shared instead (the
        partitions of one cache count the same bytes: 8 B per id once, not per part), and
        so is a read-only int64 column (a manifest's, mapped from its columns file: not
        copied into every process; ``set_sizes`` copies it before it writes)."""
        shared = sizes if isinstance(sizes, array) and sizes.typecode == "q" else None
        sizes = np.asarray(sizes, dtype=np.int64)
        if shared is None and _read_only_column(sizes):
            shared = memoryview(sizes)  # a Python int per read, as from an array
        if sizes.ndim != 1 or sizes.size == 0:
            raise ConfigError("sizes must be a non-empty 1-D array of per-sample byte sizes")
        if (sizes < 0).any():
            raise ConfigError("sizes must be >= 0")
        if int(capacity_bytes) < 0:
            raise ConfigError(f"capacity_bytes must be >= 0, got {capacity_bytes}")
        self.capacity_bytes = int(capacity_bytes)
        self.num_samples = int(sizes.size)
        # 8 bytes per id, each read a Python int (fast in the per-sample loops)
        self._sizes = shared if shared is not None else array("q", sizes.tobytes())
        self.seed = seed
        self.used = 0  # bytes of resident samples, per the manifest sizes
        #: plans in flight that read or write each id: a pinned id is never evicted
        self.pinned = np.full(self.num_samples, 0, np.int32)
        self._holds = np.zeros(1, np.int64)  # pins held now (none: the loop skips checks)
        #: the most ids plans in flight held while another was planned (the planner's
        #: measure: plans times the global batch), for a policy that sizes a region by it
        self.in_flight_ids = 0

    @property
    @abstractmethod
    def _resident(self) -> Container[int]:
        """The resident ids, as a container with fast ``in`` and ``len`` (or a
        ``KeyedHeap``, whose ``live`` levels the miss path reads instead)."""

    def resident_mask(self, ids: np.ndarray) -> np.ndarray:
        """Whether each of ``ids`` is resident."""
        resident = self._resident
        return np.fromiter((i in resident for i in np.asarray(ids).tolist()), bool, len(ids))

    # -- the miss path, once -------------------------------------------------------------
    def _prepare(self, ids: np.ndarray) -> None:  # noqa: B027 - optional hook
        """Per-batch work before the loop (e.g. look up the batch's scores at once)."""

    def _on_hit(self, p: int, i: int) -> bool:
        """Access ``i`` at batch position ``p``: whether it is resident, after any work an
        access does (refresh, count). Not overridden: a plain ``i in _resident``."""
        return i in self._resident

    def _wants(self, p: int, i: int) -> bool:
        """Whether a missed ``i`` that fits the capacity is a candidate for admission."""
        return True

    def _victim(self, p: int, i: int) -> int:
        """Remove and return the next resident to evict for ``i``, or -1: ``i`` is worth
        less than every remaining resident (it is then not admitted). Not overridden:
        nothing is ever evicted (a miss is admitted while it fits)."""
        return -1

    def _insert(self, p: int, i: int) -> None:
        """Make ``i`` resident (its victims, if any, are gone for good)."""
        raise TypeError(f"{type(self).__name__} must implement the miss path or access")

    def _restore(self, victims: list[int]) -> None:  # noqa: B027 - optional hook
        """Put back ``victims`` removed by ``_victim`` for an admission that failed."""

    def _park(self, j: int) -> None:  # noqa: B027 - optional hook
        """``j``, removed by ``_victim``, is pinned: keep it resident and out of the
        victims' order until its pins are released (a heap policy's ``KeyedHeap.hold``).
        Not overridden: it is put back (``_restore``) once the admission is decided."""

    def _access(
        self, ids: list[int], hits: list[bool], admitted: list[int], evicted: list[int]
    ) -> None:
        """Process ``ids`` in order, appending a hit flag per id and the admitted/evicted
        ids: hit, else evict victims until the miss fits, else put them back, else admit.
        Steps a policy does not override cost no call."""
        sizes, cap, used = self._sizes, self.capacity_bytes, self.used
        resident, insert = self._resident, self._insert
        live = getattr(resident, "live", None)  # a KeyedHeap's levels: -1, not a member
        cls, base = type(self), Policy
        on_hit = self._on_hit if cls._on_hit is not base._on_hit else None
        wants = self._wants if cls._wants is not base._wants else None
        victim = self._victim if cls._victim is not base._victim else None
        park = self._park if cls._park is not base._park else None
        pinned = self.pinned if self._holds[0] else None
        for p, i in enumerate(ids):
            if on_hit(p, i) if on_hit else (live[i] >= 0 if live is not None else i in resident):
                hits.append(True)
                continue
            hits.append(False)
            s = sizes[i]
            if s > cap or (wants and not wants(p, i)):
                continue
            if used + s > cap:
                if victim is None:
                    continue  # nothing is ever evicted
                victims, held = [], []
                while used + s > cap:
                    j = victim(p, i)
                    if j < 0:
                        break
                    if pinned is not None and pinned[j]:  # a plan in flight reads/writes it
                        if park is None:
                            held.append(j)
                        else:
                            park(j)
                        continue
                    victims.append(j)
                    used -= sizes[j]
                if held:
                    self._restore(held)
                if used + s > cap:  # the rest is worth more than i: put the victims back
                    if victims:
                        self._restore(victims)
                        used += sum(sizes[j] for j in victims)
                    continue
                evicted.extend(victims)
            insert(p, i)
            used += s
            admitted.append(i)
        self.used = used

    def access(self, ids: np.ndarray | Sequence[int]) -> AccessResult:
        """Access ``ids`` in order; returns hits and the net store changes of the batch."""
        arr = np.asarray(ids, dtype=np.int64)
        self._prepare(arr)
        return self._decide(arr)

    def _decide(self, arr: np.ndarray) -> AccessResult:
        """The batch ``arr`` (prepared) through ``_access``, its lists made arrays (a
        policy that decides a batch in arrays overrides it)."""
        hits: list[bool] = []
        admitted: list[int] = []
        evicted: list[int] = []
        self._access(arr.tolist(), hits, admitted, evicted)
        return self._result(
            np.array(hits, dtype=bool), np.fromiter(dict.fromkeys(admitted), np.int64),
            np.fromiter(dict.fromkeys(evicted), np.int64),
        )  # fmt: skip

    def _result(self, hits: np.ndarray, admitted: np.ndarray, evicted: np.ndarray) -> AccessResult:
        """A batch's result from its hits and the ids it put and removed, each once in the
        order they came: the net changes (put and still resident, removed and not)."""
        return AccessResult(
            hits=hits,
            admitted=admitted[self.resident_mask(admitted)],
            evicted=evicted[~self.resident_mask(evicted)],
        )

    # -- residents ---------------------------------------------------------------------
    def __contains__(self, i: int) -> bool:
        return int(i) in self._resident

    def __len__(self) -> int:
        return len(self._resident)  # type: ignore[arg-type]

    def cached_ids(self) -> np.ndarray:
        return np.fromiter(self._resident, dtype=np.int64)  # type: ignore[arg-type]

    def cached_mask(self, out: np.ndarray) -> np.ndarray:
        """Whether each id is resident, written into ``out`` (bool, one per id)."""
        out[:] = False
        out[self.cached_ids()] = True
        return out

    def size_of(self, i: int) -> int:
        """Bytes of sample ``i`` as the policy counts them."""
        return self._sizes[int(i)]

    # -- optional hooks: working defaults ------------------------------------------------
    def set_sizes(self, ids: np.ndarray, sizes: np.ndarray) -> None:
        """Byte sizes of ids registered after construction (a shared service's policy
        covers ids of datasets that arrive later). A resident's size cannot change."""
        ids, sizes = np.asarray(ids, np.int64), np.asarray(sizes, np.int64)
        if ids.shape != sizes.shape:
            raise ConfigError(f"set_sizes: {ids.size} ids but {sizes.size} sizes")
        column = np.frombuffer(self._sizes, np.int64)  # a view: writes go to ``_sizes``
        changed = np.flatnonzero(column[ids] != sizes)
        if not changed.size:
            return
        if len(self):  # only ids whose size changes are looked up
            bad = changed[np.isin(ids[changed], self.cached_ids())]
            if bad.size:
                i, s = int(ids[bad[0]]), int(sizes[bad[0]])
                raise ConfigError(f"sample {i} is cached with {column[i]} bytes, not {s}")
        if isinstance(self._sizes, memoryview):  # a shared read-only column: own a copy
            self._sizes = self._sizes_copy()
            column = np.frombuffer(self._sizes, np.int64)
        column[ids] = sizes

    def shrink_to(self, capacity_bytes: int) -> list[int]:
        """Set a new capacity, evicting residents (this policy's victims first) until they
        fit; returns the evicted ids. A multi-job service resizes a dataset's share."""
        raise ConfigError(f"policy {self.name!r} cannot be resized")

    def set_future(self, sequence: np.ndarray) -> None:  # noqa: B027 - optional hook
        """Tell the policy the planned accesses from now on (used by offline policies)."""

    def apply_hints(self, hints: dict) -> None:  # noqa: B027 - optional hook
        """What the sampler tells the cache (iCACHE's H-list, SpiderCache's homophily
        candidates and cache ratio); see ``Sampler.cache_hints``."""

    def attach_scores(self, board: ScoreBoard) -> None:  # noqa: B027 - optional hook
        """Read priorities from ``board`` (policies that ``needs_scores``)."""

    def scores_updated(self, ids: np.ndarray) -> None:  # noqa: B027 - optional hook
        """The scores of ``ids`` changed on the attached board: re-key those resident."""

    def add_references(self, ids, delta: int = 1) -> None:  # noqa: B027 - optional hook
        """``delta`` future reads of each of ``ids`` are planned (negative: a job left);
        policies that count them (RefCnt) evict by them."""

    def pin(self, ids, delta: int = 1) -> None:
        """Hold (``delta=1``) or release (``-1``) ids whose planned reads or writes have
        not run: a pinned id is never evicted (nor deleted from the store). Counts plans,
        not repeats within one: a release must name what its hold named."""
        ids = np.asarray(ids, np.int64)
        self.pinned[ids] += int(delta)
        self._holds[0] += int(delta) * ids.size

    def _remove(self, i: int) -> None:
        """Forget resident ``i`` (``discard`` keeps ``used``)."""
        raise TypeError(f"{type(self).__name__} must implement _remove or discard")

    def discard(self, ids) -> list[int]:
        """Forget residents the store does not hold after all (a refused or failed put,
        an entry gone or corrupt); returns those that were resident. Nothing is deleted:
        the store lacks them already."""
        out = []
        for i in np.asarray(ids, np.int64).tolist():
            if i in self:
                self._remove(i)
                self.used -= self._sizes[i]
                out.append(i)
        return out

    def state_dict(self) -> dict:
        """A copy of the policy's residents and their order or keys (not its pins, nor
        an attached score board: the planner attaches its sampler's again)."""
        state = {
            k: v.state_dict() if isinstance(v, Policy) else copy.deepcopy(v)
            for k, v in vars(self).items()
            if k not in ("pinned", "_holds", "board", "_sizes")
        }
        state["_sizes"] = self._sizes_copy()
        return state

    def _sizes_copy(self) -> array:
        """The sizes as an ``array("q")`` of their own (a shared column is copied)."""
        out = array("q")
        out.frombytes(memoryview(self._sizes).cast("B"))
        return out

    def _shares(self, sizes: array) -> bool:
        """Whether the policy reads a shared read-only column holding ``sizes``."""
        return isinstance(self._sizes, memoryview) and np.array_equal(
            np.frombuffer(sizes, np.int64), np.asarray(self._sizes)
        )

    def __getstate__(self) -> dict:
        """Pickled and deep-copied with the sizes as an array (a memoryview pickles not)."""
        state = vars(self).copy()
        if isinstance(self._sizes, memoryview):
            state["_sizes"] = self._sizes_copy()
        return state

    def load_state_dict(self, state: dict) -> None:
        held = state.get("in_flight_ids", 0)  # (a state saved before it has none)
        if isinstance(held, bool) or not isinstance(held, int | np.integer) or held < 0:
            raise ConfigError(f"a saved policy state's in_flight_ids is not a count: {held!r}")
        mine = vars(self)
        for k, v in state.items():
            if k == "_sizes" and self._shares(v):
                continue  # the same sizes: the shared column stays shared
            if isinstance(mine.get(k), Policy):  # a policy inside (Spider's importance)
                mine[k].load_state_dict(v)
            else:
                mine[k] = copy.deepcopy(v)
        self.pinned[:] = 0  # nothing is in flight after a restart
        self._holds[0] = 0

    def offer(self, ids: np.ndarray) -> np.ndarray:
        """Samples a range request read through that no batch asked for
        (``io/readahead.py``): returns those the policy admits (then resident, written by
        the plan as a fetch). A policy that never evicts (the base miss path without a
        ``_victim``: MinIO) takes those that fit its free room, as it takes a miss; the
        others take none, since an admission would displace what their own rule keeps."""
        cls = type(self)
        if not (cls._victim is Policy._victim and cls.access is Policy.access
                and cls._prepare is Policy._prepare):  # fmt: skip
            return np.empty(0, np.int64)
        out = []
        for i in np.asarray(ids, np.int64).tolist():
            s = self._sizes[i]
            if self.used + s > self.capacity_bytes:
                continue
            if i not in self._resident and self._wants(-1, i):
                self._insert(-1, i)
                self.used += s
                out.append(i)
        return np.array(out, np.int64)

    def writing_ids(self) -> np.ndarray:
        """Ids the policy's feeder is putting into the store right now (not yet resident:
        their entries may already be there)."""
        return np.empty(0, np.int64)

    def reconcile(self, stored: np.ndarray, lost: np.ndarray) -> list[int]:
        """What the data plane did with a plan: ``stored`` ids are in the store (its
        admissions and fetches that landed), ``lost`` ids are not although the policy
        counts them resident. Returns the residents forgotten."""
        return self.discard(lost)

    def make_feeder(
        self,
        lock: threading.RLock,
        storage: Storage | None = None,
        store: Store | None = None,
        directory: str | None = None,
        deleting: Callable[[np.ndarray], np.ndarray] | None = None,
        ranks=None,
    ) -> Feeder | None:
        """The feeder that fills part of this cache off the batch path, if any: over
        ``storage`` and ``store`` (with ``lock``, the planner's, held on policy calls),
        or with no bytes at all when they are ``None`` (the simulator). ``deleting``
        (lock held): a mask of the ids that plans in flight delete, which the feeder must
        not put (a plan's worker may delete them after its put). ``ranks``: a
        data-parallel job's (``distributed.RankGroup``): one rank writes to the store and
        every rank commits the same outcome."""
        return None

    def hold_nothing(self) -> None:
        """This policy, of capacity 0, will never hold a sample (the template a
        partitioned cache makes its partitions from): what only residents need is
        dropped (a heap policy's levels, 8 B per id); an admission then fails loudly."""
        if self.capacity_bytes or len(self):
            raise ConfigError(f"policy {self.name!r} holds samples: it cannot hold nothing")

    def new_partition(self, capacity_bytes: int, sizes: np.ndarray) -> Policy:
        """Another policy of this kind for a partition of the same cache (a multi-job
        service's per-dataset share); it shares what the kind keeps cache-wide."""
        part = type(self)(capacity_bytes, sizes, self.seed)
        self.share_pins(part)
        return part

    def share_pins(self, other: Policy) -> None:
        """``other`` (a partition, a cache inside this one) honours this policy's pins."""
        other.pinned, other._holds = self.pinned, self._holds

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(capacity_bytes={self.capacity_bytes}, "
            f"resident={len(self)}, used={self.used})"
        )


POLICIES = Registry("policy")
#: class decorator: make a policy available to :func:`make_policy` by its ``name``
register_policy = POLICIES.register
#: the registered policy class called ``name``
policy_class = POLICIES.lookup


def make_policy(
    name: str,
    capacity_bytes: int,
    sizes: np.ndarray | Sequence[int] | None = None,
    num_samples: int | None = None,
    **options,
) -> Policy:
    """A policy by registry name: ``make_policy("lru", 64 << 20, sizes=manifest.sizes)``
    (per-sample bytes), or ``make_policy("lru", 6000, num_samples=60000)`` for items of
    equal size, when the capacity counts items."""
    cls = policy_class(name)
    if sizes is None:
        if num_samples is None:
            raise ConfigError(f"policy {name!r}: give sizes= (bytes per sample) or num_samples=")
        sizes = np.ones(int(num_samples), np.int64)
    try:
        return cls(capacity_bytes, sizes, **options)
    except TypeError as exc:
        raise ConfigError(f"policy {name!r}: {exc}") from exc
