"""The first minute on remote tar shards: how long until the first batch, and what the
index costs, against ``webdataset`` streaming the same data.

A new user's data: 2,000 RGB JPEGs of mixed sizes (64-320 px) in 8 WebDataset tar
shards, served by nginx behind one emulated link (``DelayProxy``: ``--latency-ms`` a
request, ``--bandwidth`` MB/s shared by every connection). Measured, each from a cold
start (an empty index cache, a new process for the peer):

* ``hotset (index)``: ``make_loader(url)`` (every shard indexed first, one read of each)
  and its first batch of ``--batch``, then the rest of its first epoch (``num_workers=0``).
* ``hotset (stream)``: the same with ``first_epoch="stream"``: the first epoch streams the
  shards and indexes them meanwhile.
* ``webdataset``: ``WebDataset(url).decode("pil")``, its first batch and its whole pass,
  in the peers' virtual environment (``make peers``); it streams each shard from its start.
* Over an S3 server (s3rver) behind a link of the same figures, MosaicML Streaming (the
  same samples as MDS shards of the tar shards' size, ``StreamingDataset`` from its
  making, shuffled, ``predownload`` 128: its first batch downloads the index and the
  shards the shuffle draws from first) beside ``hotset (index, s3)`` and ``hotset
  (stream, s3)``, interleaved over
  ``--reps``, each in its own process (``num_workers=0``): Streaming's workers read shards
  their siblings were still downloading on this set (with 4 or 8 workers every run failed,
  "Relative sample index ... is not present in the shard"; with 2 some did, and others
  waited ~6 s for their first batch). Both decode to 64x64 as the rows above do.

The extrapolation to an ImageNet-sized set (1,000 shards of 140 MB) divides its bytes by
the index's measured throughput over the link: a remote index reads each shard whole, so
the link's bandwidth bounds it.

    .venv/bin/python benchmarks/first_batch.py  # ~1 min
"""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from _report import report  # noqa: E402
from disk_peers import PEER_TRIES, PeerFailed, run_peer  # noqa: E402
from hotset.build import make_loader  # noqa: E402
from hotset.compare_peers import RUNNER as STREAMING_RUN  # noqa: E402
from hotset.compare_peers import write_samples  # noqa: E402
from hotset.storage.tar import TarStorage  # noqa: E402
from hotset.testing import DelayProxy, NginxServer, S3Server, s3rver_binary  # noqa: E402

PEER = """
import sys, time
import webdataset as wds
url, batch = sys.argv[1], int(sys.argv[2])
t = time.perf_counter()
ds = wds.WebDataset(url, shardshuffle=False).decode("pil").to_tuple("jpg", "cls")
it = iter(ds)
first = [next(it) for _ in range(batch)]
print(time.perf_counter() - t)
n = batch + sum(1 for _ in it)
print(time.perf_counter() - t, n)
"""


def write_shards(root: Path, samples: int, shards: int) -> list[tuple[bytes, int]]:
    """The tar shards; returns each sample's JPEG and label, in order."""
    rng = np.random.default_rng(0)
    out = []
    per = samples // shards
    for s in range(shards):
        with tarfile.open(root / f"shard-{s:03d}.tar", "w") as tf:
            for k in range(per):
                w, h = (int(v) for v in rng.integers(64, 320, 2))
                img = rng.integers(0, 256, (h, w, 3), np.uint8)
                buf = io.BytesIO()
                Image.fromarray(img).save(buf, "JPEG", quality=90)
                key = f"{s:03d}_{k:05d}"
                out.append((buf.getvalue(), k % 10))
                for name, data in ((f"{key}.jpg", buf.getvalue()),
                                   (f"{key}.cls", str(k % 10).encode())):  # fmt: skip
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
    return out


#: DataLoader workers of the S3 rows (module docstring)
PEER_WORKERS = 0


