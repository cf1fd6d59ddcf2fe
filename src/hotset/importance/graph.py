"""SpiderCache's graph-based importance (ICPP'25 section 4.1, Algorithm 1 lines 14-21).

Each sample is a node; its embedding (from the model's feature layer) lives in an HNSW
index (hnswlib) that every scored batch updates. For a batch, the ``k`` approximate
nearest neighbours of each sample give the Euclidean distance ``d`` (Eq. 1), the
similarity ``exp(-lambda d)`` (Eq. 2) and an edge where it exceeds ``alpha`` (Eq. 3).
With ``x_same`` / ``x_other`` the neighbours of the same / another class:

    score = ln(1 / x_same + x_other / neighbor_max + 1)            (Eq. 4)

An isolated sample (``x_same = 0``) takes ``1 / x_same = 1``, the largest value the
term has otherwise. The batch's node with the most same-class neighbours is returned
with its neighbour ids: the Homophily Cache's candidate (lines 17-22). ``neighbor_max``
is the paper's 500, and ``k`` (the neighbours queried) defaults to it; the node's list is
queried with ``homophily_k`` where that is larger.

The distance's scale: Eq. 2-3's threshold is an absolute distance, ``-ln(alpha)/lambda``,
so the raw embeddings' scale would decide the edges (ResNet-18 features ~4 apart: almost
none; TinyCNN's ~0.1: an edge to every neighbour). By default (``normalize=True``, ours:
the paper does not say) embeddings are L2-normalised first, and ``lambda = 1``,
``alpha = 0.9`` fix the threshold at distance 0.105 on the unit sphere (cosine similarity
>= 0.9945): edges then follow what the model learns (classes that cluster get edges,
embeddings without structure get few). ``normalize=False`` is the raw Eq. 1.

Compressed vectors (``dim``, ours): a 512-d HNSW index is about 2.1 KB per sample (28 GB
at 14M). With ``dim=D`` each embedding is stored as its coordinates on the ``D`` principal
directions of recent embeddings, plus one more coordinate, the norm of what they miss
(:class:`Projection`): a vector keeps its norm and the index's distances are lower bounds
of the full ones, so an edge of the full graph stays an edge where every neighbour is
queried (at ``k = 500``, ``dim=64`` keeps 96-98% of a 512-d graph's edges:
benchmarks/graph_scale.py). The directions are fitted on the first batch, and again on the
latest 4,096 embeddings (all come since the last fit) wherever the share of the
embeddings' squared norm they miss has doubled since (checked every 1,024: the model
moved). The graph then starts
again from those 4,096: what the full graph holds of older embeddings lies where the model
no longer puts samples.

``calibrate=True`` (ours) instead divides distances by a unit measured each epoch, so
that the threshold is the ``edge_quantile`` quantile of the previous epoch's neighbour
distances: the share of edges is then fixed whatever the model learned.
"""

from __future__ import annotations

import os

import numpy as np

from hotset.errors import ConfigError

FIT_ROWS = 4096  # the latest embeddings kept to fit a projection on
CHECK_ROWS = 1024  # embeddings between two checks that the projection still fits
HNSW_BYTES = 170  # hnswlib's bytes a sample beside its vector and links (measured, M = 8)


def index_bytes(samples: int, dim: int, M: int) -> int:
    """About what an hnswlib index of ``samples`` vectors of ``dim`` floats takes."""
    return samples * (4 * dim + 8 * M + 4 + HNSW_BYTES)


class Projection:
    """``dim`` principal directions of ``rows`` (uncentred) and, as one more coordinate,
    the norm of what they miss: ``|x|`` is kept and every distance between two projected
    vectors is at most the full one."""

    def __init__(self, rows: np.ndarray, dim: int, seed: int = 0) -> None:
        x = rows.astype(np.float64)
        if len(x) >= x.shape[1]:  # the top eigenvectors of x.T @ x: 4x an SVD's speed
            basis = np.linalg.eigh(x.T @ x)[1][:, ::-1][:, :dim]
        else:
            basis = np.linalg.svd(x, full_matrices=False)[2][:dim].T
        if basis.shape[1] < dim:  # fewer rows than directions: completed at random
            fill = np.random.default_rng(seed).standard_normal((rows.shape[1], dim))
            basis = np.linalg.qr(np.hstack([basis, fill[:, basis.shape[1] :]]))[0]
        self.basis = np.ascontiguousarray(basis, np.float32)
        self.missed = float(missed(self(rows)).mean())  # what the fit's own rows miss

    def __call__(self, emb: np.ndarray) -> np.ndarray:
        low = emb @ self.basis
        rest = np.sqrt(np.maximum((emb * emb).sum(1) - (low * low).sum(1), 0.0))
        return np.ascontiguousarray(np.hstack([low, rest[:, None]]), np.float32)


def missed(projected: np.ndarray) -> np.ndarray:
    """Each projected vector's share of its squared norm outside the directions."""
    return projected[:, -1] ** 2 / np.maximum((projected * projected).sum(1), 1e-24)


