"""SpiderCache's graph with compressed vectors (``dim``): the edges it keeps against the
full-precision graph, and a graph rank's memory at ImageNet-21k scale.

``--parts edges``: ResNet-18's 512-d embeddings of ``--images`` Fashion-MNIST images,
after one pass of training over ``--train-images`` (on the CPU: a few minutes; kept in
``--embeddings`` for the next run). The full graph and one graph per ``--dims`` score
the same batches: epoch 0 adds every sample, epoch 1 scores each again, and for each
sample of epoch 1 the edges (Eq. 3) the graphs found are compared: ``kept`` is the share
of the full graph's edges the compressed graph found too, ``extra`` its other edges
against the full graph's count. With the paper's fixed threshold and ``calibrate``.

``--parts hits``: the same embeddings replayed through SpiderCache's planner (sampler,
importance and homophily caches, ``--cache`` of the samples) for ``--epochs`` epochs, the
full graph and each of ``--dims`` on the same batches' embeddings (a sample's own,
whatever the epoch): ``hit_ratio`` of the epochs after the first, both thresholds.

``--parts scale``: ``--samples`` ids (14M: ImageNet-21k), SpiderCache as a graph rank
runs it (sampler, its cache's policy, the planner) with ``dim``, one epoch planned and
every batch fed back with class-clustered 512-d embeddings, so that every sample is in
the graph; ``--scale-k`` neighbours a query (the memory does not depend on it, the
time does). ``peak_GB``: the process's peak resident memory.

    python benchmarks/graph_scale.py [--parts edges,scale] [--dims 64,128]
        [--samples 14000000]
"""

from __future__ import annotations

import argparse
import gzip
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import report  # noqa: E402

FASHION = Path("/usr/share/datasets/fashion-mnist")
BATCH = 256


def rss() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4096


