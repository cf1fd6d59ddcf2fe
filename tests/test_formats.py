"""Formats in a registry: a new format is one class and one ``register_format`` call
(as docs/extending.md shows); detection, ``format=`` and the loader then take it, and a
directory of two formats' files or an unknown name is told apart clearly."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import hotset
from hotset.errors import ConfigError
from hotset.storage.base import TAG, Storage
from hotset.storage.formats import FORMATS, Format, register_format
from hotset.storage.manifest import LOCATION_KIND, Manifest, location_key
from hotset.storage.open import detect_format


class NpyShards(Storage):
    """A directory of ``.npy`` shards, each an (n, 28, 28) uint8 array of one class (the
    shard's name), mapped, never read whole."""

    content_keyed = False  # keys name where a sample lives: each entry carries a digest

    def __init__(self, url: str, **_options) -> None:
        files = sorted(str(p) for p in Path(url).glob("*.npy"))
        self.arrays = [np.load(f, mmap_mode="r") for f in files]
        self.where = [(s, r) for s, a in enumerate(self.arrays) for r in range(len(a))]
        n = len(self.where)
        keys = [location_key("npy", f"{files[s]}:{os.path.getsize(files[s])}", r)
                for s, r in self.where]  # fmt: skip
        self.manifest = Manifest(
            [f"{files[s]}[{r}]" for s, r in self.where], keys,
            np.full(n, 28 * 28 + TAG, np.int64),
            np.array([s for s, _ in self.where], np.int64), [Path(f).stem for f in files],
            url, LOCATION_KIND,
        )  # fmt: skip

    def read(self, i: int) -> bytes:
        s, r = self.where[int(i)]
        return self.arrays[s][r].tobytes()


@pytest.fixture
def npy_format():
    fmt = register_format(Format("npy", NpyShards, suffix=".npy"))
    yield fmt
    FORMATS.pop(fmt.name)


def _shards(root: Path, n_per: int = 60, classes: int = 3) -> np.ndarray:
    root.mkdir()
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (classes, n_per, 28, 28), np.uint8)
    for c in range(classes):
        np.save(root / f"class{c}.npy", images[c])
    return images.reshape(-1, 28, 28)


def test_a_format_registered_in_one_class_is_detected_opened_and_served(tmp_path, npy_format):
    images = _shards(tmp_path / "npy")
    assert detect_format(str(tmp_path / "npy")) == "npy"
    assert detect_format(str(tmp_path / "npy" / "class0.npy")) == "npy"
    decode = lambda b: np.frombuffer(b, np.uint8).reshape(1, 28, 28)  # noqa: E731
    with hotset.make_loader(str(tmp_path / "npy"), batch_size=16, cache_fraction=0.3,
                            store="memory", num_workers=0, decode=decode) as loader:  # fmt: skip
        for epoch in range(2):
            loader.set_epoch(epoch)
            seen = []
            for x, y, ids in loader:
                got = (x.numpy()[:, 0] * 255).round().astype(np.uint8)  # (scaled to [0, 1])
                assert np.array_equal(got, images[ids.numpy()])  # exact bytes
                assert (y.numpy() == ids.numpy() // 60).all()  # the shard's class
                seen += ids.tolist()
            assert sorted(seen) == list(range(len(images)))  # each once an epoch
        assert loader.counters()["hits"] > 0


def test_unknown_and_ambiguous_formats_are_named(tmp_path, npy_format):
    with pytest.raises(ConfigError, match="unknown format 'npz'; choose from: .*npy"):
        hotset.open_storage(str(tmp_path), format="npz")
    _shards(tmp_path / "both")
    (tmp_path / "both" / "more.tar").write_bytes(b"")
    with pytest.raises(ConfigError, match=r"\['npy', 'tar'\]: name one, format="):
        detect_format(str(tmp_path / "both"))
