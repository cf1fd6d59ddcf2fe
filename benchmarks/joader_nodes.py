"""JOADER for jobs whose ranks span nodes: one ``hotset serve`` whose store is pooled in
Redis (``--store-url``), jobs of ``--nodes`` x ``--ranks`` ranks (gloo; each node a
torchrun ``GROUP_RANK``), every rank reading its own emulated link to the source (each
node its own: ``--latency-ms`` a request, ``--bandwidth`` MB/s), a model step of
``--step-ms`` per batch (a sleep: the GPU's share of a step).

Cases, interleaved ``--reps`` times: ``one job`` alone, then ``two jobs`` on the same
samples, started together (a sweep's). Reported per case: the source reads of all jobs
(``reads``) and against one job's in the same repetition (``reads_vs_one``: JOADER's
promise is about 1.0x: one read serves both jobs), whether each job read each sample
once an epoch, its ranks disjoint (``exact``), the hits, and the share of hits a worker
waited for while another job fetched them (``waited_share``: ``waited_hits`` / hits) and
of planned hits read from the source after all (``late_share``). On 2 cores, 8 ranks and
their workers starve and the jobs drift apart: ``--ranks 1`` there.

    python benchmarks/joader_nodes.py --data data/fashion-mnist-12k/train [--samples 2000]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import report  # noqa: E402


def _rank(job: str, rank: int, world: int, per_node: int, init: str, address: str,
          args: dict, out: str) -> None:  # fmt: skip
    import torch
    import torch.distributed as dist

    import hotset
    from hotset.storage import FileStorage
    from hotset.storage.subset import SubsetStorage
    from hotset.storage.throttled import ThrottledStorage

    os.environ["GROUP_RANK"] = str(rank // per_node)  # the node, as torchrun names it
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    files = FileStorage(args["data"])
    storage = ThrottledStorage(
        SubsetStorage(files, np.arange(min(args["samples"], len(files)))),
        latency_ms=args["latency_ms"], bandwidth_mb_s=args["bandwidth"], concurrency=8,
    )  # fmt: skip
    client = hotset.connect(address, timeout_s=60)
    loader = client.make_loader(storage, batch_size=args["batch_size"], num_workers=2, name=job)
    Path(out, f"ready-{job}-{rank}").touch()  # the jobs start together, as a sweep's
    while len(list(Path(out).glob("ready-*"))) < args["procs"]:
        time.sleep(0.05)
    epochs = []
    for epoch in range(args["epochs"]):
        loader.set_epoch(epoch)
        seen = []
        for _, _, ids in loader:
            time.sleep(args["step_ms"] / 1e3)  # the model's step
            seen += ids.tolist()
            loader.feedback(ids, torch.ones(len(ids)))
        epochs.append(seen)
    c = loader.counters()
    Path(out, f"{job}-{rank}.json").write_text(json.dumps({
        "epochs": epochs, "reads": c["storage_reads"], "hits": c["hits"],
        "late": c["late_misses"], "waited": c["internal"]["waited_hits"],
    }))  # fmt: skip
    dist.barrier()
    loader.close()
    dist.destroy_process_group()


def run_case(jobs: list[str], args: argparse.Namespace, tmp: Path) -> dict:
    """``jobs`` at once on a fresh Redis and service; what they read and served."""
    from hotset.service.server import start_service
    from hotset.testing import RedisServer, run_processes

    redis = RedisServer(tmp)
    redis.start()
    address = f"ipc://{tmp}/svc.sock"
    n = args.samples
    service = start_service(address, capacity_bytes=int(args.cache_bytes), store_url=redis.url)
    world = args.nodes * args.ranks
    args.procs = world * len(jobs)
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank, args=(job, r, world, args.ranks, f"file://{tmp}/pg-{job}",
                                             address, vars(args), str(tmp)))
             for job in jobs for r in range(world)]  # fmt: skip
    start = time.perf_counter()
    try:
        codes = run_processes(procs, 1200)
        if any(codes):
            raise SystemExit(f"a rank failed: exit codes {codes}")
    finally:
        service.terminate()
        service.join(10)
        redis.shutdown()
    took = time.perf_counter() - start
    recs = {(j, r): json.loads((tmp / f"{j}-{r}.json").read_text())
            for j in jobs for r in range(world)}  # fmt: skip
    exact = all(
        sorted(sum((recs[j, r]["epochs"][e] for r in range(world)), [])) == list(range(n))
        for j in jobs for e in range(args.epochs)
    )  # fmt: skip
    total = {k: sum(rec[k] for rec in recs.values()) for k in ("reads", "hits", "late", "waited")}
    return {"jobs": len(jobs), "seconds": took, "exact": "yes" if exact else "NO", **total,
            "waited_share": total["waited"] / max(1, total["hits"]),
            "late_share": total["late"] / max(1, total["hits"])}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="data/fashion-mnist-12k/train")
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--ranks", type=int, default=2, help="ranks per node")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=25, help="per rank")
    ap.add_argument("--cache", type=float, default=0.2, help="share of the samples' bytes")
    ap.add_argument("--latency-ms", type=float, default=20.0)
    ap.add_argument("--bandwidth", type=float, default=100.0, help="MB/s, each node's link")
    ap.add_argument("--step-ms", type=float, default=50.0)
    ap.add_argument("--reps", type=int, default=2)
    args = ap.parse_args()
    from hotset.storage import FileStorage

    files = FileStorage(args.data)
    args.samples = min(args.samples, len(files))
    args.cache_bytes = args.cache * float(files.manifest.sizes[: args.samples].sum())
    rows = []
    for rep in range(args.reps):  # interleaved: each repetition runs both cases
        one = None
        for jobs in (["a"], ["a", "b"]):
            with tempfile.TemporaryDirectory(prefix="hotset-joader-") as tmp:
                r = run_case(jobs, args, Path(tmp))
            one = r["reads"] if one is None else one
            rows.append({"case": "one job" if len(jobs) == 1 else "two jobs", "rep": rep,
                         **r, "reads_vs_one": r["reads"] / max(1, one)})  # fmt: skip
            print(f"  rep {rep}: {rows[-1]['case']} done", file=sys.stderr)
    report(
        "joader_nodes", rows,
        [("case", "s"), ("rep", "d"), ("seconds", ".1f"), ("exact", "s"), ("reads", ",d"),
         ("reads_vs_one", ".2f"), ("hits", ",d"), ("waited_share", ".3f"),
         ("late_share", ".3f")],
        meta={k: v for k, v in vars(args).items()},
    )  # fmt: skip


if __name__ == "__main__":
    main()
