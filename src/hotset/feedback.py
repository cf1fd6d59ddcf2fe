"""The training loop's side of the feedback path (SHADE Eq. 3-5)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeAlias

import numpy as np
import torch
import torch.nn.functional as F

from hotset.errors import ConfigError

#: what ``feedback`` takes: ids served, and per-sample losses or embeddings
IdsLike: TypeAlias = torch.Tensor | np.ndarray[Any, Any] | Sequence[int]
ArrayLike: TypeAlias = torch.Tensor | np.ndarray[Any, Any] | Sequence[float]

_HOW = (
    "give one loss per sample: the loss with reduction='none' "
    "(hotset.per_sample_loss(logits, targets)), and backpropagate its .mean()"
)


def per_sample_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-sample cross entropy (Eq. 3 with the softmax of Eq. 4) from the logits the step
    already computed; ``.mean()`` of it is the minibatch loss to backpropagate (Eq. 5)."""
    return F.cross_entropy(logits, targets, reduction="none")


def as_numpy(x: IdsLike | ArrayLike) -> np.ndarray:
    """A detached CPU numpy view of ids or losses handed to ``feedback``."""
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def checked_shape(losses, n_ids: int) -> None:
    """A ``ConfigError`` where ``losses`` is not one loss per id (a scalar, a shape other
    than ``(B,)``, a count other than the ids')."""
    shape = tuple(losses.shape) if hasattr(losses, "shape") else np.shape(losses)
    if len(shape) != 1:
        what = "a scalar (shape ())" if not shape else f"of shape {shape}"
        raise ConfigError(f"feedback: the losses are {what} for {n_ids} ids; {_HOW}")
    if shape[0] != n_ids:
        raise ConfigError(
            f"feedback: {shape[0]} losses for {n_ids} ids; pass the trained batch's ids (a "
            "framework that fetches ahead, as Lightning does, yields later batches)"
        )


def checked_losses(losses, n_ids: int, ids: np.ndarray) -> np.ndarray:
    """``losses`` as one float64 per id, or a ``ConfigError`` that names what is wrong
    (a scalar, a shape other than ``(B,)``, a count other than the ids', NaN or inf).
    Losses that still require grad are detached: feedback never backpropagates."""
    checked_shape(losses, n_ids)
    out = as_numpy(losses).astype(np.float64)
    bad = ~np.isfinite(out)
    if bad.any():
        first = int(ids[np.flatnonzero(bad)[0]])
        raise ConfigError(
            f"feedback: {int(bad.sum())} of {n_ids} losses are NaN or inf (first: sample "
            f"{first}); the model diverged or the loss is undefined for that sample"
        )
    return out


class DeferredFeedback:
    """A loader's feedback on its way to ``learn`` (the planner's ``feedback``): at once,
    or, where ``defer`` says so (``None``: where the losses are on a CUDA device), when
    the next batch's feedback comes or at ``flush``. A deferred batch's losses (and
    embeddings) are copied to pinned host memory behind the step that computes them, so
    ``feedback`` never waits for the GPU to finish the step, and the planning of the next
    batches runs while it does (at 32 ranks a rank plans 8,192 ids a step). The plans made
    meanwhile see that batch's feedback one batch later, the same on every rank (ours: the
    papers feed back each step; a DataLoader's prefetch already plans batches ahead)."""

    def __init__(
        self,
        learn: Callable[[np.ndarray, np.ndarray, np.ndarray | None], None],
        defer: bool | None = None,
    ) -> None:
        self.learn = learn
        self.defer = defer
        self._pending: tuple | None = None  # ids, losses, embeddings: copies on their way

    def put(self, ids: np.ndarray, losses, embeddings=None) -> None:
        """A batch's feedback (``ids`` a numpy array; ``losses`` and ``embeddings``
        tensors or arrays): the batch before is learnt now, this one now or later."""
        on_gpu = isinstance(losses, torch.Tensor) and losses.is_cuda
        if not (self.defer if self.defer is not None else on_gpu):
            self.flush()
            self._learn(ids, losses, embeddings)
            return
        checked_shape(losses, len(ids))  # (the values are checked once they are here)
        before, self._pending = self._pending, (
            ids, _staged(losses), None if embeddings is None else _staged(embeddings)
        )  # (kept where the batch before is refused)
        self._learn_staged(before)

    def flush(self) -> None:
        """Learn the deferred batch's feedback (waiting for its copy), if one is."""
        staged, self._pending = self._pending, None
        self._learn_staged(staged)

    def _learn_staged(self, staged: tuple | None) -> None:
        if staged is not None:
            ids, losses, emb = staged
            self._learn(ids, _landed(losses), None if emb is None else _landed(emb))

    def _learn(self, ids: np.ndarray, losses, embeddings) -> None:
        losses = checked_losses(losses, len(ids), ids)
        emb = None if embeddings is None else as_numpy(embeddings).astype(np.float32)
        self.learn(ids, losses, emb)


def _staged(x) -> tuple:
    """A copy of ``x`` that the caller's later changes leave alone, and the event its copy
    from a CUDA device completes (to pinned host memory behind the work that computes it,
    not waited for; ``None`` for a copy made at once)."""
    if not isinstance(x, torch.Tensor):
        return np.array(x, copy=True), None
    x = x.detach()
    if not x.is_cuda:
        return x.clone(), None
    host = torch.empty(x.shape, dtype=x.dtype, pin_memory=True)
    host.copy_(x, non_blocking=True)
    copied = torch.cuda.Event()
    copied.record(torch.cuda.current_stream(x.device))
    return host, copied


def _landed(staged: tuple):
    """A staged copy, once it is there."""
    x, copied = staged
    if copied is not None:
        copied.synchronize()
    return x
