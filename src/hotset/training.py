"""The training loop hotset's own jobs use (compare, record): a plain PyTorch step that
hands each batch's per-sample losses back to the loader."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from hotset.errors import ConfigError
from hotset.feedback import per_sample_loss
from hotset.loader import HotsetLoader


def train_epoch(
    loader: HotsetLoader,
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    on_batch: Callable[[np.ndarray, np.ndarray], None] | None = None,
) -> float:
    """One epoch over ``loader`` on the model's device; returns the mean training loss.
    ``on_batch(ids, losses)`` sees every batch's served ids and per-sample losses."""
    model.train()
    device = next(model.parameters()).device
    total, count = 0.0, 0
    embed = loader.wants_embeddings
    # the one user-side protocol probed: a model that returns its feature-layer output
    if embed and not hasattr(model, "forward_with_embedding"):
        raise ConfigError(
            "the sampler scores embeddings: give the model a "
            "forward_with_embedding(x) -> (logits, embedding) method"
        )
    for x, y, ids in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        emb = None
        if embed:
            logits, emb = model.forward_with_embedding(x)
        else:
            logits = model(x)
        losses = per_sample_loss(logits, y)  # Eq. 3-4
        opt.zero_grad(set_to_none=True)
        losses.mean().backward()  # Eq. 5
        opt.step()
        detached = losses.detach()  # on the device: feedback does not wait for the step
        loader.feedback(ids, detached, emb)
        if on_batch is not None:
            on_batch(ids.numpy(), detached.cpu().numpy())
        total = total + detached.sum().double()  # (read once, at the epoch's end)
        count += int(detached.numel())
    return float(total) / max(1, count)
