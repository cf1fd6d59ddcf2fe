"""Chaos soak: faults on a schedule while jobs read, every served sample checked.

    python benchmarks/chaos.py [--minutes 10] [--samples 3000]

Rounds of eight faults until the time is up, each injected mid-epoch into a loader of
real bytes (Fashion-MNIST files, DataLoader workers, a real store or service):

* ``worker-kill``: a DataLoader worker is killed (-9); torch raises, the loop resumes
  from the ``state_dict`` saved after the last batch it got.
* ``store-removed``: the named LMDB store's directory is removed (a tmpfs cleanup).
* ``tmpfs-full``: the store's tmpfs is filled by another writer (needs root to mount).
* ``redis-restart``: the Redis server is killed, then started again empty.
* ``cluster-master-restart``: one master of a 3-master Redis Cluster is killed (each in
  turn), then started again.
* ``service-kill9``: ``hotset serve`` is killed (-9) and started again; the job registers
  again and finishes its epoch.
* ``process-kill9``: the training process itself is killed (-9) after saving its state;
  a new process resumes from it on the surviving named store.
* ``process-kill9-before-save``: killed between a batch and its state's save: the
  resumed process serves that batch again (it was never checkpointed as trained).

Every served sample is compared with a direct read and decode of its file, its pixels
and its label (``wrong``, must be 0); every epoch's ids with the epoch's (``lost``: never
served, must be 0; ``repeated``: served twice, must be 0). A fault is ``absorbed`` when
its epochs end with nothing wrong, lost or repeated. Writes ``results/chaos.json`` and
prints a table.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import hotset  # noqa: E402
from _report import report  # noqa: E402
from hotset.codecs import decode_image, to_tensor  # noqa: E402
from hotset.service.server import start_service  # noqa: E402
from hotset.storage import FileStorage  # noqa: E402
from hotset.storage.prepare import prepare_fashion_mnist  # noqa: E402
from hotset.testing import RedisClusterServers, RedisServer  # noqa: E402

BATCH = 50


@dataclass
class Outcome:
    fault: str
    injected: int = 0
    samples: int = 0
    wrong: int = 0
    lost: int = 0
    repeated: int = 0
    errors: int = 0  # the fault escaped: the epochs did not end
    store_failures: int = 0
    hits: int = 0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def absorbed(self) -> bool:
        return self.injected > 0 and self.wrong == self.lost == self.repeated == self.errors == 0


def check(storage: FileStorage, x: torch.Tensor, y: torch.Tensor, ids: torch.Tensor) -> int:
    """How many served samples differ from a direct read of their files, in their pixels
    or their labels."""
    truth = torch.stack([to_tensor(decode_image(storage.read(i))) for i in ids.tolist()])
    labels = torch.as_tensor(storage.labels[ids.numpy()], dtype=y.dtype)
    return int(((x != truth).flatten(1).any(1) | (y != labels)).sum())


def coverage(out: Outcome, served: list[int], expected: int) -> None:
    out.samples += len(served)
    out.repeated += len(served) - len(set(served))
    out.lost += expected - len(set(served))


def epoch(loader, storage, out: Outcome, e: int, fault=None, at: int = 5) -> list[int]:
    """One epoch of ``loader``, every batch checked; ``fault()`` after batch ``at``."""
    loader.set_epoch(e)
    served = []
    for k, (x, y, ids) in enumerate(loader):
        out.wrong += check(storage, x, y, ids)
        served += ids.tolist()
        if k == at and fault is not None:
            fault()
            out.injected += 1
    return served


def finish(loader, out: Outcome) -> None:
    c = loader.counters()
    out.store_failures += c["store_failures"]
    out.hits += c["hits"]
    loader.close()


def worker_kill(storage, tmp: Path, round_: int) -> Outcome:
    out = Outcome("worker-kill")
    loader = hotset.make_loader(storage, batch_size=BATCH, cache_fraction=0.3, num_workers=2)
    for e in range(2):
        loader.set_epoch(e)
        served, state, killed = [], loader.state_dict(), e != 1
        while True:
            try:
                for k, (x, y, ids) in enumerate(loader):
                    # one statement: torch raises a dead worker's error between any two
                    state, served = loader.state_dict(), served + ids.tolist()
                    out.wrong += check(storage, x, y, ids)
                    if not killed and k == 5:
                        killed = True
                        os.kill(_workers()[0], signal.SIGKILL)
                        out.injected += 1
                break
            except (RuntimeError, OSError) as exc:  # torch: "DataLoader worker ... killed by
                # signal", or the connection reset while a batch came from that worker
                out.notes.append(str(exc).split("\n")[0][:80])
                loader.load_state_dict(state)
        coverage(out, served, len(storage))
    finish(loader, out)
    return out


def _workers() -> list[int]:
    """This process's forked children (the DataLoader's workers: same command line)."""
    me, kids = str(os.getpid()), []
    cmdline = Path(f"/proc/{me}/cmdline").read_bytes()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            if stat[1] == me and Path(f"/proc/{pid}/cmdline").read_bytes() == cmdline:
                kids.append(int(pid))
    return kids


def store_removed(storage, tmp: Path, round_: int) -> Outcome:
    out = Outcome("store-removed")
    path = tmp / "named-store"
    loader = hotset.make_loader(storage, batch_size=BATCH, cache_fraction=0.3,
                                store=f"shared://{path}", num_workers=2)  # fmt: skip
    for e in range(3):
        fault = (lambda: shutil.rmtree(path)) if e == 1 else None
        coverage(out, epoch(loader, storage, out, e, fault), len(storage))
    finish(loader, out)
    return out


def tmpfs_full(storage, tmp: Path, round_: int) -> Outcome:
    out = Outcome("tmpfs-full")
    mnt = tmp / "small-tmpfs"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)], capture_output=True
    ).returncode:
        out.notes.append("skipped: mounting a tmpfs needs root")
        return out
    try:
        loader = hotset.make_loader(storage, batch_size=BATCH, capacity_bytes=6 << 20,
                                    store=f"shared://{mnt}/store", num_workers=2)  # fmt: skip

        def fill() -> None:
            free = os.statvfs(mnt).f_bavail * os.statvfs(mnt).f_frsize
            (mnt / "ballast").write_bytes(b"\0" * max(free - (256 << 10), 0))

        for e in range(3):
            coverage(out, epoch(loader, storage, out, e, fill if e == 0 else None), len(storage))
        finish(loader, out)
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)
    return out


def redis_restart(storage, tmp: Path, round_: int) -> Outcome:
    out = Outcome("redis-restart")
    server = RedisServer(tmp)
    server.start()
    try:
        loader = hotset.make_loader(storage, batch_size=BATCH, cache_fraction=0.3,
                                    store=server.url, num_workers=2)  # fmt: skip
        def outage() -> None:  # down for a few batches, then back empty
            server.stop()
            threading.Timer(1.5, server.start).start()

        for e in range(3):
            coverage(out, epoch(loader, storage, out, e, outage if e == 1 else None),
                     len(storage))  # fmt: skip
        finish(loader, out)
    finally:
        server.shutdown()
    return out


def cluster_master_restart(storage, tmp: Path, round_: int) -> Outcome:
    out = Outcome("cluster-master-restart")
    cluster = RedisClusterServers(tmp)
    victim = cluster.ports[round_ % len(cluster.ports)]
    try:
        loader = hotset.make_loader(storage, batch_size=BATCH, cache_fraction=0.3,
                                    store=cluster.url, num_workers=2)  # fmt: skip
        for e in range(3):
            fault = (lambda: cluster.kill(victim)) if e == 1 else None
            coverage(out, epoch(loader, storage, out, e, fault), len(storage))
            if e == 1:
                cluster.restart(victim)
        finish(loader, out)
        out.notes.append(f"master {cluster.ports.index(victim)}")
    finally:
        cluster.stop()
    return out


def service_kill9(storage, tmp: Path, round_: int) -> Outcome:
    out = Outcome("service-kill9")
    address = f"ipc://{tmp}/svc.sock"
    opts = {"capacity_bytes": int(0.3 * storage.manifest.total_bytes),
            "store_path": str(tmp / "service-store"), "job_timeout_s": 5.0}  # fmt: skip
    service = [start_service(address, **opts)]
    client = hotset.connect(address, timeout_s=20)
    client.hello()

    def kill_and_restart() -> None:
        os.kill(service[0].pid, signal.SIGKILL)
        service[0].join(10)
        service[0] = start_service(address, **opts)

    try:
        loader = client.make_loader(storage, batch_size=BATCH, num_workers=1, name="chaos")
        for e in range(2):
            fault = kill_and_restart if e == 0 else None
            coverage(out, epoch(loader, storage, out, e, fault), len(set(storage.keys)))
        out.notes.append(f"rejoins {loader.counters()['service_rejoins']}")
        finish(loader, out)
    finally:
        client.close()
        service[0].kill()
        service[0].join(10)
    return out


RESUME = textwrap.dedent("""
    import os, pickle, signal, sys
    sys.path.insert(0, {bench!r})
    from chaos import BATCH, check
    import hotset
    from hotset.storage import FileStorage
    storage = FileStorage({data!r})
    loader = hotset.make_loader(storage, batch_size=BATCH, cache_fraction=0.3,
                                store={store!r}, num_workers=2)
    log = {log!r}
    if os.path.exists({state!r}):
        with open({state!r}, "rb") as f:
            loader.load_state_dict(pickle.load(f))
    e = loader.epoch
    while e < 2:
        loader.set_epoch(e)
        for k, (x, y, ids) in enumerate(loader):
            wrong = check(storage, x, y, ids)
            with open(log, "a") as f:
                f.write(f"served {{e}} {{wrong}} {{' '.join(map(str, ids.tolist()))}}\\n")
            if {kill!r} == "before save" and e == 1 and k == 7:
                os.kill(os.getpid(), signal.SIGKILL)  # the batch served, its state not saved
            with open({state!r} + ".new", "wb") as f:
                pickle.dump(loader.state_dict(), f)
            os.replace({state!r} + ".new", {state!r})
            with open(log, "a") as f:
                f.write("saved\\n")
            if {kill!r} == "after save" and e == 1 and k == 7:
                os.kill(os.getpid(), signal.SIGKILL)
        e += 1
    loader.close()
