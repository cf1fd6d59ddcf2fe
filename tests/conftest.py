"""Shared fixtures: real data on disk, a real redis-server, real stores."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from hotset.storage.prepare import FASHION_MNIST_DIR, prepare_fashion_mnist
from hotset.testing import RedisClusterServers, RedisServer

# gcsfs asks GCS's gRPC control plane for each bucket's layout (60 s, then it gives up,
# every call) unless this is off before it is imported: the emulator has no such plane
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")


@pytest.fixture(scope="session", autouse=True)
def _index_cache(tmp_path_factory):
    """Indexes of users' datasets go to a temporary directory, not ~/.cache/hotset."""
    os.environ["HOTSET_CACHE_DIR"] = str(tmp_path_factory.mktemp("index-cache"))


@pytest.fixture(scope="session")
def fmnist_dir(tmp_path_factory) -> Path:
    """The first 1,000 training and test images of Fashion-MNIST, prepared as PNGs."""
    if not Path(FASHION_MNIST_DIR, "train-images-idx3-ubyte.gz").exists():
        pytest.fail("Fashion-MNIST missing: run `make test` (installs dataset-fashion-mnist)")
    out = tmp_path_factory.mktemp("fmnist")
    prepare_fashion_mnist(str(out), limit=1000)
    return out


def make_imagefolder(
    root: Path, classes=("cat", "dog", "eel"), per_class=5, seed=0, side: int | None = None
) -> Path:
    """A small ImageFolder tree of random RGB PNG images (of different sizes, or ``side``
    x ``side``)."""
    rng = np.random.default_rng(seed)
    for c in classes:
        (root / c).mkdir(parents=True, exist_ok=True)
        for k in range(per_class):
            n = side or int(rng.integers(8, 20))
            img = rng.integers(0, 256, (n, n, 3), dtype=np.uint8)
            Image.fromarray(img).save(root / c / f"img{k}.png")
    return root


def _started(start):
    try:
        return start()
    except FileNotFoundError as exc:
        pytest.fail(f"{exc}: run `make test` (installs redis-server and redis-tools)")


@pytest.fixture
def redis_server(tmp_path):
    server = RedisServer(tmp_path)
    _started(server.start)
    yield server
    server.shutdown()


@pytest.fixture
def redis_cluster(tmp_path):
    cluster = _started(lambda: RedisClusterServers(tmp_path))
    yield cluster
    cluster.stop()
