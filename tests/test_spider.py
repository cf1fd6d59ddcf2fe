"""SpiderCache: graph importance, the importance + homophily caches, the ratio controller."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.signal import savgol_filter

from hotset import make_policy
from hotset.build import make_loader
from hotset.errors import ConfigError, RankError
from hotset.importance import ScoreBoard
from hotset.importance.elastic import RatioController
from hotset.importance.graph import GraphImportance
from hotset.models import TinyCNN
from hotset.sampling import make_sampler
from hotset.storage import FileStorage
from hotset.training import train_epoch


def test_graph_scores_follow_eq_1_to_4():
    # Class 0 near the origin, class 1 near (10, 0); id 5 is a class-0 sample sitting in
    # class 1's cluster (misclassified); id 6 is far from everything (isolated).
    emb = np.array(
        [[0, 0], [0.5, 0], [0, 0.5], [10, 0], [10.5, 0], [10, 0.5], [500, 500]], np.float32
    )
    labels = np.array([0, 0, 0, 1, 1, 1, 0])
    labels_with_intruder = np.r_[labels[:5], 0, labels[6]]
    g = GraphImportance(
        labels_with_intruder, lam=0.01, alpha=0.98, k=6, neighbor_max=6, normalize=False
    )
    ids, scores, best, nbrs = g.score_batch(np.arange(7), emb)
    # Edges: exp(-0.01 d) > 0.98  <=>  d < 2.02, so only within each cluster.
    x_same = np.array([2, 2, 2, 1, 1, 0, 0])
    x_other = np.array([0, 0, 0, 1, 1, 2, 0])
    expect = np.log(1 / np.maximum(x_same, 1) + x_other / 6 + 1)
    assert np.allclose(scores, expect)
    assert scores[5] == scores.max()  # the misclassified sample matters most
    assert scores[0] < scores[3] < scores[5]
    assert best == 0 and set(nbrs.tolist()) == {1, 2}  # the highest x_same, its neighbours


def small_spider(cap=6, n=20, imp_ratio=0.5):
    p = make_policy("spider", cap, num_samples=n, imp_ratio=imp_ratio)
    board = ScoreBoard(n)
    board.score[:] = np.arange(n) / n
    p.attach_scores(board)
    return p


def test_homophily_serves_only_listed_neighbours_first_in_first_out():
    p = small_spider()
    assert p.add_node(3, np.array([4, 5]))
    assert list(p.access([9]).fetch) == [3]  # the node is read and cached with a batch
    early = small_spider()
    early.add_node(3, np.array([4, 5]))
    early.access([9])
    r = early.access([4])
    assert list(r.served) == [4] and not r.substituted.any()  # its fetch has not landed
    p.reconcile(stored=np.array([3]), lost=np.empty(0, np.int64))  # the worker stored it
    r = p.access([4, 7, 3])
    assert list(r.served) == [3, 7, 3] and list(r.substituted) == [True, False, False]
    assert r.hits.tolist() == [True, False, True]
    p.add_node(10, np.array([11]))
    p.add_node(12, np.array([13]))
    p.add_node(14, np.array([15]))
    r = p.access([5])  # the FIFO dropped node 3 (capacity 3): 5 is no longer listed
    assert 3 in r.evicted and not r.substituted.any() and list(r.served) == [5]
    # exclusive: a node in the Importance Cache does not enter the Homophily Cache
    q = small_spider()
    q.access([19])
    assert 19 in q.importance and not q.add_node(19, np.array([1]))


def test_importance_cache_changes_only_on_a_double_miss():
    p = small_spider(cap=4, imp_ratio=0.5)  # importance cache: 2 items
    p.add_node(0, np.array([1, 2]))
    p.access([10, 11])
    p.reconcile(stored=np.array([0]), lost=np.empty(0, np.int64))  # node 0 landed
    assert set(p.importance.cached_ids().tolist()) == {10, 11}
    r = p.access([1])  # a homophily hit: no change to the importance cache
    assert r.substituted.all() and set(p.importance.cached_ids().tolist()) == {10, 11}
    r = p.access([15])  # double miss, 0.75 > top's 0.5: evicts 10 (case 4)
    assert list(r.admitted) == [15] and list(r.evicted) == [10]
    r = p.access([5])  # double miss, 0.25 < top: not admitted (case 2)
    assert not r.admitted.size


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10**6), st.integers(0, 30), st.floats(0.0, 1.0))
def test_spider_never_exceeds_capacity(seed, cap, ratio):
    n = 40
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 4, n)
    p = make_policy("spider", cap, sizes=sizes, imp_ratio=ratio)
    board = ScoreBoard(n)
    p.attach_scores(board)
    for _ in range(20):
        board.score[:] = rng.random(n)
        hints = {"homophily": [(int(rng.integers(n)), rng.integers(0, n, 5))]}
        if rng.random() < 0.2:
            hints["imp_ratio"] = float(rng.random())
        p.apply_hints(hints)
        r = p.access(rng.integers(0, n, 8))
        assert p.used <= p.capacity_bytes
        assert p.importance.used <= p.importance.capacity_bytes
        assert p.hom_used <= p.hom_capacity
        assert not set(p.importance.cached_ids().tolist()) & set(p.homophily)  # exclusive
        for i, sub in zip(r.served.tolist(), r.substituted.tolist(), strict=True):
            if sub:
                assert i in p.homophily


def test_ratio_controller_follows_eq_5_to_8():
    T = 20
    c = RatioController(total=T, r_start=0.9, r_end=0.8, gamma=0.01, window=5)
    acc = 0.9 - 0.5 * np.exp(-np.arange(12) / 3) + 0.003 * (-1) ** np.arange(12)
    for a in acc:
        c.observe_accuracy(a)
    c.observe_scores(np.array([0.0, 2.0]))  # std 1
    assert c.beta() == 0 and c.ratio(10) == pytest.approx(0.9)  # std not falling yet
    c.observe_scores(np.array([0.0, 1.0]))  # std 0.5: falling
    smooth = savgol_filter(acc, 5, 2)
    delta = np.mean(np.diff(smooth)[-5:])
    u = delta / (0.01 + delta)
    for t in (0, 5, 10, 20):
        assert c.ratio(t) == pytest.approx(0.9 - 0.1 * (t / T) ** (1 + u))
    assert c.ratio(40) == pytest.approx(0.8)  # t beyond T: r_end
    flat = RatioController(total=T)
    for a in [0.9] * 8:
        flat.observe_accuracy(a)
    flat.observe_scores(np.array([0.0, 2.0]))
    flat.observe_scores(np.array([0.0, 1.0]))
    assert flat.u() == pytest.approx(0, abs=1e-12)
    assert flat.ratio(10) == pytest.approx(0.9 - 0.1 * 0.5)
    noisy = RatioController(total=T)
    for std in (1.0, 1.0 - 1e-15, 1.0 + 1e-15, 1.0 - 2e-15):  # rounding, not a trend
        noisy.observe_scores(np.array([-std, std]))
    assert noisy.beta() == 0 and noisy.ratio(10) == pytest.approx(0.9)


def test_background_scoring_lands_on_the_served_ids_and_drops_when_behind():
    n = 64
    labels = np.arange(n) % 2
    s = make_sampler("spider", n, labels=labels, k=4, max_pending=2)
    try:
        with pytest.raises(ConfigError, match="embeddings"):
            s.feedback(np.arange(4), np.zeros(4))
        rng = np.random.default_rng(0)
        for lo in range(0, n, 8):
            ids = np.arange(lo, lo + 8)
            s.feedback(ids, np.zeros(8), rng.normal(size=(8, 3)))
        s.drain()
        assert s.scored + s.dropped == n
        assert s.board.seen.sum() == s.scored
        assert s.take_hints()["homophily"]  # one candidate node per scored batch
        assert s.take_hints() == {}
    finally:
        s.close()


def test_under_ranks_one_rank_keeps_the_graph_and_every_rank_applies_its_scores():
    """Rank 0 of two scores every rank's batches (the exchange's feedback, in rank order)
    and hands its scores on in the next exchange; both ranks apply them alike and decide
    as one process scoring them itself. Rank 1 builds no index; a state saved on rank 0
    loads on rank 1 without it; scores not yet handed on when rank 0 saved its state are
    handed on after a restore; scores that are not this dataset's are refused."""
    n, dim = 240, 6
    rng = np.random.default_rng(3)
    labels = rng.integers(0, 3, n)
    emb = (rng.normal(size=(n, dim)) + 3 * labels[:, None]).astype(np.float32)
    options = {"labels": labels, "k": 12, "homophily_k": 12, "threads": 1, "seed": 5}
    alone = make_sampler("spider", n, background=False, **options)
    ranks = [make_sampler("spider", n, **options) for _ in range(2)]  # background: default
    for r, smp in enumerate(ranks):
        smp.plan_with_ranks(r, 2)
    try:
        for epoch in range(2):
            order = alone.global_order(epoch)
            assert all(np.array_equal(smp.global_order(epoch), order) for smp in ranks)
            for lo in range(0, n, 40):  # a global batch of 2 x 20: each rank's shard
                items = [(order[lo + r : lo + 40 : 2], emb[order[lo + r : lo + 40 : 2]])
                         for r in range(2)]  # fmt: skip
                for ids, e in items:
                    alone.feedback(ids, np.ones(ids.size), e)
                    for smp in ranks:  # every rank learns every rank's, in rank order
                        smp.feedback(ids, np.ones(ids.size), e)
                ranks[0].drain()  # (the exchange takes what is scored by then)
                shared = [smp.shared() for smp in ranks]
                assert shared[1] is None and len(shared[0]) == 2
                for smp in ranks:
                    scored = smp.apply_shared(shared)
                    assert set(scored.tolist()) == set(order[lo : lo + 40].tolist())
            found = [(v, nb.tolist()) for v, nb in alone.take_hints()["homophily"]]
            for smp in ranks:  # the same scores and homophily candidates as alone
                assert np.array_equal(smp.board.score, alone.board.score)
                assert [(v, nb.tolist()) for v, nb in smp.take_hints()["homophily"]] == found
        assert np.array_equal(ranks[1].global_order(2), alone.global_order(2))
        assert ranks[0].graph.index is not None and ranks[1].graph.index is None
        assert ranks[1].graph_s == 0 and ranks[0].scored == ranks[1].scored == alone.scored
        ranks[1].load_state_dict(ranks[0].state_dict())
        assert ranks[1].graph.index is None and not ranks[1].graph.indexed.any()
        assert np.array_equal(ranks[1].board.score, alone.board.score)
        for r in range(2):  # one more global batch, saved before its exchange
            ids = alone.global_order(2)[r:40:2]
            for smp in (alone, *ranks):
                smp.feedback(ids, np.ones(ids.size), emb[ids])
        ranks[0].drain()
        restored = [make_sampler("spider", n, **options) for _ in range(2)]
        for r, smp in enumerate(restored):  # each rank from its own state
            smp.plan_with_ranks(r, 2)
            smp.load_state_dict(ranks[r].state_dict())
        shared = [smp.shared() for smp in restored]
        assert shared[1] is None and len(shared[0]) == 2  # handed on after the restore
        for smp in restored:
            smp.apply_shared(shared)
            assert np.array_equal(smp.board.score, alone.board.score)
        restored[1].load_state_dict(ranks[0].state_dict())  # a peer takes none to hand on
        assert restored[1].shared() is None
        none = np.zeros(0, np.int64)
        good = (np.array([2]), np.array([9.0]), 2, none)  # applied only with the rest
        bad = [[good, (np.array([n]), np.ones(1), 0, none)]]
        nan = [[good, (np.array([1]), np.array([np.nan]), 1, none)]]
        node = [[good, (np.array([1]), np.ones(1), n, none)]]
        before = ranks[1].board.score.copy()
        for items in (bad, nan, node, [[good, ("not", "scores")]]):
            with pytest.raises(RankError, match="graph rank's scores"):
                ranks[1].apply_shared(items)
        assert np.array_equal(ranks[1].board.score, before)
        with pytest.raises(ConfigError, match="graph_rank=2"):
            make_sampler("spider", n, graph_rank=2, **options).plan_with_ranks(0, 2)
    finally:
        for smp in ranks:
            smp.close()


