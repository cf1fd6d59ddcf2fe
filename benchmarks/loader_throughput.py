"""Warm-cache loader throughput with 2 workers, against plain PyTorch DataLoaders over
in-memory datasets of the same samples:

* ``hotset (warm)``: make_loader with a cache holding the whole dataset (MinIO, filled
  in a first epoch), so every sample is a planned hit served from the shared store;
* ``in-memory bytes``: a Dataset holding the same encoded bytes in a list, decoding them
  with the same decoder (the same per-sample work, no cache);
* ``in-memory tensors``: a TensorDataset of the samples already decoded.

Both sample formats of ``hotset prepare``: PNG (decode-bound: PIL costs ~60 us per
28x28 image, which the tensor baseline never pays) and ``.npy`` (decoded by a
``frombuffer``, so the comparison with in-memory tensors measures hotset's own cost).

Target (issue #2): hotset >= 80% of the plain DataLoader over in-memory tensors.

    python benchmarks/loader_throughput.py [--samples 20000] [--epochs 3]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import report  # noqa: E402
from hotset import FileStorage, decode_sample, make_loader, to_tensor  # noqa: E402
from hotset.storage.prepare import prepare_fashion_mnist  # noqa: E402


class BytesDataset(Dataset):
    """The same encoded samples held in memory, decoded per item as a user would."""

    def __init__(self, blobs: list[bytes], labels) -> None:
        self.blobs, self.labels = blobs, labels

    def __len__(self) -> int:
        return len(self.blobs)

    def __getitem__(self, i: int):
        return to_tensor(decode_sample(self.blobs[i])), int(self.labels[i])


def rate(loader, epochs: int, set_epoch=None) -> float:
    """Samples per second over ``epochs`` timed epochs, after one warm-up epoch."""

    def one(e):
        if set_epoch:
            set_epoch(e)
        n = 0
        for batch in loader:
            n += len(batch[0])
        return n

    one(0)
    start = time.perf_counter()
    n = sum(one(e) for e in range(1, epochs + 1))
    return n / (time.perf_counter() - start)


def measure(fmt: str, data: str, args) -> list[dict]:
    storage = FileStorage(f"{data}/train")
    blobs = storage.read_many(range(len(storage)))
    labels = torch.as_tensor(storage.labels)
    common = dict(num_workers=args.num_workers, persistent_workers=True)

    hot = make_loader(
        storage,
        batch_size=args.batch_size,
        policy="minio",
        cache_fraction=1.0,
        store="shared",
        **common,
    )
    try:
        hot_rate = rate(hot, args.epochs, hot.set_epoch)
        c = hot.counters()
        assert c["misses"] == len(storage) and c["late_misses"] == 0  # only epoch 0 missed
    finally:
        hot.dataset.store.close(destroy=True)
    plain_bytes = DataLoader(
        BytesDataset(blobs, labels), batch_size=args.batch_size, shuffle=True, **common
    )
    bytes_rate = rate(plain_bytes, args.epochs)
    tensors = TensorDataset(to_tensor(np.stack([decode_sample(b) for b in blobs])), labels)
    plain_t = DataLoader(tensors, batch_size=args.batch_size, shuffle=True, **common)
    tensor_rate = rate(plain_t, args.epochs)
    return [
        {
            "format": fmt,
            "loader": "hotset (warm, all hits)",
            "samples_per_s": hot_rate,
            "hotset_ratio": 1.0,
        },
        {
            "format": fmt,
            "loader": "in-memory bytes + decode",
            "samples_per_s": bytes_rate,
            "hotset_ratio": hot_rate / bytes_rate,
        },
        {
            "format": fmt,
            "loader": "in-memory tensors",
            "samples_per_s": tensor_rate,
            "hotset_ratio": hot_rate / tensor_rate,
        },
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--samples", type=int, default=20000)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--num-workers", type=int, default=2)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="hotset-bench-data-") as tmp:
        for fmt in ("png", "npy"):
            prepare_fashion_mnist(f"{tmp}/{fmt}", limit=args.samples, fmt=fmt)
            rows.extend(measure(fmt, f"{tmp}/{fmt}", args))
    report(
        "loader_throughput",
        rows,
        [("format", "s"), ("loader", "s"), ("samples_per_s", ",.0f"), ("hotset_ratio", ".2f")],
        meta={
            "samples": args.samples,
            "batch_size": args.batch_size,
            "num_workers": args.num_workers,
            "epochs_timed": args.epochs,
            "note": "hotset_ratio = hotset's rate / this loader's rate",
        },
    )


if __name__ == "__main__":
    main()
