"""Real servers on this machine for tests and benchmarks: a redis-server on a unix
socket, a Redis Cluster of several redis-server processes on 127.0.0.1 (``redis-cli
--cluster create``). Each can be killed and started again."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

REDIS_SERVER = os.environ.get("HOTSET_REDIS_SERVER") or shutil.which("redis-server")


def _binary(name: str | None, what: str) -> str:
    if name is None or not shutil.which(name):
        raise FileNotFoundError(f"{what} not found")
    return name


class RedisServer:
    """A real redis-server on a unix socket in a temp dir; can be stopped and restarted."""

    def __init__(self, workdir: Path, extra: list[str] | None = None) -> None:
        self.workdir = workdir
        self.extra = list(extra or [])
        self.sock = str(workdir / "redis.sock")
        self.url = f"unix://{self.sock}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                _binary(REDIS_SERVER, "redis-server"),
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
    with ``redis-cli --cluster create``; a master can be killed and started again (it
    rejoins with its ``nodes.conf``, empty)."""

    def __init__(self, workdir: Path, masters: int = 3) -> None:
        _binary(REDIS_SERVER, "redis-server")
        _binary("redis-cli", "redis-cli")
        self.workdir = workdir
        self.ports = [_free_port_pair() for _ in range(masters)]
        self.procs: dict[int, subprocess.Popen] = {}
        for port in self.ports:
            (workdir / f"node{port}").mkdir()
            self.start(port)
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

    def start(self, port: int) -> None:
        self.procs[port] = subprocess.Popen(
            [REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1",
             "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
             "--cluster-node-timeout", "2000", "--cluster-require-full-coverage", "no",
             "--save", "", "--appendonly", "no", "--dir", str(self.workdir / f"node{port}")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip

    def kill(self, port: int) -> None:
        self.procs[port].kill()
        self.procs[port].wait(10)

    def restart(self, port: int) -> None:
        """Start a killed master again; returns once the cluster is ok."""
        self.start(port)
        self._wait(lambda: "cluster_state:ok" in self._cli(port, "cluster", "info"))

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
                proc.wait(10)