def against_streaming(args, work: Path, samples: list[tuple[bytes, int]]) -> list[dict]:
    """hotset's streamed first epoch and Streaming over one S3 server behind the link,
    each from a cold start, interleaved over ``--reps``: their first batch and epoch."""
    peer = Path(args.peer_python)
    if not peer.exists():
        return []
    data = write_samples(work / "samples.npz", [b for b, _ in samples], [y for _, y in samples])
    shard = sum(p.stat().st_size for p in (work / "data").iterdir()) // args.shards
    subprocess.run([str(peer), str(STREAMING_RUN), "write", str(work / "samples.npz"),
                    str(work / "mds"), "--shard-bytes", str(shard)], check=True)  # fmt: skip
    s3 = S3Server("s3rver" if s3rver_binary() else "moto")
    wire = None
    try:
        s3.upload(work / "data", "s3://bench/tar")
        s3.upload(work / "mds", "s3://bench/mds")
        wire = DelayProxy(int(s3.endpoint.rsplit(":", 1)[1]), args.latency_ms, args.bandwidth)
        options = {**s3.storage_options, "client_kwargs": {"endpoint_url": wire.url,
                                                           "region_name": "eu-west-1"}}  # fmt: skip
        rows, tries = [], 0
        for rep in range(args.reps):
            for who in ("index", "stream", "streaming")[:: 1 if rep % 2 == 0 else -1]:
                before = wire.stats()
                if who != "streaming":  # (a cold start: an empty index cache)
                    os.environ["HOTSET_CACHE_DIR"] = str(work / f"index-s3-{who}-{rep}")
                    row = _first(lambda who=who: make_loader(
                        "s3://bench/tar", storage_options=options, batch_size=args.batch,
                        cache_fraction=0.1, num_workers=PEER_WORKERS, store="shared",
                        size=(64, 64), first_epoch=who, persistent_workers=False,
                    ), f"hotset ({who}, s3)")  # fmt: skip
                else:
                    for _ in range(PEER_TRIES):  # (a run may fail: mosaicml/streaming#475)
                        local = work / f"streaming-{rep}-{tries}"
                        tries += 1
                        try:
                            line = run_peer(
                                [str(peer), str(STREAMING_RUN), "epochs", "s3://bench/mds",
                                 "--local", str(local), "--cache-limit", str(1 << 40),
                                 "--epochs", "1", "--workers", str(PEER_WORKERS),
                                 "--batch-size", str(args.batch), "--size", "64,64"],
                                s3, wire, data,
                            )[0]  # fmt: skip
                            break
                        except PeerFailed:
                            continue
                    else:
                        raise SystemExit(f"Streaming failed {PEER_TRIES} times")
                    row = {"loader": "streaming (s3)", "first_batch_s": line["first_batch_s"],
                           "epoch_s": line["first_batch_s"] + line["seconds"],
                           "samples": line["samples"]}  # fmt: skip
                after = wire.stats()
                moved = _moved(before, after) / args.shards
                rows.append({**row, "rep": rep, "index_s": 0.0, "index_mb_s": 0.0,
                             "requests_per_shard": moved})  # fmt: skip
        print(f"Streaming: {tries} runs for {args.reps} rows (a failed run is run again)")
        return rows
    finally:
        if wire is not None:
            wire.stop()
        s3.stop()


def _first(make, name: str) -> dict:
    """A loader made by ``make``: its first batch and its first epoch, from its making."""
    t = time.perf_counter()
    loader = make()
    batches = iter(loader)
    n = next(batches)[2].numel()
    first_s = time.perf_counter() - t
    n += sum(ids.numel() for _, _, ids in batches)
    epoch_s = time.perf_counter() - t
    loader.close()
    return {"loader": name, "first_batch_s": first_s, "epoch_s": epoch_s, "samples": n}


