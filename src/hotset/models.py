"""Small models for the compare job and the tests (CPU-friendly)."""

from __future__ import annotations

import torch
from torch import nn


class TinyCNN(nn.Module):
    """Two conv blocks and a linear head: about 20k parameters, any input size."""

    def __init__(self, num_classes: int = 10, in_channels: int = 1, width: int = 16) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.AdaptiveAvgPool2d((7, 7)), nn.Flatten(),
        )  # fmt: skip
        self.head = nn.Linear(2 * width * 49, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))

    def forward_with_embedding(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits and an embedding from the feature layer: the conv channels averaged
        over space (``2 * width`` numbers per sample), for graph importance."""
        f = self.features(x)
        return self.head(f), f.detach().view(f.shape[0], self.head.in_features // 49, 49).mean(-1)


@torch.no_grad()
def accuracy(
    model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, batch: int = 1000
) -> float:
    """Top-1 accuracy of ``model`` on in-memory tensors."""
    was_training = model.training
    model.eval()
    correct = sum(
        int((model(inputs[i : i + batch]).argmax(1) == targets[i : i + batch]).sum())
        for i in range(0, len(inputs), batch)
    )
    model.train(was_training)
    return correct / max(1, len(inputs))