def peak_rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def embeddings(path: Path, train_images: int, images: int) -> tuple[np.ndarray, np.ndarray]:
    """ResNet-18's embeddings (and labels) of the first ``images`` training images after
    one pass over ``train_images`` of them (SGD, batches of 128)."""
    if path.exists():
        got = np.load(path)
        if len(got["labels"]) >= images:
            return got["emb"][:images], got["labels"][:images]
    import torch

    from hotset.models import ResNet18

    def idx(name: str, offset: int) -> np.ndarray:
        return np.frombuffer(gzip.open(FASHION / name).read(), np.uint8, offset=offset)

    x = idx("train-images-idx3-ubyte.gz", 16).reshape(-1, 1, 28, 28)
    y = idx("train-labels-idx1-ubyte.gz", 8).astype(np.int64)
    torch.manual_seed(0)
    model = ResNet18(10, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    order = np.random.default_rng(0).permutation(len(x))[:train_images]
    for start in range(0, len(order), 128):
        b = order[start : start + 128]
        loss = torch.nn.functional.cross_entropy(
            model(torch.from_numpy(x[b] / np.float32(255))), torch.from_numpy(y[b])
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    emb = np.empty((images, 512), np.float32)
    with torch.no_grad():
        for start in range(0, images, 512):
            batch = torch.from_numpy(x[start : start + 512][: images - start] / np.float32(255))
            emb[start : start + len(batch)] = model.features(batch).numpy()
    np.savez(path, emb=emb, labels=y[:images])
    return emb, y[:images]


def graph_edges(emb: np.ndarray, labels: np.ndarray, dim: int | None, calibrate: bool,
                k: int) -> list[set]:  # fmt: skip
    """Each sample's edges in epoch 1 (the batches of a seeded shuffle)."""
    from hotset.importance.graph import GraphImportance

    n = len(emb)
    graph = GraphImportance(labels, k=k, calibrate=calibrate, dim=dim, threads=2)
    found: list[tuple] = []
    query = graph._query

    def recorded(*args, **kwargs):  # the batch's neighbours and distances (Eq. 1)
        out = query(*args, **kwargs)
        found.append(out)
        return out

    graph._query = recorded
    edges: list[set] = [set() for _ in range(n)]
    for epoch in range(2):
        graph.recalibrate()  # as the sampler does at each epoch start
        order = np.random.default_rng(epoch).permutation(n)
        for start in range(0, n, BATCH):
            ids = np.sort(order[start : start + BATCH])
            found.clear()
            graph.score_batch(ids, emb[ids])
            if epoch == 1:  # Eq. 2-3 on the batch's query, as score_batch decided them
                nbr, d = found[0]
                edge = (np.exp(-graph.lam * d / graph.scale) > graph.alpha) & (nbr != ids[:, None])
                for row, i in enumerate(ids):
                    edges[i] = set(nbr[row][edge[row]].tolist())
    return edges


def part_edges(args) -> list[dict]:
    emb, labels = embeddings(Path(args.embeddings), args.train_images, args.images)
    rows = []
    for calibrate in (False, True):
        full = graph_edges(emb, labels, None, calibrate, args.k)
        total = sum(map(len, full))
        rows.append({"graph": "full (512-d)", "calibrate": calibrate, "edges_per_sample":
                     total / len(emb), "kept": 1.0, "extra": 0.0})  # fmt: skip
        for dim in args.dims:
            got = graph_edges(emb, labels, dim, calibrate, args.k)
            kept = sum(len(a & b) for a, b in zip(full, got, strict=True))
            extra = sum(len(b - a) for a, b in zip(full, got, strict=True))
            rows.append({"graph": f"dim={dim}", "calibrate": calibrate,
                         "edges_per_sample": sum(map(len, got)) / len(emb),
                         "kept": kept / max(total, 1), "extra": extra / max(total, 1)})  # fmt: skip
            print(rows[-1], flush=True)
    report(
        "graph_edges", rows,
        [("graph", "s"), ("calibrate", "d"), ("edges_per_sample", ".1f"), ("kept", ".3f"),
         ("extra", ".3f")],
        {"images": args.images, "train_images": args.train_images, "k": args.k},
    )  # fmt: skip
    return rows


def spider_planner(n: int, labels: np.ndarray, capacity: int, **options):
    from hotset.plan import Planner
    from hotset.policy.base import make_policy
    from hotset.sampling.base import make_sampler
    from hotset.systems import resolve_system

    policy = make_policy(resolve_system("spider").policy, capacity, sizes=np.ones(n), seed=0)
    sampler = make_sampler(
        "spider", n, seed=0, labels=labels, background=False, total_epochs=10, **options
    )
    return Planner(sampler, policy, BATCH, feed_future=False), sampler


def part_hits(args) -> list[dict]:
    emb, labels = embeddings(Path(args.embeddings), args.train_images, args.images)
    n, rows = len(emb), []
    losses = np.random.default_rng(0).random(n).astype(np.float32)
    for calibrate in (False, True):
        for dim in (None, *args.dims):
            planner, sampler = spider_planner(
                n, labels, int(args.cache * n), k=args.k, calibrate=calibrate, dim=dim
            )
            hits = served = 0
            for epoch in range(args.epochs):
                planner.set_epoch(epoch)
                for plan in planner:
                    planner.feedback(plan.ids, losses[plan.ids], emb[plan.ids])
                    if epoch:
                        hits, served = hits + int(plan.hits.sum()), served + plan.ids.size
            rows.append({"graph": "full (512-d)" if dim is None else f"dim={dim}",
                         "calibrate": calibrate, "hit_ratio": hits / served,
                         "mean_degree": sampler.counters()["graph_mean_degree"]})  # fmt: skip
            print(rows[-1], flush=True)
    meta = {"images": args.images, "cache": args.cache, "epochs": args.epochs, "k": args.k}
    report("graph_hits", rows,
           [("graph", "s"), ("calibrate", "d"), ("hit_ratio", ".3f"), ("mean_degree", ".1f")],
           meta)  # fmt: skip
    return rows


def part_scale(args) -> list[dict]:
    n, rows = args.samples, []
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 1000, n).astype(np.int64)  # 1,000 classes
    centres = rng.standard_normal((1000, 512)).astype(np.float32)
    base = rss()
    planner, sampler = spider_planner(n, labels, n // 10, k=args.scale_k,
                                      homophily_k=args.scale_k, dim=args.scale_dim)  # fmt: skip
    planner.set_epoch(0)
    start, done = time.perf_counter(), 0
    for plan in planner:
        ids = plan.ids
        emb = centres[labels[ids]] + 0.5 * rng.standard_normal((ids.size, 512), np.float32)
        planner.feedback(ids, rng.random(ids.size, np.float32), emb)
        done += ids.size
        if done % (BATCH * 4096) == 0:
            print(f"{done:,} samples, {time.perf_counter() - start:.0f} s, "
                  f"{rss() / 1e9:.2f} GB", flush=True)  # fmt: skip
    rows.append({"samples": n, "dim": args.scale_dim, "in_graph": int(sampler.graph.indexed.sum()),
                 "peak_GB": peak_rss() / 1e9, "held_GB": (rss() - base) / 1e9,
                 "s": time.perf_counter() - start})  # fmt: skip
    report("graph_scale", rows,
           [("samples", ",d"), ("dim", "d"), ("in_graph", ",d"), ("peak_GB", ".2f"),
            ("held_GB", ".2f"), ("s", ".0f")],
           {"k": args.scale_k, "target_peak_GB": 8.0})  # fmt: skip
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="edges,hits,scale")
    ap.add_argument("--cache", type=float, default=0.2, help="hits: the cache, a share")
    ap.add_argument("--epochs", type=int, default=4, help="hits: epochs replayed")
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--images", type=int, default=20000)
    ap.add_argument("--train-images", type=int, default=12800)
    ap.add_argument("--k", type=int, default=500, help="neighbours a query (the paper's 500)")
    ap.add_argument("--embeddings", default=Path(tempfile.gettempdir(), "hotset-graph-emb.npz"))
    ap.add_argument("--samples", type=int, default=14_000_000)
    ap.add_argument("--scale-dim", type=int, default=64)
    ap.add_argument("--scale-k", type=int, default=16)
    args = ap.parse_args()
    args.dims = [int(d) for d in args.dims.split(",")]
    parts = args.parts.split(",")
    if "edges" in parts:
        part_edges(args)
    if "hits" in parts:
        part_hits(args)
    if "scale" in parts:
        part_scale(args)


if __name__ == "__main__":
    main()