def _moved(before: dict, after: dict, key: str = "requests") -> int:
    """What the wire carried between two ``DelayProxy.stats()`` readings."""
    return after.get(key, 0) - before.get(key, 0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--latency-ms", type=float, default=20.0)
    ap.add_argument("--bandwidth", type=float, default=100.0, help="MB/s, shared")
    ap.add_argument("--peer-python", default=".venv-peers/bin/python")
    ap.add_argument("--name", default="first_batch")
    ap.add_argument("--reps", type=int, default=2, help="of the S3 rows, interleaved")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hotset-first-"))
    data = work / "data"
    data.mkdir()
    samples = write_shards(data, args.samples, args.shards)
    shard_bytes = sum(p.stat().st_size for p in data.iterdir())
    nginx = NginxServer(data, work)
    wire = DelayProxy(int(nginx.url.rsplit(":", 1)[1]), args.latency_ms, args.bandwidth)
    url = f"{wire.url}/shard-{{000..{args.shards - 1:03d}}}.tar"
    rows = []
    try:
        os.environ["HOTSET_CACHE_DIR"] = str(work / "index-cold")
        before = wire.stats()
        t = time.perf_counter()
        TarStorage(url)
        index_s = time.perf_counter() - t
        after = wire.stats()
        gets, requests = _moved(before, after, "gets"), _moved(before, after)
        for first_epoch in ("index", "stream"):
            os.environ["HOTSET_CACHE_DIR"] = str(work / f"index-cold-{first_epoch}")
            before = wire.stats()
            t = time.perf_counter()
            loader = make_loader(
                url, batch_size=args.batch, cache_fraction=0.1, num_workers=0, store="memory",
                size=(64, 64), first_epoch=first_epoch,
            )  # fmt: skip
            batches = iter(loader)
            next(batches)
            first_s = time.perf_counter() - t
            n = args.batch + sum(ids.numel() for _, _, ids in batches)
            epoch_s = time.perf_counter() - t
            after = wire.stats()
            loader.close()
            rows.append({
                "loader": f"hotset ({first_epoch})", "first_batch_s": first_s, "epoch_s": epoch_s,
                "samples": n, "index_s": index_s if first_epoch == "index" else epoch_s,
                "requests_per_shard": _moved(before, after) / args.shards,
                "index_mb_s": shard_bytes / index_s / 1e6 if first_epoch == "index" else 0.0,
            })  # fmt: skip
        rows[0]["index_requests_per_shard"] = requests / args.shards
        rows[0]["index_gets_per_shard"] = gets / args.shards
        peer = Path(args.peer_python)
        if peer.exists():
            before = wire.stats()
            out = subprocess.run([str(peer), "-c", PEER, url, str(args.batch)],
                                 capture_output=True, text=True, check=True)  # fmt: skip
            after = wire.stats()
            first_line, last = out.stdout.strip().splitlines()[-2:]
            rows.append({
                "loader": "webdataset", "first_batch_s": float(first_line),
                "epoch_s": float(last.split()[0]), "samples": int(last.split()[1]),
                "index_s": 0.0, "index_mb_s": 0.0,
                "requests_per_shard": _moved(before, after) / args.shards,
            })  # fmt: skip
            for r in rows:
                r["first_batch_ratio"] = r["first_batch_s"] / rows[-1]["first_batch_s"]
                r["epoch_ratio"] = r["epoch_s"] / rows[-1]["epoch_s"]
    finally:
        wire.stop()
        nginx.stop()
    s3_rows = against_streaming(args, work, samples)
    peers = [r for r in s3_rows if r["loader"].startswith("streaming")]
    for r in s3_rows:  # against Streaming's first batch of the same rep
        peer = next(p for p in peers if p["rep"] == r["rep"])
        r["first_batch_ratio"] = r["first_batch_s"] / peer["first_batch_s"]
        r["epoch_ratio"] = r["epoch_s"] / peer["epoch_s"]
    rows += s3_rows
    imagenet_s = 1000 * 140e6 / (rows[0]["index_mb_s"] * 1e6)
    for r in rows:
        r.setdefault("first_batch_ratio", float("nan"))
        r.setdefault("epoch_ratio", float("nan"))
    for r in rows:
        r.setdefault("rep", 0)
    cols = [("loader", "s"), ("rep", "d"), ("first_batch_s", ".2f"), ("first_batch_ratio", ".2f"),
            ("epoch_s", ".2f"), ("epoch_ratio", ".2f"), ("samples", "d"), ("index_s", ".2f"),
            ("requests_per_shard", ".2f")]  # fmt: skip
    report(args.name, rows, cols, {
        "args": vars(args), "shard_bytes": shard_bytes,
        "imagenet_index_extrapolated_s": imagenet_s,
        "index_requests_per_shard": rows[0]["index_requests_per_shard"],
        "index_gets_per_shard": rows[0]["index_gets_per_shard"],
    })  # fmt: skip
    rate = rows[0]["index_mb_s"]
    print(f"indexed first: 1,000 shards of 140 MB at {rate:.1f} MB/s: {imagenet_s / 60:.0f} min "
          "before the first batch (the link's bandwidth bounds a whole-shard index); "
          f"streamed: the first shard's {140e6 / (rate * 1e6):.1f} s")  # fmt: skip


if __name__ == "__main__":
    main()
