"""What building a manifest costs before the first batch, per id: memory held and at its
peak (``tracemalloc``, numpy's buffers included) and seconds.

* ``tar``: a WebDataset tar set of ``--samples`` samples in ``--shards`` shards (two small
  members each), opened from its cached indexes (the second opening: what every run
  after the first pays), its manifest's paths and keys built as columns shard by shard;
* ``imagefolder``: an ImageFolder tree of ``--files`` small files in 200 classes, listed
  and its index built, then listed again with its index cached (what every start pays);
* ``tar-scale``: a tar set of ``--scale-ids`` samples (10,000 a shard) opened from its
  shards' cached indexes in a fresh process (the first opening joins them into the set's
  index file), then again (later openings map that file): seconds, and the process's
  peak resident bytes (``VmHWM``, less its peak before opening) per id. The shards'
  indexes are written as hotset keeps them (two members a sample, random keys) and the
  shards are sparse files of the indexed sizes: opening from cached indexes reads no
  shard's bytes;
* ``columns``: an ImageNet-like manifest (``plan_scale.make_manifest``: keys, paths,
  sizes, labels) built from its strings, then written as the columns file a node's
  processes map (``Manifest.to_columns``): its peak against the file's bytes.

    python benchmarks/manifest_build.py [--samples 200000] [--shards 20] [--files 200000]
        [--ids 1000000] [--scale-ids 50000000] [--parts tar,imagefolder,columns,tar-scale]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tarfile
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import report  # noqa: E402


def write_tars(root: Path, samples: int, shards: int) -> None:
    per = -(-samples // shards)
    for s in range(shards):
        with tarfile.open(root / f"shard-{s:05d}.tar", "w") as tf:
            for i in range(min(per, samples - s * per)):
                for ext, data in (("cls", b"3"), ("txt", b"x" * 10)):
                    info = tarfile.TarInfo(f"sample{s:05d}_{i:08d}.{ext}")
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))


def measure(build) -> tuple[object, dict]:
    """``build()`` under tracemalloc: what it returns, and its seconds, held and peak bytes."""
    tracemalloc.start()
    t = time.perf_counter()
    out = build()
    seconds = time.perf_counter() - t
    held, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return out, {"seconds": seconds, "held": held, "peak": peak}


def bench_tar(work: Path, samples: int, shards: int) -> dict:
    from hotset.storage.tar import TarStorage

    root = work / "tars"
    root.mkdir()
    write_tars(root, samples, shards)
    os.environ["HOTSET_CACHE_DIR"] = str(work / "index-cache")
    TarStorage(f"{root}/")  # the indexes built and cached
    storage, r = measure(lambda: TarStorage(f"{root}/"))
    n = len(storage)
    return {"part": "tar, from cached indexes", "ids": n, "seconds": r["seconds"],
            "held_B_per_id": r["held"] / n, "peak_B_per_id": r["peak"] / n,
            "columns_B_per_id": len(storage.manifest.to_columns()) / n}  # fmt: skip


PER_SHARD = 10_000


def write_indexed_sparse_tars(root: Path, ids: int) -> None:
    """Shards of ``PER_SHARD`` samples (``sample########``, members ``cls`` and ``txt``
    of 1 and 10 bytes: 2 KB a sample) as sparse files, each with its index cached."""
    import numpy as np

    from hotset.io.reader import Retry
    from hotset.storage.columns import DigestColumn, StringColumn
    from hotset.storage.index_cache import cached_index
    from hotset.storage.tar import INDEX_KIND, fingerprint, index_bytes, locate_shards

    shards = -(-ids // PER_SHARD)
    for s in range(shards):
        with open(root / f"shard-{s:05d}.tar", "wb") as f:
            f.truncate(min(PER_SHARD, ids - s * PER_SHARD) * 2048 + 1024)
    fs, urls, paths = locate_shards(f"{root}/", {}, Retry())
    rng = np.random.default_rng(0)
    for s in range(shards):
        n = min(PER_SHARD, ids - s * PER_SHARD)
        i = s * PER_SHARD + np.arange(n, dtype=np.int64)
        digits = (i[:, None] // 10 ** np.arange(7, -1, -1)) % 10 + ord("0")
        text = np.hstack([np.tile(np.frombuffer(b"sample", np.uint8), (n, 1)), digits])
        start = np.arange(n, dtype=np.int64) * 2048
        arrays = {
            "names": StringColumn._of(text.astype(np.uint8).ravel(), 14 * np.arange(1, n + 1)),
            "keys": DigestColumn.of_raw(rng.integers(0, 256, (n, 16), np.uint8)),
            "start": start, "end": start + 2048, "sizes": np.full(n, 40, np.int64),
            "m_ptr": 2 * np.arange(n + 1, dtype=np.int64),
            "m_field": np.tile(np.array([0, 1], np.int16), n),
            "m_off": np.tile(np.array([512, 1536], np.int64), n),
            "m_size": np.tile(np.array([1, 10], np.int64), n), "fields": np.array(["cls", "txt"]),
        }  # fmt: skip
        version = fingerprint(fs.info(paths[s]))
        cached_index(INDEX_KIND, urls[s], version, lambda a=arrays: index_bytes(a))


def open_at_scale(root: str) -> dict:
    """Open the tar set at ``root`` (in this fresh process): seconds and peak bytes."""
    from hotset.storage.tar import TarStorage

    def hwm() -> int:
        with open("/proc/self/status") as f:
            return 1024 * next(int(x.split()[1]) for x in f if x.startswith("VmHWM"))

    before = hwm()
    t = time.perf_counter()
    storage = TarStorage(f"{root}/")
    seconds = time.perf_counter() - t
    n, m = len(storage), storage.manifest
    columns = (m.paths._blob.nbytes + m.paths._ends.nbytes + m.keys.raw.nbytes + m.sizes.nbytes
               + m.labels.nbytes)  # what ``to_columns`` writes, without a copy of it here
    return {"part": "", "ids": n, "seconds": seconds,
            "held_B_per_id": float("nan"), "peak_B_per_id": (hwm() - before) / n,
            "columns_B_per_id": columns / n}  # fmt: skip


def first_plan(root: str, system: str, batches: int = 16) -> list[int]:
    """The ids the first ``batches`` batches of a loader of ``system`` over the set at
    ``root`` read, with their read-ahead's."""
    import itertools

    import hotset

    loader = hotset.make_loader(f"{root}/", **LOADER, system=system)
    loader.set_epoch(0)
    plans = list(itertools.islice(loader.planner, batches))
    return sorted({i for p in plans for i in (*p.ids.tolist(), *p.loads.tolist())})


