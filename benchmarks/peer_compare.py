"""hotset beside the loader users would pick instead (MosaicML Streaming), in one run, on
the same data behind the same wire.

Fashion-MNIST's first ``--samples`` training images (the same PNG bytes) are written as
hotset's WebDataset tar shards and as Streaming's MDS shards (``--shard-bytes``), both
uploaded to one S3-compatible server (moto's, on 127.0.0.1) that sits behind
``hotset.testing.DelayProxy``: ``--latency-ms`` of round trip and ``--bandwidth-mb-s``
shared by every connection, for hotset's s3fs reads and Streaming's boto3 downloads
alike. Each hotset system reads its tar shards by range with ``--concurrency`` requests
in flight on the node (the gap a range request reads through follows the latency hotset
measures, the wire's as its prior); Streaming runs in its own venv (``make peers``) with
``cache_limit`` = the same cache fraction of its shards, its shuffle block and
predownload as given. Both sides' shards hold about ``--shard-bytes`` (moto copies the
whole object for each range request, so the object size sets its cost per request). The
wire counts the HTTP requests and bytes of every epoch; ``cpu_s`` is the CPU seconds
per epoch of the loader's process tree (its workers included, the servers not).

No model trains: SHADE (``--systems shade``) learns from a fixed log-normal loss per
sample, so its rows show the I/O of its importance sampling, not its accuracy.

Memory is counted on both sides: hotset's cache plus its read-ahead hold ``--cache-
fraction`` of the dataset's bytes, as Streaming's ``cache_limit`` holds that fraction of
its shards, for every ``--readahead`` (a fraction of the dataset, one row each) up to
the cache fraction; a larger read-ahead leaves no cache and more memory than the peer's
(its row says so), to trace requests per epoch against read-ahead memory.

    make peers && python benchmarks/peer_compare.py [--latency-ms 2,20] [--epochs 3]

"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _cpu import cpu_seconds  # noqa: E402
from _report import report  # noqa: E402
from hotset.io.requests import CostModel  # noqa: E402
from hotset.loader import make_loader  # noqa: E402
from hotset.storage.prepare import (  # noqa: E402
    _IDX_FILES,
    FASHION_MNIST_DIR,
    png_bytes,
    prepare_fashion_mnist,
    read_idx,
)
from hotset.storage.tar import TarStorage  # noqa: E402
from hotset.testing import DelayProxy, S3Server  # noqa: E402

PEER_RUN = Path(__file__).resolve().parent / "peers" / "streaming_run.py"


def dump_samples(path: Path, n: int) -> tuple[int, float]:
    """The first ``n`` training images as PNG bytes and labels, for the MDS writer; returns
    how many, and their mean size."""
    images = read_idx(Path(FASHION_MNIST_DIR, _IDX_FILES["train"][0]))[:n]
    labels = read_idx(Path(FASHION_MNIST_DIR, _IDX_FILES["train"][1]))[:n]
    blobs = [png_bytes(img) for img in images]
    offsets = np.concatenate([[0], np.cumsum([len(b) for b in blobs])]).astype(np.int64)
    np.savez(path, blob=np.frombuffer(b"".join(blobs), np.uint8), offsets=offsets,
             labels=labels.astype(np.int64))  # fmt: skip
    return len(blobs), float(offsets[-1]) / max(len(blobs), 1)


def _delta(after: dict, before: dict) -> dict:
    return {k: after.get(k, 0) - before.get(k, 0) for k in after}


#: the systems by name, as ``hotset compare`` builds them (SHADE as its prototype repeats)
SYSTEMS = {
    "lru": {"policy": "lru"},
    "minio": {"policy": "minio"},
    # Streaming's shuffle (hotset's named option): shards in a random order, samples
    # shuffled within windows of --shuffle-block
    "lru-shards": {"policy": "lru", "sampler_options": {"shuffle": "shards"}},
    "shade": {"policy": "app", "sampler": "shade",
              "sampler_options": {"repetition_mode": "repeat"}},
}  # fmt: skip


def run_hotset(
    args, system: str, wire: DelayProxy, s3: S3Server, latency: float, ahead: float
) -> dict:
    options = {**s3.storage_options, "client_kwargs": {"endpoint_url": wire.url,
                                                       "region_name": "eu-west-1"}}  # fmt: skip
    storage = TarStorage(
        "s3://bench/tar", storage_options=options,
        concurrency=max(1, math.ceil(args.concurrency / args.workers)),
        cost=CostModel(latency, args.bandwidth_mb_s, args.concurrency),  # measured online
    )  # fmt: skip
    times, requests, nbytes, distinct, cpu = [], [], [], [], []
    servers = (wire.proc.pid, s3.proc.pid)  # not the loader's CPU
    memory = int(args.cache_fraction * storage.manifest.total_bytes)
    readahead = int(ahead * storage.manifest.total_bytes)
    # no model trains here: SHADE learns from a fixed loss per sample (log-normal, so a
    # few samples matter most, as a trained model's losses spread)
    losses = np.random.default_rng(0).lognormal(0.0, 1.0, len(storage))
    spec = dict(SYSTEMS[system])
    if spec.get("sampler_options", {}).get("shuffle") == "shards":
        spec["sampler_options"] = {**spec["sampler_options"], "shuffle_block": args.shuffle_block}
    with make_loader(
        storage, batch_size=args.batch_size, **spec,
        capacity_bytes=max(memory - readahead, 0),
        readahead_bytes=readahead, num_workers=args.workers, seed=0, persistent_workers=True,
    ) as loader:  # fmt: skip
        capacity = loader.planner.policy.capacity_bytes
        for epoch in range(args.epochs):
            loader.set_epoch(epoch)
            before, start, seen = wire.stats(), time.perf_counter(), set()
            cpu0 = cpu_seconds(os.getpid(), servers)
            for _, _, ids in loader:
                seen.update(ids.tolist())
                loader.feedback(ids, losses[ids.numpy()])
            times.append(time.perf_counter() - start)
            cpu.append(cpu_seconds(os.getpid(), servers) - cpu0)
            d = _delta(wire.stats(), before)
            requests.append(d["requests"])
            nbytes.append(d["bytes_down"])
            distinct.append(len(seen))
        c = loader.counters()
    row = _row(f"hotset {system}", latency, times, requests, nbytes, distinct, capacity,
               c["hit_ratio"], cpu)  # fmt: skip
    return {**row, "readahead_mb": readahead / 1e6,
            **{k: c[k] for k in ("readahead_served", "readahead_lost", "offered",
                                 "request_latency_ms", "merge_gap")}}  # fmt: skip


def run_streaming(args, wire: DelayProxy, s3: S3Server, latency: float, mds_bytes: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="streaming-local-") as local:  # its shard cache
        return _run_streaming(args, wire, latency, mds_bytes, local)


def _run_streaming(args, wire: DelayProxy, latency: float, mds_bytes: int, local: str) -> dict:
    capacity = int(args.cache_fraction * mds_bytes)
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
    times, requests, nbytes, distinct, cpu = [], [], [], [], []
    before = wire.stats()
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True) as proc:
        cpu0 = cpu_seconds(proc.pid)
        for line in proc.stdout:
            if not line.startswith("{"):
                continue
            epoch = json.loads(line)
            cpu1 = cpu_seconds(proc.pid)
            cpu.append(cpu1 - cpu0)
            cpu0 = cpu1
            after = wire.stats()
            d = _delta(after, before)
            before = after
            times.append(epoch["seconds"])
            requests.append(d["requests"])
            nbytes.append(d["bytes_down"])
            distinct.append(epoch["distinct"])
    if proc.returncode:
        raise SystemExit(f"streaming run failed ({proc.returncode}): {' '.join(cmd)}")
    return _row("streaming", latency, times, requests, nbytes, distinct, capacity, float("nan"),
                cpu)  # fmt: skip


def _row(name, latency, times, requests, nbytes, distinct, capacity, hit, cpu) -> dict:
    steady = slice(1, None) if len(times) > 1 else slice(None)
    return {
        "loader": name, "latency_ms": latency,
        "epoch_s": float(np.mean(times[steady])), "first_epoch_s": times[0],
        "requests": float(np.mean(requests[steady])), "mb": float(np.mean(nbytes[steady])) / 1e6,
        "distinct": float(np.mean(distinct[steady])), "cache_mb": capacity / 1e6,
        "hit_ratio": hit, "readahead_mb": 0.0, "epoch_times_s": times,
        "cpu_s": float(np.mean(cpu[steady])), "epoch_cpu_s": cpu,
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=20000)
    ap.add_argument("--systems", default="lru,minio")
    ap.add_argument("--latency-ms", default="2,20")
    ap.add_argument("--bandwidth-mb-s", type=float, default=100.0)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--cache-fraction", type=float, default=0.2)
    ap.add_argument("--readahead", default="0,0.1,0.2",
                    help="read-ahead memory as fractions of the dataset, one row each")
    ap.add_argument("--shard-bytes", type=int, default=256 << 10)
    ap.add_argument("--shuffle-block", type=int, default=2048)
    ap.add_argument("--predownload", type=int, default=128)
    ap.add_argument("--peer-python", default=".venv-peers/bin/python")
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
        mds_bytes = sum(p.stat().st_size for p in (root / "mds").glob("shard.*.mds"))
        s3 = S3Server()
        try:
            s3.upload(root / "tar" / "train", "s3://bench/tar")
            s3.upload(root / "mds", "s3://bench/mds")
            for latency in [float(x) for x in args.latency_ms.split(",")]:
                wire = DelayProxy(int(s3.endpoint.rsplit(":", 1)[1]), latency,
                                  args.bandwidth_mb_s)  # fmt: skip
                try:
                    for system in args.systems.split(","):
                        for ahead in [float(x) for x in args.readahead.split(",")]:
                            rows.append(run_hotset(args, system, wire, s3, latency, ahead))
                            print(json.dumps(rows[-1]), flush=True)
                    rows.append(run_streaming(args, wire, s3, latency, mds_bytes))
                    print(json.dumps(rows[-1]), flush=True)
                finally:
                    wire.stop()
        finally:
            s3.stop()
    cols = [
        ("loader", "s"), ("latency_ms", ".0f"), ("epoch_s", ".2f"), ("first_epoch_s", ".2f"),
        ("cpu_s", ".1f"),
        ("requests", ".0f"), ("mb", ".1f"), ("distinct", ".0f"), ("cache_mb", ".2f"),
        ("readahead_mb", ".2f"), ("hit_ratio", ".3f"),
    ]  # fmt: skip
    report(args.name, rows, cols, {"args": vars(args), "samples": n})


if __name__ == "__main__":
    main()
