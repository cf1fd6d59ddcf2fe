"""What reading by shard blocks (``make_loader(order="blocks")``: each system's draw in
Streaming's ``py1b`` order) costs in accuracy and saves in requests, against each
system's own order (``order="paper"``): TinyCNN trained on Fashion-MNIST tar shards
written in two layouts,

* ``dataset order``: the samples as the dataset lists them (classes mixed in each shard);
* ``class-sorted``: shards written class by class, as converting an ImageFolder tree
  (ImageNet's) to shards does by default.

Each row: a system and an order; test accuracy after the last epoch (mean and spread
over seeds) and its difference from the same system's paper order (``delta``, points),
the epoch's range requests (read-ahead on, a cache of ``--cache-fraction``) and the
classes in a batch (mean distinct labels).

    python benchmarks/shuffle_quality.py [--systems lru,shade] [--epochs 3] [--seeds 0,1]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from itertools import product
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import report  # noqa: E402
from hotset import make_loader, to_tensor  # noqa: E402
from hotset.models import TinyCNN, accuracy  # noqa: E402
from hotset.storage.prepare import (  # noqa: E402
    _IDX_FILES,
    FASHION_MNIST_DIR,
    _write_tar_split,
    png_bytes,
    read_idx,
)
from hotset.training import train_epoch  # noqa: E402


def fashion_mnist(samples: int) -> tuple[np.ndarray, np.ndarray, tuple]:
    """The first ``samples`` training images and labels, and the test set as tensors."""
    src = Path(FASHION_MNIST_DIR)
    images = read_idx(src / _IDX_FILES["train"][0])[:samples]
    labels = read_idx(src / _IDX_FILES["train"][1])[:samples].astype(np.int64)
    test_x = to_tensor(read_idx(src / _IDX_FILES["test"][0])[:, None])
    return images, labels, (test_x, torch.as_tensor(read_idx(src / _IDX_FILES["test"][1]),
                                                    dtype=torch.int64))  # fmt: skip


def write_layout(out: str, images, labels, sort: bool, shard_size: int) -> None:
    order = np.argsort(labels, kind="stable") if sort else np.arange(len(labels))
    samples = ((f"{i:05d}.png", png_bytes(images[i]), int(labels[i])) for i in order)
    _write_tar_split(out, samples, "fashion-mnist", len(order), shard_size)


def run(url: str, system: str, order: str, args, seed: int, test, labels_of: np.ndarray) -> dict:
    torch.manual_seed(seed)
    model = TinyCNN()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    classes = []
    with make_loader(
        url, batch_size=args.batch_size, system=system, cache_fraction=args.cache_fraction,
        num_workers=2, seed=seed, order=order, block_size=args.block,
    ) as loader:  # fmt: skip
        for epoch in range(args.epochs):
            loader.set_epoch(epoch)
            train_epoch(loader, model, opt,
                        on_batch=lambda ids, _: classes.append(np.unique(labels_of[ids]).size))
        requests = loader.counters()["storage_requests"] / args.epochs
    return {"accuracy": accuracy(model, *test), "requests": requests,
            "classes_per_batch": float(np.mean(classes))}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--samples", type=int, default=20000)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--block", type=int, default=2048, help="block_size of order='blocks'")
    ap.add_argument("--systems", default="lru,shade")
    ap.add_argument("--cache-fraction", type=float, default=0.1)
    ap.add_argument("--shard-size", type=int, default=512, help="samples per tar shard")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    images, labels, test = fashion_mnist(args.samples)
    rows = []
    with tempfile.TemporaryDirectory(prefix="hotset-shuffle-") as tmp:
        for layout, sort in (("dataset order", False), ("class-sorted", True)):
            url = f"{tmp}/{'sorted' if sort else 'plain'}"
            write_layout(url, images, labels, sort, args.shard_size)
            # ids are in shard order: sample k of the layout is image order[k]
            labels_of = np.sort(labels) if sort else labels
            for system, order in product(args.systems.split(","), ("paper", "blocks")):
                runs = [run(url, system, order, args, seed, test, labels_of) for seed in seeds]
                acc = np.array([r["accuracy"] for r in runs])
                paper = rows[-1]["accuracy"] if order == "blocks" else float(acc.mean())
                rows.append({
                    "layout": layout, "system": system, "order": order,
                    "accuracy": float(acc.mean()), "spread": float(acc.max() - acc.min()),
                    "delta_pt": 100 * (float(acc.mean()) - paper),
                    "requests_per_epoch": float(np.mean([r["requests"] for r in runs])),
                    "classes_per_batch": float(np.mean([r["classes_per_batch"] for r in runs])),
                })  # fmt: skip
                print(rows[-1], flush=True)
    report(
        "shuffle_quality", rows,
        [("layout", "s"), ("system", "s"), ("order", "s"), ("accuracy", ".4f"),
         ("spread", ".4f"), ("delta_pt", "+.1f"), ("requests_per_epoch", ",.0f"),
         ("classes_per_batch", ".2f")],
        meta={"samples": args.samples, "epochs": args.epochs, "seeds": seeds,
              "batch_size": args.batch_size, "shuffle_block": args.block,
              "shard_size": args.shard_size, "model": "TinyCNN",
              "cache_fraction": args.cache_fraction},
    )  # fmt: skip


if __name__ == "__main__":
    main()
