"""The first minute on remote tar shards: how long until the first batch, and what the
index costs, against ``webdataset`` streaming the same data.

A new user's data: 2,000 RGB JPEGs of mixed sizes (64-320 px) in 8 WebDataset tar
shards, served by nginx behind one emulated link (``DelayProxy``: ``--latency-ms`` a
request, ``--bandwidth`` MB/s shared by every connection). Measured, each from a cold
start (an empty index cache, a new process for the peer):

* ``hotset``: ``make_loader(url)`` and its first batch of ``--batch`` (``num_workers=0``);
  the index's requests per shard (a size/version request and the reads of the shard).
* ``webdataset``: ``WebDataset(url).decode("pil")`` and its first batch, in the peers'
  virtual environment (``make peers``): it streams the first shard from its start.

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
from hotset.loader import make_loader  # noqa: E402
from hotset.storage.tar import TarStorage  # noqa: E402
from hotset.testing import DelayProxy, NginxServer  # noqa: E402

PEER = """
import sys, time
import webdataset as wds
url, batch = sys.argv[1], int(sys.argv[2])
t = time.perf_counter()
ds = wds.WebDataset(url, shardshuffle=False).decode("pil").to_tuple("jpg", "cls")
it = iter(ds)
first = [next(it) for _ in range(batch)]
print(time.perf_counter() - t)
"""


def write_shards(root: Path, samples: int, shards: int) -> None:
    rng = np.random.default_rng(0)
    per = samples // shards
    for s in range(shards):
        with tarfile.open(root / f"shard-{s:03d}.tar", "w") as tf:
            for k in range(per):
                w, h = (int(v) for v in rng.integers(64, 320, 2))
                img = rng.integers(0, 256, (h, w, 3), np.uint8)
                buf = io.BytesIO()
                Image.fromarray(img).save(buf, "JPEG", quality=90)
                key = f"{s:03d}_{k:05d}"
                for name, data in ((f"{key}.jpg", buf.getvalue()),
                                   (f"{key}.cls", str(k % 10).encode())):  # fmt: skip
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--latency-ms", type=float, default=20.0)
    ap.add_argument("--bandwidth", type=float, default=100.0, help="MB/s, shared")
    ap.add_argument("--peer-python", default=".venv-peers/bin/python")
    ap.add_argument("--name", default="first_batch")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hotset-first-"))
    data = work / "data"
    data.mkdir()
    write_shards(data, args.samples, args.shards)
    shard_bytes = sum(p.stat().st_size for p in data.iterdir())
    nginx = NginxServer(data, work)
    wire = DelayProxy(int(nginx.url.rsplit(":", 1)[1]), args.latency_ms, args.bandwidth)
    url = f"{wire.url}/shard-{{000..{args.shards - 1:03d}}}.tar"
    rows = []
    try:
        os.environ["HOTSET_CACHE_DIR"] = str(work / "index-cold")
        before = wire.stats()
        t = time.perf_counter()
        storage = TarStorage(url)
        index_s = time.perf_counter() - t
        after = wire.stats()
        gets = after.get("gets", 0) - before.get("gets", 0)
        requests = after.get("requests", 0) - before.get("requests", 0)
        os.environ["HOTSET_CACHE_DIR"] = str(work / "index-cold-2")
        t = time.perf_counter()
        loader = make_loader(url, batch_size=args.batch, cache_fraction=0.1, num_workers=0,
                             store="memory", size=(64, 64))  # fmt: skip
        next(iter(loader))
        hotset_s = time.perf_counter() - t
        loader.close()
        rows.append({
            "loader": "hotset", "first_batch_s": hotset_s, "index_s": index_s,
            "index_requests_per_shard": requests / args.shards,
            "index_gets_per_shard": gets / args.shards,
            "index_mb_s": shard_bytes / index_s / 1e6, "samples": len(storage),
        })  # fmt: skip
        peer = Path(args.peer_python)
        if peer.exists():
            first = f"{wire.url}/shard-000.tar"
            out = subprocess.run([str(peer), "-c", PEER, first, str(args.batch)],
                                 capture_output=True, text=True, check=True)  # fmt: skip
            wds_s = float(out.stdout.strip().splitlines()[-1])
            rows.append({
                "loader": "webdataset", "first_batch_s": wds_s, "index_s": 0.0,
                "index_requests_per_shard": 0.0, "index_gets_per_shard": 0.0,
                "index_mb_s": 0.0, "samples": args.batch,
            })  # fmt: skip
            rows[0]["ratio_to_webdataset"] = hotset_s / wds_s
    finally:
        wire.stop()
        nginx.stop()
    imagenet_s = 1000 * 140e6 / (rows[0]["index_mb_s"] * 1e6)
    for r in rows:
        r.setdefault("ratio_to_webdataset", 1.0 if r["loader"] == "webdataset" else float("nan"))
    cols = [("loader", "s"), ("first_batch_s", ".2f"), ("ratio_to_webdataset", ".2f"),
            ("index_s", ".2f"), ("index_requests_per_shard", ".2f"),
            ("index_gets_per_shard", ".2f"), ("index_mb_s", ".1f")]  # fmt: skip
    report(args.name, rows, cols, {
        "args": vars(args), "shard_bytes": shard_bytes,
        "imagenet_index_extrapolated_s": imagenet_s,
    })  # fmt: skip
    rate = rows[0]["index_mb_s"]
    print(f"1,000 shards of 140 MB indexed at {rate:.1f} MB/s: {imagenet_s / 60:.0f} min "
          "(the link's bandwidth bounds a whole-shard index)")  # fmt: skip


if __name__ == "__main__":
    main()
