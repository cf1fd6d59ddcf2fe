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

``--planner node`` plans with one planner process for the node's ranks
(``make_loader(planner_process="node")``), ``--planner process`` with one per rank; the
node's control plane (``node_GB``) is then what every process of it added: the ranks'
proportional memory (PSS) since before the plan was made, and the planner processes'.
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


def _pss(pid: int | str = "self") -> int:
    """A process's proportional set size (shared pages split among their processes)."""
    with open(f"/proc/{pid}/smaps_rollup") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("Pss:"))


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
    from hotset.plan_process import PlannerProcess
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
    base, pss0 = _rss(), _pss()
    manifest = Manifest.map_columns(columns)
    n = len(manifest)
    opts = dict(sysdef.sampler_options)
    if sysdef.sampler == "spider":
        opts.update(labels=manifest.labels, total_epochs=10)
    sent: list[int] = []

    def build(ranks):
        gather = ranks.all_gather

        def counted(obj, call="all_gather"):
            sent.append(len(pickle.dumps(obj)))
            return gather(obj, call=call)

        ranks.all_gather = counted
        policy = make_policy(sysdef.policy, int(0.1 * manifest.total_bytes), sizes=manifest.sizes)
        sampler = make_sampler(sysdef.sampler, n, seed=0, **opts)
        # a store makes the planner track plans in flight and exchange the reports, as
        # under a loader (nothing is written: the reports say each admission landed)
        return Planner(sampler, policy, args.batch_size, feed_future=False, ranks=ranks,
                       store=MemoryStore(1), sync_every=args.sync_every)  # fmt: skip

    if args.planner == "rank":
        planner = build(RankGroup())
    else:  # (its collectives, and their bytes, are the planner process's)
        planner = PlannerProcess(build, None, RankGroup(), per_node=args.planner == "node")

    def counters() -> dict:
        """The planner's, and SpiderCache's graph seconds where it runs in this process."""
        graph_s = getattr(getattr(planner, "sampler", None), "graph_s", 0.0)
        return {**planner.counters(), "graph_s": graph_s}
    centers = np.random.default_rng(1).normal(size=(CLASSES, args.dim)).astype(np.float32)
    starts = []
    for epoch in range(2):
        t0 = time.perf_counter()
        planner.set_epoch(epoch)
        it = iter(planner)
        for k, plan in zip(range(args.batches), it, strict=False):
            if k == 0:
                starts.append(time.perf_counter() - t0)
                c0, sent0 = counters(), len(sent)
            emb = embeddings_of(plan.ids, manifest.labels, centers) \
                if planner.wants_embeddings else None
            planner.feedback(plan.ids, losses_of(plan.ids, epoch + k / args.batches), emb)
            planner.batch_consumed(PlanReport(stored=plan.admitted))
        it.close()
        planner.flush()
        wall = time.perf_counter() - t0 - starts[-1]
    steps = args.batches - 1  # the second epoch's, after its start
    mem, c = _rss(), counters()
    proc = getattr(planner, "_proc", None)
    record = {
        "system": system, "ranks": world, "ids": n, "rank": rank,
        "epoch_start_ms": 1e3 * starts[-1],
        "step_ms": 1e3 * wall / steps,  # a step's wall time, all of it (this loop's)
        **{f"{k}_ms_per_step": 1e3 * (c.get(f"{k}_s", 0) - c0.get(f"{k}_s", 0)) / steps
           for k in ("planning", "sync", "feedback", "graph")},  # fmt: skip
        "collectives_per_step": (c["sync_calls"] - c0["sync_calls"]) / steps,
        "bytes_per_collective": float(np.mean(sent[sent0:])) if sent[sent0:] else 0.0,
        "private_B_per_id": (mem["RssAnon"] - base["RssAnon"]) / n,
        "mapped_MB": (mem["RssFile"] - base["RssFile"]) / 1e6,
        "compiled_MB": (base["RssAnon"] - before["RssAnon"]) / 1e6,
        # what this rank and its planner process (if it has one) added to the node
        "added_GB": (_pss() - pss0 + (_pss(proc.pid) if proc is not None else 0)) / 1e9,
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
        row["system"], row["planner"] = system, args.planner
        row["least_private_B_per_id"] = min(r["private_B_per_id"] for r in recs)  # the best
        row["node_GB"] = sum(r["added_GB"] for r in recs)
        rows.append(row)
        print(f"  {system} done", file=sys.stderr)
    report("distributed_dry_run", rows, [
        ("system", "s"), ("planner", "s"), ("ranks", "d"), ("ids", ",d"),
        ("epoch_start_ms", ".0f"),
        ("step_ms", ".0f"),
        ("planning_ms_per_step", ".1f"), ("sync_ms_per_step", ".1f"),
        ("feedback_ms_per_step", ".1f"), ("graph_ms_per_step", ".1f"),
        ("collectives_per_step", ".2f"), ("bytes_per_collective", ",.0f"),
        ("private_B_per_id", ".0f"), ("least_private_B_per_id", ".0f"), ("compiled_MB", ".0f"),
        ("node_GB", ".2f"),
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
    ap.add_argument("--planner", choices=("rank", "process", "node"), default="rank",
                    help="a dry run's planners: in each rank, a process per rank, one per node")
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
