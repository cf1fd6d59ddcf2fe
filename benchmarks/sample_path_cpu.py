"""CPU per sample on hotset's data path, outside decode: what a miss and a hit cost the
process beyond decoding the sample (issue 25's "lean path": target <= 60 us per miss and
<= 40 us per hit).

Everything runs in this one process (``num_workers=0``), so ``time.process_time`` counts
the planner, the store, the storage's reads (its threads included), the collation and
the loader's bookkeeping. Storage is local files or tar shards with no emulated latency:
only CPU is left to measure.

* ``miss``: ``cache_fraction=0`` (LRU): every sample is a miss, read from storage;
* ``hit``: the whole dataset cached (MinIO, filled by a first epoch): every sample a
  planned hit from the shared store, checked against its digest;
* ``cpu_us_per_sample``: with the samples decoded; ``outside_decode_us``: the same run
  with a decoder that does no work (one small constant array per sample);
  ``decode_alone_us``: the samples' bytes decoded and stacked with no loader.

``--cache-decoded`` adds the hit path with the store holding decoded arrays.

    python benchmarks/sample_path_cpu.py [--samples 20000] [--epochs 3] [--format npy]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import report  # noqa: E402
from hotset import decode_sample, make_loader, open_storage, to_tensor  # noqa: E402
from hotset.storage.prepare import prepare_fashion_mnist  # noqa: E402


def epoch_cpu(loader, epochs: int) -> tuple[float, int, float]:
    """CPU seconds, samples and hit ratio over ``epochs`` epochs after an untimed one."""
    n = 0
    for e in range(epochs + 1):
        if e == 1:
            n, start, hits0 = 0, time.process_time(), loader.counters()["hits"]
        loader.set_epoch(e)
        for batch in loader:
            n += len(batch.ids)
    return time.process_time() - start, n, (loader.counters()["hits"] - hits0) / n


def decode_cpu(blobs: list[bytes], batch_size: int, epochs: int) -> float:
    """CPU seconds per sample to decode ``blobs`` and stack them in batches."""
    def image(b: bytes) -> np.ndarray:
        x = decode_sample(b)
        return x["png"] if isinstance(x, dict) else x  # a tar record: its image field

    start = time.process_time()
    for _ in range(epochs):
        for k in range(0, len(blobs), batch_size):
            to_tensor(np.stack([image(b) for b in blobs[k : k + batch_size]]))
    return (time.process_time() - start) / (epochs * len(blobs))


def _null_decode(record: bool):
    """A decoder that does no work: the same small array for every sample (a record's
    image and class fields for tar shards)."""
    image = np.zeros((1, 28, 28), np.uint8)
    return (lambda data: {"png": image, "cls": 0}) if record else (lambda data: image)


def measure(fmt: str, url: str, args) -> list[dict]:
    storage = open_storage(url)
    blobs = [bytes(b) for b in storage.read_many(range(len(storage)))]
    decode_us = 1e6 * decode_cpu(blobs, args.batch_size, args.epochs)
    room = 4 * int(storage.sizes.sum())  # the whole dataset, decoded too
    cases = [("miss", "lru", 0, {}), ("hit", "minio", room, {})]
    if args.cache_decoded:
        cases.append(("hit, decoded", "minio", room, {"cache_decoded": True}))
    rows = []
    for path, policy, capacity, extra in cases:
        row = {"format": fmt, "path": path, "decode_alone_us": decode_us}
        for col, decode in (("cpu_us_per_sample", None),
                            ("outside_decode_us", _null_decode(fmt == "tar"))):  # fmt: skip
            loader = make_loader(
                url, batch_size=args.batch_size, policy=policy, capacity_bytes=capacity,
                num_workers=0, store="shared", readahead_bytes=0, decode=decode, **extra,
            )  # fmt: skip
            with loader:
                cpu, n, hit_ratio = epoch_cpu(loader, args.epochs)
            row[col] = 1e6 * cpu / n
            row.setdefault("hit_ratio", hit_ratio)
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--samples", type=int, default=20000)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--formats", default="npy,png,tar")
    ap.add_argument("--cache-decoded", action="store_true")
    ap.add_argument("--name", default="sample_path_cpu")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="hotset-bench-cpu-") as tmp:
        for fmt in args.formats.split(","):
            prepare_fashion_mnist(f"{tmp}/{fmt}", limit=args.samples, fmt=fmt)
            rows.extend(measure(fmt, f"{tmp}/{fmt}/train", args))
    report(
        args.name,
        rows,
        [("format", "s"), ("path", "s"), ("cpu_us_per_sample", ".1f"), ("decode_alone_us", ".1f"),
         ("outside_decode_us", ".1f"), ("hit_ratio", ".3f")],  # fmt: skip
        meta={"samples": args.samples, "batch_size": args.batch_size, "epochs": args.epochs,
              "num_workers": 0, "targets_us": {"miss": 60, "hit": 40}},  # fmt: skip
    )


if __name__ == "__main__":
    main()
