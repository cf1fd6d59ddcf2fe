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


def _free_port_pair() -> int:
    """A port P with P and P + 10000 (the cluster bus) both free."""
    import random
    import socket

    for _ in range(100):
        port = random.randint(20000, 29999)
        try:
            for p in (port, port + 10000):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port pair")


class RedisClusterServers:
    """A real Redis Cluster of ``masters`` redis-server processes (no replicas), created
    with ``redis-cli --cluster create``; a master can be killed."""

    def __init__(self, workdir: Path, masters: int = 3) -> None:
        if REDIS_SERVER is None or not shutil.which("redis-cli"):
            pytest.fail("redis-server/redis-cli not found: run `make test` (installs them)")
        self.ports = [_free_port_pair() for _ in range(masters)]
        self.procs: dict[int, subprocess.Popen] = {}
        for port in self.ports:
            d = workdir / f"node{port}"
            d.mkdir()
            self.procs[port] = subprocess.Popen(
                [REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1",
                 "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                 "--cluster-node-timeout", "2000", "--cluster-require-full-coverage", "no",
                 "--save", "", "--appendonly", "no", "--dir", str(d)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
        for port in self.ports:
            self._wait(lambda p=port: self._cli(p, "ping") == "PONG")
        nodes = [f"127.0.0.1:{p}" for p in self.ports]
        subprocess.run(
            ["redis-cli", "--cluster", "create", *nodes, "--cluster-replicas", "0",
             "--cluster-yes"],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        for port in self.ports:
            self._wait(lambda p=port: "cluster_state:ok" in self._cli(p, "cluster", "info"))
        self.url = f"redis+cluster://127.0.0.1:{self.ports[0]}"

    @staticmethod
    def _cli(port: int, *args: str) -> str:
        out = subprocess.run(["redis-cli", "-p", str(port), *args], capture_output=True,
                             text=True, timeout=10)  # fmt: skip
        return out.stdout.strip()

    @staticmethod
    def _wait(ok, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not ok():
            if time.monotonic() > deadline:
                raise RuntimeError("the redis cluster did not come up")
            time.sleep(0.1)

    def keys_per_master(self) -> list[int]:
        return [int(self._cli(p, "dbsize") or 0) for p in self.ports]

    def kill(self, port: int) -> None:
        self.procs[port].kill()
        self.procs[port].wait(10)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
                proc.wait(10)


@pytest.fixture
def redis_cluster(tmp_path):
    cluster = RedisClusterServers(tmp_path)
    yield cluster
    cluster.stop()
