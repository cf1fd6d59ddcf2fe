"""The Lightning example runs as a user would run it (one process, and 2 ranks under
torchrun with Lightning's own DDP): Lightning sets the loader's epoch, every epoch has its
own order, the ranks split each epoch and hit the pooled cache, and feedback carries the
ids of the batch trained, not of the batch Lightning fetched ahead."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import hotset
from hotset.storage import FileStorage

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "lightning_train.py"
pytest.importorskip("lightning")


def run(args: list[str], out: Path, ranks: int = 1) -> tuple[dict[int, list[dict]], str]:
    launch = [sys.executable]
    if ranks > 1:
        launch += ["-m", "torch.distributed.run", "--nproc-per-node", str(ranks)]
    proc = subprocess.run(
        [*launch, str(EXAMPLE), *args, "--out", str(out), "--devices", str(ranks)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = {
        r: [json.loads(line) for line in (out / f"rank-{r}.jsonl").read_text().splitlines()]
        for r in range(ranks)
    }
    return lines, proc.stdout + proc.stderr


def test_lightning_trains_on_one_process_with_its_epochs(fmnist_dir, tmp_path):
    data = str(fmnist_dir / "train")
    lines, log = run(["--data", data, "--epochs", "3", "--batch-size", "50"], tmp_path)
    epochs = lines[0]
    assert [e["epoch"] for e in epochs] == [0, 1, 2]
    assert "set_epoch was never called" not in log  # Lightning set it, through .sampler
    assert len({e["order"] for e in epochs}) == 3  # a new order (and draw) each epoch
    assert all(e["samples"] == len(FileStorage(data)) for e in epochs)
    assert epochs[-1]["hits"] > 0 and epochs[-1]["corrupt_hits"] == 0  # SHADE's cache works


def test_lightning_ddp_under_torchrun_splits_each_epoch(fmnist_dir, tmp_path):
    data = str(fmnist_dir / "train")
    n = len(FileStorage(data))
    args = ["--data", data, "--epochs", "2", "--batch-size", "25"]
    lines, _ = run([*args, "--system", "minio"], tmp_path, ranks=2)
    for e in range(2):
        r0, r1 = lines[0][e], lines[1][e]
        assert r0["batches"] == r1["batches"] == n // 50  # equal batch counts
        assert sorted(r0["ids"] + r1["ids"]) == list(range(n))  # each sample once
    assert lines[0][0]["order"] != lines[0][1]["order"]
    hits = sum(lines[r][1]["hits"] for r in (0, 1))  # cumulative: epoch 0 has no hit
    assert abs(hits / n - 0.2) <= 0.02  # MinIO at 20%, one pooled store for both ranks


def test_feedback_with_the_wrong_batch_is_refused(fmnist_dir):
    loader = hotset.make_loader(FileStorage(str(fmnist_dir / "train")), batch_size=32,
                                sampler="shade", policy="app", cache_fraction=0.2,
                                num_workers=0, store="memory", with_ids=False)  # fmt: skip
    batches = iter(loader)
    next(batches)
    next(batches)  # fetched ahead: last_ids is this one's
    with pytest.raises(hotset.ConfigError, match="31 losses for 32 ids"):
        loader.feedback(losses=torch.ones(31))
    loader.feedback(losses=np.ones(32))  # the right size is taken
    loader.close()
