"""SHADE's Priority-based Adaptive Data Sampling (PADS, FAST'23 section 4.2.1).

Epoch 0 is a uniform permutation (nothing is scored yet). Each later epoch draws its
``num_samples`` ids from the multinomial distribution of the importance scores, *with*
replacement, with the weight of every sample the cache holds multiplied by
``repetition`` (SHADE's cache-aware repetition of samples that are important and cached:
the planner reports the cached ids at each epoch start); the list is then sharded across
ranks like DistributedSampler. ``repetition_mode="repeat"`` does it as SHADE's prototype
does instead: the ids are drawn by score alone, each drawn id the cache holds appears
``repetition`` times, and the misses fill what is left of ``num_samples`` (the cut falls
on the misses only), so a cached share ``c`` of the draw becomes ``min(1, r c)`` of the
epoch: 0.60 at a 20% cache where weighting gives ``c r / (c r + 1 - c)`` = 0.43.

``order="hits_first"`` (the default, as the prototype serves them) puts the drawn ids the
cache holds before the others, each part in a random order; ``order="shuffled"`` (ours,
not the paper's) shuffles the whole list. Either is shuffled as the planner reads it
(:class:`~hotset.sampling.draw.ShuffledAsRead`), not at the epoch's start.

With a disk tier below the RAM tier (``make_loader(disk_dir=...)``, ours), the cache the
repetition favours is both tiers' (``cache_tiers="both"``, the default): the RAM tier's
residents and the disk tier's among the most important that both budgets fit
(:mod:`hotset.importance.tiers`); ``cache_tiers="ram"`` repeats the RAM tier's only.

Coverage floor (ours: no paper guarantees it): with ``coverage_epochs=K`` every sample is
trained at least once every ``K`` epochs (:mod:`hotset.sampling.coverage`).

Bias guard: when the epoch mean training loss fell by more than ``steep_drop`` (a
fraction) from one epoch to the next, or the validation accuracy reported with
``report_accuracy`` gained less than ``stagnation`` over the last ``patience`` epochs,
the next epoch is a plain uniform shuffle, mixing the important samples back in
(``guard_epochs`` lists those epochs).
"""

from __future__ import annotations

from functools import partial

import numpy as np

from hotset.errors import ConfigError
from hotset.ids import as_ids, index_dtype
from hotset.importance import SCORERS, ScoreBoard
from hotset.sampling import draw_kernel
from hotset.sampling.ahead import OrderAhead
from hotset.sampling.base import Sampler, register_sampler
from hotset.sampling.coverage import DEFAULT_COVERAGE_EPOCHS, Coverage
from hotset.sampling.draw import ShuffledAsRead, draw_weighted, final

ORDERS = ("hits_first", "shuffled")
CACHE_TIERS = ("both", "ram")


def repeat_into(out: np.ndarray, ids: np.ndarray, whole: int, extra: int) -> int:
    """``np.concatenate([np.repeat(ids, whole), ids[:extra]])`` written at the start of
    ``out`` as far as it fits, without the two arrays between; returns how far."""
    m = min(whole * ids.size, out.size)
    k = m // whole  # ids repeated whole, then one repeated in part where cut
    out[: k * whole].reshape(k, whole)[:] = ids[:k, None]
    out[k * whole : m] = ids[k : k + 1]
    e = min(extra, out.size - m)
    out[m : m + e] = ids[:e]
    return m + e


