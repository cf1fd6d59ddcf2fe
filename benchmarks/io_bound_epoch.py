"""Epoch time where it is decided on a GPU: by storage reads. The real loader (real bytes
from the prepared dataset, DataLoader workers, storage throttled to ``--latency-ms`` per
read with ``--concurrency`` in flight and ``--bandwidth-mb-s`` per stream, the LMDB store)
for every system, driven by a recorded oracle instead of a model: each batch's losses
(and embeddings, for SpiderCache) are the ones the recorded run had for those samples at
that point of training, so the samplers and caches decide as in the real run, and no
model step competes with the loader for the two CPU cores. Epoch-time ratios against
uniform + LRU are set beside the ones measured on an H100 (issue 13's table).

The oracle: ``hotset record --model resnet18 --device cuda --epochs 5 --embedding-dims 64``
on a GPU (``--oracle``, default ``data/oracles/resnet18_gpu.npz``); a system written
``spider:tiny`` replays ``--tiny-oracle`` (``hotset record --model tiny``). Where an
oracle file is missing it is recorded here on the CPU with the tiny model (that run's
figures are then TinyCNN's, and the table says so).

``--storage http`` (or ``s3``) reads the same samples over a real network instead of
through ``ThrottledStorage``'s sleeps: nginx (or an S3 server, s3rver or moto's) on
127.0.0.1 behind a TCP proxy whose wire has ``--latency-ms`` of round trip and
``--bandwidth-mb-s`` (``hotset.testing.DelayProxy``: this kernel has no ``tc netem``),
each worker reading with ``concurrency / num_workers`` requests in flight, so that the
node has ``--concurrency``.
``cpu_s``: CPU seconds per epoch of the loader's process tree (workers included);
``server_cpu_s``: the server's and the wire's, on the same cores. ``emulated:MS`` charges
the client's CPU as well, ``MS`` per request burnt in the reading thread (an S3 client's
signing and parsing: ``ThrottledStorage(client_cpu_ms=)``), beside the sleep.

Time to a target accuracy without a GPU (``--accuracy compare.json``): each system's test
accuracy after every epoch comes from a real training run (``hotset compare --epochs N
--seeds ... --json compare.json``, any device), its epoch times from this benchmark; a
system reaches the target after the same number of epochs as in that run, and its time to
target is the sum of its I/O-bound epoch times up to there (per seed, then mean +- spread).
The system ``memory`` is uniform shuffling over unthrottled storage with no cache: the
in-memory floor.

    python benchmarks/io_bound_epoch.py [--cache-fractions 0.2,0.1] [--epochs 5]
    python benchmarks/io_bound_epoch.py --storage emulated,http --systems lru,minio,shade
    python benchmarks/io_bound_epoch.py --epochs 10 --oracle ORACLE.npz \
        --systems memory,lru,minio,shade,icache,spider --accuracy compare.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _cpu import cpu_seconds  # noqa: E402
from _report import report  # noqa: E402
from hotset.build import make_loader  # noqa: E402
from hotset.cli import parse_options  # noqa: E402
from hotset.codecs import decode_sample  # noqa: E402
from hotset.compare import (  # noqa: E402
    IMAGE_SIZE,
    IN_MEMORY,
    accuracy_target,
    record_oracle,
    split_train,
)
from hotset.policy import POLICIES  # noqa: E402
from hotset.sampling import SAMPLERS  # noqa: E402
from hotset.sim.oracle import LossOracle  # noqa: E402
from hotset.storage import FileStorage, SubsetStorage, ThrottledStorage  # noqa: E402
from hotset.systems import resolve_system  # noqa: E402

#: (epoch s, hit ratio) on an H100, ResNet-18, Fashion-MNIST, 2 ms x 8 in flight, 8 workers:
#: "issue": issue 13's table (60,000 samples; the code before calibration and repetition);
#: "h100-ec118e8": that commit's `hotset compare ... --model resnet18 --device cuda`,
#: 55,000 samples, epochs 3-5 (hit ratio: epochs 2-5), the systems' older defaults;
#: "h100-compare": the same on that commit (the papers' defaults), means of the seeds in
#: benchmarks/reference/h100-compare.json (usable as ``--accuracy``)
GPU_REFERENCE = {
    "issue": {
        ("lru", 0.2): (15.66, 0.022), ("minio", 0.2): (12.87, 0.200),
        ("shade", 0.2): (10.17, 0.385), ("icache", 0.2): (9.95, 0.319),
        ("spider", 0.2): (13.22, 0.178), ("spider:tiny", 0.2): (8.64, 0.476),
        ("lru", 0.1): (15.91, None), ("shade", 0.1): (12.80, 0.20), ("spider", 0.1): (14.65, 0.09),
    },
    "h100-ec118e8": {
        ("lru", 0.2): (14.55, 0.022), ("minio", 0.2): (11.86, 0.200),
        ("shade", 0.2): (7.40, 0.510), ("icache", 0.2): (10.21, 0.305),
        ("spider", 0.2): (9.59, 0.352), ("spider:tiny", 0.2): (11.18, 0.281),
        ("lru", 0.1): (14.68, 0.005), ("shade", 0.1): (11.61, 0.220),
        ("spider", 0.1): (11.95, 0.221),
    },
    "h100-compare": {
        ("lru", 0.2): (14.22, 0.022), ("minio", 0.2): (11.68, 0.200),
        ("shade", 0.2): (8.38, 0.612), ("icache", 0.2): (8.20, 0.417),
        ("spider", 0.2): (13.14, 0.199),
    },
}  # fmt: skip


def lru_row(rows: list[dict], r: dict) -> dict | None:
    """Uniform + LRU's row at ``r``'s cache size and storage: what ratios are against."""
    return next((b for b in rows if b["system"] == "lru" and b["cache"] == r["cache"]
                 and b.get("storage") == r.get("storage")), None)  # fmt: skip


def speedups(rows: list[dict], reference: str) -> None:
    """Each row's speed-up over uniform+LRU here and in the ``reference`` GPU run."""
    gpu = GPU_REFERENCE[reference]
    for r in rows:
        base = lru_row(rows, r)
        ref, ref_base = gpu.get((r["system"], r["cache"])), gpu.get(("lru", r["cache"]))
        r["speedup"] = base["epoch_s"] / r["epoch_s"] if base else float("nan")
        r["gpu_speedup"] = ref_base[0] / ref[0] if ref and ref_base else float("nan")
        r["gpu_hit"] = ref[1] if ref and ref[1] is not None else float("nan")
        r["vs_gpu_pct"] = 100 * (r["speedup"] / r["gpu_speedup"] - 1)


