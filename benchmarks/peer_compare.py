"""hotset beside the loader users would pick instead (MosaicML Streaming), in one run, on
the same data behind the same wire, with the peer tuned as its users tune it.

Fashion-MNIST's first ``--samples`` training images (the same PNG bytes) are written as
hotset's WebDataset tar shards and as Streaming's MDS shards (``--shard-bytes``), both
uploaded to one S3-compatible server (moto's, on 127.0.0.1) that sits behind
``hotset.testing.DelayProxy``: ``--latency-ms`` of round trip and ``--bandwidth-mb-s``
shared by every connection (one link), for hotset's s3fs reads and Streaming's boto3
downloads alike. Each hotset system reads its tar shards by range with ``--concurrency``
requests in flight on the node (``--slots node``: the workers share them,
``TarStorage(node_concurrency=)``; ``worker``: ``concurrency / workers`` each; the gap a range
request reads through follows the latency hotset measures, the wire's as its prior), in
each ``--orders`` (``paper``: the system's own order; ``blocks``: the same draw read by
blocks of ``--shuffle-block`` ids, ``make_loader(order="blocks")``).

Memory is equal: hotset's cache plus its read-ahead (``--readahead`` of the dataset's
bytes; a row for each share listed) hold ``--memory`` of the dataset's bytes, Streaming's
``cache_limit`` holds that share of its shards' bytes. The split matters: a uniform
sampler's cache hits about its share of the data, where read-ahead saves requests.
Streaming is tuned as its docs and users tune it: shards of about hotset's size,
``predownload`` and ``shuffle_block_size`` as given (2048 ids, 128 predownloaded a
worker), the cache as large as hotset's memory. A tuned Streaming reads
each shard about once an epoch: its requests per shard per epoch are printed beside its
time (``req_per_shard``: GETs, as each download is a HEAD and a GET), and where they
exceed ``MAX_PEER_READS`` the run says the peer thrashed and reports no ratio against it
(``ratio`` is NaN).

The loaders run interleaved (every hotset row, then Streaming) ``--repeats`` times at each
latency; ``epoch_s`` is the mean of the steady epochs (all but the first), ``ratio`` a
row's over Streaming's of the same repetition. The wire counts the HTTP requests and
bytes of every epoch; ``cpu_s`` is the CPU seconds per epoch of the loader's process tree
(its workers included, the servers not), ``server_cpu_s`` the servers' (the wire's and
the object store's, on the same cores: each request costs them CPU). ``mb`` beside
``shard_mb`` (the shards' bytes, what one read of each costs): bytes on the wire per epoch.

``--disk F``: a local-disk cache of ``F`` of the data beside the memory: hotset's disk
tier (``make_loader(disk_dir=)``, a fresh one each run, its budget counting its index)
and Streaming's ``cache_limit`` of ``F`` (its ``local`` directory, on the same disk).

No model trains: SHADE (``--systems shade``) learns from a fixed log-normal loss per
sample, so its rows show the I/O of its importance sampling, not its accuracy.

    make peers && python benchmarks/peer_compare.py [--latency-ms 2,20] [--epochs 3]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _cpu import cpu_seconds  # noqa: E402
from _report import report  # noqa: E402
from hotset.build import make_loader  # noqa: E402
from hotset.compare_peers import (
    MAX_PEER_READS,  # noqa: E402
    write_samples,  # noqa: E402
)
from hotset.compare_peers import RUNNER as PEER_RUN  # noqa: E402
from hotset.io.requests import CostModel  # noqa: E402
from hotset.storage.prepare import (  # noqa: E402
    _IDX_FILES,
    FASHION_MNIST_DIR,
    png_bytes,
    prepare_fashion_mnist,
    read_idx,
)
from hotset.storage.tar import TarStorage  # noqa: E402
from hotset.testing import DelayProxy, S3Server  # noqa: E402


def dump_samples(path: Path, n: int) -> tuple[int, float]:
    """The first ``n`` training images as PNG bytes and labels, for the MDS writer; returns
    how many, and their mean size."""
    images = read_idx(Path(FASHION_MNIST_DIR, _IDX_FILES["train"][0]))[:n]
    labels = read_idx(Path(FASHION_MNIST_DIR, _IDX_FILES["train"][1]))[:n]
    blobs = [png_bytes(img) for img in images]
    return len(blobs), write_samples(path, blobs, labels) / max(len(blobs), 1)


def _delta(after: dict, before: dict) -> dict:
    return {k: after.get(k, 0) - before.get(k, 0) for k in after}


#: the systems by name, as ``hotset compare`` builds them (SHADE as its prototype repeats)
SYSTEMS = {
    "lru": {"policy": "lru"},
    "minio": {"policy": "minio"},
    "shade": {"policy": "app", "sampler": "shade",
              "sampler_options": {"repetition_mode": "repeat"}},
}  # fmt: skip




def run_hotset(
    args, system: str, order: str, slots: str, share: float, wire: DelayProxy, s3: S3Server,
    latency: float,
) -> dict:  # fmt: skip
    options = {**s3.storage_options, "client_kwargs": {"endpoint_url": wire.url,
                                                       "region_name": "eu-west-1"}}  # fmt: skip
    node = slots == "node"  # the node's slots shared by the workers, or a share each
    each = max(1, math.ceil(args.concurrency / args.workers))
    storage = TarStorage(
        "s3://bench/tar", storage_options=options,
        concurrency=args.concurrency if node else each,
        node_concurrency=args.concurrency if node else None,
        cost=CostModel(latency, args.bandwidth_mb_s, args.concurrency),  # measured online
    )  # fmt: skip
    times, requests, gets, nbytes, distinct, cpu, served = [], [], [], [], [], [], []
    servers = (wire.proc.pid, s3.proc.pid)  # not the loader's CPU
    memory = int(args.memory * storage.manifest.total_bytes)
    readahead = min(int(share * storage.manifest.total_bytes), memory)
    # no model trains here: SHADE learns from a fixed loss per sample (log-normal, so a
    # few samples matter most, as a trained model's losses spread)
    losses = np.random.default_rng(0).lognormal(0.0, 1.0, len(storage))
    disk = {}
    if args.disk:  # a fresh disk tier for each run, on the disk Streaming's local dir is on
        disk = {"disk_dir": tempfile.mkdtemp(prefix="hotset-disk-"),
                "disk_bytes": int(args.disk * storage.manifest.total_bytes * 1.5) + (8 << 20)}
    with make_loader(
        storage, batch_size=args.batch_size, **SYSTEMS[system],
        capacity_bytes=memory - readahead, readahead_bytes=readahead,
        order=order, block_size=args.shuffle_block,
        num_workers=args.workers, seed=0, persistent_workers=True, **disk,
    ) as loader:  # fmt: skip
        capacity = loader.planner.policy.capacity_bytes
        for epoch in range(args.epochs):
            loader.set_epoch(epoch)
            before, start, seen = wire.stats(), time.perf_counter(), set()
            cpu0, srv0 = cpu_seconds(os.getpid(), servers), server_cpu(servers)
            for _, _, ids in loader:
                seen.update(ids.tolist())
                loader.feedback(ids, losses[ids.numpy()])
            times.append(time.perf_counter() - start)
            cpu.append(cpu_seconds(os.getpid(), servers) - cpu0)
            served.append(server_cpu(servers) - srv0)
            d = _delta(wire.stats(), before)
            requests.append(d["requests"])
            gets.append(d["gets"])
            nbytes.append(d["bytes_down"])
            distinct.append(len(seen))
        c = loader.counters()
    if disk:
        shutil.rmtree(disk["disk_dir"], ignore_errors=True)
    name = (f"hotset {system} {order}, read-ahead {share:.0%}"
            + ("" if node else ", a slot per worker")
            + (f", disk tier {args.disk:.0%}" if disk else ""))  # fmt: skip
    row = _row(name, latency, times, requests, gets, nbytes, distinct,
               capacity, c["hit_ratio"], cpu, served)  # fmt: skip
    shards = int(storage.extents[0].max()) + 1
    return {**row, "readahead_mb": readahead / 1e6, "shards": shards,
            "shard_mb": args.tar_bytes / 1e6,
            **{k: c["internal"][k] for k in ("readahead_served", "readahead_lost", "offered",
                                 "request_latency_ms", "merge_gap")}}  # fmt: skip


def server_cpu(servers: tuple[int, ...]) -> float:
    """CPU seconds of the benchmark's servers (the wire and the object store): on a small
    machine they share its cores with the loader, and each request costs them CPU."""
    return sum(cpu_seconds(pid) for pid in servers)


def run_streaming(
    args, wire: DelayProxy, s3: S3Server, latency: float, mds: tuple[int, int]
) -> dict:
    with tempfile.TemporaryDirectory(prefix="streaming-local-") as local:  # its shard cache
        return _run_streaming(args, wire, s3, latency, mds, local)


def _run_streaming(
    args, wire: DelayProxy, s3: S3Server, latency: float, mds: tuple, local: str
) -> dict:
    mds_bytes, shards = mds
    capacity = int((args.disk or args.memory) * mds_bytes)
    env = {
        **os.environ, "S3_ENDPOINT_URL": wire.url, "AWS_ACCESS_KEY_ID": "hotset",
        "AWS_SECRET_ACCESS_KEY": "hotset-secret", "AWS_DEFAULT_REGION": "eu-west-1",
    }  # fmt: skip
    cmd = [
        args.peer_python, str(PEER_RUN), "epochs", "s3://bench/mds", "--local", local,
        "--cache-limit", str(capacity), "--epochs", str(args.epochs),
        "--workers", str(args.workers), "--batch-size", str(args.batch_size),
        "--shuffle-block", str(args.shuffle_block), "--predownload", str(args.predownload),
    ]  # fmt: skip
    times, requests, gets, nbytes, distinct, cpu, served = [], [], [], [], [], [], []
    servers = (wire.proc.pid, s3.proc.pid)
    before, srv0 = wire.stats(), server_cpu(servers)
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True) as proc:
        cpu0 = cpu_seconds(proc.pid)
        for line in proc.stdout:
            if not line.startswith("{"):
                continue
            epoch = json.loads(line)
            cpu1 = cpu_seconds(proc.pid)
            cpu.append(cpu1 - cpu0)
            cpu0 = cpu1
            srv1 = server_cpu(servers)
            served.append(srv1 - srv0)
            srv0 = srv1
            after = wire.stats()
            d = _delta(after, before)
            before = after
            times.append(epoch["seconds"])
            requests.append(d["requests"])
            gets.append(d["gets"])
            nbytes.append(d["bytes_down"])
            distinct.append(epoch["distinct"])
    if proc.returncode:
        raise SystemExit(f"streaming run failed ({proc.returncode}): {' '.join(cmd)}")
    row = _row("streaming", latency, times, requests, gets, nbytes, distinct, capacity,
               float("nan"), cpu, served)  # fmt: skip
    per_shard = row["gets"] / shards  # a download is a HEAD and a GET
    if per_shard > MAX_PEER_READS:
        print(f"streaming read each shard {per_shard:.1f} times an epoch (a tuned one reads it "
              f"about once): its cache_limit of {capacity} B thrashes; no ratio is reported "
              "against it", file=sys.stderr)  # fmt: skip
    return {**row, "shards": shards, "shard_mb": mds_bytes / 1e6, "req_per_shard": per_shard,
            "tuned": per_shard <= MAX_PEER_READS}


def _row(name, latency, times, requests, gets, nbytes, distinct, capacity, hit, cpu,
         served) -> dict:  # fmt: skip
    steady = slice(1, None) if len(times) > 1 else slice(None)
    return {
        "loader": name, "latency_ms": latency,
        "epoch_s": float(np.mean(times[steady])), "first_epoch_s": times[0],
        "requests": float(np.mean(requests[steady])), "gets": float(np.mean(gets[steady])),
        "mb": float(np.mean(nbytes[steady])) / 1e6,
        "distinct": float(np.mean(distinct[steady])), "cache_mb": capacity / 1e6,
        "hit_ratio": hit, "readahead_mb": 0.0, "epoch_times_s": times, "ratio": float("nan"),
        "cpu_s": float(np.mean(cpu[steady])), "epoch_cpu_s": cpu,
        "server_cpu_s": float(np.mean(served[steady])),
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=20000)
    ap.add_argument("--systems", default="lru,minio,shade")
    ap.add_argument("--latency-ms", default="2,20")
    ap.add_argument("--bandwidth-mb-s", type=float, default=100.0)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--memory", type=float, default=0.2,
                    help="hotset's cache + read-ahead = Streaming's cache_limit, a share of "
                    "the dataset's bytes")
    ap.add_argument("--readahead", default="0.1,0.18",
                    help="hotset's read-ahead, a share of the dataset's bytes (of --memory, "
                    "the rest its cache); a list: a row for each")
    ap.add_argument("--orders", default="paper,blocks")
    ap.add_argument("--slots", default="node",
                    help="node: the --concurrency slots shared by hotset's workers "
                    "(node_concurrency); worker: concurrency / workers each; or both")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--shard-bytes", type=int, default=256 << 10)
    ap.add_argument("--shuffle-block", type=int, default=2048)
    ap.add_argument("--predownload", type=int, default=128)
    ap.add_argument("--peer-python", default=".venv-peers/bin/python")
    ap.add_argument("--disk", type=float, default=0.0,
                    help="a local-disk cache of this share of the dataset's bytes: hotset's "
                    "disk tier (disk_dir, each run's fresh) and Streaming's cache_limit (its "
                    "local dir on the same disk); 0: none (memory alone)")
    ap.add_argument("--name", default="peer_compare")
    args = ap.parse_args()
    if not Path(args.peer_python).exists():
        raise SystemExit(f"{args.peer_python} missing: run `make peers` first")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        os.environ.setdefault("HOTSET_CACHE_DIR", str(root / "index"))
        n, png = dump_samples(root / "samples.npz", args.samples)
        # tar shards of the MDS shards' bytes (moto copies a whole object per request)
        per = 3 * 512 + 512 * math.ceil(png / 512)  # headers, the PNG and the cls, padded
        prepare_fashion_mnist(str(root / "tar"), limit=args.samples, fmt="tar",
                              shard_size=max(1, args.shard_bytes // per))  # fmt: skip
        subprocess.run([args.peer_python, str(PEER_RUN), "write", str(root / "samples.npz"),
                        str(root / "mds"), "--shard-bytes", str(args.shard_bytes)],
                       check=True)  # fmt: skip
        args.tar_bytes = sum(p.stat().st_size for p in (root / "tar" / "train").glob("*.tar"))
        mds_files = list((root / "mds").glob("shard.*.mds"))
        mds = (sum(p.stat().st_size for p in mds_files), len(mds_files))
        s3 = S3Server()
        try:
            s3.upload(root / "tar" / "train", "s3://bench/tar")
            s3.upload(root / "mds", "s3://bench/mds")
            for latency in [float(x) for x in args.latency_ms.split(",")]:
                wire = DelayProxy(int(s3.endpoint.rsplit(":", 1)[1]), latency,
                                  args.bandwidth_mb_s)  # fmt: skip
                try:
                    for repeat in range(args.repeats):  # interleaved: hotset's rows, the peer
                        mine = [run_hotset(args, system, order, slots, float(share), wire, s3,
                                           latency)
                                for system in args.systems.split(",")
                                for order in args.orders.split(",")
                                for share in args.readahead.split(",")
                                for slots in args.slots.split(",")]  # fmt: skip
                        peer = run_streaming(args, wire, s3, latency, mds)
                        for row in [*mine, peer]:
                            if peer["tuned"]:
                                row["ratio"] = row["epoch_s"] / peer["epoch_s"]
                            row["repeat"] = repeat
                            rows.append(row)
                            print(json.dumps(row), flush=True)
                finally:
                    wire.stop()
        finally:
            s3.stop()
    for row in rows:
        row.setdefault("req_per_shard", row["gets"] / row["shards"])
    cols = [
        ("loader", "s"), ("latency_ms", ".0f"), ("repeat", "d"), ("epoch_s", ".2f"),
        ("ratio", ".2f"), ("first_epoch_s", ".2f"), ("cpu_s", ".1f"), ("server_cpu_s", ".1f"),
        ("requests", ".0f"),
        ("gets", ".0f"), ("shards", "d"), ("req_per_shard", ".1f"), ("mb", ".1f"),
        ("shard_mb", ".1f"), ("distinct", ".0f"), ("cache_mb", ".2f"), ("readahead_mb", ".2f"),
        ("hit_ratio", ".3f"),
    ]  # fmt: skip
    report(args.name, rows, cols, {"args": vars(args), "samples": n})


if __name__ == "__main__":
    main()
