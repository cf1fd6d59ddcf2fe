"""The models of the compare job and the tests: ``tiny`` (CPU-friendly) and ``resnet18``
(torchvision's layers), each with ``forward_with_embedding`` for graph importance, or a
user's own (``module:callable``)."""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch
from torch import nn

from hotset.errors import ConfigError


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
        self.embedding_dim = 2 * width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))

    def forward_with_embedding(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits and an embedding from the feature layer: the conv channels averaged
        over space (``2 * width`` numbers per sample), for graph importance."""
        f = self.features(x)
        return self.head(f), f.detach().view(f.shape[0], self.embedding_dim, 49).mean(-1)


class BasicBlock(nn.Module):
    """ResNet's two 3x3 convolutions with a shortcut (He et al. 2016, Figure 2)."""

    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + (x if self.downsample is None else self.downsample(x)))


class ResNet18(nn.Module):
    """ResNet-18 as torchvision builds it (same layers, names and parameter count, so its
    state dict loads into ``torchvision.models.resnet18`` with the two changes) for
    small images: a 3x3 stride-1 ``conv1`` over ``in_channels`` and no max-pool. Written
    here because torchvision's PyPI wheels load only against a CUDA build of torch. The
    embedding is the 512-d pooled feature vector before ``fc``."""

    embedding_dim = 512

    def __init__(self, num_classes: int = 10, in_channels: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 64, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        widths = (64, 128, 256, 512)
        for k, w in enumerate(widths):
            cin, stride = (64, 1) if k == 0 else (widths[k - 1], 2)
            setattr(
                self, f"layer{k + 1}", nn.Sequential(BasicBlock(cin, w, stride), BasicBlock(w, w))
            )
        self.fc = nn.Linear(512, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn1(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x))

    def forward_with_embedding(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        f = self.features(x)
        return self.fc(f), f.detach()


MODELS = {"tiny": TinyCNN, "resnet18": ResNet18}


def model_factory(name: str) -> Callable[..., nn.Module]:
    """A model of ``MODELS`` by name, or a user's ``module:callable`` (imported)."""
    if name in MODELS:
        return MODELS[name]
    module, colon, attr = name.partition(":")
    if not colon:
        raise ConfigError(f"--model: unknown model {name!r}; choose from: {', '.join(MODELS)}, "
                          "or give your own as module:callable")  # fmt: skip
    try:
        factory = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"--model {name}: cannot import it ({exc})") from exc
    if not callable(factory):
        raise ConfigError(f"--model {name}: {attr} is not callable")
    return factory


def make_model(name: str, num_classes: int, in_channels: int = 1) -> nn.Module:
    """A model by name (``model_factory``), called as ``factory(num_classes=,
    in_channels=)``: a user's callable takes those two keywords and returns a module."""
    net = model_factory(name)(num_classes=num_classes, in_channels=in_channels)
    if not isinstance(net, nn.Module):
        raise ConfigError(f"--model {name}: returned a {type(net).__name__}, not a torch Module")
    return net


def resolve_device(name: str | torch.device = "auto") -> torch.device:
    """``auto`` is CUDA when available, else the CPU; ``cuda`` without a GPU is an error."""
    name = str(name)
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"--device {name}: torch sees no CUDA device")
    try:
        return torch.device(name)
    except RuntimeError as exc:
        raise ConfigError(f"--device: {exc}") from exc


@torch.no_grad()
def accuracy(
    model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, batch: int = 1000
) -> float:
    """Top-1 accuracy of ``model`` on in-memory tensors (moved to the model's device)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    correct = sum(
        int(
            (
                model(inputs[i : i + batch].to(device)).argmax(1).cpu() == targets[i : i + batch]
            ).sum()
        )
        for i in range(0, len(inputs), batch)
    )
    model.train(was_training)
    return correct / max(1, len(inputs))
