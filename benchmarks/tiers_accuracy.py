"""What SHADE's repetition over both tiers (``cache_tiers="both"``, its default with a disk
tier) does to accuracy. TinyCNN trained on Fashion-MNIST tar shards on local disk; SHADE
with a RAM tier of 5% over a disk tier of 30% of the data, its repetition favouring both
tiers or the RAM tier's alone; beside it SHADE with the two tiers' memory in RAM (35%, as
its paper runs it), SHADE with 5% and no disk tier, and uniform + LRU over the same two
tiers. Seeds interleaved. Each row: test accuracy after the last epoch (mean and spread
over seeds) and the hits over both tiers (epochs after the first).

    python benchmarks/tiers_accuracy.py [--epochs 5] [--seeds 0,1]
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
from hotset import make_loader  # noqa: E402
from hotset.models import TinyCNN, accuracy  # noqa: E402
from hotset.training import train_epoch  # noqa: E402
from shuffle_quality import fashion_mnist, write_layout  # noqa: E402

DISK = 0.3  # the disk tier's budget, of the data's bytes
VARIANTS = {  # name: make_loader's arguments (a disk tier where ``disk`` is true)
    "shade, 5% RAM over 30% disk (both tiers repeated)": (
        {"system": "shade", "cache_fraction": 0.05}, True),
    "shade, 5% RAM over 30% disk (RAM tier repeated)": (
        {"system": "shade", "cache_fraction": 0.05,
         "sampler_options": {"cache_tiers": "ram"}}, True),
    "shade, 35% RAM": ({"system": "shade", "cache_fraction": 0.35}, False),
    "shade, 5% RAM": ({"system": "shade", "cache_fraction": 0.05}, False),
    "uniform + lru, 5% RAM over 30% disk": ({"system": "lru", "cache_fraction": 0.05}, True),
}  # fmt: skip


def run(url: str, data: int, options: dict, disk: bool, work: Path, seed: int, args,
        test) -> dict:  # fmt: skip
    torch.manual_seed(seed)
    model = TinyCNN()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    tier = {"disk_dir": tempfile.mkdtemp(dir=work),  # (a fresh tier a run)
            "disk_bytes": int(DISK * data)} if disk else {}  # fmt: skip
    hits = []
    with make_loader(url, batch_size=args.batch_size, num_workers=2, seed=seed,
                     **options, **tier) as loader:  # fmt: skip
        for epoch in range(args.epochs):
            loader.set_epoch(epoch)
            train_epoch(loader, model, opt)
            e = loader.epoch_stats[-1]
            hits.append((e.hits + e.disk_hits) / max(1, e.samples))
    return {"accuracy": accuracy(model, *test), "both_tiers": float(np.mean(hits[1:]))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=20000)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--only", help="run the variants whose name contains this")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    images, labels, test = fashion_mnist(args.samples)
    variants = {k: v for k, v in VARIANTS.items() if not args.only or args.only in k}
    runs: dict[str, list[dict]] = {k: [] for k in variants}
    with tempfile.TemporaryDirectory(prefix="hotset-tiers-") as tmp:
        url, work = f"{tmp}/shards", Path(tmp, "work")
        work.mkdir()
        write_layout(url, images, labels, False, 512)
        data = sum(p.stat().st_size for p in Path(url).glob("*.tar"))
        for seed in seeds:  # (interleaved: each seed runs every variant in turn)
            for name, (options, disk) in variants.items():
                runs[name].append(run(url, data, options, disk, work, seed, args, test))
                print(name, seed, runs[name][-1], flush=True)
    rows = []
    for name, done in runs.items():
        acc = np.array([r["accuracy"] for r in done])
        rows.append({"variant": name, "accuracy": float(acc.mean()),
                     "spread": float(acc.max() - acc.min()),
                     "both_tiers": float(np.mean([r["both_tiers"] for r in done]))})  # fmt: skip
    report(
        "tiers_accuracy", rows,
        [("variant", "s"), ("accuracy", ".4f"), ("spread", ".4f"), ("both_tiers", ".3f")],
        meta={"samples": args.samples, "epochs": args.epochs, "seeds": seeds,
              "batch_size": args.batch_size, "model": "TinyCNN", "disk_fraction": DISK},
    )  # fmt: skip


if __name__ == "__main__":
    main()