def first_batch(root: str, system: str) -> dict:
    """``make_loader`` over the set at ``root`` to its first batch (in this fresh process)."""
    import hotset

    t = time.perf_counter()
    loader = hotset.make_loader(f"{root}/", **LOADER, system=system)
    loader.set_epoch(0)
    _, _, ids = next(iter(loader))
    seconds = time.perf_counter() - t
    with open("/proc/self/status") as f:
        peak = 1024 * next(int(x.split()[1]) for x in f if x.startswith("VmHWM"))
    return {"seconds": seconds, "peak_GB": peak / 2**30, "served": len(ids)}


#: the first batch's loader: 10% cache, batches of 256, 2 workers, no read-ahead (the
#: samples it would stage are not made real)
LOADER = {"batch_size": 256, "cache_fraction": 0.1, "num_workers": 2, "seed": 0,
          "input_field": "txt", "target_field": "cls", "readahead_bytes": 0,
          "collate_fn": lambda samples: samples}  # fmt: skip


def write_members(root: Path, ids: list[int]) -> None:
    """The members of samples ``ids`` written into their sparse shards where the index
    says they are (the shards' sizes and times kept: their cached indexes still hold)."""
    import tarfile

    for i in ids:
        path = root / f"shard-{i // PER_SHARD:05d}.tar"
        st = path.stat()
        with open(path, "r+b") as f:
            for at, (field, data) in zip((0, 1024), (("cls", b"3"), ("txt", b"x" * 10)),
                                         strict=True):  # fmt: skip
                info = tarfile.TarInfo(f"sample{i:08d}.{field}")
                info.size = len(data)
                f.seek((i % PER_SHARD) * 2048 + at)
                f.write(info.tobuf() + data)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def bench_tar_scale(work: Path, ids: int) -> list[dict]:
    import subprocess

    root = work / "sparse-tars"
    root.mkdir()
    os.environ["HOTSET_CACHE_DIR"] = str(work / "index-cache")
    write_indexed_sparse_tars(root, ids)
    rows = []
    for part in ("tar at scale, first opening", "tar at scale, later openings"):
        out = subprocess.run([sys.executable, __file__, "--open-at-scale", str(root)],
                             capture_output=True, text=True, check=True)  # fmt: skip
        rows.append({**json.loads(out.stdout.splitlines()[-1]), "part": part})
    for system in ("lru", "shade"):  # its first batch's samples made real, then timed
        run = [sys.executable, __file__, "--open-at-scale", str(root), "--system", system]
        out = subprocess.run([*run, "--first-plan"], capture_output=True, text=True, check=True)
        write_members(root, json.loads(out.stdout.splitlines()[-1]))
        out = subprocess.run(run, capture_output=True, text=True, check=True)
        got = json.loads(out.stdout.splitlines()[-1])
        rows.append({"part": f"make_loader to the first batch, {system}", "ids": ids,
                     "seconds": got["seconds"], "held_B_per_id": float("nan"),
                     "peak_B_per_id": got["peak_GB"] * 2**30 / ids,
                     "columns_B_per_id": float("nan")})  # fmt: skip
    return rows


