"""Loss oracle: each sample's training loss over time, recorded from a real run.

``losses[e, i]`` is the loss sample ``i`` had when it was trained in epoch ``e`` (NaN if
it was not drawn). The oracle answers the loss of any sample at any training progress
``t`` (in epochs) by linear interpolation between epoch midpoints, so a simulated
importance sampler gets realistic feedback without training a model. An oracle may also
hold each sample's embedding per epoch and the labels (graph importance replays them).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from hotset.errors import ConfigError


class LossOracle:
    def __init__(
        self,
        losses: np.ndarray,
        meta: dict | None = None,
        embeddings: np.ndarray | None = None,
        labels: np.ndarray | None = None,
    ) -> None:
        losses = np.asarray(losses, dtype=np.float64)
        if losses.ndim != 2 or losses.shape[0] < 1:
            raise ConfigError(f"oracle losses must be epochs x samples, got {losses.shape}")
        filled = losses.copy()
        for e in range(1, len(filled)):  # carry a sample's last loss over epochs without it
            gap = np.isnan(filled[e])
            filled[e, gap] = filled[e - 1, gap]
        for e in range(len(filled) - 2, -1, -1):  # and its first loss back
            gap = np.isnan(filled[e])
            filled[e, gap] = filled[e + 1, gap]
        never = np.isnan(filled)
        if never.any():
            filled[never] = np.nanmean(losses) if np.isfinite(losses).any() else 1.0
        self.losses = filled
        self.meta = meta or {}
        if embeddings is not None and embeddings.shape[:2] != losses.shape:
            raise ConfigError(f"oracle embeddings {embeddings.shape} do not match {losses.shape}")
        self.embeddings = embeddings
        self.labels = None if labels is None else np.asarray(labels, np.int64)

    @property
    def epochs(self) -> int:
        return self.losses.shape[0]

    @property
    def num_samples(self) -> int:
        return self.losses.shape[1]

    def at(self, ids: np.ndarray, t: float) -> np.ndarray:
        """Losses of ``ids`` at training progress ``t`` (epochs)."""
        pos = min(max(t - 0.5, 0.0), self.epochs - 1.0)
        e0 = int(pos)
        e1 = min(e0 + 1, self.epochs - 1)
        frac = pos - e0
        return (1 - frac) * self.losses[e0, ids] + frac * self.losses[e1, ids]

    def embeddings_at(self, ids: np.ndarray, t: float) -> np.ndarray:
        """Embeddings of ``ids`` as recorded in the epoch that ``t`` falls in."""
        if self.embeddings is None:
            raise ConfigError("this oracle has no embeddings: record it again with `hotset record`")
        e = min(max(int(t), 0), self.epochs - 1)
        return self.embeddings[e, ids].astype(np.float32)

    def save(self, path: str | Path) -> None:
        extra = {}
        if self.embeddings is not None:
            extra["embeddings"] = self.embeddings.astype(np.float16)
        if self.labels is not None:
            extra["labels"] = self.labels
        np.savez_compressed(
            path, losses=self.losses.astype(np.float32), meta=json.dumps(self.meta), **extra
        )

    @classmethod
    def load(cls, path: str | Path) -> LossOracle:
        try:
            with np.load(path) as f:
                return cls(
                    f["losses"],
                    json.loads(str(f["meta"])),
                    f["embeddings"] if "embeddings" in f.files else None,
                    f["labels"] if "labels" in f.files else None,
                )
        except (OSError, KeyError, ValueError) as exc:
            raise ConfigError(
                f"{path}: not a loss oracle written by `hotset record` ({exc})"
            ) from exc
