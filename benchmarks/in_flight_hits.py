"""What plans in flight cost iCACHE's hits and package loads, with the L-cache sized
for them (``l_in_flight``, hotset's) and without (the paper's split).

A DataLoader holds ``num_workers x prefetch_factor`` plans in flight, and the ids a plan
serves from the cache stay pinned until it has run. iCACHE's L-hits and substitutes are
used L residents, the ones the paper's L-cache evicts to make room for the next package:
pinned, they cannot go, and where the global batches in flight hold more of them than
the L-cache (a tenth of the cache until III-A's split) the room comes from unused
residents, evicted unread. Here a rank's planner (``replication_step.warmed_planner``:
its first epoch planned until the cache is full, every id scored, the plans taken
``--ahead`` plans ahead there too, so that the planner counts them) plans epochs 1 (the
first H-list, the initial split) and 2 (III-A's split), each plan consumed and fed back
``--ahead`` plans after it was taken, against the same with none in flight. Packages are
loaded the moment they are wanted (no bytes: ``InstantPackages``). Reported per epoch:
the hit ratio, the packages loaded, the L-cache's items, the planning time.

    python benchmarks/in_flight_hits.py             # 1 x 256, 32 x 256, 4 x 256
    python benchmarks/in_flight_hits.py --ranks 2 --ids 100000 --ahead 4   # a quick run
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import report  # noqa: E402
from plan_scale import make_manifest  # noqa: E402
from replication_step import Prefetch, warmed_planner  # noqa: E402

#: (ranks, ids): one rank over 100,000 ids; 32 ranks over ImageNet-1k's; and batches in
#: flight too large for the cache (4 x 256 over 10,000 ids: the paper's split stands)
DEFAULT_RUNS = ((1, 100_000), (32, 1_281_167), (4, 10_000))


def run(ranks: int, ids: int, batch: int, ahead: int, l_in_flight: bool) -> list[dict]:
    manifest = make_manifest(ids)
    planner = warmed_planner("icache", ranks, manifest, batch, ahead, l_in_flight=l_in_flight)
    policy, rows = planner.policy, []
    for epoch in (1, 2):
        planner.set_epoch(epoch)
        prefetch = Prefetch(planner, ahead, 1.0)
        served = hits = 0
        loaded, planning, start = planner.feeder.packages_loaded, planner.planning_s, time.time()
        for plan in planner:
            served += plan.ids.size
            hits += int(plan.hits.sum())
            prefetch.take(plan)
        prefetch.drain()
        rows.append({
            "ranks": ranks, "ids": ids, "ahead": ahead,
            "l_cache": "in_flight" if l_in_flight else "paper", "epoch": epoch,
            "hit_ratio": hits / served, "hits": hits, "served": served,
            "packages": planner.feeder.packages_loaded - loaded,
            "l_items": policy.l_capacity // policy._typical_size,
            "in_flight_ids": policy.in_flight_ids,
            "planning_s": planner.planning_s - planning, "wall_s": time.time() - start,
        })  # fmt: skip
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--ranks", type=int, help="one run of this many ranks (with --ids)")
    ap.add_argument("--ids", type=int)
    ap.add_argument("--batch-size", type=int, default=256, help="per rank")
    ap.add_argument("--ahead", type=int, default=4, help="plans in flight (2 workers x 2)")
    args = ap.parse_args()
    runs = ((args.ranks, args.ids),) if args.ranks else DEFAULT_RUNS
    rows = []
    for ranks, ids in runs:
        for ahead, l_in_flight in ((0, True), (args.ahead, False), (args.ahead, True)):
            rows += run(ranks, ids or 100_000, args.batch_size, ahead, l_in_flight)
            for r in rows[-2:]:
                print({k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()},
                      flush=True)  # fmt: skip
    report(
        "in_flight_hits", rows,
        [("ranks", "d"), ("ids", "d"), ("ahead", "d"), ("l_cache", "s"), ("epoch", "d"),
         ("hit_ratio", ".3f"), ("packages", "d"), ("l_items", "d"), ("in_flight_ids", "d"),
         ("planning_s", ".2f")],
        {"batch_size": args.batch_size, "system": "icache"},
    )  # fmt: skip


if __name__ == "__main__":
    main()
