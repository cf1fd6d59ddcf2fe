"""One global plan across ranks: for each system, R real ranks (gloo, DDP TinyCNN) train 3
epochs over a shared 20% cache; reports whether every rank drew the same global list, the
batches per rank, the aggregate hit ratio of epochs 1-2 and the time each step spent in
hotset's collectives (an upper bound: it includes waiting for the slowest rank).

    python benchmarks/distributed_plan.py --data data/fashion-mnist-1k/train

With ``--ids N`` a dry run of the control plane alone, no GPU, no data: ``--ranks`` gloo
processes on this machine plan a synthetic ImageNet-like manifest of N ids (mapped from
one columns file, as a node's ranks share it) with simulated feedback, and report per
rank the epoch start, planning per step, the collectives per step with their bytes and
time, and memory (private per rank, and the mapped manifest shared by the node; what
making the policy takes whatever the ids, numba's compiled loops for SHADE's, RefCnt's
and iCACHE's caches, apart as ``compiled_MB`` and in the node's total).

    python benchmarks/distributed_plan.py --ids 14000000 --ranks 8 --systems lru,shade
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


def _rss() -> dict:
    """This process's resident memory: private (anonymous) and mapped from files."""
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return {k: int(fields[k].split()[0]) * 1024 for k in ("RssAnon", "RssFile")}


def dry_rank(rank: int, world: int, init: str, columns: str, system: str, args, out: str):
    """One rank of the dry run: plan ``args.batches`` global steps of two epochs, feed
    back this rank's shard, report what the control plane cost."""
    import pickle
    import time

    import numpy as np
    import torch.distributed as dist

    from hotset.distributed import RankGroup
    from hotset.plan import Planner, PlanReport
    from hotset.policy.base import make_policy
    from hotset.sampling.base import make_sampler
    from hotset.storage.manifest import Manifest
    from hotset.store import MemoryStore
    from hotset.systems import resolve_system
    from plan_scale import CLASSES, compiled_bytes, embeddings_of, losses_of

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    before = _rss()
    sysdef = resolve_system(system)
    compiled_bytes(sysdef.policy)  # (numba and compiled loops: once, whatever the ids)
    base = _rss()
    manifest = Manifest.map_columns(columns)
    n = len(manifest)
    opts = dict(sysdef.sampler_options)
    if sysdef.sampler == "spider":
        opts.update(labels=manifest.labels, total_epochs=10)
    policy = make_policy(sysdef.policy, int(0.1 * manifest.total_bytes), sizes=manifest.sizes)
    sampler = make_sampler(sysdef.sampler, n, seed=0, **opts)
    ranks = RankGroup()
    sent: list[int] = []
    gather = ranks.all_gather

    def counted(obj):
        sent.append(len(pickle.dumps(obj)))
        return gather(obj)

    ranks.all_gather = counted
    # a store makes the planner track plans in flight and exchange the reports, as under
    # a loader (nothing is written: the reports say each admission landed)
    planner = Planner(sampler, policy, args.batch_size, feed_future=False, ranks=ranks,
                      store=MemoryStore(1), sync_every=args.sync_every)  # fmt: skip
    centers = np.random.default_rng(1).normal(size=(CLASSES, args.dim)).astype(np.float32)
    starts = []
    for epoch in range(2):
        t0 = time.perf_counter()
        planner.set_epoch(epoch)
        it = iter(planner)
        for k, plan in zip(range(args.batches), it, strict=False):
            if k == 0:
                starts.append(time.perf_counter() - t0)
                plan0, sync0, calls0, sent0 = planner.planning_s, planner.sync_s, \
                    planner.sync_calls, len(sent)
                fb0, graph0 = planner.feedback_s, getattr(sampler, "graph_s", 0.0)
            emb = embeddings_of(plan.ids, manifest.labels, centers) \
                if sampler.needs_embeddings else None
            planner.feedback(plan.ids, losses_of(plan.ids, epoch + k / args.batches), emb)
            planner.batch_consumed(PlanReport(stored=plan.admitted))
        it.close()
        planner.flush()
        wall = time.perf_counter() - t0 - starts[-1]
    steps = args.batches - 1  # the second epoch's, after its start
    mem = _rss()
    record = {
        "system": system, "ranks": world, "ids": n, "rank": rank,
        "epoch_start_ms": 1e3 * starts[-1],
        "step_ms": 1e3 * wall / steps,  # a step's wall time, all of it (this loop's)
        "plan_ms_per_step": 1e3 * (planner.planning_s - plan0) / steps,
        "sync_ms_per_step": 1e3 * (planner.sync_s - sync0) / steps,
        # learning the feedback on the planner's thread, and SpiderCache's graph scoring
        # (on the rank that keeps the graph, in its worker)
        "feedback_ms_per_step": 1e3 * (planner.feedback_s - fb0) / steps,
        "graph_ms_per_step": 1e3 * (getattr(sampler, "graph_s", 0.0) - graph0) / steps,
        "collectives_per_step": (planner.sync_calls - calls0) / steps,
        "bytes_per_collective": float(np.mean(sent[sent0:])) if sent[sent0:] else 0.0,
        "private_B_per_id": (mem["RssAnon"] - base["RssAnon"]) / n,
        "mapped_MB": (mem["RssFile"] - base["RssFile"]) / 1e6,
        "compiled_MB": (base["RssAnon"] - before["RssAnon"]) / 1e6,
    }  # fmt: skip
    Path(out).write_text(__import__("json").dumps(record))
    planner.close()
    dist.destroy_process_group()


