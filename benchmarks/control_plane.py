"""Control-plane cost per sample: each policy driven by the planner over uniform epochs,
at 60,000 and 1,281,167 ids (Fashion-MNIST and ImageNet-1k sizes), 10% cache.

Targets (issue #2): LRU, FIFO, MinIO >= 1M accesses/s; Belady >= 300k accesses/s.

    python benchmarks/control_plane.py [--epochs 2] [--sizes 60000,1281167]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import report  # noqa: E402
from hotset.policy import POLICIES  # noqa: E402
from hotset.sim import simulate  # noqa: E402

TARGETS = {"lru": 1e6, "fifo": 1e6, "minio": 1e6, "belady": 3e5}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes", default="60000,1281167")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--cache-fraction", type=float, default=0.1)
    ap.add_argument("--batch-size", type=int, default=256)
    args = ap.parse_args()
    rows = []
    for n in (int(s) for s in args.sizes.split(",")):
        for name in sorted(POLICIES):
            r = simulate(
                name,
                n,
                args.epochs,
                cache_fraction=args.cache_fraction,
                batch_size=args.batch_size,
                seed=0,
            )
            target = TARGETS.get(name)
            rows.append(
                {
                    "policy": name,
                    "ids": n,
                    "accesses": r["accesses"],
                    "accesses_per_s": r["accesses_per_s"],
                    "us_per_sample": 1e6 / r["accesses_per_s"],
                    "steady_hit_ratio": r["steady_hit_ratio"],
                    "target_per_s": target or 0.0,
                    "meets_target": "yes"
                    if target is None or r["accesses_per_s"] >= target
                    else "NO",
                }
            )
    report(
        "control_plane",
        rows,
        [
            ("policy", "s"),
            ("ids", "d"),
            ("accesses_per_s", ",.0f"),
            ("us_per_sample", ".3f"),
            ("steady_hit_ratio", ".4f"),
            ("target_per_s", ",.0f"),
            ("meets_target", "s"),
        ],
        meta={
            "epochs": args.epochs,
            "cache_fraction": args.cache_fraction,
            "batch_size": args.batch_size,
        },
    )


if __name__ == "__main__":
    main()
