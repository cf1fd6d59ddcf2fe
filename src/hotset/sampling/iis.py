"""iCACHE's I/O-oriented importance sampling (IIS, HPCA'23 section III-A).

Before each epoch IIS chooses the subset of samples to train on from their historical
importance, so unselected samples are never fetched. Importance is loss-based (the
paper's choice, its ref. [18]): a sample's latest loss, turned into its percentile
``p`` among the scored samples (never-scored samples count as the most important). A
sample is kept with probability ``p ** keep_exponent``; the kept ones are shuffled.

Warm-up epochs (``warmup_epochs``) and every ``full_every``-th epoch are full passes.
The paper's prototype warms up for 5 epochs and makes every 3rd epoch a full pass
(``warmup_epochs=5, full_every=3``), for runs of a hundred epochs and more; the defaults
here (1 and never) suit the few-epoch runs of ``hotset compare``, where 5 warm-up epochs
would leave IIS no epoch to act in.
The H-list is sized to the cache by default (``h_fraction=None``): the most important
samples whose bytes together fit the cache, as the paper's overhead example reads it (a
cache of 20% of the samples, an H-list of 20%). The cache, which knows its size, draws it
from the percentiles the sampler hands it at each epoch start
(:func:`hotset.policy.icache_lists.h_list_to_fit`; once every sample is scored, with the most
important half in order, whose run that fits is the same H-list without a second sort:
:func:`hotset.policy.icache_lists.h_list_of_ranked`). ``h_fraction=0.7`` is the prototype's
fixed share instead: every sample whose percentile is in the top 70%.

Coverage floor (ours): ``coverage_epochs`` as for every importance sampler
(:mod:`hotset.sampling.coverage`); a due sample IIS did not keep is added to the epoch.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from hotset.errors import ConfigError
from hotset.ids import BLOCK, index_dtype, nonzero_as, stable_order
from hotset.importance import ScoreBoard
from hotset.sampling.base import Sampler, register_sampler
from hotset.sampling.coverage import DEFAULT_COVERAGE_EPOCHS, Coverage
from hotset.sampling.draw import ShuffledAsRead, final

#: losses ranked at a time: the sort keys and the ranks' scatter (``percentiles``)
RANK_BLOCK = 1 << 18
#: the most important 1/RANKED_SHARE of the ids go to the cache in order of importance
#: (``cache_hints``' ``ranked``: its H-list without a sort of its own)
RANKED_SHARE = 2


def place_ranks(rank: np.ndarray, order: np.ndarray) -> None:
    """``rank[order[k]] = k / (n - 1)`` for each place ``k`` of ``order`` (n places),
    block by block, the two halves of the places on two threads where there are many
    (numpy's scatter releases the GIL; 14M places at random: 0.3-0.4 s on one thread,
    0.1 s on two)."""
    n = order.size

    def part(lo: int, hi: int) -> None:
        for start in range(lo, hi, RANK_BLOCK):
            places = np.arange(start, min(hi, start + RANK_BLOCK), dtype=np.float64)
            rank[order[start : start + places.size]] = places / (n - 1)

    cut = (n // (2 * RANK_BLOCK)) * RANK_BLOCK
    if cut < BLOCK:
        part(0, n)
        return
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(part, (0, cut), (cut, n)))


@register_sampler
class IISSampler(Sampler):
    name = "iis"
    order_known_ahead = False
    learns_from_feedback = True

    def __init__(
        self,
        num_samples: int,
        warmup_epochs: int = 1,
        full_every: int = 0,
        keep_exponent: float = 0.33,
        h_fraction: float | None = None,
        coverage_epochs: int | None = DEFAULT_COVERAGE_EPOCHS,
        **kwargs,
    ) -> None:
        super().__init__(num_samples, **kwargs)
        if warmup_epochs < 1:
            raise ConfigError(
                f"warmup_epochs must be >= 1 (nothing is scored before), got {warmup_epochs}"
            )
        if full_every < 0:
            raise ConfigError(f"full_every must be >= 0 (0: never), got {full_every}")
        if keep_exponent < 0:
            raise ConfigError(f"keep_exponent must be >= 0, got {keep_exponent}")
        if h_fraction is not None and not 0.0 <= h_fraction <= 1.0:
            raise ConfigError(
                f"h_fraction must be in [0, 1] or None (the cache's), got {h_fraction}"
            )
        self.warmup_epochs = int(warmup_epochs)
        self.full_every = int(full_every)
        self.keep_exponent = float(keep_exponent)
        self.h_fraction = None if h_fraction is None else float(h_fraction)
        self.coverage = Coverage(num_samples, coverage_epochs)
        self.board = ScoreBoard(num_samples, scores=False)  # scores: the losses
        self._orders: dict[int, np.ndarray] = {}
        self._hints: dict[int, dict] = {}

    def feedback(self, ids: np.ndarray, losses: np.ndarray, embeddings=None) -> None:
        """The losses of a served batch: the samples' new importance values."""
        ids = np.asarray(ids, np.int64)
        losses = np.asarray(losses, np.float64)
        if ids.shape != losses.shape:
            raise ConfigError(f"feedback: {ids.size} ids but {losses.size} losses")
        self.board.update(ids, losses, losses)
        self.coverage.trained(ids, self.epoch)

    def counters(self) -> dict:
        return self.coverage.counters(self.epoch)

    def percentiles(self) -> np.ndarray:
        """Each sample's importance as its loss percentile in [0, 1] (unscored: 1), in
        float32 (4 B per id, kept as the epoch's hint: iCACHE quantises it to 2^-24)."""
        return self._ranked_percentiles()[0]

    def _ranked_percentiles(self) -> tuple[np.ndarray, np.ndarray | None]:
        """``percentiles()``, and where every id is scored, the ids in the order of their
        percentiles (ascending, ties in id order: ``stable_order``'s), else ``None``."""
        seen = self.board.seen
        n = int(seen.sum())
        every = n == self.num_samples
        pct = (np.empty if every and n > 1 else np.ones)(self.num_samples, np.float32)
        if n <= 1:
            return pct, None
        # places in the stable order: a sort, then a scatter (no temporaries of n);
        # every id seen: the ranks go straight into ``pct``
        rank = pct if every else np.empty(n, np.float32)
        order = stable_order(self.board.loss if every else self.board.loss[seen], RANK_BLOCK)
        place_ranks(rank, order)
        if not every:
            pct[seen] = rank
        return pct, order if every else None

    def full_pass(self, epoch: int) -> bool:
        return (
            epoch < self.warmup_epochs
            or not self.board.seen.any()
            or (self.full_every > 0 and epoch % self.full_every == 0)
        )

    def global_order(self, epoch: int) -> np.ndarray:
        return final(self.order_as_read(epoch))

    def order_as_read(self, epoch: int) -> np.ndarray | ShuffledAsRead:
        """The epoch's kept ids, put in their random order as they are read."""
        if epoch not in self._orders:  # decided once per epoch, at its start
            # the order two epochs back goes before this one is drawn (two at most)
            self._orders = {e: o for e, o in self._orders.items() if e >= epoch - 1}
            rng = np.random.default_rng([self.seed, epoch])
            pct, ranked = self._ranked_percentiles()
            due = self.coverage.due(epoch)
            n, dtype = self.num_samples, index_dtype(self.num_samples)  # the order's
            if self.full_pass(epoch):
                selected = np.arange(n, dtype=dtype)
            else:  # block by block: the draws of one call, no temporaries of n
                keep = np.empty(n, bool)
                for lo in range(0, n, BLOCK):
                    hi = min(n, lo + BLOCK)
                    np.less(rng.random(hi - lo, np.float32), pct[lo:hi] ** self.keep_exponent,
                            out=keep[lo:hi])  # fmt: skip
                keep[due] = True
                selected = nonzero_as(keep, dtype)
            if not self.board.seen.any():  # nothing known yet: every sample is an H-sample
                hot = np.ones(self.num_samples, bool)
            elif self.h_fraction is None:
                hot = None  # the cache's size decides
            else:
                hot = pct >= 1.0 - self.h_fraction
            self._orders[epoch] = ShuffledAsRead(selected, rng)  # two kept: 4 B per id each
            self._hints = {
                epoch: {"hot": hot, "importance": pct, "epoch": epoch, "due": due}
            }
            if hot is None and ranked is not None:  # the most important, down
                top = ranked[n - n // RANKED_SHARE :]
                self._hints[epoch]["ranked"] = top[::-1].astype(dtype)
        return self._orders[epoch]

    def cache_hints(self, epoch: int) -> dict:
        """The epoch's H-list or the importances it is drawn from (``hot`` ``None``);
        with the latter, once, ``ranked``: the most important half of the ids in order,
        down (2 B per id, not kept)."""
        self.order_as_read(epoch)
        hints = self._hints.get(epoch, {})
        ranked = hints.pop("ranked", None)
        return hints if ranked is None else {**hints, "ranked": ranked}

    def __len__(self) -> int:
        return self._per_rank(self.order_as_read(self.epoch).size)