def add_time_to_target(rows: list[dict], path: str, target: float | None) -> dict:
    """Each row's time to the target accuracy: the epochs a real training run of the same
    system (``hotset compare --json``, rows of ``test_accuracy_per_epoch``) needed, timed
    with this benchmark's epochs; mean and spread over that run's seeds."""
    runs = json.loads(Path(path).read_text())
    runs = runs["rows"] if isinstance(runs, dict) else runs
    target, source = accuracy_target(runs, target)
    for r in rows:
        name = IN_MEMORY if r["system"] == "memory" else r["system"]
        seeds = [a for a in runs if a["policy"] == name
                 and (name == IN_MEMORY or a["cache_fraction"] == r["cache"])]  # fmt: skip
        times, finals = [], []
        for a in seeds:
            accs = a.get("test_accuracy_per_epoch") or []
            finals.append(accs[-1] if accs else float("nan"))
            hit = next((e for e, acc in enumerate(accs) if acc >= target), None)
            if hit is not None and hit < len(r["epoch_times_s"]):
                times.append(float(np.sum(r["epoch_times_s"][: hit + 1])))
        r["seeds"] = len(seeds)
        r["reached"] = f"{len(times)}/{len(seeds)}"
        r["final_acc"] = float(np.mean(finals)) if finals else float("nan")
        r["time_to_target_s"] = float(np.mean(times)) if times else float("nan")
        r["time_to_target_std"] = float(np.std(times)) if times else float("nan")
    for r in rows:
        base = lru_row(rows, r)
        base_s = base["time_to_target_s"] if base else float("nan")
        r["ttt_speedup"] = base_s / r["time_to_target_s"]
    return {"target_accuracy": target, "target_source": source, "accuracy_runs": path}


