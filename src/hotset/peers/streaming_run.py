"""MosaicML Streaming, the peer hotset is measured against. Run by the peer's own Python
(a venv with ``mosaicml-streaming``: ``make peers`` builds ``.venv-peers``), as a script:
it imports numpy, torch, PIL and streaming, never hotset.

    python streaming_run.py write SAMPLES.npz OUT_DIR --shard-bytes 262144
    python streaming_run.py epochs REMOTE --local DIR --cache-limit BYTES [--epochs 3]
        [--workers 8] [--batch-size 128] [--shuffle-block 2048] [--predownload 128]
        [--link LATENCY_MS,BANDWIDTH_MB_S,CONCURRENCY]
        [--model MODEL.pt --eval EVAL.npz --size 28,28 --seed 0 --device cpu] [--head N]

``write``: samples (image or ``.npy`` bytes and labels, as ``hotset compare --peers`` and
``benchmarks/peer_compare.py`` dump them) as MDS shards. ``epochs``: a
``StreamingDataset`` over ``REMOTE`` (a directory, or ``s3://`` through
``S3_ENDPOINT_URL``) in a DataLoader, each sample decoded as hotset's loader decodes it;
one JSON line per epoch (seconds, samples, distinct samples, shard reads and bytes; the
first epoch's also the seconds from the dataset's making to its first batch).
``--head N``: a sample is its first ``N`` bytes, not decoded (``head``: the data path
alone measured, as ``benchmarks/disk_peers.py`` measures it).

``--link``: a remote directory sits behind the link model of hotset's
``ThrottledStorage``: each shard download waits for one of ``CONCURRENCY`` slots (across
the DataLoader's workers), then ``LATENCY_MS``, then its bytes cross one
``BANDWIDTH_MB_S`` shared by every download. ``--model``: a TorchScript model (hotset
saves it, initialised as its own rows' model) trained with Adam (lr 1e-3) on the mean
per-sample cross entropy, as ``hotset compare`` trains; after each timed epoch, its
accuracy on ``EVAL.npz``'s validation and test tensors (not timed).
"""

from __future__ import annotations

import argparse
import io
import json
import multiprocessing
import os
import sys
import time
import types
import warnings

import numpy as np

NPY_MAGIC = b"\x93NUMPY"
KEPT_MODES = ("L", "LA", "RGB", "RGBA")  # hotset.codecs.decode_image's


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


def decode(data: bytes, size: tuple[int, int] | None) -> np.ndarray:
    """As hotset's ``decode_sample`` for an image or ``.npy`` sample: C x H x W uint8
    (PIL, the image's mode kept where it is one of ``KEPT_MODES``, else RGB; resized to
    ``size``), or the array."""
    if data[:6] == NPY_MAGIC:
        return np.load(io.BytesIO(data), allow_pickle=False)
    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        want = img.mode if img.mode in KEPT_MODES else "RGB"
        if img.mode != want:
            img = img.convert(want)
        if size is not None and img.size != size:
            img = img.resize(size)
        arr = np.asarray(img, dtype=np.uint8)
    return arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1)


def head(data: bytes, n: int) -> np.ndarray:
    """A sample's first ``n`` bytes (zero-padded), as ``benchmarks/disk_peers.py`` serves
    it to every loader: the data path measured without a decoder's CPU."""
    out = np.zeros(n, np.uint8)
    view = np.frombuffer(data[:n], np.uint8)
    out[: view.size] = view
    return out


class Link:
    """``ThrottledStorage``'s link for Streaming's downloads from a local directory:
    ``concurrency`` slots, ``latency_ms`` a download, one ``bandwidth_mb_s`` shared by all
    (the time the link is next free, a value every forked worker shares), and the count
    of downloads and bytes."""

    def __init__(self, latency_ms: float, bandwidth_mb_s: float, concurrency: int) -> None:
        self.latency_s, self.bytes_per_s = latency_ms / 1000.0, bandwidth_mb_s * 1e6
        self.slots = multiprocessing.BoundedSemaphore(int(concurrency))
        self.free = multiprocessing.Value("d", 0.0)
        self.reads = multiprocessing.Value("q", 0)
        self.nbytes = multiprocessing.Value("q", 0)

    def install(self) -> None:
        """Every download from a local directory goes through this link."""
        from streaming.base.storage.download import LocalDownloader

        copy = LocalDownloader._download_file_impl
        link = self

        def through_link(self, remote: str, local: str, timeout: float) -> None:
            size = os.path.getsize(remote)
            with link.slots:
                start = time.monotonic()
                copy(self, remote, local, timeout)
                link.pay(size, start)
            with link.reads.get_lock():
                link.reads.value += 1
            with link.nbytes.get_lock():
                link.nbytes.value += size

        LocalDownloader._download_file_impl = through_link

    def pay(self, nbytes: int, start: float) -> None:
        done = start + self.latency_s
        if self.bytes_per_s and nbytes:
            with self.free.get_lock():
                done = max(done, self.free.value) + nbytes / self.bytes_per_s
                self.free.value = done
        remaining = done - time.monotonic()
        if remaining > 0:
            time.sleep(remaining)


