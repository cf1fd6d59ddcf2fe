"""``make_loader(cache_decoded=True)``: the cache holds decoded samples. Every served
sample equals a direct decode of its bytes; a hit decodes nothing; entries of the
decoded and the encoded form never meet; samples of several decoded sizes are refused
unless ``size=`` makes them one; the budget shows bytes per sample both ways."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import hotset
from hotset.build import dataset_namespace
from hotset.errors import ConfigError

sys.path.insert(0, str(Path(__file__).parent))
from test_sources import _chw, _images, _jpeg_folder, _pil_direct, _write_tar  # noqa: E402


def _serve(loader, epochs: int = 2) -> list[tuple[int, torch.Tensor, int]]:
    out = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for x, y, ids in loader:
            out += [(int(i), x[k], int(y[k])) for k, i in enumerate(ids)]
    return out


@pytest.mark.parametrize("fmt", ["files", "tar"])
def test_decoded_entries_serve_the_samples_right_and_hits_decode_nothing(tmp_path, fmt, fmnist_dir):
    if fmt == "tar":
        images = _images(48)
        (tmp_path / "shards").mkdir()
        for k in range(3):
            _write_tar(tmp_path / "shards" / f"shard-{k}.tar", images[16 * k : 16 * k + 16], 16 * k)
        url = str(tmp_path / "shards")

        def expect(i):
            return _chw(images[i]), i % 3
    else:
        url = str(fmnist_dir / "train")
        plain = hotset.open_storage(url)

        def expect(i):
            return hotset.to_tensor(hotset.decode_sample(plain.read(i))), int(plain.labels[i])

    calls = []

    def decode(data: bytes):
        calls.append(1)
        return hotset.decode_sample(data)

    n = len(hotset.open_storage(url))
    with hotset.make_loader(
        url, batch_size=16, policy="minio", capacity_bytes=10 << 20, store="memory",
        num_workers=0, cache_decoded=True, decode=decode,
    ) as loader:  # fmt: skip
        probe = len(calls)  # the samples decoded to learn the decoded size
        served = _serve(loader)
        c = loader.counters()
        budget = loader.budget
    for i, x, y in served:
        want_x, want_y = expect(i)
        assert torch.equal(x, want_x) and y == want_y
    # the second epoch all hits (the first may hit what a range request read through)
    assert len(served) == 2 * n and c["hits"] >= n and c["hits"] + c["misses"] == 2 * n
    assert len(calls) - probe == n  # each sample decoded once, at its miss
    shape = tuple(expect(0)[0].shape)
    assert budget["cache_decoded"]
    assert budget["cached_bytes_per_sample"] >= np.prod(shape)  # uint8 pixels, decoded
    assert budget["cached_bytes_per_sample"] > budget["encoded_bytes_per_sample"]
    assert budget["samples_in_cache"] < budget["samples_in_cache_encoded"]


def test_decoded_and_encoded_entries_never_meet(fmnist_dir):
    url = str(fmnist_dir / "train")
    keys = {}
    for decoded in (False, True):
        with hotset.make_loader(
            url, batch_size=32, cache_fraction=0.5, num_workers=0, store="memory",
            cache_decoded=decoded,
        ) as loader:  # fmt: skip
            keys[decoded] = loader.dataset.keys
    assert dataset_namespace(keys[False]) != dataset_namespace(keys[True])
    assert not set(keys[False]) & set(keys[True])


def test_samples_of_several_decoded_sizes_need_one_size(tmp_path):
    root = tmp_path / "folder"
    files = _jpeg_folder(root)
    with pytest.raises(ConfigError, match=r"decode to different sizes.*size=\(width, height\)"):
        hotset.make_loader(str(root), batch_size=8, cache_fraction=0.5, cache_decoded=True)
    storage = hotset.open_storage(str(root))
    with hotset.make_loader(
        str(root), batch_size=8, capacity_bytes=1 << 20, policy="minio", num_workers=2,
        cache_decoded=True, size=(16, 16),
    ) as loader:  # fmt: skip
        for i, x, y in _serve(loader):
            data, label = files[storage.manifest.paths[i]]
            assert torch.equal(x, _pil_direct(data, (16, 16))) and y == label
        assert loader.counters()["hits"] == len(storage)
