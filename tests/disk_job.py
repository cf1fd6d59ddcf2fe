"""One training job over tar shards with a disk tier, in a process of its own (the disk
tier's tests start it): ``python disk_job.py CONFIG_JSON``. Every served sample is checked
against the shards' bytes as they are on disk now (``shards``: a local copy); prints what
each epoch served and read as JSON."""

from __future__ import annotations

import io
import json
import sys
import tarfile
from pathlib import Path

import numpy as np
import torch

import hotset
from hotset.io.readahead import STAGE


def expected(shards: str) -> dict[str, tuple[np.ndarray, int]]:
    """Each sample's array and label, by name, from the shards' files."""
    out: dict[str, list] = {}
    for path in sorted(Path(shards).glob("*.tar")):
        with tarfile.open(path) as tf:
            for member in tf:
                name, field = member.name.split(".", 1)
                data = tf.extractfile(member).read()
                out.setdefault(name, [None, None])[field == "cls"] = (
                    int(data) if field == "cls" else np.load(io.BytesIO(data))
                )
    return {k: (v[0], v[1]) for k, v in out.items()}


def main(cfg: dict) -> dict:
    truth = expected(cfg["shards"])
    progress = Path(cfg["progress"]) if cfg.get("progress") else None
    batches, out, in_ram = 0, {"epochs": []}, 0
    with hotset.make_loader(
        cfg["url"], batch_size=8, system=cfg.get("system", "lru"),
        cache_fraction=cfg.get("cache_fraction", 0.1), num_workers=2, seed=cfg.get("seed", 0),
        disk_dir=cfg["disk_dir"], disk_bytes=cfg.get("disk_bytes"),
        storage_options=cfg.get("storage_options"), input_field="npy", target_field="cls",
        epochs=cfg["epochs"],
    ) as loader:  # fmt: skip
        paths = loader.dataset.storage.manifest.paths
        for epoch in range(cfg["epochs"]):
            loader.set_epoch(epoch)
            seen = []
            for x, y, ids in loader:
                for k, i in enumerate(ids.tolist()):
                    array, label = truth[paths[i].split("#", 1)[1]]
                    assert torch.equal(x[k], torch.from_numpy(array)), f"sample {i}: wrong bytes"
                    assert int(y[k]) == label, f"sample {i}: wrong label"
                seen += ids.tolist()
                in_ram = max(in_ram, len(loader.dataset.store.list_keys(STAGE)))
                loader.feedback(ids, torch.rand(len(ids)))
                batches += 1
                if progress is not None:
                    progress.write_text(str(batches))
            e = loader.epoch_stats[-1]
            internal = loader.counters()["internal"]  # (the run's, so far)
            out["epochs"].append({"served": seen, "storage_bytes": e.storage_bytes,
                                  "disk_hits": e.disk_hits, "hits": e.hits,
                                  "staged": internal.get("readahead_staged", 0),
                                  "taken": internal.get("readahead_served", 0),
                                  "staged_in_ram": in_ram})  # fmt: skip
        out["counters"] = {k: v for k, v in loader.counters().items() if k != "internal"}
        out["samples"] = len(paths)
        out["ram_bytes"] = loader.dataset.store.capacity_bytes
        out["cache_bytes"] = loader.budget["capacity_bytes"]
    return out


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
