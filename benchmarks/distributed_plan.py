"""One global plan across ranks: for each system, R real ranks (gloo, DDP TinyCNN) train 3
epochs over a shared 20% cache; reports whether every rank drew the same global list, the
batches per rank, the aggregate hit ratio of epochs 1-2 and the time each step spent in
hotset's collectives (an upper bound: it includes waiting for the slowest rank).

    python benchmarks/distributed_plan.py --data data/fashion-mnist-1k/train
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "tests")]

from _report import report  # noqa: E402
from test_distributed import SYSTEMS, run_ranks  # noqa: E402

CASES = [("uniform", 2), ("uniform", 4), ("shade", 2), ("shade", 4), ("icache", 2), ("spider", 2)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data", required=True, help="a prepared train dir (1,000 samples is enough)")
    args = ap.parse_args()
    rows = []
    for name, world in CASES:
        records = run_ranks(world, args.data, SYSTEMS[name], Path(tempfile.mkdtemp()))
        later = [ep for r in records for ep in r["epochs"][1:]]
        steps = sum(ep["batches"] for ep in records[0]["epochs"])
        rows.append({
            "system": name, "ranks": world,
            "identical": "yes" if all(len({r["epochs"][e]["order"] for r in records}) == 1
                             for e in range(3)) else "NO",
            "batches": "/".join(str(ep["batches"]) for ep in records[0]["epochs"]),
            "hit": sum(ep["hits"] for ep in later) / sum(ep["reads"] for ep in later),
            "sync_ms_per_step": 1000 * records[0]["epochs"][-1]["sync_s"] / steps,
        })  # fmt: skip
    report("distributed_plan", rows, [("system", "s"), ("ranks", "d"), ("identical", "s"),
           ("batches", "s"), ("hit", ".3f"), ("sync_ms_per_step", ".1f")])  # fmt: skip


if __name__ == "__main__":
    main()
