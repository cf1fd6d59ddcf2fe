"""Training with PyTorch Lightning on a hotset loader, on one process or under torchrun:

    python examples/lightning_train.py --data data/fashion-mnist/train
    torchrun --nproc-per-node 2 examples/lightning_train.py --data ... --devices 2

Lightning sets the loader's epoch each epoch (it calls ``loader.sampler.set_epoch``) and,
under DDP, initialises the process group before ``train_dataloader``: hotset then plans
once for all ranks. ``hotset.lightning.HotsetCallback`` feeds the per-sample losses that
``training_step`` returns back against the batch's ids (Lightning fetches one batch
ahead, so ``loader.last_ids`` is already the next batch's), logs the loader's counters and
keeps its state in Lightning's checkpoints.

Prints one line per rank and epoch; ``--out DIR`` writes them as JSON to
``DIR/rank-R.jsonl`` instead (what the tests check).
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import lightning as L
import torch

import hotset
from hotset.lightning import HotsetCallback
from hotset.models import TinyCNN


class HotsetModule(L.LightningModule):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.args = args
        self.model = TinyCNN()
        self.seen: list[torch.Tensor] = []

    def train_dataloader(self) -> hotset.HotsetLoader:
        a = self.args
        self.loader = hotset.make_loader(  # ranks come from Lightning's process group
            hotset.FileStorage(a.data), batch_size=a.batch_size, system=a.system,
            cache_fraction=0.2, store=a.store, num_workers=a.num_workers, epochs=a.epochs,
        )  # fmt: skip
        return self.loader

    def training_step(self, batch, _):
        x, y, ids = batch
        losses = hotset.per_sample_loss(self.model(x), y)
        self.seen.append(ids)
        return {"loss": losses.mean(), "losses": losses}  # the callback feeds them back

    def on_train_epoch_end(self) -> None:
        ids = torch.cat(self.seen).numpy()
        self.seen = []
        c = self.loader.counters()
        line = {"rank": self.global_rank, "epoch": self.current_epoch, "batches": len(self.loader),
                "samples": int(ids.size), "order": hashlib.blake2b(ids.tobytes()).hexdigest()[:16],
                "ids": ids.tolist(), "hits": c["hits"], "misses": c["misses"],
                "corrupt_hits": c["corrupt_hits"]}  # fmt: skip
        if self.args.out:
            with open(Path(self.args.out) / f"rank-{self.global_rank}.jsonl", "a") as f:
                f.write(json.dumps(line) + "\n")
        else:
            print({k: v for k, v in line.items() if k != "ids"}, flush=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--devices", type=int, default=1)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--system", default="shade", help="shade, icache, spider, lru, minio, ...")
    ap.add_argument("--store", default="shared")
    ap.add_argument("--num-workers", type=int, default=2)
    ap.add_argument("--out", help="a directory for each rank's JSON lines")
    args = ap.parse_args()
    module = HotsetModule(args)
    trainer = L.Trainer(
        accelerator="cpu", devices=args.devices, strategy="ddp" if args.devices > 1 else "auto",
        max_epochs=args.epochs, logger=False, enable_checkpointing=False,
        callbacks=[HotsetCallback()],
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(module)
    module.loader.close()


if __name__ == "__main__":
    main()