@pytest.mark.slow
def test_spider_trains_with_two_workers_and_serves_neighbours(fmnist_dir):
    storage = FileStorage(str(fmnist_dir / "train"))
    loader = make_loader(
        storage, batch_size=50, policy="spider", sampler="spider", cache_fraction=0.3,
        num_workers=2, sampler_options={"total_epochs": 3},
    )  # fmt: skip
    torch.manual_seed(0)
    model = TinyCNN()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    try:
        for epoch in range(3):
            loader.set_epoch(epoch)
            train_epoch(loader, model, opt)
            loader.planner.sampler.drain()
        c = loader.counters()
        policy = loader.planner.policy
    finally:
        loader.close()
        loader.dataset.store.close(destroy=True)
    assert loader.planner.sampler.scored > 0 and policy.homophily
    assert c["substitute_hits"] > 0 and c["exact_hits"] > 0 and c["internal"]["prefetched"] > 0
    assert c["hits"] == c["exact_hits"] + c["substitute_hits"]


def _epochs_of_scores(
    emb: np.ndarray, labels: np.ndarray, epochs: int = 2, **options
) -> list[np.ndarray]:
    g = GraphImportance(labels, k=16, **options)
    out = []
    for e in range(epochs):
        order = np.random.default_rng(e).permutation(len(labels))
        scores = np.zeros(len(labels))
        for b in range(0, len(order), 64):
            ids, s, _, _ = g.score_batch(order[b : b + 64], emb[order[b : b + 64]])
            scores[ids] = s
        g.recalibrate()  # the sampler does this at each epoch start
        out.append(scores)
    return out, g