def _distance(squared: np.ndarray) -> np.ndarray:
    """Eq. 1's Euclidean distance from hnswlib's squared l2."""
    return np.sqrt(np.maximum(squared, 0.0))


class GraphImportance:
    def __init__(
        self,
        labels: np.ndarray,
        lam: float = 1.0,
        alpha: float = 0.9,
        k: int | None = None,
        neighbor_max: int = 500,
        homophily_k: int = 500,
        M: int = 8,
        ef_construction: int = 100,
        threads: int = 1,
        seed: int = 0,
        calibrate: bool = False,
        edge_quantile: float = 0.5,
        normalize: bool = True,
        dim: int | None = None,
    ) -> None:
        try:
            import hnswlib  # noqa: F401
        except ImportError as exc:
            raise ConfigError(
                "graph importance needs hnswlib: pip install 'hotset[graph]'"
            ) from exc
        k = neighbor_max if k is None else k
        if dim is not None and dim < 1:
            raise ConfigError(f"dim (compressed vectors' directions) must be >= 1, got {dim}")
        if lam <= 0 or not 0 < alpha < 1 or k < 1 or neighbor_max < 1 or not 0 < edge_quantile < 1:
            raise ConfigError(
                f"need lam > 0, 0 < alpha < 1, k >= 1, neighbor_max >= 1, "
                f"0 < edge_quantile < 1; got {lam}, {alpha}, {k}, {neighbor_max}, {edge_quantile}"
            )
        self.labels = np.asarray(labels, np.int64)
        self.num_samples = int(self.labels.size)
        self.lam, self.alpha, self.k = float(lam), float(alpha), int(k)
        self.neighbor_max = int(neighbor_max)
        self.normalize = bool(normalize)
        self.homophily_k = int(homophily_k)
        self.M, self.ef_construction, self.threads, self.seed = M, ef_construction, threads, seed
        self.index = None
        self.indexed = np.full(self.num_samples, False)
        self.dim = None if dim is None else int(dim)
        self.projection: Projection | None = None
        self.refits = 0  # projections fitted again (the graph started again)
        self._recent: np.ndarray | None = None  # the latest FIT_ROWS embeddings, a ring
        self._recent_ids = np.zeros(FIT_ROWS, np.int64)  # and their ids
        self._written = 0  # rows written to the ring
        self._missed = [0.0, 0]  # since the last check: shares missed, their sum and count
        self._fitted_at = 0  # rows written when the projection was fitted
        self.calibrate, self.edge_quantile = bool(calibrate), float(edge_quantile)
        self.scale = 1.0  # the distance unit of Eq. 2
        self._calibrated = False  # from a whole epoch's distances (else each batch's own)
        self._seen: list[np.ndarray] = []  # this epoch's neighbour distances
        self.edges = 0  # edges found (Eq. 3) over all scored samples
        self.retries = 0  # queries hnswlib refused at the first ef

    def recalibrate(self, distances: np.ndarray | None = None) -> None:
        """Set the distance unit from ``distances`` (default: those measured since the
        last call, then forgotten: once per epoch)."""
        if distances is None:
            found, self._seen = self._seen, []
            distances = np.concatenate(found) if found else np.zeros(0)
            self._calibrated = self._calibrated or distances.size > 0
        d = distances[distances > 0]
        if self.calibrate and d.size:
            threshold = -np.log(self.alpha) / self.lam  # Eq. 2-3 in units of the scale
            self.scale = float(np.quantile(d, self.edge_quantile)) / threshold

    def check_fits(self, dim: int) -> None:
        """Refuse, naming ``dim``, a graph this machine's memory cannot hold."""
        stored = dim if self.dim is None or self.dim >= dim else self.dim + 1
        need = index_bytes(self.num_samples, stored, self.M)
        try:
            have = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError):
            return
        if need > have:
            raise ConfigError(
                f"the graph of {self.num_samples} samples' {dim}-d embeddings needs about "
                f"{need / 1e9:.1f} GB, more than this machine's {have / 1e9:.1f} GB: give the "
                f"sampler option dim=64 (compressed vectors, about "
                f"{index_bytes(self.num_samples, 65, self.M) / 1e9:.1f} GB)"
            )

    def _project(self, ids: np.ndarray, emb: np.ndarray) -> np.ndarray:
        """``emb`` in the projection: fitted at the first batch, and again on the ring of
        the latest embeddings where what they miss has doubled since (the index then
        starts again from the ring's)."""
        if self._recent is None:
            self._recent = np.zeros((FIT_ROWS, emb.shape[1]), np.float32)
        elif self._recent.shape[1] != emb.shape[1]:
            raise ConfigError(f"embeddings changed dimension: {emb.shape[1]} after "
                              f"{self._recent.shape[1]}")  # fmt: skip
        at = (self._written + np.arange(len(emb))) % FIT_ROWS
        self._recent[at[-FIT_ROWS:]] = emb[-FIT_ROWS:]
        self._recent_ids[at[-FIT_ROWS:]] = ids[-FIT_ROWS:]
        self._written += len(emb)
        if self.projection is None:
            self.projection = Projection(emb, self.dim, self.seed)
        out = self.projection(emb)
        self._missed[0] += float(missed(out).sum())
        self._missed[1] += len(emb)
        total, rows = self._missed
        if rows >= CHECK_ROWS:
            self._missed = [0.0, 0]
            fresh = self._written - self._fitted_at >= FIT_ROWS  # a ring of new rows
            if fresh and total / rows > 2 * self.projection.missed + 1e-4:
                self._refit_on_recent()
                out = self.projection(emb)
        return out

    def _refit_on_recent(self) -> None:
        """A projection fitted on the ring, and a new index of the ring's embeddings."""
        filled = min(self._written, FIT_ROWS)
        latest = (self._written - 1 - np.arange(filled)) % FIT_ROWS  # newest first
        rows = self._recent[latest]
        self.projection = Projection(rows, self.dim, self.seed)
        self._fitted_at = self._written
        self.index, self.indexed[:] = None, False
        self.refits += 1
        ids, first = np.unique(self._recent_ids[latest], return_index=True)  # their latest
        self._ensure_index(self.dim + 1)
        self.index.add_items(self.projection(rows[first]), ids)
        self.indexed[ids] = True

    def _query(
        self, emb: np.ndarray, k: int, ids: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """``k`` nearest neighbours and their distances (Eq. 1; hnswlib's l2 is squared).
        hnswlib refuses a query whose search found fewer than ``k`` (a small ``ef``, or a
        graph whose clusters are not linked): retry wider, then row by row with a smaller
        ``k``, padding a row with the sample itself (never an edge) at infinite distance."""
        ef = max(k, 16)
        for _ in range(3):
            self.index.set_ef(ef)
            try:
                nbr, sq = self.index.knn_query(emb, k=k)
                return nbr.astype(np.int64), _distance(sq)
            except RuntimeError:
                self.retries += 1
                ef *= 4
        own = np.full(len(emb), -1, np.int64) if ids is None else ids
        nbr = np.repeat(own[:, None], k, axis=1)
        dist = np.full((len(emb), k), np.inf)
        for row in range(len(emb)):
            kk = k
            while kk >= 1:
                try:
                    n, sq = self.index.knn_query(emb[row : row + 1], k=kk)
                    nbr[row, :kk], dist[row, :kk] = n[0], _distance(sq[0])
                    break
                except RuntimeError:
                    kk //= 2
        return nbr, dist

    def _ensure_index(self, dim: int) -> None:
        if self.index is None:
            import hnswlib

            self.index = hnswlib.Index(space="l2", dim=dim)
            self.index.init_index(
                max_elements=self.num_samples, ef_construction=self.ef_construction,
                M=self.M, random_seed=self.seed,
            )  # fmt: skip
            self.index.set_num_threads(self.threads)
        elif self.index.dim != dim:
            raise ConfigError(f"embeddings changed dimension: {dim} after {self.index.dim}")

    def score_batch(
        self, ids: np.ndarray, embeddings: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, int, np.ndarray]:
        """Update the index with the batch; returns the (distinct) ids scored, their
        scores, the highest-degree node and that node's neighbour ids."""
        ids = np.asarray(ids, np.int64)
        emb = np.ascontiguousarray(embeddings, dtype=np.float32)
        if emb.ndim != 2 or emb.shape[0] != ids.size:
            raise ConfigError(f"embeddings must be ({ids.size}, dim), got {emb.shape}")
        ids, first = np.unique(ids, return_index=True)  # a repeated id: its first row
        emb = emb[first]
        if self.normalize:
            emb = emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
        if self.dim is not None and self.dim < emb.shape[1]:
            emb = self._project(ids, emb)
        self._ensure_index(emb.shape[1])
        self.index.add_items(emb, ids)  # line 15: insert or update
        self.indexed[ids] = True
        count = self.index.get_current_count()
        k = min(self.k + 1, count)
        nbr, d = self._query(emb, k, ids)
        other = nbr != ids[:, None]
        if self.calibrate:
            found = d[other & np.isfinite(d)]
            self._seen.append(found)
            if not self._calibrated:
                self.recalibrate(found)
        edge = (np.exp(-self.lam * d / self.scale) > self.alpha) & other  # Eq. 2-3
        same = edge & (self.labels[nbr] == self.labels[ids][:, None])
        x_same = same.sum(1)
        x_other = (edge & ~same).sum(1)
        self.edges += int(edge.sum())
        inv = 1.0 / np.maximum(x_same, 1)  # x_same = 0: an isolated sample, 1/x_same := 1
        scores = np.log(inv + x_other / self.neighbor_max + 1.0)  # Eq. 4
        best = int(np.argmax(x_same))
        neighbours = nbr[best][edge[best]]
        if self.homophily_k > k and x_same[best] > 0:
            hn, hd = self._query(
                emb[best : best + 1], min(self.homophily_k, count), ids[best : best + 1]
            )
            near = np.exp(-self.lam * hd[0] / self.scale) > self.alpha
            neighbours = hn[0][near & (hn[0] != ids[best])]
        return ids, scores, int(ids[best]), neighbours
