"""What the shard-local shuffle (``sampler_options={"shuffle": "shards"}``, Streaming's
``py1b``) costs in accuracy and saves in requests, against hotset's default full
permutation: TinyCNN trained on Fashion-MNIST tar shards written in two layouts,

* ``dataset order``: the samples as the dataset lists them (classes mixed in each shard);
* ``class-sorted``: shards written class by class, as converting an ImageFolder tree
  (ImageNet's) to shards does by default.

Each row: test accuracy after the last epoch (mean and spread over seeds), the epoch's
range requests (read-ahead on, no cache: every sample is read) and the classes in a
batch (mean distinct labels).

    python benchmarks/shuffle_quality.py [--samples 20000] [--epochs 3] [--seeds 0,1]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
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


def write_layout(out: str, images, labels, sort: bool, shard_size: int) -> None:
    order = np.argsort(labels, kind="stable") if sort else np.arange(len(labels))
    samples = ((f"{i:05d}.png", png_bytes(images[i]), int(labels[i])) for i in order)
    _write_tar_split(out, samples, "fashion-mnist", len(order), shard_size)


def run(url: str, shuffle, args, seed: int, test, labels_of: np.ndarray) -> dict:
    options = {"shuffle": shuffle, "shuffle_block": args.block} if shuffle == "shards" else {}
    torch.manual_seed(seed)
    model = TinyCNN()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    classes = []
    with make_loader(
        url, batch_size=args.batch_size, cache_fraction=0.0, num_workers=2, seed=seed,
        sampler_options=options,
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
    ap.add_argument("--block", type=int, default=2048, help="shuffle_block of 'shards'")
    ap.add_argument("--shard-size", type=int, default=512, help="samples per tar shard")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    src = Path(FASHION_MNIST_DIR)
    images = read_idx(src / _IDX_FILES["train"][0])[: args.samples]
    labels = read_idx(src / _IDX_FILES["train"][1])[: args.samples].astype(np.int64)
    test_x = to_tensor(read_idx(src / _IDX_FILES["test"][0])[:, None])
    test = (test_x, torch.as_tensor(read_idx(src / _IDX_FILES["test"][1]), dtype=torch.int64))
    rows = []
    with tempfile.TemporaryDirectory(prefix="hotset-shuffle-") as tmp:
        for layout, sort in (("dataset order", False), ("class-sorted", True)):
            url = f"{tmp}/{'sorted' if sort else 'plain'}"
            write_layout(url, images, labels, sort, args.shard_size)
            # ids are in shard order: sample k of the layout is image order[k]
            labels_of = np.sort(labels) if sort else labels
            for shuffle, name in ((True, "full permutation"), ("shards", "shard-local")):
                runs = [run(url, shuffle, args, seed, test, labels_of) for seed in seeds]
                acc = np.array([r["accuracy"] for r in runs])
                rows.append({
                    "layout": layout, "shuffle": name, "accuracy": float(acc.mean()),
                    "spread": float(acc.max() - acc.min()),
                    "requests_per_epoch": float(np.mean([r["requests"] for r in runs])),
                    "classes_per_batch": float(np.mean([r["classes_per_batch"] for r in runs])),
                })  # fmt: skip
                print(rows[-1], flush=True)
    report(
        "shuffle_quality", rows,
        [("layout", "s"), ("shuffle", "s"), ("accuracy", ".4f"), ("spread", ".4f"),
         ("requests_per_epoch", ",.0f"), ("classes_per_batch", ".2f")],
        meta={"samples": args.samples, "epochs": args.epochs, "seeds": seeds,
              "batch_size": args.batch_size, "shuffle_block": args.block,
              "shard_size": args.shard_size, "model": "TinyCNN", "cache_fraction": 0.0},
    )  # fmt: skip


if __name__ == "__main__":
    main()