def load_oracle(path: str, data: str, epochs: int) -> LossOracle:
    """The recorded oracle at ``path``, recorded here with the tiny model where missing."""
    if not Path(path).exists():
        print(f"{path} missing: recording it with --model tiny (CPU)")
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        return record_oracle(data, epochs, path, model="tiny", device="auto", num_workers=2)
    return LossOracle.load(path)


class RemoteSite:
    """The prepared dataset served over a real network: nginx (``http``) or an S3 server
    (``s3``: s3rver or moto's, ``--s3-server``; the train split uploaded once) behind a
    ``DelayProxy``."""

    def __init__(self, args) -> None:
        import tempfile

        from hotset.testing import DelayProxy, NginxServer, S3Server

        self.tmp = tempfile.TemporaryDirectory()
        self.concurrency = max(1, -(-args.concurrency // max(1, args.num_workers)))
        self.options: dict = {}
        if args.remote == "http":
            self.server = NginxServer(Path(args.data).resolve(), Path(self.tmp.name))
            port = int(self.server.url.rsplit(":", 1)[1])
        else:
            self.server = S3Server(args.s3_server)
            print("uploading the train split to the S3 server ...", flush=True)
            self.server.upload(Path(args.data) / "train", "s3://bench/train")
            port = int(self.server.endpoint.rsplit(":", 1)[1])
        self.proxy = DelayProxy(port, args.latency_ms, args.bandwidth_mb_s)
        wire = f"http://127.0.0.1:{self.proxy.port}"
        if args.remote == "http":
            self.url = wire + "/train"
        else:
            self.url = "s3://bench/train"
            self.options = {**self.server.storage_options, "client_kwargs": {
                "endpoint_url": wire, "region_name": "eu-west-1"}}  # fmt: skip

    def storage(self, train):
        """``train`` (the prepared split, or a subset of it) read over the wire."""
        remote = FileStorage(self.url, concurrency=self.concurrency,
                             storage_options=self.options)  # fmt: skip
        return SubsetStorage(remote, train.indices) if isinstance(train, SubsetStorage) else remote

    @property
    def pids(self) -> tuple[int, ...]:
        """The server's and the wire's processes (their CPU is not the loader's)."""
        return (self.server.proc.pid, self.proxy.proc.pid)

    def stop(self) -> None:
        self.proxy.stop()
        self.server.stop()
        self.tmp.cleanup()


def run_system(args, name: str, fraction: float, oracle: LossOracle) -> dict:
    """One system for ``args.epochs`` epochs; the oracle answers every batch's feedback."""
    system = resolve_system("lru" if name == "memory" else name.split(":")[0])
    train, _ = split_train(args.data, oracle.meta.get("val_fraction", 0.0), args.seed)
    if len(train) != oracle.num_samples:
        raise SystemExit(f"oracle has {oracle.num_samples} samples, the split {len(train)}")
    if name == "memory":  # the floor: no storage wait, no cache
        storage = train
    elif args.site is None:
        storage = ThrottledStorage(train, args.latency_ms, args.bandwidth_mb_s, args.concurrency,
                                   args.client_cpu_ms)  # fmt: skip
    else:
        storage = args.site.storage(train)
    options = {**system.sampler_options, **SAMPLERS.options_for(system.sampler, args.sampler_opts)}
    if system.sampler == "spider":
        options["total_epochs"] = args.epochs
    loader = make_loader(
        storage, batch_size=args.batch_size, policy=system.policy, sampler=system.sampler,
        sampler_options=options, cache_fraction=0.0 if name == "memory" else fraction,
        store="shared", seed=args.seed,
        policy_options=POLICIES.options_for(system.policy, args.policy_opts),
        num_workers=args.num_workers, decode=partial(decode_sample, size=IMAGE_SIZE),
        persistent_workers=True,
    )  # fmt: skip
    times, reads, mb, hits, served, cpu, server_cpu = [], [], [], [], [], [], []
    servers = args.site.pids if args.site else ()
    try:
        for epoch in range(args.epochs):
            loader.set_epoch(epoch)
            before = loader.counters()
            cpu0 = cpu_seconds(os.getpid(), servers)
            server0 = sum(cpu_seconds(p) for p in servers)
            start = time.perf_counter()
            batches = max(1, len(loader))
            for b, (_, _, ids) in enumerate(loader):
                ids = ids.numpy()
                t = min(epoch, oracle.epochs - 1) + (b + 0.5) / batches
                emb = oracle.embeddings_at(ids, t) if loader.wants_embeddings else None
                loader.feedback(ids, oracle.at(ids, t), emb)
                if args.step_ms:
                    time.sleep(args.step_ms / 1000)  # a GPU step: the loader runs meanwhile
            times.append(time.perf_counter() - start)
            cpu.append(cpu_seconds(os.getpid(), servers) - cpu0)
            server_cpu.append(sum(cpu_seconds(p) for p in servers) - server0)
            after = loader.counters()
            reads.append(after["storage_requests"] - before["storage_requests"]
                         if args.site else after["storage_reads"] - before["storage_reads"])
            hits.append(after["hits"] - before["hits"])
            mb.append((after["storage_bytes"] - before["storage_bytes"]) / 1e6)
            served.append(after["accesses"] - before["accesses"])
        loader.planner.drain()
        c = loader.counters()
    finally:
        loader.close()
    inner = c["internal"]
    steady = slice(min(2, args.epochs - 1), None)  # epochs 3-5, as the GPU table
    return {
        "system": name, "cache": fraction, "epoch_s": float(np.mean(times[steady])),
        "hit_ratio": float(np.sum(hits[steady]) / max(1, np.sum(served[steady]))),
        "storage_reads": float(np.mean(reads[steady])), "storage_mb": float(np.mean(mb[steady])),
        "served": float(np.mean(served[steady])), "epoch_times_s": times,
        "cpu_s": float(np.mean(cpu[steady])), "server_cpu_s": float(np.mean(server_cpu[steady])),
        "cpu_ms_per_read": 1e3 * float(np.sum(cpu[steady]) / max(1, np.sum(reads[steady]))),
        "late_misses": c["late_misses"], "refused_puts": inner["refused_puts"],
        **{k: inner.get(k, 0) for k in ("graph_failed", "graph_dropped", "graph_mean_degree")},
        "oracle": oracle.meta.get("model", "?"),
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="data/fashion-mnist")
    ap.add_argument("--oracle", default="data/oracles/resnet18_gpu.npz")
    ap.add_argument("--tiny-oracle", default="data/oracles/tiny_gpu.npz")
    ap.add_argument("--systems", default="lru,minio,shade,icache,spider,spider:tiny")
    ap.add_argument("--cache-fractions", default="0.2")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--num-workers", type=int, default=8)
    ap.add_argument("--latency-ms", type=float, default=2.0)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--bandwidth-mb-s", type=float, default=100.0)
    ap.add_argument("--step-ms", type=float, default=0.0, help="sleep per batch (a GPU step)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sampler-option", action="append", metavar="KEY=VALUE",
                    help="for the systems whose sampler takes it (repeat)")  # fmt: skip
    ap.add_argument("--policy-option", action="append", metavar="KEY=VALUE")
    ap.add_argument("--name", default="io_bound_epoch", help="results/NAME.json")
    ap.add_argument("--reference", choices=list(GPU_REFERENCE), default="h100-compare",
                    help="the GPU run to compare with")  # fmt: skip
    ap.add_argument("--rows", help="only recompute the table of this results JSON")
    ap.add_argument("--accuracy", metavar="COMPARE.json",
                    help="per-epoch test accuracy of real runs (`hotset compare --json`): "
                    "adds each system's time to the target accuracy")  # fmt: skip
    ap.add_argument("--target-accuracy", type=float,
                    help="default: the in-memory run's final accuracy - 0.5 pt")
    ap.add_argument("--storage", default="emulated",
                    help="emulated (ThrottledStorage; emulated:4 also burns 4 ms of the "
                    "client's CPU per request), http or s3 (nginx or an S3 server behind a "
                    "wire), or several, comma-separated: run side by side")
    ap.add_argument("--s3-server", choices=("s3rver", "moto"), default="s3rver",
                    help="the S3 server behind --storage s3 (s3rver: `make s3rver`)")
    args = ap.parse_args()
    args.sampler_opts = parse_options(args.sampler_option, "--sampler-option")
    args.policy_opts = parse_options(args.policy_option, "--policy-option")
    oracles = {
        "resnet18": partial(load_oracle, args.oracle, args.data, args.epochs),
        "tiny": partial(load_oracle, args.tiny_oracle, args.data, args.epochs),
    }
    loaded: dict[str, LossOracle] = {}
    rows = json.loads(Path(args.rows).read_text())["rows"] if args.rows else []
    for r in rows:
        r.setdefault("storage", "emulated")
        for k in ("cpu_s", "server_cpu_s", "cpu_ms_per_read", "storage_mb"):  # measured later
            r.setdefault(k, float("nan"))
    fractions = [] if args.rows else [float(f) for f in args.cache_fractions.split(",")]
    for mode in [] if args.rows else args.storage.split(","):
        kind, _, cpu = mode.partition(":")
        if kind not in ("emulated", "http", "s3") or (cpu and kind != "emulated"):
            raise SystemExit(f"--storage {mode}: emulated[:CLIENT_CPU_MS], http or s3")
        args.client_cpu_ms = float(cpu or 0.0)
        args.remote = None if kind == "emulated" else kind
        args.site = RemoteSite(args) if args.remote else None
        try:
            for fraction in fractions:
                for name in args.systems.split(","):
                    which = "tiny" if name.endswith(":tiny") else "resnet18"
                    if which not in loaded:
                        loaded[which] = oracles[which]()
                    rows.append({"storage": mode, **run_system(args, name, fraction,
                                                               loaded[which])})  # fmt: skip
                    print(f"{mode} {name} at {fraction:.0%}: {rows[-1]['epoch_s']:.2f} s/epoch",
                          flush=True)  # fmt: skip
        finally:
            if args.site is not None:
                args.site.stop()
    args.site = None
    speedups(rows, args.reference)
    cols = [
        ("storage", "s"), ("system", "s"), ("cache", ".0%"), ("oracle", "s"), ("epoch_s", ".2f"),
        ("speedup", ".2f"), ("gpu_speedup", ".2f"), ("vs_gpu_pct", "+.1f"),
        ("hit_ratio", ".3f"), ("gpu_hit", ".3f"), ("storage_reads", ".0f"), ("storage_mb", ".1f"),
        ("served", ".0f"),
        ("cpu_s", ".1f"), ("server_cpu_s", ".1f"), ("cpu_ms_per_read", ".2f"),
        ("late_misses", "d"), ("refused_puts", "d"),
    ]  # fmt: skip
    meta = {"args": vars(args), "reference": args.reference}
    if args.accuracy:
        meta.update(add_time_to_target(rows, args.accuracy, args.target_accuracy))
        print(f"target accuracy {meta['target_accuracy']:.4f} ({meta['target_source']})")
        cols[5:5] = [("final_acc", ".4f"), ("time_to_target_s", ".1f"), ("reached", "s"),
                     ("time_to_target_std", ".1f"), ("ttt_speedup", ".2f")]  # fmt: skip
    report(args.name, rows, cols, meta)


if __name__ == "__main__":
    main()
