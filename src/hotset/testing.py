"""Real servers on this machine for tests and benchmarks: a redis-server on a unix
socket, a Redis Cluster of several redis-server processes on 127.0.0.1 (``redis-cli
--cluster create``), an HTTP server that fails on purpose, nginx, an S3-compatible
server (moto's or s3rver), and a TCP proxy that puts latency and bandwidth on the wire."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

REDIS_SERVER = os.environ.get("HOTSET_REDIS_SERVER") or shutil.which("redis-server")


def run_processes(
    procs: list, timeout_s: float, wait_for: list[int] | None = None
) -> list[int | None]:
    """Start ``procs`` (``multiprocessing`` processes), wait up to ``timeout_s`` for each
    (of ``wait_for``, their indexes, where given: the rest are not waited for), kill
    those still running (a hang fails, never waits forever); their exit codes."""
    try:
        for p in procs:
            p.start()
        for i in range(len(procs)) if wait_for is None else wait_for:
            procs[i].join(timeout_s)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(10)
    return [p.exitcode for p in procs]


def forget_redis_leases(*addresses: str) -> int:
    """Remove the leases of Redis namespaces drawn on a server at one of ``addresses`` (its
    URL, or ``host:port``), a server gone for good with its data (a test's saves nothing):
    a store that could not clear its namespace, or is still open, keeps a lease for a
    later store on that server to clear what it left, and none ever will. Returns how
    many went."""
    from hotset.errors import ConfigError
    from hotset.store import lease
    from hotset.store.redis_store import REDIS_LEASE

    named = [re.compile(rb"(?<![\w.])" + re.escape(a.encode()) + rb"(?![\w.])") for a in addresses]
    base, gone = lease.private_base(), 0
    for name in os.listdir(base):
        if name.startswith(REDIS_LEASE):
            with contextlib.suppress(OSError, ConfigError):  # a lock file of the store's,
                fd = lease.open_lock(base, create=False, name=name)  # opened as it opens one
                try:
                    content = os.pread(fd, 4096, 0)
                finally:
                    os.close(fd)
                if any(n.search(content) for n in named):
                    os.unlink(os.path.join(base, name))
                    gone += 1
    return gone


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

    def shutdown(self) -> None:
        """Stop for good: the namespaces drawn on it are gone, their leases too."""
        self.stop()
        forget_redis_leases(self.url)


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
        self.ports: list[int] = []
        while len(self.ports) < masters:  # (a random draw can repeat: each master its own)
            port = _free_port_pair()
            if port not in self.ports:
                self.ports.append(port)
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
        """Stop every master for good: the namespaces drawn on the cluster are gone, their
        leases too."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
                proc.wait(10)
        forget_redis_leases(*(f"127.0.0.1:{p}" for p in self.ports))




FAULTY_HTTP = """
import asyncio, hashlib, sys
from aiohttp import web

root, faulty, always = sys.argv[1], float(sys.argv[2]), sys.argv[3]
seen = {}

async def serve(request):
    name = request.match_info["name"]
    if request.method == "HEAD":  # (an object's size and version: never a fault)
        return web.FileResponse(f"{root}/{name}")
    seen[name] = seen.get(name, 0) + 1
    h = int(hashlib.blake2b(name.encode(), digest_size=4).hexdigest(), 16)
    if not name.endswith("manifest.json") and (
        name == always or (seen[name] == 1 and (h % 1000) < faulty * 1000)
    ):
        fault = h % 4 if name != always else 0
        if fault == 0:
            return web.Response(status=503, text="SlowDown")
        if fault == 1:
            request.transport.abort()  # the connection drops mid-request
            await asyncio.sleep(0.05)
            return web.Response(status=500)
        if fault == 3:  # the connection resets mid-body
            with open(f"{root}/{name}", "rb") as f:
                body = f.read()
            answer = web.StreamResponse(headers={"Content-Length": str(len(body))})
            await answer.prepare(request)
            await answer.write(body[: len(body) // 2])
            request.transport.abort()
            return answer
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
    whose first GET for a share ``faulty`` of the files (chosen by name) is a fault:
    a 503, a dropped connection, a connection reset mid-body or a 3 s stall; the file
    ``always`` fails every time (a 503)."""

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


class PlainHTTPServer:
    """Python's own HTTP server (``http.server``, in a thread of this process) serving
    ``root`` as ``python -m http.server`` does: no ``Range`` support, a directory listing;
    paths containing ``forbidden`` answered 403. ``requests`` counts the requests."""

    def __init__(self, root: Path, forbidden: str = "forbidden") -> None:
        import functools
        import http.server
        import threading

        server = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def send_head(self):
                server.requests += 1
                if forbidden and forbidden in self.path:
                    self.send_error(403)
                    return None
                return super().send_head()

            def log_message(self, *args) -> None:
                pass

        self.requests = 0
        self._httpd = http.server.ThreadingHTTPServer(
            ("127.0.0.1", 0), functools.partial(Handler, directory=str(root))
        )
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, proc: subprocess.Popen, what: str) -> None:
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(url, timeout=1).close()
            return
        except urllib.error.HTTPError:
            return  # it answers
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not start") from None
            time.sleep(0.05)


