"""Control-plane cost per sample: each policy driven by the planner over uniform epochs,
at 60,000 and 1,281,167 ids (Fashion-MNIST and ImageNet-1k sizes), 10% cache.

Targets: LRU, FIFO, MinIO >= 1M accesses/s; Belady >= 300k accesses/s (issue #2);
SHADE (PADS + APP) planning <= 2 us per sample (issue #3); its feedback (scoring each
batch, re-keying cached ids) is reported beside it, and us_per_sample counts both,
fed by a synthetic loss oracle (per-sample difficulty that persists, losses shrinking).

    python benchmarks/control_plane.py [--epochs 2] [--sizes 60000,1281167]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

from _report import report  # noqa: E402
from hotset.policy import POLICIES  # noqa: E402
from hotset.sim import LossOracle, simulate  # noqa: E402
from hotset.systems import SYSTEMS  # noqa: E402

# the most planning microseconds per sample each target allows (1M/s = 1 us)
TARGETS = {"lru": 1.0, "fifo": 1.0, "minio": 1.0, "belady": 1 / 0.3, "shade": 2.0}


def synthetic_oracle(n: int, epochs: int) -> LossOracle:
    hard = np.random.default_rng(0).lognormal(0, 1, n)
    return LossOracle(np.stack([hard * 0.7**e for e in range(epochs)]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes", default="60000,1281167")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--cache-fraction", type=float, default=0.1)
    ap.add_argument("--batch-size", type=int, default=256)
    args = ap.parse_args()
    rows = []
    for n in (int(s) for s in args.sizes.split(",")):
        oracle = synthetic_oracle(n, args.epochs)
        for name in [*sorted(p for p, c in POLICIES.items() if not c.needs_scores), "shade"]:
            system = SYSTEMS.get(name)
            r = simulate(
                system.policy if system else name,
                n,
                args.epochs,
                cache_fraction=args.cache_fraction,
                batch_size=args.batch_size,
                seed=0,
                sampler=system.sampler if system else "uniform",
                sampler_options=system.sampler_options if system else None,
                oracle=oracle if system else None,
            )
            target = TARGETS.get(name)
            rows.append(
                {
                    "system": name,
                    "ids": n,
                    "accesses": r["accesses"],
                    "accesses_per_s": r["accesses_per_s"],
                    "us_per_sample": 1e6 / r["accesses_per_s"],
                    "planning_us": r["planning_us_per_sample"],
                    "feedback_us": r["feedback_us_per_sample"],
                    "steady_hit_ratio": r["steady_hit_ratio"],
                    "target_us": target or 0.0,
                    "meets_target": "yes"
                    if target is None or r["planning_us_per_sample"] <= target
                    else "NO",
                }
            )
    report(
        "control_plane",
        rows,
        [
            ("system", "s"),
            ("ids", "d"),
            ("accesses_per_s", ",.0f"),
            ("us_per_sample", ".3f"),
            ("planning_us", ".3f"),
            ("feedback_us", ".3f"),
            ("steady_hit_ratio", ".4f"),
            ("target_us", ".2f"),
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