@register_sampler
class PADSSampler(Sampler):
    name = "shade"
    order_known_ahead = False
    cache_aware = True
    learns_from_feedback = True
    transient = ("_score",)  # from the arguments, not learnt

    def __init__(
        self,
        num_samples: int,
        importance: str = "rank",
        b0: float = 10.0,
        repetition: float = 3.0,
        repetition_mode: str = "weight",
        steep_drop: float = 0.5,
        stagnation: float = 0.001,
        patience: int = 3,
        order: str = "hits_first",
        coverage_epochs: int | None = DEFAULT_COVERAGE_EPOCHS,
        cache_tiers: str = "both",
        importance_options: dict | None = None,
        **kwargs,
    ) -> None:
        super().__init__(num_samples, **kwargs)
        if cache_tiers not in CACHE_TIERS:
            raise ConfigError(f"cache_tiers must be one of {CACHE_TIERS}, got {cache_tiers!r}")
        self.cache_tiers = cache_tiers
        if order not in ORDERS:
            raise ConfigError(f"order must be one of {ORDERS}, got {order!r}")
        self.order = order
        self.coverage = Coverage(num_samples, coverage_epochs)
        if importance not in SCORERS:
            raise ConfigError(f"importance must be one of {sorted(SCORERS)}, got {importance!r}")
        if repetition < 1.0:
            raise ConfigError(f"repetition must be >= 1, got {repetition}")
        if repetition_mode not in ("weight", "repeat"):
            raise ConfigError(f"repetition_mode must be weight or repeat, got {repetition_mode!r}")
        self.repetition_mode = repetition_mode
        self.importance = importance
        self.b0 = float(b0)
        options = {"b0": self.b0} if importance == "rank" else {}  # (b0: the rank's)
        self.importance_options = {**options, **(importance_options or {})}
        self._score = partial(SCORERS[importance], **self.importance_options)
        try:  # (its options checked now, not at the first feedback)
            self._score(np.zeros(2, np.int64), np.zeros(2), ScoreBoard(2))
        except TypeError as exc:
            raise ConfigError(f"importance {importance!r}, options "
                              f"{self.importance_options}: {exc}") from exc  # fmt: skip
        self.repetition = float(repetition)
        self.steep_drop = float(steep_drop)
        self.stagnation = float(stagnation)
        self.patience = int(patience)
        self.board = ScoreBoard(num_samples)
        self.prior: float | None = None  # weight of never-scored samples
        self.guard_epochs: list[int] = []
        self._cached = np.full(num_samples, False)
        self._loss_sum: dict[int, float] = {}
        self._loss_n: dict[int, int] = {}
        self._accuracy: list[float] = []
        self._orders: dict[int, np.ndarray] = {}
        draw_kernel.load()  # (compiled here, not at an epoch start)

    # -- feedback ------------------------------------------------------------------------
    def feedback(self, ids: np.ndarray, losses: np.ndarray, embeddings=None) -> np.ndarray:
        """Score one minibatch (ids as served, their per-sample losses); returns the scores."""
        ids = np.asarray(ids, np.int64)
        losses = np.asarray(losses, np.float64)
        if ids.shape != losses.shape:
            raise ConfigError(f"feedback: {ids.size} ids but {losses.size} losses")
        scores = np.asarray(self._score(ids, losses, self.board), np.float64)
        self.board.update(ids, scores, losses)
        if self.prior is None and ids.size:  # a median rank / the first batch's mean loss
            self.prior = float(np.median(scores))
            self.board.fill_unseen(self.prior)
        self.coverage.trained(ids, self.epoch)
        self._loss_sum[self.epoch] = self._loss_sum.get(self.epoch, 0.0) + float(losses.sum())
        self._loss_n[self.epoch] = self._loss_n.get(self.epoch, 0) + int(losses.size)
        return scores

    def report_accuracy(self, accuracy: float) -> None:
        """Validation accuracy after an epoch (feeds the bias guard)."""
        self._accuracy.append(float(accuracy))

    def counters(self) -> dict:
        return {"bias_guard_epochs": list(self.guard_epochs), **self.coverage.counters(self.epoch)}

    def set_cached(self, ids: np.ndarray) -> None:
        self._cached[:] = False
        self._cached[as_ids(ids)] = True

    def set_cached_mask(self, mask: np.ndarray) -> None:
        np.copyto(self._cached, mask)

    # -- sampling ------------------------------------------------------------------------
    def weights(self, out: np.ndarray | None = None) -> np.ndarray:
        """Each id's sampling weight for the next draw (proportional to its probability),
        in ``out`` where given."""
        w = np.maximum(self.board.score, 1e-12, out=out)  # never-scored: the prior
        if self.repetition_mode == "weight":
            w[np.flatnonzero(self._cached)] *= self.repetition  # (a mask: 3x the time)
        return w

    def probabilities(self) -> np.ndarray:
        """Sampling probability of each id for the next draw."""
        w = self.weights()
        return w / w.sum()

    def _draw(
        self, rng: np.random.Generator, in_thread: bool
    ) -> tuple[np.ndarray, int, OrderAhead | None]:
        """The epoch's draw of ``num_samples`` ids, its hits (the drawn ids the cache
        holds, repeated in ``repeat`` mode) before its misses, made part by part: the
        number of hits is Binomial(n, P(cached)) and each part is an i.i.d. draw from the
        weights restricted to it -- the distribution of one draw partitioned afterwards,
        without a look-up of every drawn id, and only as many misses drawn as the epoch
        keeps. Each part is left unshuffled (``ShuffledAsRead`` shuffles it as it is
        read); returns the ids, where the hits end, and (``in_thread``) the thread still
        drawing the misses, which are read after the hits (the same draws: the misses'
        generators are spawned from ``rng``, whose reads do not spawn)."""
        w = self._buffer("weights", np.float64)  # (becomes the misses' weights)
        r = self.repetition if self.repetition_mode == "weight" else 1.0
        held, w_held = draw_kernel.split_weights(
            self.board.score, self._cached, r, w, index_dtype(self.num_samples)
        )
        w_hit, w_miss = float(w_held.sum()), float(w.sum())
        n = self.num_samples
        h = n if w_miss <= 0.0 else int(rng.binomial(n, w_hit / (w_hit + w_miss)))
        hits = held[draw_weighted(rng, w_held, h, overwrite=True, shuffle=False)]
        order = np.empty(n, index_dtype(n))  # the hits, then the misses drawn after them
        if self.repetition_mode == "repeat":
            whole = int(self.repetition)  # r copies of each hit; a fractional r: some once more
            extra = int((self.repetition - whole) * hits.size)
            if extra or whole * hits.size > n:  # random hits get the extra copy, or are cut
                rng.shuffle(hits)
            h = repeat_into(order, hits, whole, extra)
        else:
            order[:h] = hits

        def misses(_epoch: int) -> np.ndarray:
            return draw_weighted(rng, w, n - h, out=order[h:], overwrite=True, shuffle=False)

        if in_thread:
            return order, h, OrderAhead(misses, self.epoch)
        misses(self.epoch)
        return order, h, None

    def _guard(self, epoch: int) -> bool:
        means = [
            self._loss_sum[e] / self._loss_n[e]
            for e in (epoch - 2, epoch - 1)
            if self._loss_n.get(e)
        ]
        if len(means) == 2 and means[0] > 0 and (means[0] - means[1]) / means[0] > self.steep_drop:
            return True
        acc, k = self._accuracy, self.patience
        return len(acc) > k and max(acc[-k:]) - acc[-k - 1] < self.stagnation

    def global_order(self, epoch: int) -> np.ndarray:
        return final(self.order_as_read(epoch))

    def order_as_read(self, epoch: int) -> np.ndarray | ShuffledAsRead:
        """The epoch's ids, drawn once (every caller sees one list) and put in their
        random order as they are read: a uniform permutation of all ids, or the draw,
        its hits before its misses (``hits_first``, each part shuffled) or not."""
        if epoch not in self._orders:
            for drawn in self._orders.values():  # (a thread may still draw from the buffer)
                drawn.drawn()
            # the order two epochs back goes before this one is drawn (two at most)
            self._orders = {e: o for e, o in self._orders.items() if e >= epoch - 1}
            rng = np.random.default_rng([self.seed, epoch])
            dtype, ends, filling = index_dtype(self.num_samples), None, None
            if self.prior is None:
                order = np.arange(self.num_samples, dtype=dtype)
            elif self._guard(epoch):
                self.guard_epochs.append(epoch)
                order = np.arange(self.num_samples, dtype=dtype)
            else:
                # the misses drawn in a thread while the hits are read (not where the
                # floor needs the whole draw at once, nor one part shuffled whole)
                later = self.order == "hits_first" and self.coverage.epochs is None
                order, hits, filling = self._draw(rng, later)
                order = self.coverage.ensure(order, epoch, rng)
                ends = [hits] if self.order == "hits_first" else None
            self._orders[epoch] = ShuffledAsRead(order, rng, ends, filling=filling,
                                                 fill_from=ends[0] if filling else 0)  # fmt: skip
        return self._orders[epoch]
