"""What each source format costs per sample: opening it (building its index the first
time, reading the cached index after), the index's bytes per id (on disk and in memory),
and reading samples (first reads from local disk, in batches of 256 in a random order;
storage requests per sample with ``TarStorage``'s coalescing).

Fashion-MNIST's first ``--samples`` training images are written in each format by
``hotset prepare`` (files, tar, parquet), a Hugging Face dataset is saved with
``save_to_disk`` when ``datasets`` is installed, and an in-memory torch Dataset of the
same images is wrapped by ``from_dataset``.

    python benchmarks/source_costs.py [--samples 20000]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import report  # noqa: E402
from hotset.storage.open import from_dataset, open_storage  # noqa: E402
from hotset.storage.prepare import prepare_fashion_mnist  # noqa: E402


def _timed_open(make):
    tracemalloc.start()
    t = time.perf_counter()
    storage = make()
    seconds = time.perf_counter() - t
    current = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return storage, seconds, current


def measure(name: str, make, index_dir: Path | None) -> dict:
    before = {p: p.stat().st_size for p in index_dir.glob("*")} if index_dir else {}
    storage, first_s, mem = _timed_open(make)
    index_bytes = (
        sum(p.stat().st_size for p in index_dir.glob("*") if p not in before) if index_dir else 0
    )
    _, again_s, _ = _timed_open(make)
    n = len(storage)
    order = np.random.default_rng(0).permutation(n)
    requests0 = storage.requests or 0
    t = time.perf_counter()
    nbytes = 0
    for b in range(0, n, 256):
        nbytes += sum(len(x) for x in storage.read_many(order[b : b + 256].tolist()))
    read_s = time.perf_counter() - t
    requests = storage.requests
    return {
        "format": name, "samples": n, "open_first_ms": first_s * 1e3,
        "open_cached_ms": again_s * 1e3, "index_file_b_per_id": index_bytes / n,
        "index_mem_b_per_id": mem / n, "read_us_per_sample": read_s / n * 1e6,
        "bytes_per_sample": nbytes / n,
        "requests_per_sample": (requests - requests0) / n if requests is not None else float("nan"),
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=20000)
    ap.add_argument("--name", default="source_costs")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        os.environ["HOTSET_CACHE_DIR"] = str(root / "cache")
        index_dir = root / "cache" / "index"
        rows = []
        for fmt in ("files", "tar", "parquet"):
            prepare_fashion_mnist(str(root / fmt), limit=args.samples, fmt=fmt)
            path = str(root / fmt / "train")
            rows.append(measure(fmt, lambda path=path: open_storage(path), index_dir))
        # the files tree without its manifest: an ImageFolder indexed from its listing
        (root / "files" / "train" / "manifest.json").unlink()
        path = str(root / "files" / "train")
        rows.append(measure("imagefolder", lambda: open_storage(path), index_dir))
        try:
            import datasets

            table = open_storage(str(root / "parquet" / "train"))._file(0).read()
            datasets.Dataset(table).save_to_disk(str(root / "hf"))
            rows.append(measure("hf", lambda: open_storage(str(root / "hf")), None))
        except ImportError:
            print("datasets not installed: no hf row")
        tensors = _InMemory(root / "parquet" / "train")
        rows.append(measure("torch Dataset", lambda: from_dataset(tensors, name="fmnist"), None))
    cols = [
        ("format", "s"), ("samples", "d"), ("open_first_ms", ".0f"), ("open_cached_ms", ".0f"),
        ("index_file_b_per_id", ".1f"), ("index_mem_b_per_id", ".1f"),
        ("read_us_per_sample", ".1f"), ("bytes_per_sample", ".0f"), ("requests_per_sample", ".3f"),
    ]  # fmt: skip
    report(args.name, rows, cols, {"args": vars(args)})


class _InMemory:
    """A user's map-style Dataset: decoded uint8 images and labels in memory."""

    def __init__(self, parquet_dir: Path) -> None:
        import io

        from PIL import Image

        table = open_storage(str(parquet_dir))._file(0).read()
        self.images = [np.asarray(Image.open(io.BytesIO(b))) for b in table["image"].to_pylist()]
        self.labels = table["label"].to_pylist()

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):
        return self.images[i], self.labels[i]


if __name__ == "__main__":
    main()
