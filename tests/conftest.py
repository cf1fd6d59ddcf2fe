"""Shared fixtures: real data on disk, a real redis-server, real stores."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from hotset.storage.prepare import FASHION_MNIST_DIR, prepare_fashion_mnist

REDIS_SERVER = os.environ.get("HOTSET_REDIS_SERVER") or shutil.which("redis-server")


@pytest.fixture(scope="session")
def fmnist_dir(tmp_path_factory) -> Path:
    """The first 1,000 training and test images of Fashion-MNIST, prepared as PNGs."""
    if not Path(FASHION_MNIST_DIR, "train-images-idx3-ubyte.gz").exists():
        pytest.fail("Fashion-MNIST missing: run `make test` (installs dataset-fashion-mnist)")
    out = tmp_path_factory.mktemp("fmnist")
    prepare_fashion_mnist(str(out), limit=1000)
    return out


def make_imagefolder(root: Path, classes=("cat", "dog", "eel"), per_class=5, seed=0) -> Path:
    """A small ImageFolder tree of random PNG images (different sizes)."""
    rng = np.random.default_rng(seed)
    for c in classes:
        (root / c).mkdir(parents=True, exist_ok=True)
        for k in range(per_class):
            side = int(rng.integers(8, 20))
            img = rng.integers(0, 256, (side, side, 3), dtype=np.uint8)
            Image.fromarray(img).save(root / c / f"img{k}.png")
    return root


class RedisServer:
    """A real redis-server on a unix socket in a temp dir; can be stopped and restarted."""

    def __init__(self, workdir: Path, extra: list[str] | None = None) -> None:
        self.workdir = workdir
        self.extra = list(extra or [])
        self.sock = str(workdir / "redis.sock")
        self.url = f"unix://{self.sock}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        if REDIS_SERVER is None:
            pytest.fail("redis-server not found: run `make test` (installs redis-server)")
        self.proc = subprocess.Popen(
            [
                REDIS_SERVER,
                "--port",
                "0",
                "--unixsocket",
                self.sock,
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
                *self.extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while not os.path.exists(self.sock):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None
        if os.path.exists(self.sock):
            os.unlink(self.sock)


@pytest.fixture
def redis_server(tmp_path):
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.stop()