def test_scores_do_not_depend_on_the_embedding_scale():
    """The default (L2-normalised embeddings, lambda and alpha fixed) and the calibrated
    unit (ours) both give the same graph whatever the features' scale (ResNet-18's
    neighbours ~4 apart, TinyCNN's ~0.1), with edges that discriminate; the raw Eq. 1
    gives far-apart features no edge at all."""
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 3, 600)
    emb = (rng.normal(size=(600, 8)) + 3 * labels[:, None]).astype(np.float32)
    for options in ({}, {"calibrate": True, "normalize": False}):
        base, g = _epochs_of_scores(emb, labels, **options)
        for factor in (2.0**-6, 2.0**5):  # exact in floating point: the very same graph
            scaled, gs = _epochs_of_scores(emb * factor, labels, **options)
            for a, b in zip(base, scaled, strict=True):
                assert np.allclose(a, b, atol=1e-6)
        for factor in (0.01, 40.0):  # rounding may move a distance across the threshold
            scaled, _ = _epochs_of_scores(emb * factor, labels, **options)
            assert np.mean(np.isclose(base[1], scaled[1])) > 0.97
        degree = g.edges / (2 * 600)
        assert 1 < degree < 15, options  # neither no edge nor every neighbour one
        assert base[1].std() > 0.05
    raw = GraphImportance(labels, k=16, lam=0.01, alpha=0.98, normalize=False)
    _, s, _, _ = raw.score_batch(np.arange(600), emb * 100)
    assert np.allclose(s, np.log(2))  # the paper's absolute threshold: no edge at all


