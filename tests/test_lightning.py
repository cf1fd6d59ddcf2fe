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
        launch += ["-m", "torch.distributed.run", "--nproc-per-node", str(ranks),
                   "--log-dir", str(out / "torchrun")]  # (not a new directory in /tmp)
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


class CallbackModule:
    """A LightningModule whose training step returns its per-sample losses and records
    the ids it trained on, per epoch; the callback does the rest."""

    @staticmethod
    def make(data: str, system: str = "shade", per_sample: bool = True):
        import lightning as L

        from hotset.models import TinyCNN

        class Module(L.LightningModule):
            def __init__(self) -> None:
                super().__init__()
                torch.manual_seed(0)
                self.model = TinyCNN()
                self.trained: dict[int, list[int]] = {}

            def train_dataloader(self):
                self.loader = hotset.make_loader(data, batch_size=50, system=system,
                                                 cache_fraction=0.2, store="memory",
                                                 num_workers=0, seed=3)  # fmt: skip
                return self.loader

            def training_step(self, batch, _):
                x, y, ids = batch
                self.trained.setdefault(self.current_epoch, []).extend(ids.tolist())
                losses = hotset.per_sample_loss(self.model(x), y)
                return {"loss": losses.mean(), "losses": losses} if per_sample else losses.mean()

            def configure_optimizers(self):
                return torch.optim.SGD(self.model.parameters(), lr=0.05)

        return Module()


def trainer(tmp_path, checkpoint_every: int = 0, **kwargs):
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    from hotset.lightning import HotsetCallback

    callbacks = [HotsetCallback()]
    if checkpoint_every:
        callbacks.append(ModelCheckpoint(tmp_path, "{step}", save_top_k=-1,
                                         every_n_train_steps=checkpoint_every))  # fmt: skip
    return L.Trainer(callbacks=callbacks, accelerator="cpu", logger=False,
                     enable_progress_bar=False, enable_model_summary=False,
                     enable_checkpointing=bool(checkpoint_every), default_root_dir=tmp_path,
                     num_sanity_val_steps=0, **kwargs)  # fmt: skip


def test_callback_feeds_back_logs_and_resumes_the_rest_of_the_epoch(fmnist_dir, tmp_path):
    """Without user code the callback feeds SHADE the losses, logs counters per epoch, and
    a checkpoint taken mid-epoch (Lightning has fetched the next batch already) resumes
    with exactly the batches the uninterrupted run still trained, none skipped."""
    data = str(fmnist_dir / "train")
    whole = CallbackModule.make(data)
    t = trainer(tmp_path, max_epochs=2)
    t.fit(whole)
    assert whole.loader.planner.sampler.board.seen.all()  # every trained sample fed back
    assert t.callback_metrics["hotset/hits"] > 0  # logged through log_dict
    assert t.callback_metrics["hotset/storage_reads"] > 0

    first = CallbackModule.make(data)  # a checkpoint at step 7 of epoch 0's 20, then a crash
    trainer(tmp_path, checkpoint_every=7, max_steps=7).fit(first)
    ckpt = tmp_path / "step=7.ckpt"

    resumed = CallbackModule.make(data)
    trainer(tmp_path, max_epochs=2).fit(resumed, ckpt_path=ckpt)  # torch's weights_only=True
    assert first.trained[0] + resumed.trained[0] == whole.trained[0]  # nothing skipped
    # the next epoch whole (its draw differs: SHADE repeats what the cache holds, and the
    # resumed job's in-memory cache started cold)
    assert len(resumed.trained[1]) == len(whole.trained[1])


def test_callback_names_what_training_step_must_return(fmnist_dir, tmp_path):
    module = CallbackModule.make(str(fmnist_dir / "train"), per_sample=False)
    with pytest.raises(hotset.ConfigError, match="per-sample losses"):
        trainer(tmp_path, max_steps=1).fit(module)
