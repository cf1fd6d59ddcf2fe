"""The disk tier (``store/disk.py``), measured side by side on the same disk.

* ``hit``: one 100 KB sample read from the tier against one ``pread`` of the same bytes
  from a flat file on the same disk, the files' pages dropped before each read
  (``posix_fadvise(DONTNEED)``: no read-ahead of the kernel's helps either), interleaved
  in a random order; the reads and bytes the kernel counts per sample
  (``/proc/self/io``: ``syscr``, ``read_bytes``).
* ``fill``: samples put into the tier in batches (64 x 100 KB), then ``sync``, against
  ``dd bs=1M conv=fdatasync`` of as many bytes, interleaved.
* ``epoch``: a training loader's epochs over tar shards of 100 KB ``.npy`` samples behind
  an emulated link (nginx behind a wire of ``--latency-ms`` a request and
  ``--bandwidth`` MB/s shared), a RAM tier of 5% of the data: hotset with a disk tier that
  holds the data, hotset without one, a second run over the kept disk tier, and a plain
  DataLoader reading the same samples from files on the local disk; then, with a disk
  tier of 30% of the data, SHADE against uniform + LRU (their hits over both tiers).
  Each rep runs the variants one after another, reps interleaved.

    python benchmarks/disk_tier.py [--reps 2] [--samples 3000] [--dir DIR]
"""

from __future__ import annotations

import argparse
import io
import os
import random
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
from _report import report  # noqa: E402
from hotset.store.disk import SUBDIR, DiskTier  # noqa: E402
from hotset.testing import DelayProxy, NginxServer  # noqa: E402

SAMPLE = 100_000


def io_counts() -> tuple[int, int]:
    """This process's read syscalls and bytes read from storage (``/proc/self/io``; its
    own reading of that file counted in: ``IO_COUNTS_READS``)."""
    fields = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    return int(fields["syscr"]), int(fields["read_bytes"])


IO_COUNTS_READS = io_counts()[0] - io_counts()[0] and 0  # (set in main: calibrated)


def drop_pages(paths) -> None:
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def bench_hit(work: Path, n: int, reps: int) -> list[dict]:
    rng = np.random.default_rng(0)
    values = {f"k{i}": rng.bytes(SAMPLE) for i in range(n)}
    tier = DiskTier(work / "tier", 4 * n * SAMPLE)
    tier.put(values)
    flat = work / "flat.bin"
    flat.write_bytes(b"".join(values.values()))
    segments = list((work / "tier" / SUBDIR).glob("seg-*"))
    fd = os.open(flat, os.O_RDONLY)
    keys = list(values)
    rows = []
    for rep in range(reps):
        order = random.Random(rep).sample(range(n), n)
        times = {"tier": [], "pread": []}
        counts = {"tier": [0, 0], "pread": [0, 0]}
        for i in order:  # interleaved: each sample from both, in turn, each read cold
            for how in random.Random(i + rep).sample(["tier", "pread"], 2):
                drop_pages([*segments, flat])
                c0, b0 = io_counts()
                t = time.perf_counter()
                if how == "tier":
                    got = tier.get_many([keys[i]])[0]
                else:
                    got = os.pread(fd, SAMPLE, i * SAMPLE)
                times[how].append(time.perf_counter() - t)
                c1, b1 = io_counts()
                counts[how][0] += c1 - c0 - IO_COUNTS_READS
                counts[how][1] += b1 - b0
                assert got == values[keys[i]]
        for how in ("tier", "pread"):
            rows.append({
                "part": "hit", "variant": how, "rep": rep,
                "median_us": 1e6 * float(np.median(times[how])),
                "mean_us": 1e6 * float(np.mean(times[how])),
                "reads_per_sample": counts[how][0] / n,
                "bytes_read_per_byte": counts[how][1] / (n * SAMPLE),
            })  # fmt: skip
    os.close(fd)
    tier.close()
    return rows