""")


def _process_kill9(storage, tmp: Path, when: str) -> Outcome:
    """The training process killed (-9) at its eighth batch of epoch 1, ``when`` "after
    save" (its state saved) or "before save" (the batch served, its state not saved: the
    resumed run serves it again, as a trainer that had not checkpointed it would want);
    a new process resumes from the last state on the surviving named store. A batch
    counts as trained once its state was saved."""
    out = Outcome("process-kill9" + ("" if when == "after save" else "-before-save"))
    args = {"bench": str(Path(__file__).resolve().parent), "data": storage.url,
            "store": f"shared://{tmp}/job-store", "log": str(tmp / "served.log"),
            "state": str(tmp / "state.pkl")}  # fmt: skip
    first = subprocess.run([sys.executable, "-c", RESUME.format(kill=when, **args)],
                           capture_output=True, text=True, timeout=600)  # fmt: skip
    if first.returncode == -signal.SIGKILL:
        out.injected += 1
    else:
        out.notes.append(f"no kill: rc {first.returncode} {first.stderr[-200:]}")
    second = subprocess.run([sys.executable, "-c", RESUME.format(kill="", **args)],
                            capture_output=True, text=True, timeout=600)  # fmt: skip
    if second.returncode:
        out.notes.append(f"resume failed: {second.stderr[-300:]}")
    served: dict[int, list[int]] = {0: [], 1: []}
    pending = None  # the batch served whose state is not saved yet
    for line in Path(args["log"]).read_text().splitlines():
        if line == "saved":
            e, ids = pending
            served[e] += ids
            pending = None
            continue
        _, e, wrong, *ids = line.split()
        out.wrong += int(wrong)
        pending = (int(e), list(map(int, ids)))  # (a pending one before it died unsaved)
    for ids in served.values():
        coverage(out, ids, len(storage))
    return out


def process_kill9(storage, tmp: Path, round_: int) -> Outcome:
    return _process_kill9(storage, tmp, "after save")


def process_kill9_before_save(storage, tmp: Path, round_: int) -> Outcome:
    return _process_kill9(storage, tmp, "before save")


FAULTS = [worker_kill, store_removed, tmpfs_full, redis_restart, cluster_master_restart,
          service_kill9, process_kill9, process_kill9_before_save]  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--samples", type=int, default=3000)
    ap.add_argument("--data", default="data/chaos-fmnist")
    names = {f.__name__.replace("_", "-"): f for f in FAULTS}
    ap.add_argument("--faults", default=",".join(names),
                    help=f"the faults to inject, comma-separated (default: all: {','.join(names)})")
    args = ap.parse_args()
    unknown = [f for f in args.faults.split(",") if f not in names]
    if unknown:
        ap.error(f"unknown fault(s) {unknown}: choose from {', '.join(names)}")
    chosen = [names[f] for f in args.faults.split(",")]
    data = Path(args.data) / f"{args.samples}"
    if not (data / "train" / "manifest.json").exists():
        prepare_fashion_mnist(str(data), limit=args.samples)
    storage = FileStorage(str(data / "train"))
    start, outcomes, round_ = time.monotonic(), [], 0
    while time.monotonic() - start < args.minutes * 60:
        for fault in chosen:
            tmp = Path(tempfile.mkdtemp(prefix="hotset-chaos-", dir="/dev/shm"))
            t = time.monotonic()
            try:
                out = fault(storage, tmp, round_)
            except Exception as exc:  # noqa: BLE001 - a fault not absorbed is the finding
                out = Outcome(fault.__name__.replace("_", "-"), injected=1, errors=1,
                              notes=[f"{type(exc).__name__}: {exc}"[:200]])  # fmt: skip
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            out.seconds = time.monotonic() - t
            outcomes.append(out)
            print(f"[{time.monotonic() - start:6.0f} s] round {round_} {out.fault}: "
                  f"{out.samples} samples, wrong {out.wrong}, lost {out.lost}, repeated "
                  f"{out.repeated}, absorbed {out.absorbed} {'; '.join(out.notes)}",
                  flush=True)  # fmt: skip
        round_ += 1
    rows = []
    for name in dict.fromkeys(o.fault for o in outcomes):
        mine = [o for o in outcomes if o.fault == name]
        rows.append({
            "fault": name,
            "injected": sum(o.injected for o in mine),
            "absorbed": sum(o.absorbed for o in mine),
            "samples": sum(o.samples for o in mine),
            "wrong": sum(o.wrong for o in mine),
            "lost": sum(o.lost for o in mine),
            "repeated": sum(o.repeated for o in mine),
            "errors": sum(o.errors for o in mine),
            "store_failures": sum(o.store_failures for o in mine),
            "hits": sum(o.hits for o in mine),
            "seconds": sum(o.seconds for o in mine),
        })  # fmt: skip
    total = {k: sum(r[k] for r in rows) for k in rows[0] if k != "fault"}
    rows.append({"fault": "all", **total})
    report(
        "chaos", rows,
        [("fault", "s"), ("injected", "d"), ("absorbed", "d"), ("samples", "d"),
         ("wrong", "d"), ("lost", "d"), ("repeated", "d"), ("errors", "d"),
         ("store_failures", "d"),
         ("hits", "d"), ("seconds", ".0f")],
        meta={"minutes": args.minutes, "samples_per_epoch": len(storage), "rounds": round_,
              "runs": [asdict(o) for o in outcomes]},
    )  # fmt: skip
    if total["wrong"] or total["lost"] or total["repeated"] or total["errors"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
