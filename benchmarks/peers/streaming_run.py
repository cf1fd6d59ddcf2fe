"""MosaicML Streaming, the peer hotset is measured against; run with the peers' venv
(``make peers``), never imported by hotset.

    python streaming_run.py write SAMPLES.npz OUT_DIR --shard-bytes 262144
    python streaming_run.py epochs s3://bucket/mds --local DIR --cache-limit BYTES \
        --epochs 3 --workers 8 --batch-size 128 --shuffle-block 2048 --predownload 128

``write``: the samples (PNG bytes and labels, as ``peer_compare.py`` dumps them) as MDS
shards. ``epochs``: a ``StreamingDataset`` over the remote (S3 through
``S3_ENDPOINT_URL``) in a DataLoader, each image decoded as hotset's loader decodes it;
prints one JSON line per epoch (seconds, samples, distinct samples).
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
import types

import numpy as np


def _without_torchvision() -> None:
    """``import streaming`` imports its vision datasets, and they import torchvision; no
    torchvision build matches the locked CPU torch, and this run reads MDS shards of bytes,
    never those datasets: the two names they import are stood in for where torchvision is
    not installed (``make peers`` leaves it out)."""
    try:
        import torchvision  # noqa: F401
    except ImportError:
        import importlib.machinery

        tv = types.ModuleType("torchvision")
        tv.__spec__ = importlib.machinery.ModuleSpec("torchvision", None)
        datasets = types.ModuleType("torchvision.datasets")
        datasets.VisionDataset = datasets.CIFAR10 = type("VisionDataset", (), {})
        transforms = types.ModuleType("torchvision.transforms")
        functional = types.ModuleType("torchvision.transforms.functional")
        functional.to_tensor = None
        tv.datasets, tv.transforms, transforms.functional = datasets, transforms, functional
        sys.modules.update({"torchvision": tv, "torchvision.datasets": datasets,
                            "torchvision.transforms": transforms,
                            "torchvision.transforms.functional": functional})  # fmt: skip


def _samples(path: str):
    z = np.load(path)
    blob, offsets, labels = z["blob"], z["offsets"], z["labels"]
    for i in range(labels.size):
        yield blob[offsets[i] : offsets[i + 1]].tobytes(), int(labels[i])


def write(args) -> None:
    _without_torchvision()
    from streaming import MDSWriter

    with MDSWriter(out=args.out, columns={"image": "bytes", "label": "int"},
                   size_limit=args.shard_bytes) as w:  # fmt: skip
        for image, label in _samples(args.samples):
            w.write({"image": image, "label": label})


def epochs(args) -> None:
    import torch
    from PIL import Image

    _without_torchvision()
    from streaming import StreamingDataset
    from torch.utils.data import DataLoader

    class Decoded(StreamingDataset):
        def __getitem__(self, i):
            row = super().__getitem__(i)
            img = np.asarray(Image.open(io.BytesIO(row["image"])))
            return torch.from_numpy(img[None].copy()).float().div_(255.0), row["label"], i

    ds = Decoded(
        remote=args.remote, local=args.local, shuffle=True, shuffle_algo=args.shuffle_algo,
        shuffle_block_size=args.shuffle_block, predownload=args.predownload,
        cache_limit=args.cache_limit, batch_size=args.batch_size, shuffle_seed=0,
    )  # fmt: skip
    loader = DataLoader(ds, batch_size=args.batch_size, num_workers=args.workers,
                        persistent_workers=True)  # fmt: skip
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
    w.add_argument("--shard-bytes", type=int, default=256 << 10)
    e = sub.add_parser("epochs")
    e.add_argument("remote")
    e.add_argument("--local", required=True)
    e.add_argument("--cache-limit", type=int, required=True)
    e.add_argument("--epochs", type=int, default=3)
    e.add_argument("--workers", type=int, default=8)
    e.add_argument("--batch-size", type=int, default=128)
    e.add_argument("--shuffle-block", type=int, default=2048)
    e.add_argument("--shuffle-algo", default="py1e")
    e.add_argument("--predownload", type=int, default=128)
    args = ap.parse_args()
    (write if args.cmd == "write" else epochs)(args)


if __name__ == "__main__":
    main()