class NginxServer:
    """nginx (Debian's) on 127.0.0.1 serving ``root`` read-only, with directory listings
    (``autoindex``) and range requests, as a dataset behind a web server is."""

    def __init__(self, root: Path, workdir: Path) -> None:
        port = _free_port()
        conf = workdir / "nginx.conf"
        user = "user root;" if os.geteuid() == 0 else ""
        conf.write_text(f"""{user}
daemon off; worker_processes 2; pid {workdir}/nginx.pid; error_log {workdir}/error.log;
events {{ worker_connections 256; }}
http {{
  access_log off; client_body_temp_path {workdir}/body; proxy_temp_path {workdir}/proxy;
  fastcgi_temp_path {workdir}/fcgi; uwsgi_temp_path {workdir}/uwsgi; scgi_temp_path {workdir}/scgi;
  server {{ listen 127.0.0.1:{port}; root {root}; autoindex on; }}
}}
""")
        self.proc = subprocess.Popen(
            [_binary(shutil.which("nginx") or "/usr/sbin/nginx", "nginx"), "-c", str(conf),
             "-p", str(workdir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self.url = f"http://127.0.0.1:{port}"
        _wait_http(self.url + "/", self.proc, "nginx")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def s3rver_binary() -> str | None:
    """s3rver's launcher: ``$HOTSET_S3RVER``, ``s3rver`` on the PATH, or the one ``make
    s3rver`` installs under ``.tools/`` (from npm) in the current
    directory; None where none is."""
    local = Path.cwd() / ".tools" / "node_modules" / ".bin" / "s3rver"
    for name in (os.environ.get("HOTSET_S3RVER"), shutil.which("s3rver"), str(local)):
        if name and os.access(name, os.X_OK):
            return name
    return None


class _ObjectStore:
    """An object-store server the tests start: ``protocol`` (fsspec's) and the
    ``storage_options`` that reach it."""

    protocol: str
    storage_options: dict

    def upload(self, local: Path, url: str) -> None:
        """Copy the tree ``local`` to ``url`` (``s3://bucket/prefix``, ``gs://...``),
        making the bucket."""
        import fsspec

        fs = fsspec.filesystem(self.protocol, **self.storage_options)
        bucket = url.split("://", 1)[1].split("/", 1)[0]
        if not fs.exists(bucket):
            fs.mkdir(bucket)
        fs.put(str(local), url, recursive=True)


class S3Server(_ObjectStore):
    """An S3-compatible server on 127.0.0.1 in a process of its own, speaking the S3 HTTP
    API: ``kind="moto"`` (moto's standalone server, Python) or ``"s3rver"`` (s3rver, a
    Node.js server that keeps objects as files and checks SigV4 signatures; its data
    directory is a temp dir removed by ``stop``). ``storage_options`` are s3fs's."""

    protocol = "s3"

    def __init__(self, kind: str = "moto") -> None:
        import sys
        import tempfile

        port = _free_port()
        env = dict(os.environ)
        self.kind = kind
        self.data: str | None = None
        if kind == "moto":
            cmd = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
            key = ("hotset", "hotset-secret")
        elif kind == "s3rver":
            binary = s3rver_binary()
            if binary is None:
                raise FileNotFoundError("s3rver not found: `make s3rver` installs it "
                                        "(npm), or set HOTSET_S3RVER")  # fmt: skip
            self.data = tempfile.mkdtemp(prefix="hotset-s3rver-")
            cmd = [binary, "-d", self.data, "-a", "127.0.0.1", "-p", str(port), "-s",
                   "--no-vhost-buckets"]  # fmt: skip
            key = ("S3RVER", "S3RVER")  # s3rver's one account
            # its continuation tokens use a cipher OpenSSL 3 keeps in the legacy provider
            env["NODE_OPTIONS"] = "--openssl-legacy-provider"
        else:
            raise ValueError(f"S3Server kind={kind!r}: 'moto' or 's3rver'")
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)  # fmt: skip
        self.endpoint = f"http://127.0.0.1:{port}"
        _wait_http(self.endpoint + "/", self.proc, kind)
        self.storage_options = {
            "key": key[0], "secret": key[1],
            "client_kwargs": {"endpoint_url": self.endpoint, "region_name": "eu-west-1"},
        }  # fmt: skip

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
        if self.data is not None:
            shutil.rmtree(self.data, ignore_errors=True)


class GcsServer(_ObjectStore):
    """A Google Cloud Storage server on 127.0.0.1 in a process of its own, speaking GCS's
    JSON API (``gcp-storage-emulator``, Python; objects in memory, range reads served):
    what gcsfs talks to, given ``storage_options`` (its endpoint, anonymous). gcsfs must
    be imported with ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false``: else it asks GCS's gRPC
    control plane, which the emulator lacks, for each bucket's layout (60 s per call)."""

    protocol = "gs"

    def __init__(self) -> None:
        import sys

        port = _free_port()
        cmd = [sys.executable, "-m", "gcp_storage_emulator", "start", "--host", "127.0.0.1",
               "--port", str(port), "--in-memory"]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.endpoint = f"http://127.0.0.1:{port}"
        _wait_http(self.endpoint + "/", self.proc, "gcp-storage-emulator")
        self.storage_options = {"endpoint_url": self.endpoint, "token": "anon"}

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


DELAY_PROXY = r"""
import asyncio, random, sys, time

listen, target = int(sys.argv[1]), int(sys.argv[2])
one_way_s, rate, stats_path = float(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
faults, failing = float(sys.argv[6]), sys.argv[7].encode()
METHODS = (b"GET ", b"HEAD ", b"PUT ", b"POST ", b"DELETE ")
STATS = {"requests": 0, "gets": 0, "bytes_up": 0, "bytes_down": 0, "connections": 0,
         "faults": 0}
BODY = b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
SLOW_DOWN = (b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\n"
             b"Content-Length: %d\r\n\r\n%s" % (len(BODY), BODY))
draw = random.Random(0)


class Link:
    '''One direction of the wire: bytes leave at ``rate`` (shared by every connection),
    then travel ``one_way_s``.'''

    def __init__(self):
        self.free_at = 0.0

    def arrival(self, n):
        start = max(time.monotonic(), self.free_at)
        self.free_at = start + (n / rate if rate else 0.0)
        return self.free_at + one_way_s


UP, DOWN = Link(), Link()


def fault(data):
    '''None, or how this ranged GET (a sample read, not a listing) fails: a 503 SlowDown
    answer or a dropped connection (a share ``faults`` of them, and every one whose path
    holds ``failing``).'''
    if not data.startswith(b"GET ") or b"\r\nrange:" not in data.lower() or not (
        draw.random() < faults or (failing and failing in data.split(b" ", 2)[1])
    ):
        return None
    STATS["faults"] += 1
    return "reset" if draw.random() < 0.5 else "503"


async def carry(reader, writer, link, back=None):
    queue = asyncio.Queue()

    async def deliver():
        while True:
            at, data = await queue.get()
            wait = at - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            if data is None:
                break
            writer.write(data)
            await writer.drain()
        writer.close()

    task = asyncio.create_task(deliver())
    up = link is UP
    try:
        while data := await reader.read(1 << 16):
            STATS["bytes_up" if up else "bytes_down"] += len(data)
            if up and data.startswith(METHODS):  # a new HTTP request on this connection
                STATS["requests"] += 1
                STATS["gets"] += data.startswith(b"GET ")
                how = fault(data)
                if how == "reset":
                    back.transport.abort()
                    break
                if how == "503":  # answered here; the client waits for it before its next
                    back.write(SLOW_DOWN)
                    continue
            queue.put_nowait((link.arrival(len(data)), data))
    except ConnectionError:
        pass
    queue.put_nowait((link.arrival(0), None))
    try:
        await task
    except ConnectionError:
        pass


async def handle(client_r, client_w):
    STATS["connections"] += 1
    try:
        server_r, server_w = await asyncio.open_connection("127.0.0.1", target)
    except OSError:
        client_w.close()
        return
    await asyncio.gather(carry(client_r, server_w, UP, client_w), carry(server_r, client_w, DOWN))


async def report():
    import json, os
    while stats_path:
        try:
            with open(stats_path + ".tmp", "w") as f:
                json.dump(STATS, f)
            os.replace(stats_path + ".tmp", stats_path)
        except FileNotFoundError:  # stopped: its directory is gone
            return
        await asyncio.sleep(0.1)


async def main():
    asyncio.create_task(report())
    server = await asyncio.start_server(handle, "127.0.0.1", listen)
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


asyncio.run(main())
"""


class DelayProxy:
    """A TCP proxy on 127.0.0.1 in front of ``port`` that puts a wire between them:
    ``latency_ms`` of round trip (half each way) and ``bandwidth_mb_s`` shared by every
    connection in each direction, as ``tc netem delay`` and ``rate`` would (netem is not
    in every kernel; this needs none). Requests and bytes cross it as they would cross a
    network: a request costs a round trip, bytes cost their transfer time. ``stats()``:
    the HTTP requests (``gets`` of them GETs), bytes each way and connections it has
    carried (within 0.1 s).

    Faults, as an object store under load gives them: a share ``faults`` of the ranged
    GETs (drawn with a fixed seed), and every one whose path contains ``failing``, are answered
    by the wire itself with a 503 SlowDown or a dropped connection (``stats()["faults"]``)."""

    def __init__(
        self,
        port: int,
        latency_ms: float,
        bandwidth_mb_s: float,
        faults: float = 0.0,
        failing: str = "",
    ) -> None:
        import sys
        import tempfile

        self._dir = tempfile.TemporaryDirectory(prefix="hotset-wire-")
        self._stats = Path(self._dir.name, "stats.json")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", DELAY_PROXY, "0", str(port), str(latency_ms / 2000.0),
             str(bandwidth_mb_s * 1e6), str(self._stats), str(faults), failing],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.port = int(self.proc.stdout.readline())
        self.url = f"http://127.0.0.1:{self.port}"

    def stats(self) -> dict:
        import json

        time.sleep(0.15)  # the proxy writes its counters every 0.1 s
        return json.loads(self._stats.read_text()) if self._stats.exists() else {}

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(10)
        self._dir.cleanup()
