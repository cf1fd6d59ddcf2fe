"""The training loop's side of the feedback path (SHADE Eq. 3-5)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from hotset.errors import ConfigError

_HOW = (
    "give one loss per sample: the loss with reduction='none' "
    "(hotset.per_sample_loss(logits, targets)), and backpropagate its .mean()"
)


def per_sample_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-sample cross entropy (Eq. 3 with the softmax of Eq. 4) from the logits the step
    already computed; ``.mean()`` of it is the minibatch loss to backpropagate (Eq. 5)."""
    return F.cross_entropy(logits, targets, reduction="none")


def as_numpy(x: torch.Tensor | np.ndarray | list) -> np.ndarray:
    """A detached CPU numpy view of ids or losses handed to ``feedback``."""
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def checked_losses(losses, n_ids: int, ids: np.ndarray) -> np.ndarray:
    """``losses`` as one float64 per id, or a ``ConfigError`` that names what is wrong
    (a scalar, a shape other than ``(B,)``, a count other than the ids', NaN or inf).
    Losses that still require grad are detached: feedback never backpropagates."""
    shape = tuple(losses.shape) if hasattr(losses, "shape") else np.shape(losses)
    if len(shape) != 1:
        what = "a scalar (shape ())" if not shape else f"of shape {shape}"
        raise ConfigError(f"feedback: the losses are {what} for {n_ids} ids; {_HOW}")
    if shape[0] != n_ids:
        raise ConfigError(
            f"feedback: {shape[0]} losses for {n_ids} ids; pass the trained batch's ids (a "
            "framework that fetches ahead, as Lightning does, yields later batches)"
        )
    out = as_numpy(losses).astype(np.float64)
    bad = ~np.isfinite(out)
    if bad.any():
        first = int(ids[np.flatnonzero(bad)[0]])
        raise ConfigError(
            f"feedback: {int(bad.sum())} of {n_ids} losses are NaN or inf (first: sample "
            f"{first}); the model diverged or the loss is undefined for that sample"
        )
    return out
