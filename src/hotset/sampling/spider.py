"""SpiderCache's sampler (ICPP'25 sections 4.1, 4.3, 5): importance sampling on graph
importance scores, computed off the training step.

Epoch 0 is a uniform permutation; each later epoch draws ``num_samples`` ids with
replacement, proportionally to the scores (``torch.multinomial`` in the paper; the same
distribution with numpy here). ``feedback(ids, losses, embeddings)`` only queues the
batch: a background worker scores it on the HNSW graph (section 5's pipelining), so the
training step does not wait. When the worker falls behind by more than ``max_pending``
batches the oldest are dropped (counted in ``dropped``): a sample then keeps its last
score, which the paper argues costs nothing. ``background=False`` scores inline
(the simulator, for a deterministic replay).

The sampler also runs the elastic cache manager (section 4.3) and hands the cache, as
hints, the Importance Cache ratio at each epoch start and each batch's highest-degree
node with its neighbours (the Homophily Cache candidates).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import deque

import numpy as np

from hotset.errors import ConfigError
from hotset.importance import ScoreBoard
from hotset.importance.elastic import RatioController
from hotset.importance.graph import GraphImportance
from hotset.sampling.base import Sampler, register_sampler

log = logging.getLogger(__name__)


@register_sampler
class SpiderSampler(Sampler):
    name = "spider"
    order_known_ahead = False
    learns_from_feedback = True
    needs_embeddings = True
    needs_labels = True
    transient = ("_lock", "_cv", "_pending", "_busy", "_worker", "_stop")

    def __init__(
        self,
        num_samples: int,
        labels=None,
        lam: float = 0.01,
        alpha: float = 0.98,
        k: int = 32,
        neighbor_max: int | None = None,
        homophily_k: int = 500,
        M: int = 8,
        ef_construction: int = 40,
        background: bool = True,
        max_pending: int = 8,
        total_epochs: float = 10,
        r_start: float = 0.9,
        r_end: float = 0.8,
        gamma: float = 0.01,
        window: int = 5,
        calibrate: bool = True,
        edge_quantile: float = 0.5,
        **kwargs,
    ) -> None:
        super().__init__(num_samples, **kwargs)
        if labels is None or len(labels) != num_samples:
            raise ConfigError(f"sampler 'spider' needs labels= for its {num_samples} samples")
        self.graph = GraphImportance(
            labels, lam=lam, alpha=alpha, k=k, neighbor_max=neighbor_max,
            homophily_k=homophily_k, M=M,
            ef_construction=ef_construction, seed=self.seed, calibrate=calibrate,
            edge_quantile=edge_quantile,
        )  # fmt: skip
        self.controller = RatioController(total_epochs, r_start, r_end, gamma, window)
        self.board = ScoreBoard(num_samples)
        self.prior: float | None = None
        self.background = bool(background)
        self.max_pending = int(max_pending)
        self.scored = 0  # samples scored
        self.dropped = 0  # samples whose batch was dropped unscored
        self.failed = 0  # samples whose batch the graph could not score (they keep a score)
        self.graph_s = 0.0  # seconds the worker spent scoring
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        self._pending: deque[tuple[np.ndarray, np.ndarray]] = deque()
        self._busy = False
        self._homophily: list[tuple[int, np.ndarray]] = []
        self._orders: dict[int, np.ndarray] = {}
        self._ratio: dict[int, float] = {}
        self._worker: threading.Thread | None = None
        self._stop = False

    # -- feedback --------------------------------------------------------------------
    def feedback(self, ids: np.ndarray, losses: np.ndarray, embeddings=None) -> None:
        if embeddings is None:
            raise ConfigError(
                "sampler 'spider' scores samples from embeddings: call "
                "loader.feedback(ids, losses, embeddings=...) with the feature-layer output"
            )
        ids = np.asarray(ids, np.int64)
        emb = np.array(embeddings, dtype=np.float32)  # a copy: the caller's may change
        if emb.ndim != 2 or emb.shape[0] != ids.size:
            raise ConfigError(f"feedback: {ids.size} ids but embeddings of shape {emb.shape}")
        if not self.background:
            self._score(ids, emb)
            return
        with self._cv:
            if self._worker is None:
                self._worker = threading.Thread(target=self._work, name="hotset-graph", daemon=True)
                self._worker.start()
            self._pending.append((ids, emb))
            while len(self._pending) > self.max_pending:
                self.dropped += self._pending.popleft()[0].size
            self._cv.notify_all()

    def _score(self, ids: np.ndarray, emb: np.ndarray) -> None:
        start = time.perf_counter()
        uids, scores, node, neighbours = self.graph.score_batch(ids, emb)
        with self._lock:
            self.board.update(uids, scores, scores)
            if self.prior is None:
                self.prior = float(np.median(scores))
                self.board.fill_unseen(self.prior)
            if neighbours.size:
                self._homophily.append((node, neighbours))
            self.scored += uids.size
            self.graph_s += time.perf_counter() - start

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
        calibrated distance unit, queries hnswlib refused at first."""
        with self._lock:
            seen = self.board.score[self.board.seen]
            return {
                "graph_scored": self.scored, "graph_dropped": self.dropped,
                "graph_failed": self.failed, "graph_edges": self.graph.edges,
                "graph_mean_degree": self.graph.edges / max(1, self.scored),
                "graph_score_std": float(seen.std()) if seen.size else 0.0,
                "graph_score_range": float(np.ptp(seen)) if seen.size else 0.0,
                "graph_scale": self.graph.scale, "graph_retries": self.graph.retries,
            }  # fmt: skip

    def close(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if self._worker is not None:
            self._worker.join(timeout=10)
            self._worker = None
        self._stop = False

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
            self._ratio[epoch] = self.controller.ratio(epoch)
        return {"imp_ratio": self._ratio[epoch]}

    def take_hints(self) -> dict:
        with self._lock:
            found, self._homophily = self._homophily, []
        return {"homophily": found} if found else {}

    # -- sampling ----------------------------------------------------------------------
    def probabilities(self) -> np.ndarray:
        with self._lock:
            w = np.maximum(self.board.score, 1e-12)
        return w / w.sum()

    def global_order(self, epoch: int) -> np.ndarray:
        if epoch not in self._orders:
            rng = np.random.default_rng([self.seed, epoch])
            if epoch == 0 or self.prior is None:
                order = rng.permutation(self.num_samples)
            else:
                order = rng.choice(self.num_samples, self.num_samples, p=self.probabilities())
            self._orders = {e: o for e, o in self._orders.items() if e >= epoch - 1}
            self._orders[epoch] = order
        return self._orders[epoch]