def bench_fill(work: Path, mbytes: int, reps: int) -> list[dict]:
    rng = np.random.default_rng(1)
    batch = [rng.bytes(SAMPLE) for _ in range(64)]
    n_batches = max(1, mbytes * 1_000_000 // (64 * SAMPLE))
    rows = []
    for rep in range(reps):
        for how in random.Random(rep).sample(["tier", "dd"], 2):
            shutil.rmtree(work / "fill", ignore_errors=True)
            (work / "fill").mkdir(mode=0o700)
            os.sync()
            t = time.perf_counter()
            if how == "tier":
                tier = DiskTier(work / "fill" / "t", 2 * n_batches * 64 * SAMPLE)
                for b in range(n_batches):
                    tier.put({f"r{rep}-{b}-{k}": v for k, v in enumerate(batch)})
                tier.close()
                os.sync()
            else:
                subprocess.run(["dd", "if=/dev/zero", f"of={work / 'fill' / 'dd.bin'}", "bs=1M",
                                f"count={n_batches * 64 * SAMPLE >> 20}"],
                               check=True, capture_output=True)  # fmt: skip
                os.sync()
            s = time.perf_counter() - t
            rows.append({"part": "fill", "variant": how, "rep": rep,
                         "mb_s": n_batches * 64 * SAMPLE / s / 1e6})  # fmt: skip
    shutil.rmtree(work / "fill", ignore_errors=True)
    return rows


def make_shards(root: Path, n: int, per_shard: int = 100) -> int:
    root.mkdir(parents=True, exist_ok=True)
    files = root.parent / "files"
    files.mkdir(exist_ok=True)
    for s in range(0, n, per_shard):
        with tarfile.open(root / f"shard-{s // per_shard:04d}.tar", "w") as tf:
            for k in range(s, min(n, s + per_shard)):
                arr = np.random.default_rng(k).integers(0, 255, SAMPLE - 128, np.uint8)
                buf = io.BytesIO()
                np.save(buf, arr)
                (files / f"s{k:06d}.npy").write_bytes(buf.getvalue())
                for field, data in (("npy", buf.getvalue()), ("cls", str(k % 10).encode())):
                    info = tarfile.TarInfo(f"s{k:06d}.{field}")
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
    return n * SAMPLE


class LocalFiles(torch.utils.data.Dataset):
    """The plain baseline: the same samples as files (``*suffix``) on the local disk, each
    an array by ``load`` (a path -> uint8 array)."""

    def __init__(self, root: Path, suffix: str = ".npy", load=np.load) -> None:
        self.paths, self.load = sorted(root.glob("*" + suffix)), load

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        return torch.from_numpy(self.load(self.paths[i])).float().div_(255), i % 10


def losses_of(ids: torch.Tensor) -> torch.Tensor:
    """Persistent per-sample losses (a skewed importance), as a model's would be."""
    return torch.from_numpy(np.exp(2.0 * ((ids.numpy() * 7919) % 97 / 97.0)))


def run_hotset(url: str, wire: DelayProxy, epochs: int, data: int, **options) -> list[dict]:
    """Each epoch's seconds, hits over both tiers and source bytes (the first epoch's
    with what opening the loader read: shards read whole to be indexed)."""
    out, opened = [], wire.stats().get("bytes_down", 0)
    with hotset.make_loader(
        url, batch_size=64, cache_fraction=0.05, num_workers=8, input_field="npy",
        target_field="cls", epochs=epochs, seed=0, **options,
    ) as loader:  # fmt: skip
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            before = opened if epoch == 0 else wire.stats().get("bytes_down", 0)
            t = time.perf_counter()
            for _, _, ids in loader:
                loader.feedback(ids, losses_of(ids))
            s = time.perf_counter() - t
            e = loader.epoch_stats[-1]
            out.append({"epoch": epoch, "seconds": s, "hit_ratio": e.hit_ratio,
                        "disk_hits": e.disk_hits, "samples": e.samples,
                        "both_tiers": (e.hits + e.disk_hits) / max(1, e.samples),
                        "source_bytes_per_data_byte":
                            (wire.stats().get("bytes_down", 0) - before) / data})  # fmt: skip
    return out


def run_plain(root: Path, epochs: int) -> list[dict]:
    loader = torch.utils.data.DataLoader(LocalFiles(root), batch_size=64, shuffle=True,
                                         num_workers=8)  # fmt: skip
    out = []
    for epoch in range(epochs):
        t = time.perf_counter()
        for _ in loader:
            pass
        out.append({"epoch": epoch, "seconds": time.perf_counter() - t,
                    "source_bytes_per_data_byte": 0.0})  # fmt: skip
    return out


def bench_epoch(work: Path, n: int, reps: int, latency_ms: float, bandwidth: float) -> list[dict]:
    www = work / "www"
    data = make_shards(www / "shards", n)
    (work / "nginx").mkdir(exist_ok=True)
    nginx = NginxServer(www, work / "nginx")
    wire = DelayProxy(int(nginx.url.rsplit(":", 1)[1]), latency_ms, bandwidth)
    url = f"{wire.url}/shards/"
    os.environ["HOTSET_CACHE_DIR"] = str(work / "index-cache")
    rows = []
    try:
        for rep in range(reps):
            shutil.rmtree(work / "nvme", ignore_errors=True)
            variants = {
                "hotset, disk tier (fits)": lambda: run_hotset(
                    url, wire, 3, data, system="lru", disk_dir=work / "nvme",
                    disk_bytes=2 * data),
                "hotset, disk tier, a second run": lambda: run_hotset(
                    url, wire, 1, data, system="lru", disk_dir=work / "nvme",
                    disk_bytes=2 * data),
                "hotset, RAM only": lambda: run_hotset(url, wire, 3, data, system="lru"),
                "DataLoader, local files": lambda: run_plain(work / "www" / "files", 3),
                "lru, disk 30%": lambda: run_hotset(
                    url, wire, 3, data, system="lru", disk_dir=work / "small-lru",
                    disk_bytes=int(0.3 * data)),
                "shade, disk 30%": lambda: run_hotset(
                    url, wire, 3, data, system="shade", disk_dir=work / "small-shade",
                    disk_bytes=int(0.3 * data)),
            }  # fmt: skip
            for name, run in variants.items():
                for small in ("small-lru", "small-shade"):
                    shutil.rmtree(work / small, ignore_errors=True)
                for e in run():
                    rows.append({"part": "epoch", "variant": name, "rep": rep, **e})
                    print(rows[-1], flush=True)
    finally:
        wire.stop()
        nginx.stop()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--hit-samples", type=int, default=400)
    ap.add_argument("--fill-mb", type=int, default=512)
    ap.add_argument("--samples", type=int, default=3000, help="the epoch part's samples")
    ap.add_argument("--latency-ms", type=float, default=20.0)
    ap.add_argument("--bandwidth", type=float, default=100.0, help="MB/s")
    ap.add_argument("--parts", default="hit,fill,epoch")
    ap.add_argument("--dir", help="a directory on the disk to measure (default: a temp dir)")
    args = ap.parse_args()
    global IO_COUNTS_READS
    a, b = io_counts()[0], io_counts()[0]
    IO_COUNTS_READS = b - a  # what one io_counts() reads
    work = Path(tempfile.mkdtemp(prefix="hotset-disk-bench-", dir=args.dir))
    rows: list[dict] = []
    try:
        parts = args.parts.split(",")
        if "hit" in parts:
            rows += bench_hit(work, args.hit_samples, args.reps)
        if "fill" in parts:
            rows += bench_fill(work, args.fill_mb, args.reps)
        if "epoch" in parts:
            rows += bench_epoch(work, args.samples, args.reps, args.latency_ms, args.bandwidth)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for r in rows:
        for k in ("median_us", "mean_us", "reads_per_sample", "bytes_read_per_byte", "mb_s",
                  "epoch", "seconds", "hit_ratio", "both_tiers", "source_bytes_per_data_byte"):
            r.setdefault(k, float("nan"))
    report("disk_tier", rows, [
        ("part", "s"), ("variant", "s"), ("rep", "d"), ("median_us", ".0f"), ("mean_us", ".0f"),
        ("reads_per_sample", ".2f"), ("bytes_read_per_byte", ".2f"), ("mb_s", ".0f"),
        ("epoch", ".0f"), ("seconds", ".2f"), ("both_tiers", ".3f"),
        ("source_bytes_per_data_byte", ".3f"),
    ], meta={"dir": str(work.parent), "latency_ms": args.latency_ms,
             "bandwidth_mb_s": args.bandwidth})  # fmt: skip


if __name__ == "__main__":
    main()