def bench_imagefolder(work: Path, files: int, classes: int = 200) -> list[dict]:
    from hotset.storage.files import FileStorage

    root = work / "imagefolder"
    for i in range(files):
        folder = root / f"c{i % classes:04d}"
        if i < classes:
            folder.mkdir(parents=True)
        (folder / f"{i:08d}.jpg").write_bytes(b"x" * (100 + i % 7))
    os.environ["HOTSET_CACHE_DIR"] = str(work / "index-cache")
    rows = []
    for part in ("imagefolder, index built", "imagefolder, index cached"):
        storage, r = measure(lambda: FileStorage(str(root)))
        rows.append({"part": part, "ids": len(storage), "seconds": r["seconds"],
                     "held_B_per_id": r["held"] / files, "peak_B_per_id": r["peak"] / files,
                     "columns_B_per_id": len(storage.manifest.to_columns()) / files})  # fmt: skip
    return rows


def bench_columns(ids: int) -> dict:
    from plan_scale import make_manifest

    make_manifest(10)  # imports are not the build's memory
    data, r = measure(lambda: make_manifest(ids).to_columns())
    return {"part": "manifest to its columns file", "ids": ids, "seconds": r["seconds"],
            "held_B_per_id": r["held"] / ids, "peak_B_per_id": r["peak"] / ids,
            "columns_B_per_id": len(data) / ids}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=200_000, help="tar samples")
    ap.add_argument("--shards", type=int, default=20)
    ap.add_argument("--files", type=int, default=200_000, help="ImageFolder files")
    ap.add_argument("--ids", type=int, default=1_000_000, help="the columns part's ids")
    ap.add_argument("--scale-ids", type=int, default=50_000_000, help="tar-scale's samples")
    ap.add_argument("--parts", default="tar,imagefolder,columns")
    ap.add_argument("--open-at-scale", help=argparse.SUPPRESS)
    ap.add_argument("--system", help=argparse.SUPPRESS)
    ap.add_argument("--first-plan", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.open_at_scale and args.system:
        run = first_plan if args.first_plan else first_batch
        print(json.dumps(run(args.open_at_scale, args.system)))
        return
    if args.open_at_scale:
        print(json.dumps(open_at_scale(args.open_at_scale)))
        return
    parts, rows = args.parts.split(","), []
    with tempfile.TemporaryDirectory(prefix="hotset-manifest-") as tmp:
        if "tar" in parts:
            rows.append(bench_tar(Path(tmp), args.samples, args.shards))
        if "imagefolder" in parts:
            rows += bench_imagefolder(Path(tmp), args.files)
        if "columns" in parts:
            rows.append(bench_columns(args.ids))
        if "tar-scale" in parts:
            rows += bench_tar_scale(Path(tmp), args.scale_ids)
    report(
        "manifest_build", rows,
        [("part", "s"), ("ids", ",d"), ("seconds", ".2f"), ("held_B_per_id", ".0f"),
         ("peak_B_per_id", ".0f"), ("columns_B_per_id", ".0f")],
        meta=vars(args),
    )  # fmt: skip


if __name__ == "__main__":
    main()
