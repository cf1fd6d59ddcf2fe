"""SpiderCache's graph-based importance (ICPP'25 section 4.1, Algorithm 1 lines 14-21).

Each sample is a node; its embedding (from the model's feature layer) lives in an HNSW
index (hnswlib) that every scored batch updates. For a batch, the ``k`` approximate
nearest neighbours of each sample give the Euclidean distance ``d`` (Eq. 1), the
similarity ``exp(-lambda d)`` (Eq. 2) and an edge where it exceeds ``alpha`` (Eq. 3).
With ``x_same`` / ``x_other`` the neighbours of the same / another class:

    score = ln(1 / x_same + x_other / neighbor_max + 1)            (Eq. 4)

An isolated sample (``x_same = 0``) takes ``1 / x_same = 1``, the largest value the
term has otherwise. The batch's node with the most same-class neighbours is returned
with its neighbour ids: the Homophily Cache's candidate (lines 17-22). Scores use the
``k`` nearest neighbours (a small ``k`` keeps the per-batch query cheap); the chosen
node's own list is queried once more with ``homophily_k`` (the paper's 500).
"""

from __future__ import annotations

import numpy as np

from hotset.errors import ConfigError


class GraphImportance:
    def __init__(
        self,
        labels: np.ndarray,
        lam: float = 0.01,
        alpha: float = 0.98,
        k: int = 32,
        neighbor_max: int | None = None,
        homophily_k: int = 500,
        M: int = 8,
        ef_construction: int = 40,
        threads: int = 1,
        seed: int = 0,
    ) -> None:
        try:
            import hnswlib  # noqa: F401
        except ImportError as exc:
            raise ConfigError(
                "graph importance needs hnswlib: pip install 'hotset[graph]'"
            ) from exc
        if lam <= 0 or not 0 < alpha < 1 or k < 1:
            raise ConfigError(f"need lam > 0, 0 < alpha < 1, k >= 1; got {lam}, {alpha}, {k}")
        self.labels = np.asarray(labels, np.int64)
        self.num_samples = int(self.labels.size)
        self.lam, self.alpha, self.k = float(lam), float(alpha), int(k)
        self.neighbor_max = int(neighbor_max or k)
        self.homophily_k = int(homophily_k)
        self.M, self.ef_construction, self.threads, self.seed = M, ef_construction, threads, seed
        self.index = None
        self.indexed = np.zeros(self.num_samples, bool)

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
        self._ensure_index(emb.shape[1])
        self.index.add_items(emb, ids)  # line 15: insert or update
        self.indexed[ids] = True
        count = self.index.get_current_count()
        k = min(self.k + 1, count)
        self.index.set_ef(max(k, 16))
        nbr, sq = self.index.knn_query(emb, k=k)
        nbr = nbr.astype(np.int64)
        d = np.sqrt(np.maximum(sq, 0.0))  # Eq. 1 (hnswlib's l2 is squared)
        edge = (np.exp(-self.lam * d) > self.alpha) & (nbr != ids[:, None])  # Eq. 2-3
        same = edge & (self.labels[nbr] == self.labels[ids][:, None])
        x_same = same.sum(1)
        x_other = (edge & ~same).sum(1)
        inv = 1.0 / np.maximum(x_same, 1)  # x_same = 0: an isolated sample, 1/x_same := 1
        scores = np.log(inv + x_other / self.neighbor_max + 1.0)  # Eq. 4
        best = int(np.argmax(x_same))
        neighbours = nbr[best][edge[best]]
        if self.homophily_k > k and x_same[best] > 0:
            kh = min(self.homophily_k, count)
            self.index.set_ef(kh)
            hn, hsq = self.index.knn_query(emb[best : best + 1], k=kh)
            hn = hn[0].astype(np.int64)
            near = np.exp(-self.lam * np.sqrt(np.maximum(hsq[0], 0.0))) > self.alpha
            neighbours = hn[near & (hn != ids[best])]
        return ids, scores, int(ids[best]), neighbours
