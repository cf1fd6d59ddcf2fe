"""SpiderCache's graph with compressed vectors (``dim``): what it keeps of the full graph."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hotset.errors import ConfigError
from hotset.importance.graph import GraphImportance, Projection
from hotset.sampling import make_sampler


def _clustered(n: int, width: int, rank: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` embeddings of 4 classes that span ``rank`` directions of ``width``."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 4, n)
    basis = np.linalg.qr(rng.standard_normal((width, rank)))[0].T
    centres = rng.standard_normal((4, rank))
    low = centres[labels] + 0.08 * rng.standard_normal((n, rank))
    return (low @ basis).astype(np.float32), labels


def _edges(graph: GraphImportance, ids: np.ndarray, emb: np.ndarray) -> list[set]:
    """The batch's edges (Eq. 3) as ``score_batch`` decided them."""
    query, found = graph._query, []
    graph._query = lambda *a, **kw: found.append(query(*a, **kw)) or found[-1]
    graph.score_batch(ids, emb)
    graph._query = query
    nbr, d = found[0]
    edge = (np.exp(-graph.lam * d / graph.scale) > graph.alpha) & (nbr != ids[:, None])
    return [set(nbr[r][edge[r]].tolist()) for r in range(len(ids))]


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10**6), st.integers(1, 40), st.integers(1, 24))
def test_a_projection_keeps_norms_and_never_lengthens_a_distance(seed, rows, dim):
    rng = np.random.default_rng(seed)
    fit, x = rng.standard_normal((rows, 32)), rng.standard_normal((50, 32)).astype(np.float32)
    p = Projection(fit, dim, seed)
    y = p(x)
    assert y.shape == (50, dim + 1)
    assert np.allclose(np.linalg.norm(y, axis=1), np.linalg.norm(x, axis=1), rtol=1e-4)
    full = np.linalg.norm(x[:, None] - x[None], axis=2)
    low = np.linalg.norm(y[:, None] - y[None], axis=2)
    assert (low <= full + 1e-4).all()


def test_every_edge_of_the_full_graph_is_an_edge_of_the_compressed_one():
    # every neighbour is queried (k = n): only the distances decide, and they are lower
    # bounds of the full ones, so the compressed graph keeps each edge (and finds others)
    emb, labels = _clustered(300, 96, rank=40)
    ids = np.arange(300)
    full = GraphImportance(labels, k=300)
    small = GraphImportance(labels, k=300, dim=8)
    a, b = _edges(full, ids, emb), _edges(small, ids, emb)
    assert small.index.dim == 9
    assert sum(map(len, a)) > 300  # edges to keep
    assert all(x <= y for x, y in zip(a, b, strict=True))
    assert sum(map(len, b)) > sum(map(len, a))  # 8 of 40 directions: some edges more


def test_embeddings_within_dim_directions_score_as_the_full_graph():
    emb, labels = _clustered(300, 96, rank=6)
    full = GraphImportance(labels, k=299)
    small = GraphImportance(labels, k=299, dim=8)
    for ids in np.array_split(np.random.default_rng(1).permutation(300), 3):
        ids = np.sort(ids)
        got_full, got_small = full.score_batch(ids, emb[ids]), small.score_batch(ids, emb[ids])
        assert np.array_equal(got_full[0], got_small[0])
        assert np.allclose(got_full[1], got_small[1])  # the scores of Eq. 4
    assert small.refits == 0


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_the_projection_is_fitted_again_where_the_model_moved_and_the_graph_restarts():
    n = 2000
    emb, labels = _clustered(n, 96, rank=6, seed=0)
    moved, _ = _clustered(n, 96, rank=6, seed=1)  # other directions: a model that learnt
    g = GraphImportance(labels, k=50, dim=8)
    batches = np.array_split(np.arange(n), 20)  # 100 a batch: a check every 11 batches
    for ids in batches:  # an epoch within 6 directions: nothing missed, no refit
        g.score_batch(ids, emb[ids])
    for ids in batches:  # moved: checked at 2,200 and 3,300, before 4,096 rows came
        g.score_batch(ids, moved[ids])
    assert g.refits == 0
    for b, ids in enumerate(batches[:4]):  # 4,400: a check, the ring new since the fit
        g.score_batch(ids, moved[ids])
        assert g.refits == (1 if b == 3 else 0)
    # the new graph holds the ring's embeddings, each sample once with its latest vector
    assert g.index.get_current_count() == n and g.indexed.all()
    assert np.allclose(g.index.get_items(np.arange(n)), g.projection(_unit(moved)), atol=1e-5)
    assert g.projection.missed < 0.01  # fitted on them


def test_a_graph_the_machine_cannot_hold_is_refused_naming_dim():
    n, width = 400_000, 100_000  # a graph of 160 GB at full precision
    labels = np.zeros(n, np.int64)
    emb = np.random.default_rng(0).standard_normal((2, width)).astype(np.float32)
    full = make_sampler("spider", n, labels=labels, background=False)
    with pytest.raises(ConfigError, match="dim=64"):
        full.feedback(np.arange(2), np.ones(2), emb)
    small = make_sampler("spider", n, labels=labels, background=False, dim=64)
    small.feedback(np.arange(2), np.ones(2), emb)  # 65 floats a sample
    assert small.scored == 2 and small.graph.index.dim == 65
    assert small.counters()["graph_refits"] == 0
    with pytest.raises(ConfigError, match="dim"):
        make_sampler("spider", 10, labels=np.zeros(10), dim=0)
