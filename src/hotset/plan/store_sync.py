"""The plan and the store agree at each epoch boundary (no plan in flight).

Rank 0 (or the one job) lists the store; every rank forgets the residents it lacks; the
lister deletes the entries the plan does not hold (left by an earlier job, or by a plan
abandoned mid-flight). After a state is loaded, the residents the store lacks are first
read back from the source (``refill``).
"""

from __future__ import annotations

import contextlib
import logging
import threading

import numpy as np

from hotset.distributed import RankGroup
from hotset.errors import HotsetError
from hotset.plan.batch import EMPTY, BatchPlan
from hotset.policy.base import Policy

log = logging.getLogger(__name__)

#: residents read back from the source a call, after a state is loaded on a cold store
REFILL_BATCH = 256


class StoreSync:
    """Reconciles ``policy`` (guarded by ``lock``) with a dataset's store."""

    def __init__(self, policy: Policy, lock: threading.RLock, ranks: RankGroup | None) -> None:
        self.policy, self.lock, self.ranks = policy, lock, ranks

    def reconcile(self, dataset, replay: list[BatchPlan], refill: bool) -> tuple[bool, int, int]:
        """Reconcile with what ``dataset``'s store holds (every rank at once): the
        residents it lacks are forgotten, its entries the plan does not hold deleted,
        leaving alone what the plans a loaded state serves again (``replay``) write.
        ``refill``: a state was loaded, its residents the store lacks are read back first.
        All under the lock: a package the feeder loads meanwhile would be in the policy
        but not in the listing. Returns whether the store could be listed, the
        disagreements fixed and the residents read back."""
        lister = self.ranks is None or self.ranks.rank == 0
        again = np.concatenate([EMPTY, *(a for p in replay for a in (p.admitted, p.fetch,
                                                                      p.loads))])  # fmt: skip
        with self.lock:
            held, refilled = None, 0
            if lister:
                try:
                    held = dataset.ids_of(dataset.store.list_keys())
                except HotsetError as exc:
                    log.debug("cannot reconcile with the store: %s", exc)
            if lister and held is not None and refill:
                held, refilled = self._refill(dataset, held, again)
            if self.ranks is not None:
                held = self.ranks.broadcast(held, call="the store's listing")
            if held is None:
                return False, 0, refilled
            extra, fixes = self._agree(held, again)
            if lister and extra.size:
                log.info("deleting %d store entries the plan does not hold", extra.size)
                dataset.store.delete_many([dataset.keys[i] for i in extra.tolist()])
            return True, fixes, refilled

    def _agree(self, held: np.ndarray, again: np.ndarray) -> tuple[np.ndarray, int]:
        """Forget the residents the store lacks (but ``again``, which the plans served
        again write: a killed job's workers may have put them, or not), and return the
        store's entries the policy does not hold, for the lister to delete, and how many
        disagreements there were."""
        cached = self.policy.cached_ids()
        writing = self.policy.writing_ids()  # the feeder's loads in flight: theirs
        forgotten = self.policy.discard(np.setdiff1d(np.setdiff1d(cached, held), again))
        extra = np.setdiff1d(np.setdiff1d(held, cached), writing)
        return extra, len(forgotten) + extra.size

    def _refill(self, dataset, held: np.ndarray, again: np.ndarray) -> tuple[np.ndarray, int]:
        """After a state is loaded, the residents its policy holds that the store lacks
        (the killed job's cache was its own, or lost some) are read from the source and
        put back, so that the plans, which depend on what is cached (SHADE's sampler
        draws its cached important samples again), are the uninterrupted run's: the same
        samples. Those that cannot be read or put are forgotten as before. Returns what
        the store holds now and how many were put back."""
        missing = np.setdiff1d(np.setdiff1d(self.policy.cached_ids(), held), again)
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
        return np.unique(np.concatenate(back)), sum(b.size for b in back[1:])
