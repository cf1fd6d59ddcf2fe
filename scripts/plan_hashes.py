"""Hash every plan each system makes (every BatchPlan field) and the samples it serves over
four epochs of a small tar set, with and without a resume mid-epoch, so that a change
meant to leave the plans alone can be checked: run it before (``--write before.json``)
and after (``--check before.json``).

The request latency fit is left at its prior (it follows the machine's timing), and
iCACHE and SpiderCache are left out: their feeder and graph threads make their plans
depend on timing. ``python scripts/plan_hashes.py --write /tmp/plans.json``
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import tarfile
import tempfile
from dataclasses import fields
from pathlib import Path

import numpy as np
import torch

import hotset
from hotset.io.requests import LatencyFit
from hotset.plan import BatchPlan, Planner

SAMPLES, SHARD = 1200, 100
CONFIGS: dict[str, dict] = {
    **{s: {"system": s} for s in ("lru", "minio", "fifo", "lfu", "random", "refcnt", "belady",
                                   "shade", "shade+", "sh_app", "sh_lru")},
    "lru-blocks": {"system": "lru", "order": "blocks", "block_size": 200},
    "shade-blocks": {"system": "shade", "order": "blocks", "block_size": 200},
    "lru-disk": {"system": "lru", "disk": True},
    "shade-disk": {"system": "shade", "disk": True},
    "shade-no-readahead": {"system": "shade", "readahead_bytes": 0},
    "shade-drop-last": {"system": "shade", "drop_last": True},
}  # fmt: skip


def write_tars(root: Path) -> None:
    rng = np.random.default_rng(0)
    root.mkdir(parents=True)
    for s in range(0, SAMPLES, SHARD):
        with tarfile.open(root / f"shard-{s // SHARD:03d}.tar", "w") as tf:
            for k in range(s, s + SHARD):
                fields_ = (("bin", rng.bytes(int(rng.integers(500, 3000)))),
                           ("cls", str(k % 10).encode()))  # fmt: skip
                for name, value in fields_:
                    info = tarfile.TarInfo(f"s{k:05d}.{name}")
                    info.size = len(value)
                    tf.addfile(info, io.BytesIO(value))


def hashed(current: list) -> None:
    """Every plan the planner yields goes into the digest ``current[0]``."""
    plain = Planner.__iter__

    def each(self):
        for p in plain(self):
            for f in fields(BatchPlan):
                v = getattr(p, f.name)
                v = v > 0 if f.name == "wait_s" else v  # (whether it waits, not how long)
                v = v.tolist() if isinstance(v, np.ndarray) else v
                current[0].update(f.name.encode() + repr(v).encode())
            yield p

    Planner.__iter__ = each


def epochs(loader, first: int, digest, stop_at=None):
    for e in range(first, 4):
        loader.set_epoch(e)
        for b, (_, _, ids) in enumerate(loader):
            digest.update(ids.numpy().tobytes())
            losses = torch.tensor(((ids.numpy() * 2654435761) % 1000) / 1000.0)
            loader.feedback(ids, losses.float())
            if stop_at == (e, b):
                return loader.state_dict()
        stats = loader.epoch_stats[-1]
        digest.update(f"{stats.hits},{stats.samples}".encode())
    return None


def run(name: str, resume: bool, data: Path, work: Path, current) -> str:
    options = dict(CONFIGS[name])
    if options.pop("disk", False):
        options.update(disk_dir=str(work / "disk"), disk_bytes=64 << 20)
    common = dict(batch_size=32, cache_fraction=0.2, num_workers=0, input_field="bin",
                  target_field="cls", decode=lambda b: torch.tensor(len(b)), seed=0,
                  epochs=4, store=f"shared://{work}/store", package_dir=str(work / "pk"),
                  **options)  # fmt: skip
    current[0] = digest = hashlib.blake2b(digest_size=8)
    with hotset.make_loader(str(data), **common) as loader:
        state = epochs(loader, 0, digest, stop_at=(1, 10) if resume else None)
    if resume:
        with hotset.make_loader(str(data), **common) as loader:
            loader.load_state_dict(state)
            epochs(loader, 1, digest)
    return digest.hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", help="record the hashes in this JSON file")
    ap.add_argument("--check", help="compare with the hashes recorded in this JSON file")
    ap.add_argument("configs", nargs="*", default=list(CONFIGS))
    args = ap.parse_args()
    LatencyFit.observe = lambda self, *a, **k: None  # (plans free of the machine's timing)
    current = [None]
    hashed(current)
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["HOTSET_CACHE_DIR"] = str(Path(tmp) / "index")
        write_tars(Path(tmp) / "tar")
        for name in args.configs:
            for resume in (False, True):
                work = Path(tempfile.mkdtemp(dir=tmp))
                key = name + ("/resume" if resume else "")
                out[key] = run(name, resume, Path(tmp) / "tar", work, current)
                print(key, out[key], flush=True)
    if args.write:
        Path(args.write).write_text(json.dumps(out, indent=1))
    if args.check:
        before = json.loads(Path(args.check).read_text())
        changed = [k for k in out if before.get(k) != out[k]]
        print("plans unchanged" if not changed else f"plans changed: {', '.join(changed)}")
        raise SystemExit(1 if changed else 0)


if __name__ == "__main__":
    main()
