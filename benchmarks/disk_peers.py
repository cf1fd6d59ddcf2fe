"""hotset's disk tier beside the loaders that keep a dataset on the node's disk: MosaicML
Streaming (shards under ``cache_limit`` in its ``local`` directory) and LitData (chunks
under ``max_cache_size`` in its ``cache_dir``), on the same disk, the same data, behind
the same wire, in one run.

The data: ``--samples`` JPEGs of about 100 KB (each unique: a base image of
``--distinct`` with the sample's own comment segment), ``--shard-mb`` shards of each
format (hotset: WebDataset tar; Streaming: MDS; LitData: its chunks), all on one
S3-compatible server (``--server``: s3rver by default; moto's, in Python, spends about 5 ms
of the loaders' cores on each request, 1.8 ms for s3rver's, which a remote store does not)
behind ``DelayProxy``: ``--latency-ms`` a
request, ``--bandwidth`` MB/s shared, each loader's requests in flight as its defaults
have them (hotset reads ``make_loader("s3://...")`` as a user would). Every loader runs 8
workers (persistent, as Streaming's runner has them) and batches of 64, and serves a
sample as its first 1 KB (``streaming_run.head``),
not decoded: the data path is what is measured (a JPEG decode costs the same in each).

Each repetition runs, in turn:

* with a disk budget that holds the data (``--fits`` x its bytes): hotset (uniform + LRU,
  a RAM tier of 5% of the data, a fresh disk tier), then over the kept tier uniform +
  MinIO (CoorDL's RAM tier: filled once, never evicted) and a second LRU run; Streaming
  (``cache_limit`` = the budget, a fresh ``local``), LitData (``max_cache_size`` = the
  budget, a fresh ``cache_dir``), and a plain DataLoader reading the same samples as
  files on that disk;
* with a disk budget of 30% of the data: SHADE (its paper's sampler, a fixed skewed loss
  per sample as importance; in its own order, and read by blocks, ``order="blocks"``) and
  uniform + LRU over both tiers, and Streaming.

``epoch_s``: the mean of the steady epochs (all but the first); ``first_epoch_s`` and
``first_source``: the first epoch's seconds and bytes read from the wire per byte of data,
hotset's with what opening the loader took (its tar index reads whole shards and keeps
them), the peers' with their downloads; ``later_source``: the later epochs' bytes;
``both_tiers``: hotset's steady hit ratio over RAM and disk; ``ratio_streaming`` /
``ratio_litdata`` / ``ratio_files``: a row's steady epoch over theirs in the same
repetition (their row at the same disk budget); ``gets``: the GET requests a steady
epoch sent over the wire; ``server_cpu_s``: the object store's and
the wire's CPU seconds in a steady epoch (they share the loaders' cores); ``failed_runs``:
the runs of the row that ended in an error before the one measured (``PeerFailed``; its
figures NaN where all ``PEER_TRIES`` did).

    make peers s3rver && python benchmarks/disk_peers.py [--reps 2] [--samples 20000]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import hotset  # noqa: E402
from _cpu import cpu_seconds  # noqa: E402
from _report import report  # noqa: E402
from disk_tier import LocalFiles, losses_of  # noqa: E402
from hotset.compare_peers import RUNNER as STREAMING_RUN  # noqa: E402
from hotset.compare_peers import write_samples  # noqa: E402
from hotset.peers.streaming_run import head  # noqa: E402
from hotset.testing import DelayProxy, S3Server  # noqa: E402

LITDATA_RUN = Path(__file__).resolve().parent / "peers" / "litdata_run.py"
HEAD = 1024  # bytes of a sample every loader serves


def head_of(data: bytes) -> np.ndarray:
    return head(data, HEAD)


def jpegs(n: int, distinct: int, side: int = 440, quality: int = 82):
    """``n`` unique JPEGs of about 100 KB: ``distinct`` noisy base images, each sample one
    of them with its own comment segment (``FF FE``) after the start marker."""
    from PIL import Image

    rng = np.random.default_rng(0)
    bases = []
    for _ in range(distinct):
        blocks = np.kron(rng.integers(0, 128, (side // 8, side // 8, 3), np.uint8),
                         np.ones((8, 8, 1), np.uint8))  # fmt: skip
        img = rng.integers(0, 128, (side, side, 3), np.uint8) + blocks
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, "JPEG", quality=quality)
        bases.append(buf.getvalue())
    for k in range(n):
        note = f"hotset sample {k}".encode()
        base = bases[k % distinct]
        yield base[:2] + b"\xff\xfe" + (len(note) + 2).to_bytes(2, "big") + note + base[2:]


def make_data(root: Path, n: int, distinct: int, shard_bytes: int) -> int:
    """The samples as tar shards (``tar/``), files (``files/``) and an ``.npz`` the peers'
    writers read; returns their bytes."""
    (root / "tar").mkdir(parents=True)
    (root / "files").mkdir()
    blobs = list(jpegs(n, distinct))
    labels = [k % 10 for k in range(n)]
    per_shard = max(1, shard_bytes // (len(blobs[0]) + 1536))  # headers and padding
    for s in range(0, n, per_shard):
        with tarfile.open(root / "tar" / f"shard-{s // per_shard:05d}.tar", "w") as tf:
            for k in range(s, min(n, s + per_shard)):
                for field, value in (("jpg", blobs[k]), ("cls", str(labels[k]).encode())):
                    info = tarfile.TarInfo(f"s{k:07d}.{field}")
                    info.size = len(value)
                    tf.addfile(info, io.BytesIO(value))
                (root / "files" / f"s{k:07d}.jpg").write_bytes(blobs[k])
    return write_samples(root / "samples.npz", blobs, labels)


def head_of_file(path: Path) -> np.ndarray:
    """The plain baseline's sample: a file's first bytes, as every loader serves it."""
    return head_of(path.read_bytes())


def source_reads(wire: DelayProxy) -> tuple[int, int]:
    """The bytes and GET requests the wire has carried from the source so far."""
    stats = wire.stats()
    return stats.get("bytes_down", 0), stats.get("gets", 0)


def server_cpu(s3: S3Server, wire: DelayProxy) -> float:
    """CPU seconds of the object store and the wire: on 2 cores they share the loaders'
    cores, and each request costs them CPU."""
    return cpu_seconds(s3.proc.pid) + cpu_seconds(wire.proc.pid)


def run_hotset(s3: S3Server, wire: DelayProxy, data: int, epochs: int, system: str,
               disk_dir: Path, disk_bytes: int, order: str = "paper",
               **loader_options) -> list[dict]:  # fmt: skip
    opened, start, opened_cpu = source_reads(wire), time.perf_counter(), server_cpu(s3, wire)
    options = {**s3.storage_options, "client_kwargs": {"endpoint_url": wire.url,
                                                       "region_name": "eu-west-1"}}  # fmt: skip
    out = []
    with hotset.make_loader(
        "s3://bench/tar", storage_options=options, batch_size=64, system=system,
        cache_fraction=0.05, num_workers=8, input_field="jpg", target_field="cls",
        decode=head_of, epochs=epochs, seed=0, order=order,
        disk_dir=disk_dir, disk_bytes=disk_bytes, persistent_workers=True,
        **loader_options,
    ) as loader:  # fmt: skip
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            before = opened if epoch == 0 else source_reads(wire)
            t = start if epoch == 0 else time.perf_counter()  # (opening read the index)
            cpu = opened_cpu if epoch == 0 else server_cpu(s3, wire)
            for _, _, ids in loader:
                loader.feedback(ids, losses_of(ids))
            s = time.perf_counter() - t
            e, after = loader.epoch_stats[-1], source_reads(wire)
            out.append({"epoch": epoch, "seconds": s, "samples": e.samples,
                        "both_tiers": (e.hits + e.disk_hits) / max(1, e.samples),
                        "source": (after[0] - before[0]) / data,
                        "gets": after[1] - before[1],
                        "server_cpu_s": server_cpu(s3, wire) - cpu})  # fmt: skip
    return out


class PeerFailed(RuntimeError):
    """A peer's run ended in an error (Streaming with ``cache_limit`` below the data can
    read a shard its cache is evicting: mosaicml/streaming#475); the row runs it again."""


