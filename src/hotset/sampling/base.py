"""The sampler base class and registry: what a job reads, epoch by epoch.

A sampler follows ``torch.utils.data.DistributedSampler``'s conventions
(``num_replicas``, ``rank``, ``seed``, ``set_epoch``, ``drop_last``) but works on numpy
arrays and knows nothing of torch, so the same object drives the simulator.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import ClassVar

import numpy as np

from hotset.errors import ConfigError
from hotset.importance.scoreboard import ScoreBoard
from hotset.registry import Registry
from hotset.sampling.ahead import OrderAhead
from hotset.sampling.draw import ShuffledAsRead

#: a sampler's attributes that are never state (a thread, reused buffers)
NOT_STATE = ("_ahead", "_buffers")


class Sampler(ABC):
    """Every hook the planner, loader and simulator call is declared here with a working
    default, so a sampler overrides only what it does (see docs/extending.md)."""

    name: ClassVar[str]
    #: whether ``global_order(e)`` is fixed in advance (offline policies need it)
    order_known_ahead: ClassVar[bool] = True
    #: whether the planner reports the cached ids at each epoch start (``set_cached``)
    cache_aware: ClassVar[bool] = False
    #: which tiers' samples it is told are cached, with a disk tier below the RAM tier:
    #: "both" (the disk tier's among the most important, ``importance/tiers.py``) or "ram"
    cache_tiers: str = "ram"
    #: whether the order depends on the losses fed back (the simulator then needs an oracle)
    learns_from_feedback: ClassVar[bool] = False
    #: whether ``feedback`` needs the batch's embeddings (graph importance)
    needs_embeddings: ClassVar[bool] = False
    #: whether the constructor needs ``labels=`` (one per sample; ``make_loader`` gives
    #: the storage's)
    needs_labels: ClassVar[bool] = False
    #: whether it schedules over the whole run and so needs its length (``total_epochs``:
    #: ``make_loader(epochs=N)`` gives it)
    needs_epochs: ClassVar[bool] = False
    #: the per-sample importance scores a score-keyed policy reads (``None``: no scores)
    board: ScoreBoard | None = None
    #: attributes that are not state (threads, locks): left out of ``state_dict``
    transient: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self,
        num_samples: int,
        num_replicas: int = 1,
        rank: int = 0,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        if num_samples <= 0:
            raise ConfigError(f"num_samples must be > 0, got {num_samples}")
        if num_replicas < 1:
            raise ConfigError(f"num_replicas must be >= 1, got {num_replicas}")
        if not 0 <= rank < num_replicas:
            raise ConfigError(f"rank must be in [0, {num_replicas - 1}], got {rank}")
        self.num_samples = int(num_samples)
        self.num_replicas = int(num_replicas)
        self.rank = int(rank)
        self.seed = int(seed)
        self.drop_last = bool(drop_last)
        self.epoch = 0
        self._ahead: OrderAhead | None = None  # an order drawn before its epoch (``prepare``)
        self._buffers: dict[str, np.ndarray] = {}  # arrays of n reused epoch to epoch

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    @abstractmethod
    def global_order(self, epoch: int) -> np.ndarray:
        """The whole epoch's id list (all ranks), identical on every rank."""

    def epoch_order(self, epoch: int | None = None) -> np.ndarray:
        """This rank's ids for ``epoch`` (default: the current one), as DistributedSampler
        shards them: pad by wrapping (or drop the tail), then every ``num_replicas``-th."""
        order = self._order(self.epoch if epoch is None else epoch)
        r = self.num_replicas
        if self.drop_last:
            order = order[: (order.size // r) * r]
        elif order.size % r:
            pad = r - order.size % r
            order = np.concatenate([order, np.resize(order, pad)])
        return order[self.rank :: r]

    def order_as_read(self, epoch: int) -> np.ndarray | ShuffledAsRead:
        """``global_order(epoch)``, or the same order still being shuffled as it is read
        (a planner reads it batch by batch, so the epoch starts without a permutation of
        all its ids); ``global_order`` is then its final form."""
        return self._order(epoch)

    def prepare(self, epoch: int) -> None:
        """Start drawing ``epoch``'s order in a thread where it is fixed in advance
        (``order_known_ahead``; the planner asks in the last quarter of the epoch before):
        that epoch then starts with its order drawn, the same order."""
        if self.order_known_ahead and (self._ahead is None or self._ahead.epoch != epoch):
            self._ahead = OrderAhead(self.global_order, epoch)

    def _order(self, epoch: int) -> np.ndarray:
        """``global_order(epoch)``, taken from ``prepare`` where it was drawn ahead."""
        ahead = self._ahead
        if ahead is None or ahead.epoch != epoch:
            return self.global_order(epoch)
        self._ahead = None
        return ahead.result()

    # -- optional hooks: no-op defaults ---------------------------------------------------
    def feedback(  # noqa: B027 - optional hook
        self, ids: np.ndarray, losses: np.ndarray, embeddings: np.ndarray | None = None
    ) -> None:
        """Per-sample losses (and embeddings, see ``needs_embeddings``) of served ids."""

    def report_accuracy(self, accuracy: float) -> None:  # noqa: B027 - optional hook
        """Validation accuracy after an epoch (SHADE's bias guard, Spider's monitor)."""

    def counters(self) -> dict:
        """Numbers worth reporting beside the loader's (e.g. graph samples scored)."""
        return {}

    def plan_with_ranks(self, rank: int, world: int) -> None:  # noqa: B027 - optional hook
        """This process plans as rank ``rank`` of ``world`` in a data-parallel job (each runs the
        sampler over the global batches): a sampler whose work one rank does for all
        (SpiderCache's graph) does it there and hands it on with ``shared``."""

    def shared(self) -> object:
        """What this rank did for every rank since the last exchange (``None``: nothing);
        it travels in the ranks' exchange to every rank's ``apply_shared``."""
        return None

    def apply_shared(self, items: list) -> np.ndarray:
        """Every rank's ``shared`` from one exchange, in rank order, applied alike on every
        rank; the ids whose scores changed."""
        return np.zeros(0, np.int64)

    def drain(self, timeout: float = 60.0) -> None:  # noqa: B027 - optional hook
        """Wait for background work on fed-back batches (graph scoring) to finish."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Stop background threads."""

    def state_dict(self) -> dict:
        """A copy of everything the sampler learnt and drew (scores, orders, RNG state):
        ``load_state_dict`` on a sampler made with the same arguments continues exactly."""
        self.drain()
        skip = (*self.transient, *NOT_STATE)
        return copy.deepcopy({k: v for k, v in vars(self).items() if k not in skip})

    def load_state_dict(self, state: dict) -> None:
        vars(self).update(copy.deepcopy(state))
        self._ahead, self._buffers = None, {}

    def __getstate__(self) -> dict:
        """Its attributes without an order being drawn ahead (a thread) nor its buffers."""
        return {**vars(self), "_ahead": None, "_buffers": {}}

    def _buffer(self, name: str, dtype: type) -> np.ndarray:
        """An array of ``num_samples`` kept from epoch to epoch (not state): an epoch's
        start writes into pages it touched before (a new array of 100M ids is its page
        faults: seconds on some machines)."""
        buf = self._buffers.get(name)
        if buf is None:
            buf = self._buffers[name] = np.empty(self.num_samples, dtype)
        return buf

    def set_cached(self, ids: np.ndarray) -> None:  # noqa: B027 - optional hook
        """The ids the cache holds at an epoch start (cache-aware samplers use it)."""

    def set_cached_mask(self, mask: np.ndarray) -> None:
        """``set_cached`` as a mask of every id (what the planner hands at an epoch start;
        a sampler that reads a mask overrides this and skips the list of ids)."""
        self.set_cached(np.flatnonzero(mask))

    def cache_hints(self, epoch: int) -> dict:
        """What the cache should know at the start of ``epoch`` (the planner hands it to
        ``Policy.apply_hints``), e.g. iCACHE's H-list."""
        return {}

    def take_hints(self) -> dict:
        """Hints that arrived since the last call (asked before each batch)."""
        return {}

    def __iter__(self) -> Iterator[int]:
        return iter(self.epoch_order().tolist())

    def __len__(self) -> int:
        """Ids per rank per epoch: ``num_samples`` drawn each epoch, sharded."""
        return self._per_rank(self.num_samples)

    def _per_rank(self, n: int) -> int:
        """A rank's share of a global list of ``n`` ids (``epoch_order``'s length)."""
        return n // self.num_replicas if self.drop_last else -(-n // self.num_replicas)


SAMPLERS = Registry("sampler")
#: class decorator: make a sampler available to :func:`make_sampler` by its ``name``
register_sampler = SAMPLERS.register
#: the registered sampler class called ``name``
sampler_class = SAMPLERS.lookup


def make_sampler(name: str, num_samples: int, **options) -> Sampler:
    """A sampler by registry name, e.g. ``make_sampler("uniform", 60000, seed=1)``."""
    cls = sampler_class(name)
    try:
        return cls(num_samples, **options)
    except TypeError as exc:
        raise ConfigError(f"sampler {name!r}: {exc}") from exc