def test_embeddings_without_structure_get_few_edges_by_default():
    """An edge means 'similar enough to substitute': clustered embeddings (classes the
    model separates) get many, the same embeddings with every coordinate shuffled across
    samples (no structure left) get almost none by default, where the calibrated
    quantile (ours) keeps half of the neighbours as edges whatever the embeddings."""
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 5, 1500)
    centres = rng.normal(size=(5, 16))
    emb = (centres[labels] * 4 + 0.2 * rng.normal(size=(1500, 16))).astype(np.float32)
    flat = emb.copy()
    for j in range(flat.shape[1]):
        flat[:, j] = rng.permutation(flat[:, j])
    degree = {}
    for name, e in (("clustered", emb), ("shuffled", flat)):
        for mode, options in (("default", {}), ("quantile", {"calibrate": True})):
            _, g = _epochs_of_scores(e, labels, **options)
            degree[name, mode] = g.edges / (2 * 1500)
    assert degree["clustered", "default"] > 5
    assert degree["shuffled", "default"] < 0.1 * degree["clustered", "default"]
    assert degree["shuffled", "quantile"] > 5  # the fixed share, structure or none


def test_spider_counts_what_the_graph_did_and_failed_batches():
    n = 200
    labels = np.arange(n) % 2
    smp = make_sampler("spider", n, labels=labels, k=8, homophily_k=8)
    emb = np.random.default_rng(1).normal(size=(n, 4)).astype(np.float32)
    for b in range(0, n, 50):
        smp.feedback(np.arange(b, b + 50), np.ones(50), emb[b : b + 50])
    smp.feedback(np.arange(10), np.ones(10), np.ones((10, 3), np.float32))  # wrong dim
    smp.drain()
    c = smp.counters()
    smp.close()
    assert c["graph_scored"] == n and c["graph_failed"] == 10 and c["graph_dropped"] == 0
    assert c["graph_edges"] > 0 and c["graph_mean_degree"] == pytest.approx(c["graph_edges"] / n)
    assert c["graph_score_std"] > 0 and c["graph_scale"] > 0
