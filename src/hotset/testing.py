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

    def __init__(self, workdir: Path, masters: int = 3, full_coverage: bool = False) -> None:
        """``full_coverage``: Redis's default, every master refuses while one is down."""
        _binary(REDIS_SERVER, "redis-server")
        self.full_coverage = full_coverage
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
            self.wait_state(port, "ok")
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
             "--cluster-node-timeout", "2000",
             "--cluster-require-full-coverage", "yes" if self.full_coverage else "no",
             "--save", "", "--appendonly", "no", "--dir", str(self.workdir / f"node{port}")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip

    def kill(self, port: int) -> None:
        self.procs[port].kill()
        self.procs[port].wait(10)

    def wait_state(self, port: int, state: str) -> None:
        """Until the node at ``port`` says the cluster is ``state`` (``ok``, ``fail``)."""
        self._wait(lambda: f"cluster_state:{state}" in self._cli(port, "cluster", "info"))

    def restart(self, port: int) -> None:
        """Start a killed master again; returns once the cluster is ok."""
        self.start(port)
        self.wait_state(port, "ok")

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
                proc.wait(10)




FAULTY_HTTP = """
import asyncio, hashlib, sys
from aiohttp import web

root, faulty, always = sys.argv[1], float(sys.argv[2]), sys.argv[3]
seen = {}

async def serve(request):
    name = request.match_info["name"]
    seen[name] = seen.get(name, 0) + 1
    h = int(hashlib.blake2b(name.encode(), digest_size=4).hexdigest(), 16)
    if not name.endswith("manifest.json") and (
        name == always or (seen[name] == 1 and (h % 1000) < faulty * 1000)
    ):
        fault = h % 3 if name != always else 0
        if fault == 0:
            return web.Response(status=503, text="SlowDown")
        if fault == 1:
            request.transport.abort()  # the connection drops mid-request
            await asyncio.sleep(0.05)
            return web.Response(status=500)
        await asyncio.sleep(3.0)  # a stall past the client's time-out
    return web.FileResponse(f"{root}/{name}")

app = web.Application()
app.router.add_get("/{name:.+}", serve)
runner = web.AppRunner(app)

async def main():
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    print(site._server.sockets[0].getsockname()[1], flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


class FaultyHTTPServer:
    """An HTTP server on 127.0.0.1 (aiohttp, in a process of its own) serving ``root``,
    whose first answer for a share ``faulty`` of the files (chosen by name) is a fault:
    a 503, a dropped connection or a 3 s stall; the file ``always`` fails every time."""

    def __init__(self, root: Path, faulty: float = 0.2, always: str = "") -> None:
        import sys

        self.proc = subprocess.Popen(
            [sys.executable, "-c", FAULTY_HTTP, str(root), str(faulty), always],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.url = f"http://127.0.0.1:{int(self.proc.stdout.readline())}"

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(10)
