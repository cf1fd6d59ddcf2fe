"""LitData (Lightning's ``litdata``), a peer hotset's disk tier is measured against. Run by
the peers' own Python (``make peers`` builds ``.venv-peers``), as a script: it imports
numpy, torch and litdata, never hotset.

    python litdata_run.py write SAMPLES.npz OUT_DIR --chunk-bytes 33554432
    python litdata_run.py epochs s3://BUCKET/DIR --cache-dir DIR --max-cache-size BYTES
        [--epochs 3] [--workers 8] [--batch-size 64] [--head 1024]

``write``: samples (image bytes and labels, as ``benchmarks/disk_tier.py`` dumps them) as
LitData chunks, each image kept as the bytes it was (``bytes``). ``epochs``: a shuffled
``StreamingDataset`` over the remote (``S3_ENDPOINT_URL`` its endpoint) with its chunk
cache in ``--cache-dir`` under ``max_cache_size``, read by a ``StreamingDataLoader``; a
sample is its first ``--head`` bytes (``streaming_run.head``: the data path alone
measured); one JSON line per epoch (seconds, samples, distinct samples).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src" / "hotset" / "peers"))

from streaming_run import _samples, head  # noqa: E402


def write(args) -> None:
    from litdata.streaming.writer import BinaryWriter

    w = BinaryWriter(args.out, chunk_bytes=args.chunk_bytes)
    for i, (image, label) in enumerate(_samples(args.samples)):
        w.add_item(i, {"image": image, "label": label, "i": i})
    w.done()
    w.merge()


def epochs(args) -> None:
    import torch
    from litdata import StreamingDataLoader, StreamingDataset
    from litdata.streaming import downloader
    from litdata.streaming.resolver import Dir

    # its async chunk prefetch (obstore) refuses an http:// endpoint unless told it may
    downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = "true"

    class Decoded(StreamingDataset):
        def __getitem__(self, index):
            row = super().__getitem__(index)
            x = torch.from_numpy(head(row["image"], args.head))
            return x.float().div_(255.0), row["label"], int(row["i"])

    options = {"endpoint_url": os.environ["S3_ENDPOINT_URL"],
               "aws_access_key_id": os.environ["AWS_ACCESS_KEY_ID"],
               "aws_secret_access_key": os.environ["AWS_SECRET_ACCESS_KEY"],
               "region_name": os.environ.get("AWS_DEFAULT_REGION", "us-east-1")}  # fmt: skip
    ds = Decoded(Dir(path=args.cache_dir, url=args.remote), shuffle=True, seed=args.seed,
                 max_cache_size=args.max_cache_size, storage_options=options)  # fmt: skip
    loader = StreamingDataLoader(ds, batch_size=args.batch_size, num_workers=args.workers,
                                 persistent_workers=args.workers > 0)  # fmt: skip
    for epoch in range(args.epochs):
        start, seen, n = time.perf_counter(), set(), 0
        for _, _, idx in loader:
            seen.update(idx.tolist())
            n += len(idx)
        print(json.dumps({"epoch": epoch, "seconds": time.perf_counter() - start,
                          "samples": n, "distinct": len(seen)}), flush=True)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write")
    w.add_argument("samples")
    w.add_argument("out")
    w.add_argument("--chunk-bytes", type=int, default=32 << 20)
    e = sub.add_parser("epochs")
    e.add_argument("remote")
    e.add_argument("--cache-dir", required=True)
    e.add_argument("--max-cache-size", type=int, required=True)
    e.add_argument("--epochs", type=int, default=3)
    e.add_argument("--workers", type=int, default=8)
    e.add_argument("--batch-size", type=int, default=64)
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--head", type=int, default=1024)
    args = ap.parse_args()
    (write if args.cmd == "write" else epochs)(args)


if __name__ == "__main__":
    main()
