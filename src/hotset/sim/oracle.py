"""Loss oracle: each sample's training loss over time, recorded from a real run.

``losses[e, i]`` is the loss sample ``i`` had when it was trained in epoch ``e`` (NaN if
it was not drawn). The oracle answers the loss of any sample at any training progress
``t`` (in epochs) by linear interpolation between epoch midpoints, so a simulated
importance sampler gets realistic feedback without training a model.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from hotset.errors import ConfigError


class LossOracle:
    def __init__(self, losses: np.ndarray, meta: dict | None = None) -> None:
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

    def save(self, path: str | Path) -> None:
        np.savez_compressed(path, losses=self.losses.astype(np.float32), meta=json.dumps(self.meta))

    @classmethod
    def load(cls, path: str | Path) -> LossOracle:
        try:
            with np.load(path) as f:
                return cls(f["losses"], json.loads(str(f["meta"])))
        except (OSError, KeyError, ValueError) as exc:
            raise ConfigError(
                f"{path}: not a loss oracle written by `hotset record` ({exc})"
            ) from exc
