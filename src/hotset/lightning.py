"""PyTorch Lightning support: :class:`HotsetCallback` (``pip install 'hotset[lightning]'``).

Return a hotset loader from ``train_dataloader`` (Lightning sets its epoch and, under DDP,
has the process group ready before it is made), return the batch's per-sample losses
from ``training_step`` beside the loss, and add the callback::

    def training_step(self, batch, _):
        x, y, ids = batch
        losses = hotset.per_sample_loss(self(x), y)
        return {"loss": losses.mean(), "losses": losses}   # "embeddings" too for spider

    trainer = L.Trainer(callbacks=[hotset.lightning.HotsetCallback()], ...)

The callback hands each trained batch's losses back to the loader (against the ids in
the batch: Lightning fetches one batch ahead, so ``loader.last_ids`` is already the next
one's), logs the loader's counters through ``log_dict`` at each epoch's end
(``hotset/hit_ratio``, ``hotset/storage_reads``, ...), and keeps the loader's state in
Lightning's checkpoints so that ``Trainer.fit(ckpt_path=...)`` serves exactly the rest of
the epoch. Lightning saves a stateful loader's ``state_dict`` itself, but at the time of
the checkpoint the loader may have served the batch fetched ahead too; the callback winds
the saved state back to the batches trained, so that batch is served again after a resume
rather than skipped. A resumed loader's ``len`` is what is left of the epoch, where
Lightning counts a resumed epoch's batches from its start: the state the callback saves
tells the loader to say the whole epoch's.

A loader's state is plain data (``hotset.checkpoint``): the checkpoint loads with torch's
default ``weights_only=True``.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl

from hotset.errors import ConfigError
from hotset.loader import HotsetLoader
from hotset.metrics import scalars


def find_loader(trainer: pl.Trainer) -> HotsetLoader:
    """The hotset loader among the trainer's training dataloaders."""
    found = trainer.train_dataloader
    candidates = found.values() if isinstance(found, dict) else (
        found if isinstance(found, list | tuple) else [found])  # fmt: skip
    for dl in candidates:
        if isinstance(dl, HotsetLoader):
            return dl
    raise ConfigError(
        "HotsetCallback: the trainer's train_dataloader is not a hotset loader "
        f"(got {type(found).__name__}); return hotset.make_loader(...) from train_dataloader"
    )


class HotsetCallback(pl.Callback):
    """Feedback, counters and checkpointed state of a hotset loader under Lightning.

    ``feedback=False``: the training step calls ``loader.feedback`` itself (the callback
    then only logs and checkpoints). ``log=False``: no ``log_dict``."""

    def __init__(self, feedback: bool = True, log: bool = True) -> None:
        self.feedback = feedback
        self.log = log
        self.trained = 0  # batches of the current epoch whose training step completed
        self._epoch = 0
        self._resume: tuple[int, int] | None = None  # (epoch, batches trained) as saved
        self._loader: HotsetLoader | None = None

    def loader(self, trainer: pl.Trainer) -> HotsetLoader:
        if self._loader is None:
            self._loader = find_loader(trainer)
        return self._loader

    def state_dict(self) -> dict:
        return {"epoch": self._epoch, "trained": self.trained}

    def load_state_dict(self, state: dict) -> None:
        self._resume = (int(state["epoch"]), int(state["trained"]))

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._epoch = trainer.current_epoch
        resumed = self._resume is not None and self._resume[0] == self._epoch
        self.trained = self._resume[1] if resumed else 0
        self._resume = None

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
        batch_idx: int,
    ) -> None:  # fmt: skip
        self.trained += 1
        if not self.feedback:
            return
        if not (isinstance(batch, list | tuple) and len(batch) == 3):
            raise ConfigError(
                "HotsetCallback: a batch must be (inputs, targets, ids), as the loader "
                "yields it with with_ids=True (the default)"
            )
        losses = outputs.get("losses") if isinstance(outputs, dict) else None
        if losses is None:
            raise ConfigError(
                "HotsetCallback: training_step must return the batch's per-sample losses, "
                "e.g. {'loss': losses.mean(), 'losses': losses} with losses = "
                "hotset.per_sample_loss(logits, y) (or pass HotsetCallback(feedback=False) "
                "and call loader.feedback yourself)"
            )
        embeddings = outputs.get("embeddings")
        self.loader(trainer).feedback(
            batch[2], losses.detach(), None if embeddings is None else embeddings.detach()
        )

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self.log:
            return
        figures = scalars(self.loader(trainer).counters())
        pl_module.log_dict({f"hotset/{k}": v for k, v in figures.items()}, on_epoch=True)

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict
    ) -> None:
        """Replace the loader's state that Lightning saved (with the batch fetched ahead
        counted as served) by its state as of the batches trained."""
        loops = checkpoint.get("loops", {}).get("fit_loop", {}).get("state_dict", {})
        states = loops.get("combined_loader") or []
        for i, state in enumerate(states):
            if isinstance(state, dict) and "planner" in state:  # the hotset loader's
                states[i] = {**self.loader(trainer).state_dict(trained=self.trained),
                             "count_from_epoch_start": True}  # fmt: skip
