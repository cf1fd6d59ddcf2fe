"""PlanSource: what a HotsetLoader talks to (the single-job Planner, the service's
RemotePlanner, a planner in a process of its own)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol, runtime_checkable

import numpy as np

from hotset.plan.batch import BatchPlan, PlanReport


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
