"""The training loop's side of the feedback path (SHADE Eq. 3-5)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F


def per_sample_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-sample cross entropy (Eq. 3 with the softmax of Eq. 4) from the logits the step
    already computed; ``.mean()`` of it is the minibatch loss to backpropagate (Eq. 5)."""
    return F.cross_entropy(logits, targets, reduction="none")


def as_numpy(x: torch.Tensor | np.ndarray | list) -> np.ndarray:
    """A detached CPU numpy view of ids or losses handed to ``feedback``."""
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    return np.asarray(x)