def dry_run(args) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        _dry_run(args, Path(tmp))


def _dry_run(args, tmp: Path) -> None:
    import json
    import multiprocessing as mp

    from plan_scale import make_manifest

    columns = tmp / "manifest.columns"
    columns.write_bytes(make_manifest(args.ids).to_columns())  # the node's one file
    rows = []
    for system in args.systems.split(","):
        ctx = mp.get_context("spawn")
        init = f"file://{tmp}/pg-{system}"
        procs = [ctx.Process(target=dry_rank, args=(r, args.ranks, init, str(columns), system,
                                                     args, str(tmp / f"{system}-{r}.json")))
                 for r in range(args.ranks)]  # fmt: skip
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        if any(p.exitcode for p in procs):
            print(f"{system}: a rank failed ({[p.exitcode for p in procs]})", file=sys.stderr)
            continue
        recs = [json.loads((tmp / f"{system}-{r}.json").read_text()) for r in range(args.ranks)]
        row = {k: max(r[k] for r in recs) for k in recs[0] if k != "rank"}  # the worst rank
        row["system"] = system
        row["least_private_B_per_id"] = min(r["private_B_per_id"] for r in recs)  # the best
        row["node_private_GB"] = (sum(r["private_B_per_id"] for r in recs) * args.ids
                                  + sum(r["compiled_MB"] for r in recs) * 1e6) / 1e9  # fmt: skip
        rows.append(row)
        print(f"  {system} done", file=sys.stderr)
    report("distributed_dry_run", rows, [
        ("system", "s"), ("ranks", "d"), ("ids", ",d"), ("epoch_start_ms", ".0f"),
        ("step_ms", ".0f"),
        ("plan_ms_per_step", ".1f"), ("sync_ms_per_step", ".1f"),
        ("feedback_ms_per_step", ".1f"), ("graph_ms_per_step", ".1f"),
        ("collectives_per_step", ".2f"), ("bytes_per_collective", ",.0f"),
        ("private_B_per_id", ".0f"), ("least_private_B_per_id", ".0f"), ("compiled_MB", ".0f"),
        ("node_private_GB", ".1f"),
        ("mapped_MB", ",.0f"),
    ], meta={"batch_size_per_rank": args.batch_size, "batches": args.batches,
             "sync_every": args.sync_every, "dim": args.dim})  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data", help="a prepared train dir (1,000 samples is enough)")
    ap.add_argument("--ids", type=int, help="a dry run of the control plane over N ids")
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--systems", default="lru,shade")
    ap.add_argument("--batch-size", type=int, default=256, help="per rank")
    ap.add_argument("--batches", type=int, default=40, help="global steps planned per epoch")
    ap.add_argument("--sync-every", type=int, default=1)
    ap.add_argument("--dim", type=int, default=16, help="SpiderCache's embeddings' width")
    args = ap.parse_args()
    if args.ids:
        return dry_run(args)
    if not args.data:
        ap.error("give --data (ranks that train) or --ids (a dry run of the plan)")
    rows = []
    for name, world in CASES:
        with tempfile.TemporaryDirectory() as tmp:
            records = run_ranks(world, args.data, SYSTEMS[name], Path(tmp))
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