def _accuracy(model, x, y, device, batch: int = 1000) -> float:
    import torch

    model.eval()
    with torch.no_grad():
        correct = sum(
            int((model(x[i : i + batch].to(device)).argmax(1).cpu() == y[i : i + batch]).sum())
            for i in range(0, len(x), batch)
        )
    model.train()
    return correct / max(1, len(x))


def epochs(args) -> None:
    import torch

    _without_torchvision()
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory
    from torch.utils.data import DataLoader

    clean_stale_shared_memory()
    link = Link(*args.link) if args.link else None
    if link is not None:
        link.install()
    size = tuple(args.size) if args.size else None

    class Decoded(StreamingDataset):
        def __getitem__(self, i):
            row = super().__getitem__(i)
            data = row["image"]
            x = torch.from_numpy(
                head(data, args.head) if args.head else np.array(decode(data, size), copy=True)
            )
            return (x.float().div_(255.0) if x.dtype == torch.uint8 else x), row["label"], i

    opened, first_batch_s = time.perf_counter(), float("nan")  # (from a cold start)
    ds = Decoded(
        remote=args.remote, local=args.local, shuffle=True, shuffle_algo=args.shuffle_algo,
        shuffle_block_size=args.shuffle_block, predownload=args.predownload,
        cache_limit=args.cache_limit, batch_size=args.batch_size, shuffle_seed=args.seed,
    )  # fmt: skip
    loader = DataLoader(ds, batch_size=args.batch_size, num_workers=args.workers,
                        persistent_workers=args.workers > 0)  # fmt: skip
    device = torch.device(args.device)
    model = opt = evals = None
    if args.model:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = torch.jit.load(args.model, map_location=device)
        model.train()
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        z = np.load(args.eval)
        evals = {k: (torch.from_numpy(z[k + "_x"]), torch.from_numpy(z[k + "_y"]))
                 for k in ("val", "test") if k + "_x" in z}  # fmt: skip
    for epoch in range(args.epochs):
        reads0, bytes0 = (link.reads.value, link.nbytes.value) if link else (0, 0)
        start, seen, n, total = time.perf_counter(), set(), 0, 0.0
        for x, y, idx in loader:
            if epoch == 0 and not n:
                first_batch_s = time.perf_counter() - opened
            seen.update(idx.tolist())
            n += len(idx)
            if model is not None:
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                losses = torch.nn.functional.cross_entropy(model(x), y, reduction="none")
                opt.zero_grad(set_to_none=True)
                losses.mean().backward()
                opt.step()
                total += float(losses.detach().sum())
        line = {"epoch": epoch, "seconds": time.perf_counter() - start, "samples": n,
                "distinct": len(seen)}  # fmt: skip
        if epoch == 0:  # from the dataset's making: its index read, its first shards
            line["first_batch_s"] = first_batch_s
        if link is not None:
            line |= {"reads": link.reads.value - reads0, "bytes": link.nbytes.value - bytes0}
        if model is not None:
            line["train_loss"] = total / max(1, n)
            line |= {k + "_accuracy": _accuracy(model, *xy, device) for k, xy in evals.items()}
        print(json.dumps(line), flush=True)


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",")]


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
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--link", type=lambda s: [float(v) for v in s.split(",")])
    e.add_argument("--model")
    e.add_argument("--eval")
    e.add_argument("--size", type=_ints)
    e.add_argument("--device", default="cpu")
    e.add_argument("--head", type=int, default=0)
    args = ap.parse_args()
    (write if args.cmd == "write" else epochs)(args)


if __name__ == "__main__":
    main()