#: runs of a row a peer may fail before the benchmark gives up
PEER_TRIES = 5


def run_peer(cmd: list[str], s3: S3Server, wire: DelayProxy, data: int) -> list[dict]:
    """A peer's runner in its own Python; each epoch's line with the wire's bytes."""
    env = {**os.environ, "S3_ENDPOINT_URL": wire.url, "AWS_DEFAULT_REGION": "eu-west-1",
           "AWS_ACCESS_KEY_ID": s3.storage_options["key"],
           "AWS_SECRET_ACCESS_KEY": s3.storage_options["secret"]}  # fmt: skip
    out, before, cpu = [], source_reads(wire), server_cpu(s3, wire)
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True) as proc:
        for line in proc.stdout:
            if line.startswith("{"):
                epoch, after, cpu_now = json.loads(line), source_reads(wire), server_cpu(s3, wire)
                out.append({**epoch, "source": (after[0] - before[0]) / data,
                            "gets": after[1] - before[1],
                            "server_cpu_s": cpu_now - cpu})  # fmt: skip
                before, cpu = after, cpu_now
    if proc.returncode:
        raise PeerFailed(f"peer run failed ({proc.returncode}): {' '.join(cmd)}")
    return out


def run_plain(root: Path, epochs: int) -> list[dict]:
    files = LocalFiles(root, ".jpg", head_of_file)
    loader = torch.utils.data.DataLoader(files, batch_size=64, shuffle=True, num_workers=8,
                                         persistent_workers=True)  # fmt: skip
    out = []
    for epoch in range(epochs):
        t = time.perf_counter()
        n = sum(len(y) for _, y in loader)
        out.append({"epoch": epoch, "seconds": time.perf_counter() - t, "samples": n,
                    "source": 0.0, "gets": 0, "server_cpu_s": 0.0})  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--samples", type=int, default=20000)
    ap.add_argument("--distinct", type=int, default=200, help="base images")
    ap.add_argument("--shard-mb", type=int, default=32)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument(
        "--fits", type=float, default=1.5, help="the disk budget that holds the data, x its bytes"
    )
    ap.add_argument("--latency-ms", type=float, default=20.0)
    ap.add_argument("--bandwidth", type=float, default=100.0, help="MB/s")
    ap.add_argument("--peer-python", default=".venv-peers/bin/python")
    ap.add_argument("--dir", help="a directory on the disk to measure (default: a temp dir)")
    ap.add_argument("--only", help="run the rows whose 'disk: loader' contains this")
    ap.add_argument("--server", choices=("s3rver", "moto"), default="s3rver",
                    help="the S3 server behind the wire")
    args = ap.parse_args()
    if not Path(args.peer_python).exists():
        raise SystemExit(f"{args.peer_python} missing: run `make peers` first")
    work = Path(tempfile.mkdtemp(prefix="hotset-disk-peers-", dir=args.dir))
    os.environ["HOTSET_CACHE_DIR"] = str(work / "index-cache")
    rows: list[dict] = []
    s3 = wire = None
    try:
        data = make_data(work / "data", args.samples, args.distinct, args.shard_mb << 20)
        shard = str(args.shard_mb << 20)
        subprocess.run([args.peer_python, str(STREAMING_RUN), "write",
                        str(work / "data" / "samples.npz"), str(work / "data" / "mds"),
                        "--shard-bytes", shard], check=True)  # fmt: skip
        subprocess.run([args.peer_python, str(LITDATA_RUN), "write",
                        str(work / "data" / "samples.npz"), str(work / "data" / "litdata"),
                        "--chunk-bytes", shard], check=True)  # fmt: skip
        s3 = S3Server(args.server)
        for fmt in ("tar", "mds", "litdata"):
            s3.upload(work / "data" / fmt, f"s3://bench/{fmt}")
        wire = DelayProxy(int(s3.endpoint.rsplit(":", 1)[1]), args.latency_ms, args.bandwidth)
        fits, small = int(args.fits * data), int(0.3 * data)
        common = ["--epochs", str(args.epochs), "--workers", "8", "--batch-size", "64",
                  "--head", str(HEAD)]  # fmt: skip

        def streaming(budget: int) -> list[dict]:
            return run_peer([args.peer_python, str(STREAMING_RUN), "epochs", "s3://bench/mds",
                             "--local", str(fresh("streaming")), "--cache-limit", str(budget),
                             "--shuffle-block", "2048", "--predownload", "128", *common],
                            s3, wire, data)  # fmt: skip

        def litdata(budget: int) -> list[dict]:
            return run_peer([args.peer_python, str(LITDATA_RUN), "epochs", "s3://bench/litdata",
                             "--cache-dir", str(fresh("litdata")), "--max-cache-size",
                             str(budget), *common], s3, wire, data)  # fmt: skip

        def fresh(name: str) -> Path:
            shutil.rmtree(work / name, ignore_errors=True)
            return work / name

        for rep in range(args.reps):
            fresh("nvme")
            variants = {
                ("fits", "hotset lru"): lambda: run_hotset(
                    s3, wire, data, args.epochs, "lru", work / "nvme", fits),
                ("fits", "hotset minio"): lambda: run_hotset(
                    s3, wire, data, args.epochs, "minio", work / "nvme", fits),
                ("fits", "hotset lru, a second run"): lambda: run_hotset(
                    s3, wire, data, 2, "lru", work / "nvme", fits),
                ("fits", "streaming"): lambda: streaming(fits),
                ("fits", "litdata"): lambda: litdata(fits),
                ("fits", "files"): lambda: run_plain(work / "data" / "files", args.epochs),
                ("30%", "hotset shade"): lambda: run_hotset(
                    s3, wire, data, args.epochs, "shade", fresh("small"), small),
                ("30%", "hotset shade, the RAM tier repeated"): lambda: run_hotset(
                    s3, wire, data, args.epochs, "shade", fresh("small"), small,
                    sampler_options={"cache_tiers": "ram"}),
                ("30%", "hotset shade, blocks"): lambda: run_hotset(
                    s3, wire, data, args.epochs, "shade", fresh("small"), small, "blocks"),
                ("30%", "hotset lru"): lambda: run_hotset(
                    s3, wire, data, args.epochs, "lru", fresh("small"), small),
                ("30%", "streaming"): lambda: streaming(small),
            }  # fmt: skip
            for (disk, name), run in variants.items():
                if args.only and args.only not in f"{disk}: {name}":
                    continue
                failed, epochs = 0, None
                while epochs is None and failed < PEER_TRIES:  # (each try from a fresh
                    try:  # local directory)
                        epochs = run()
                    except PeerFailed as exc:
                        print(f"{disk}: {name}, rep {rep}: {exc}", file=sys.stderr)
                        failed += 1
                if epochs is None:  # (its row, and the ratios to it, say so: NaN)
                    epochs = [dict.fromkeys(("seconds", "source", "gets", "server_cpu_s",
                                             "samples"), float("nan"))]  # fmt: skip
                for e in epochs:
                    print(json.dumps({"disk": disk, "loader": name, "rep": rep, **e}), flush=True)
                steady = [e["seconds"] for e in epochs[1:]] or [epochs[0]["seconds"]]
                rows.append({
                    "disk": disk, "loader": name, "rep": rep,
                    "epoch_s": float(np.mean(steady)), "first_epoch_s": epochs[0]["seconds"],
                    "first_source": epochs[0]["source"],
                    "later_source": float(sum(e["source"] for e in epochs[1:])),
                    "gets": float(np.mean([e["gets"] for e in epochs[1:]] or [epochs[0]["gets"]])),
                    "server_cpu_s": float(np.mean([e["server_cpu_s"] for e in epochs[1:]]
                                                  or [epochs[0]["server_cpu_s"]])),
                    "both_tiers": float(np.mean([e.get("both_tiers", np.nan)
                                                 for e in epochs[1:]] or [np.nan])),
                    "samples": epochs[-1]["samples"], "failed_runs": failed,
                })  # fmt: skip
    finally:
        if wire is not None:
            wire.stop()
        if s3 is not None:
            s3.stop()
        shutil.rmtree(work, ignore_errors=True)
    for r in rows:
        same = {x["loader"]: x["epoch_s"] for x in rows
                if x["rep"] == r["rep"] and x["disk"] == r["disk"]}  # fmt: skip
        for peer in ("streaming", "litdata", "files"):
            r[f"ratio_{peer}"] = r["epoch_s"] / same[peer] if peer in same else float("nan")
    report("disk_peers", rows, [
        ("disk", "s"), ("loader", "s"), ("rep", "d"), ("epoch_s", ".2f"),
        ("ratio_streaming", ".2f"), ("ratio_litdata", ".2f"), ("ratio_files", ".2f"),
        ("first_epoch_s", ".2f"), ("first_source", ".3f"), ("later_source", ".3f"),
        ("both_tiers", ".3f"), ("gets", ".0f"), ("server_cpu_s", ".1f"), ("samples", ".0f"),
        ("failed_runs", "d"),
    ], meta={"args": vars(args), "data_bytes": data})  # fmt: skip


if __name__ == "__main__":
    main()
