"""A user's training script, type-checked by ``mypy --strict`` and ``pyright`` (strict) in
``tests/test_typed_api.py``: what a user types against hotset's public names."""

from __future__ import annotations

import torch
from torch import nn

import hotset
from hotset import EpochStats, HotsetLoader, LoaderClosed, make_loader, per_sample_loss


def train(data: str, epochs: int) -> list[EpochStats]:
    model = nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    storage: hotset.Storage = hotset.open_storage(data)
    loader: HotsetLoader = make_loader(
        storage, batch_size=128, system="shade", cache_fraction=0.2, num_workers=2
    )
    with loader:
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            for x, y, ids in loader:
                losses: torch.Tensor = per_sample_loss(model(x), y)
                opt.zero_grad()
                losses.mean().backward()  # type: ignore[no-untyped-call]  # torch's own
                opt.step()  # pyright: ignore[reportUnknownMemberType]  # torch's own
                loader.feedback(ids, losses)
            loader.report_accuracy(0.5)
        hits: int = loader.counters()["hits"]
        ratio: float = loader.epoch_stats[-1].hit_ratio
        print(hits, ratio, len(loader))
        state: dict[str, object] = loader.state_dict()
        loader.load_state_dict(state)
        return list(loader.epoch_stats)


def tolerant(data: str) -> None:
    dataset = hotset.from_dataset(torch.utils.data.TensorDataset(torch.zeros(4, 2)))
    try:
        make_loader(data, batch_size=2, policy="lru", cache_fraction=0.5, num_workers=0)
    except (hotset.ConfigError, LoaderClosed) as exc:
        print(exc, len(dataset))
