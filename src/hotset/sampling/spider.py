"""SpiderCache's sampler (ICPP'25 sections 4.1, 4.3, 5): importance sampling on graph
importance scores, computed off the training step.

Epoch 0 is a uniform permutation; each later epoch draws ``num_samples`` ids with
replacement, proportionally to the scores (``torch.multinomial`` in the paper; the same
distribution with numpy here). ``feedback(ids, losses, embeddings)`` only queues the
batch: a background worker scores it on the HNSW graph (section 5's pipelining), so the
training step does not wait while the worker keeps up. When it falls behind by
``max_pending`` batches, ``feedback`` waits for room (``when_behind="wait"``, the default:
every batch is scored, the wait counted in ``graph_wait_s``); ``when_behind="drop"``
(ours) drops the oldest instead (counted in ``graph_dropped``: a sample keeps its last
score). The worker queries hnswlib with ``threads`` threads (default: three quarters of
the cores, ``graph_threads``). ``background=False`` scores inline (the simulator, for a
deterministic replay). ``dim`` (ours) stores compressed vectors in the graph: 64 keeps a
graph rank of 14M samples of 512-d within 7.4 GB (:mod:`hotset.importance.graph`); a
graph the machine's memory cannot hold is refused at the first feedback, naming ``dim``.

Under ranks (hotset's: the paper trains in one process) one rank keeps the graph,
``graph_rank``: it scores every rank's batches (their embeddings come with the ranks'
exchange of feedback) and hands the scores on in the next exchange, where every rank,
itself included, applies them alike (``shared``, ``apply_shared``). The other ranks
build no HNSW index and score nothing (at 1.28M ids of 512-d, about 2.6 GB and 40-50 µs a
sample that each rank paid before).

The sampler also runs the elastic cache manager (section 4.3) once per batch (Algorithm 1
line 23: the ratio of Eq. 8 at the batch's training time, in epochs; the scores' spread
for Eq. 5 observed once per epoch) and hands the cache, as hints, the Importance Cache
ratio and each batch's highest-degree node with its neighbours (the Homophily Cache
candidates).

Coverage floor (ours): ``coverage_epochs`` as for every importance sampler
(:mod:`hotset.sampling.coverage`).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import threading
import time
from collections import deque

import numpy as np

from hotset.errors import ConfigError, RankError
from hotset.ids import ids_within, index_dtype
from hotset.importance import ScoreBoard
from hotset.importance.elastic import RatioController
from hotset.importance.graph import GraphImportance
from hotset.sampling import draw_kernel
from hotset.sampling.base import Sampler, register_sampler
from hotset.sampling.coverage import DEFAULT_COVERAGE_EPOCHS, Coverage
from hotset.sampling.draw import ShuffledAsRead, draw_weighted, final

log = logging.getLogger(__name__)
WAIT_LIMIT_S = 60.0  # then the oldest batch is dropped (counted) rather than wait on


def graph_threads() -> int:
    """hnswlib's threads for a batch's queries: three quarters of the cores (at least
    one). They run at the worker's niceness (19: training threads come first); on a GPU
    machine of 16 cores, 4 threads made the step wait 5 s per epoch for the graph and 12
    none (docs/benchmarks.md, "On a GPU")."""
    return max(1, 3 * (os.cpu_count() or 1) // 4)


@register_sampler
class SpiderSampler(Sampler):
    name = "spider"
    order_known_ahead = False
    learns_from_feedback = True
    needs_embeddings = True
    needs_labels = True
    needs_epochs = True  # the elastic controller's horizon (Eq. 5-8)
    transient = ("_lock", "_cv", "_pending", "_busy", "_worker", "_stop", "_role")

    def __init__(
        self,
        num_samples: int,
        labels=None,
        lam: float = 1.0,
        alpha: float = 0.9,
        k: int | None = None,
        neighbor_max: int = 500,
        homophily_k: int = 500,
        M: int = 8,
        ef_construction: int = 100,
        background: bool = True,
        max_pending: int = 8,
        when_behind: str = "wait",
        threads: int | None = None,
        total_epochs: float = 10,
        r_start: float = 0.9,
        r_end: float = 0.8,
        gamma: float = 0.01,
        window: int = 5,
        calibrate: bool = False,
        edge_quantile: float = 0.5,
        normalize: bool = True,
        dim: int | None = None,
        coverage_epochs: int | None = DEFAULT_COVERAGE_EPOCHS,
        graph_rank: int = 0,
        **kwargs,
    ) -> None:
        super().__init__(num_samples, **kwargs)
        if graph_rank < 0:
            raise ConfigError(f"graph_rank must be a rank (>= 0), got {graph_rank}")
        if when_behind not in ("wait", "drop"):
            raise ConfigError(f"when_behind must be 'wait' or 'drop', got {when_behind!r}")
        if max_pending < 1:
            raise ConfigError(f"max_pending must be >= 1, got {max_pending}")
        if labels is None or len(labels) != num_samples:
            raise ConfigError(f"sampler 'spider' needs labels= for its {num_samples} samples")
        self.graph = GraphImportance(
            labels, lam=lam, alpha=alpha, k=k, neighbor_max=neighbor_max,
            homophily_k=homophily_k, M=M,
            ef_construction=ef_construction, seed=self.seed, calibrate=calibrate,
            threads=graph_threads() if threads is None else threads,
            edge_quantile=edge_quantile, normalize=normalize, dim=dim,
        )  # fmt: skip
        self.coverage = Coverage(num_samples, coverage_epochs)
        self.when_behind = when_behind
        self.controller = RatioController(total_epochs, r_start, r_end, gamma, window)
        self.board = ScoreBoard(num_samples)
        self.prior: float | None = None
        self.background = bool(background)
        self.max_pending = int(max_pending)
        self.scored = 0  # samples scored
        self.dropped = 0  # samples whose batch was dropped unscored
        self.failed = 0  # samples whose batch the graph could not score (they keep a score)
        self.graph_s = 0.0  # seconds the worker spent scoring
        self.wait_s = 0.0  # seconds feedback waited for the worker (when_behind="wait")
        self._fed = 0  # samples fed back this epoch (the batch's training time, Eq. 8)
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        self._pending: deque[tuple[np.ndarray, np.ndarray]] = deque()
        self._busy = False
        self._homophily: list[tuple[int, np.ndarray]] = []
        self._orders: dict[int, np.ndarray] = {}
        self._ratio: dict[int, float] = {}  # the epoch started, and its ratio then
        self._imp_ratio = r_start  # the latest ratio handed to the cache
        self._worker: threading.Thread | None = None
        self._stop = False
        self.graph_rank = int(graph_rank)
        self._role: str | None = None  # under ranks: "graph" (scores for all) or "peer"
        # the graph rank's scores, not yet exchanged (saved: handed on after a restore)
        self._outbox: list[tuple] = []
        draw_kernel.load()  # (compiled here, not at an epoch start)

    def plan_with_ranks(self, rank: int, world: int) -> None:
        if self.graph_rank >= world:
            raise ConfigError(
                f"sampler 'spider': graph_rank={self.graph_rank} is not one of the {world} ranks"
            )
        self._role = "graph" if rank == self.graph_rank else "peer"

    # -- feedback --------------------------------------------------------------------
    def feedback(self, ids: np.ndarray, losses: np.ndarray, embeddings=None) -> None:
        if embeddings is None:
            raise ConfigError(
                "sampler 'spider' scores samples from embeddings: call "
                "loader.feedback(ids, losses, embeddings=...) with the feature-layer output"
            )
        ids = np.asarray(ids, np.int64)
        shape = np.shape(embeddings)
        if len(shape) != 2 or shape[0] != ids.size:
            raise ConfigError(f"feedback: {ids.size} ids but embeddings of shape {shape}")
        self.coverage.trained(ids, self.epoch)
        self._fed += ids.size
        if self._role == "peer":  # the graph rank scores them, for every rank
            return
        if self.graph.index is None and self.graph.projection is None:
            self.graph.check_fits(shape[1])  # before the first batch: a clear error
        emb = np.array(embeddings, dtype=np.float32)  # a copy: the caller's may change
        if not self.background:
            self._score(ids, emb)
            return
        with self._cv:
            if self._worker is None:
                self._worker = threading.Thread(target=self._work, name="hotset-graph", daemon=True)
                self._worker.start()
            if self.when_behind == "wait" and len(self._pending) >= self.max_pending:
                start = time.perf_counter()
                self._cv.wait_for(  # bounded: a worker that stopped must not hang training
                    lambda: len(self._pending) < self.max_pending or self._stop, WAIT_LIMIT_S
                )
                self.wait_s += time.perf_counter() - start
            self._pending.append((ids, emb))
            while len(self._pending) > self.max_pending:
                self.dropped += self._pending.popleft()[0].size
            self._cv.notify_all()

    def _score(self, ids: np.ndarray, emb: np.ndarray) -> None:
        start = time.perf_counter()
        result = self.graph.score_batch(ids, emb)
        with self._lock:
            self.graph_s += time.perf_counter() - start
            if self._role == "graph":  # every rank applies it when it is exchanged
                self._outbox.append(result)
                return
        self._apply(result)

    def _apply(self, result: tuple) -> None:
        """A batch's scores (``GraphImportance.score_batch``'s) on the board; the first
        batch's median is the prior of the ids not scored yet."""
        uids, scores, node, neighbours = result
        with self._lock:
            self.board.update(uids, scores, scores)
            if self.prior is None:
                self.prior = float(np.median(scores))
                self.board.fill_unseen(self.prior)
            if neighbours.size:
                self._homophily.append((node, neighbours))
            self.scored += uids.size

    def shared(self) -> list[tuple] | None:
        """The graph rank's scores since the last exchange (``None`` on the others)."""
        with self._lock:
            out, self._outbox = self._outbox, []
        return out or None

    def apply_shared(self, items: list) -> np.ndarray:
        """The graph rank's scores (checked: ids of this dataset, a finite score each, a
        neighbour list of ids) applied in the order they were scored."""
        results = [result for got in items for result in got or ()]
        if not all(self._of_this_dataset(result) for result in results):
            raise RankError("sampler 'spider': the graph rank's scores are not scores of this "
                            f"dataset's {self.num_samples} ids")  # fmt: skip
        for result in results:
            self._apply(result)
        return np.concatenate([r[0] for r in results]) if results else np.zeros(0, np.int64)

    def _of_this_dataset(self, result) -> bool:
        """Whether ``result`` is ``GraphImportance.score_batch``'s for this dataset."""
        n = self.num_samples
        try:
            uids, scores, node, neighbours = result
            return (uids.ndim == neighbours.ndim == 1 and scores.shape == uids.shape
                    and bool(np.isfinite(scores).all()) and 0 <= int(node) < n
                    and ids_within(uids, n) and ids_within(neighbours, n))  # fmt: skip
        except (TypeError, ValueError, AttributeError):
            return False

    def _work(self) -> None:
        # a background job: the training threads come first (Linux thread niceness)
        with contextlib.suppress(AttributeError, OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        while True:
            with self._cv:
                while not self._pending and not self._stop:
                    self._cv.wait()
                if self._stop:
                    return
                ids, emb = self._pending.popleft()
                self._busy = True
            try:
                self._score(ids, emb)
            except Exception as exc:  # noqa: BLE001 - scoring must not stop training
                with self._lock:  # counted, and the batch keeps its scores (or the prior)
                    self.failed += ids.size
                log.warning("graph importance failed for %d samples: %s", ids.size, exc)
            finally:
                with self._cv:
                    self._busy = False
                    self._cv.notify_all()

    def drain(self, timeout: float = 60.0) -> None:
        """Wait until the worker has scored every queued batch."""
        with self._cv:
            self._cv.wait_for(lambda: not self._pending and not self._busy, timeout)

    def counters(self) -> dict:
        """How far the graph worker kept up (samples scored, dropped unscored, failed) and
        what the graph looks like: edges per scored sample, the spread of the scores, the
        calibrated distance unit, queries hnswlib refused at first, compressed vectors'
        directions fitted again (``dim``)."""
        with self._lock:
            seen = self.board.score[self.board.seen]
            return {
                "graph_scored": self.scored, "graph_dropped": self.dropped,
                "graph_failed": self.failed, "graph_edges": self.graph.edges,
                "graph_mean_degree": self.graph.edges / max(1, self.scored),
                "graph_score_std": float(seen.std()) if seen.size else 0.0,
                "graph_score_range": float(np.ptp(seen)) if seen.size else 0.0,
                "graph_scale": self.graph.scale, "graph_retries": self.graph.retries,
                "graph_refits": self.graph.refits,
                "graph_wait_s": self.wait_s, "imp_ratio": self._imp_ratio,
                **self.coverage.counters(self.epoch),
            }  # fmt: skip

    def close(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if self._worker is not None:
            self._worker.join(timeout=10)
            self._worker = None
        self._stop = False

    def load_state_dict(self, state: dict) -> None:
        """As the base's; a rank that keeps no graph (``plan_with_ranks``) takes neither
        the graph nor the scores to hand on from a state saved where they were kept."""
        if self._role == "peer":
            state = {**state, "_outbox": []}
            graph = state.get("graph")
            if getattr(graph, "index", None) is not None:
                state["graph"] = graph = copy.copy(graph)
                graph.index, graph.indexed = None, np.zeros_like(graph.indexed)
        super().load_state_dict(state)

    def report_accuracy(self, accuracy: float) -> None:
        """Validation accuracy after an epoch (the accuracy monitor, Eq. 6)."""
        self.controller.observe_accuracy(accuracy)

    # -- hints to the cache ------------------------------------------------------------
    def cache_hints(self, epoch: int) -> dict:
        if epoch not in self._ratio:
            self.graph.recalibrate()  # this epoch's distance unit: last epoch's neighbours
            with self._lock:
                seen = self.board.seen
                if seen.any():  # the importance monitor, once per epoch (Eq. 5)
                    self.controller.observe_scores(self.board.score[seen])
            self._ratio = {epoch: self.controller.ratio(epoch)}
            self._fed = 0
            self._imp_ratio = self._ratio[epoch]
        return {"imp_ratio": self._ratio[epoch], "due": self.coverage.due(epoch)}

    def take_hints(self) -> dict:
        """Before each batch: the homophily candidates found since the last batch, and
        the Importance Cache's ratio at this batch's training time (line 23)."""
        with self._lock:
            found, self._homophily = self._homophily, []
        hints: dict = {"homophily": found} if found else {}
        if self._ratio:
            (epoch,) = self._ratio
            ratio = self.controller.ratio(epoch + min(1.0, self._fed / self.num_samples))
            if ratio != self._imp_ratio:
                hints["imp_ratio"] = self._imp_ratio = ratio
        return hints

    # -- sampling ----------------------------------------------------------------------
    def weights(self) -> np.ndarray:
        """Each id's sampling weight, proportional to its probability: its score (at
        least 1e-12), a new array (the draw keeps its cumulative sums in it)."""
        with self._lock:
            return np.maximum(self.board.score, 1e-12)

    def probabilities(self) -> np.ndarray:
        w = self.weights()
        return w / w.sum()

    def global_order(self, epoch: int) -> np.ndarray:
        return final(self.order_as_read(epoch))

    def order_as_read(self, epoch: int) -> np.ndarray | ShuffledAsRead:
        """The epoch's ids, drawn once and put in their random order as they are read."""
        if epoch not in self._orders:
            # the order two epochs back goes before this one is drawn (two at most)
            self._orders = {e: o for e, o in self._orders.items() if e >= epoch - 1}
            rng = np.random.default_rng([self.seed, epoch])
            n = self.num_samples
            if epoch == 0 or self.prior is None:
                order = np.arange(n, dtype=index_dtype(n))
            else:
                order = draw_weighted(rng, self.weights(), n, overwrite=True, shuffle=False)
                order = self.coverage.ensure(order, epoch, rng)
            self._orders[epoch] = ShuffledAsRead(order, rng)
        return self._orders[epoch]
