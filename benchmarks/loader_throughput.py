"""Warm-cache loader throughput with 2 workers, against plain PyTorch DataLoaders over
in-memory datasets of the same samples:

* ``hotset (warm)``: make_loader with a cache holding the whole dataset (MinIO, filled
  in a first epoch), so every sample is a planned hit served from the shared store;
* ``hotset (warm, cache_decoded)``: the same with ``cache_decoded=True``: the store holds
  the decoded arrays, so a hit is not decoded again;
* ``in-memory bytes``: a Dataset holding the same encoded bytes in a list, decoding them
  with the same decoder (the same per-sample work, no cache);
* ``in-memory tensors``: a TensorDataset of the samples already decoded.

Both sample formats of ``hotset prepare``: PNG (decode-bound: PIL costs ~60 us per
28x28 image, which the tensor baseline never pays) and ``.npy`` (decoded by a
``frombuffer``, so the comparison with in-memory tensors measures hotset's own cost).

Target: hotset with ``cache_decoded`` at least half the plain DataLoader over in-memory
tensors (its warm epoch <= 2x theirs). The loaders run one after another, ``--repeats``
times.

    python benchmarks/loader_throughput.py [--samples 20000] [--epochs 3] [--repeats 2]
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


def warm_rate(storage, args, **options) -> float:
    """hotset's rate with the whole dataset cached (only the warm-up epoch misses): room
    for it decoded too (a decoded sample is larger than its PNG)."""
    room = 4 * int(storage.sizes.sum())
    hot = make_loader(storage, batch_size=args.batch_size, policy="minio", capacity_bytes=room,
                      num_workers=args.num_workers, persistent_workers=True, **options)  # fmt: skip
    try:
        hot_rate = rate(hot, args.epochs, hot.set_epoch)
        c = hot.counters()
        assert c["misses"] == len(storage) and c["late_misses"] == 0  # only epoch 0 missed
    finally:
        hot.close()
    return hot_rate


def measure(fmt: str, data: str, args, repeat: int) -> list[dict]:
    storage = FileStorage(f"{data}/train")
    blobs = storage.read_many(range(len(storage)))
    labels = torch.as_tensor(storage.labels)
    common = dict(num_workers=args.num_workers, persistent_workers=True)
    hot_rate = warm_rate(storage, args)
    decoded_rate = warm_rate(storage, args, cache_decoded=True)
    plain_bytes = DataLoader(
        BytesDataset(blobs, labels), batch_size=args.batch_size, shuffle=True, **common
    )
    bytes_rate = rate(plain_bytes, args.epochs)
    tensors = TensorDataset(to_tensor(np.stack([decode_sample(b) for b in blobs])), labels)
    plain_t = DataLoader(tensors, batch_size=args.batch_size, shuffle=True, **common)
    tensor_rate = rate(plain_t, args.epochs)
    rates = {
        "hotset (warm, all hits)": hot_rate,
        "hotset (warm, cache_decoded)": decoded_rate,
        "in-memory bytes + decode": bytes_rate,
        "in-memory tensors": tensor_rate,
    }
    return [
        {"format": fmt, "repeat": repeat, "loader": name, "samples_per_s": r,
         "hotset_ratio": hot_rate / r, "decoded_ratio": decoded_rate / r}
        for name, r in rates.items()
    ]  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--samples", type=int, default=20000)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--num-workers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="hotset-bench-data-") as tmp:
        for fmt in ("png", "npy"):
            prepare_fashion_mnist(f"{tmp}/{fmt}", limit=args.samples, fmt=fmt)
            for repeat in range(args.repeats):
                rows.extend(measure(fmt, f"{tmp}/{fmt}", args, repeat))
    report(
        "loader_throughput",
        rows,
        [("format", "s"), ("repeat", "d"), ("loader", "s"), ("samples_per_s", ",.0f"),
         ("hotset_ratio", ".2f"), ("decoded_ratio", ".2f")],  # fmt: skip
        meta={
            "samples": args.samples,
            "batch_size": args.batch_size,
            "num_workers": args.num_workers,
            "epochs_timed": args.epochs,
            "note": "hotset_ratio (decoded_ratio) = hotset's rate (with cache_decoded) / "
            "this loader's rate",
        },
    )


if __name__ == "__main__":
    main()
