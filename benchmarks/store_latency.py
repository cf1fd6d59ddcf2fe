"""Store latency per backend for 1 KB and 100 KB values, single and batched (128 keys):
in-process dict, node-local shared (LMDB on /dev/shm), and Redis (a real redis-server
this script starts on a unix socket, and on TCP loopback, and stops).

This is the measurement behind the node-local store's choice of LMDB on tmpfs.

    python benchmarks/store_latency.py [--repeats 200]
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import report  # noqa: E402
from hotset.store import MemoryStore, RedisStore, SharedStore  # noqa: E402

BATCH = 128


def start_redis(workdir: str) -> tuple[subprocess.Popen, str, str]:
    exe = os.environ.get("HOTSET_REDIS_SERVER") or shutil.which("redis-server")
    if exe is None:
        raise SystemExit("redis-server not found (apt-get install redis-server)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sock = os.path.join(workdir, "redis.sock")
    proc = subprocess.Popen(
        [
            exe,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--unixsocket",
            sock,
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            workdir,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while not os.path.exists(sock) and time.monotonic() < deadline:
        time.sleep(0.02)
    return proc, f"unix://{sock}", f"redis://127.0.0.1:{port}/0"


def timed(fn, repeats: int) -> float:
    fn()  # warm
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats


def bench(name: str, store, size: int, repeats: int) -> list[dict]:
    n = 4 * BATCH
    value = os.urandom(size)
    keys = [f"{size}-{i:06d}" for i in range(n)]
    store.put_many({k: value for k in keys})
    assert store.get_many(keys[:1]) == [value]
    one = timed(lambda: store.get_many(keys[:1]), repeats)
    batch = timed(lambda: store.get_many(keys[BATCH : 2 * BATCH]), max(10, repeats // 8))
    extra = [f"x{size}-{i:06d}" for i in range(BATCH)]

    def put_delete():
        store.put_many({k: value for k in extra})
        store.delete_many(extra)

    put = timed(put_delete, max(10, repeats // 8)) / 2
    store.clear()
    return [
        {
            "store": name,
            "value": f"{size // 1000} KB",
            "op": "get 1",
            "us_per_call": 1e6 * one,
            "us_per_item": 1e6 * one,
        },
        {
            "store": name,
            "value": f"{size // 1000} KB",
            "op": f"get {BATCH}",
            "us_per_call": 1e6 * batch,
            "us_per_item": 1e6 * batch / BATCH,
        },
        {
            "store": name,
            "value": f"{size // 1000} KB",
            "op": f"put {BATCH}",
            "us_per_call": 1e6 * put,
            "us_per_item": 1e6 * put / BATCH,
        },
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=200)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="hotset-bench-")
    proc, unix_url, tcp_url = start_redis(work)
    cap = 512 << 20
    stores = {
        "memory": MemoryStore(cap),
        "shared (lmdb, /dev/shm)": SharedStore(cap),
        "redis (unix socket)": RedisStore(cap, url=unix_url, namespace="bench-unix"),
        "redis (tcp loopback)": RedisStore(cap, url=tcp_url, namespace="bench-tcp"),
    }
    rows = []
    try:
        for size in (1000, 100_000):
            for name, store in stores.items():
                rows.extend(bench(name, store, size, args.repeats))
    finally:
        for store in stores.values():
            store.close(destroy=True)
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(work, ignore_errors=True)
    report(
        "store_latency",
        rows,
        [
            ("store", "s"),
            ("value", "s"),
            ("op", "s"),
            ("us_per_call", ".1f"),
            ("us_per_item", ".2f"),
        ],
        meta={"batch": BATCH, "repeats": args.repeats},
    )


if __name__ == "__main__":
    main()
