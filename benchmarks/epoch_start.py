"""An epoch's first batch at 100M ids: each system's control plane in one process
(sampler, policy, planner; 10% cache; batches of 256), every epoch planned to its end
with feedback (every id scored first, as after a first epoch), as a rank's training loop
plans it. The sizes are synthetic (``plan_scale.py``'s, without its manifest, whose
build at 100M takes more memory than the plan). Reported per epoch: the wait for its
first batch and the seconds its planning and feedback took; per system: the process's
peak resident memory (``VmHWM``). Each system runs in a fresh process.

    python benchmarks/epoch_start.py [--ids 100000000] [--systems lru,shade] [--epochs 3]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

from _report import report  # noqa: E402


def run(system: str, n: int, epochs: int) -> list[dict]:
    from hotset.plan import Planner
    from hotset.policy.base import make_policy
    from hotset.sampling.base import make_sampler
    from hotset.systems import resolve_system
    from plan_scale import losses_of, score_all

    sizes = np.random.default_rng(0).integers(60_000, 180_000, n)
    sysdef = resolve_system(system)
    policy = make_policy(sysdef.policy, int(0.1 * sizes.sum()), sizes=sizes, seed=0)
    sampler = make_sampler(sysdef.sampler, n, seed=0, **dict(sysdef.sampler_options))
    planner = Planner(sampler, policy, 256, feed_future=False)
    score_all(sampler, n)
    rows = []
    for epoch in range(epochs):
        t = time.perf_counter()
        planner.set_epoch(epoch)
        plans = iter(planner)
        plan = next(plans)
        first = time.perf_counter() - t
        t = time.perf_counter()
        for plan in plans:  # noqa: B007 - each plan fed back, as training does
            planner.feedback(plan.ids, losses_of(plan.ids, epoch))
        took = time.perf_counter() - t
        rows.append({"system": system, "ids": n, "epoch": epoch,
                     "first_batch_ms": 1e3 * first, "epoch_s": took})  # fmt: skip
    with open("/proc/self/status") as f:
        peak = next(int(line.split()[1]) for line in f if line.startswith("VmHWM"))
    return [{**r, "peak_GB": peak / 2**20} for r in rows]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ids", type=int, default=100_000_000)
    ap.add_argument("--systems", default="lru,shade")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(run(args.one, args.ids, args.epochs)))
        return
    rows = []
    for system in args.systems.split(","):
        out = subprocess.run(
            [sys.executable, __file__, "--one", system, "--ids", str(args.ids),
             "--epochs", str(args.epochs)], capture_output=True, text=True, check=True,
        )  # fmt: skip
        rows += json.loads(out.stdout.splitlines()[-1])
        print(f"  {system} done", file=sys.stderr)
    report(
        "epoch_start", rows,
        [("system", "s"), ("ids", ",d"), ("epoch", "d"), ("first_batch_ms", ".0f"),
         ("epoch_s", ".1f"), ("peak_GB", ".2f")],
        meta=vars(args),
    )  # fmt: skip


if __name__ == "__main__":
    main()
