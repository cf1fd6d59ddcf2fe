"""`hotset compare --jobs`: several training jobs at once on one machine, two ways side
by side. Each job is its own process with its own DataLoader workers and its own
throttled storage.

Scenarios ``same`` (identical jobs, same start), ``staggered`` (each starts ``stagger_s``
after the previous), ``speeds`` (models of different widths, so different step times) and
``overlap`` (each job on a different 70% window of the samples) compare the service
(shared DSA sampling, one RefCnt cache) with the jobs run independently (each its own
uniform sampler and LRU cache of the same size).

``benefit`` (Quiver's job heterogeneity): the jobs train on disjoint slices of the
samples; the even ones are I/O-bound (slow storage, a narrow model), the odd ones
compute-bound (storage without latency, a wide model). The service with benefit-aware
allocation (a partition per dataset, sized by measured benefit) against the same
service with one shared cache; both sample uniformly and never evict (MinIO) within a
partition. ``iis`` (iCACHE's multi-job handling): importance-sampling jobs of different
widths on the same samples; the service's H-cache keyed by the aggregated importance
(AIV) against the same sampling with an LRU cache.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import shutil
import tempfile
import time
import zlib
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

import numpy as np

from hotset.errors import ConfigError

SCENARIOS = ("same", "staggered", "speeds", "overlap", "benefit", "iis")
#: the two ways each scenario runs its jobs (the first is the one under test)
#: the ways each scenario runs its jobs (the first is the one under test, the last the
#: baseline); the others: JOADER's service (DSA + RefCnt), Quiver's substitution and its
#: coordinated chunks, each job on its own
SCENARIO_MODES = {"benefit": ("benefit", "shared"), "iis": ("aiv", "iis-lru")}
DEFAULT_MODES = ("service", "quiver", "chunks", "independent")
#: the service's options per mode ("independent": no service)
SERVICE_OPTIONS = {
    "service": {},
    "benefit": {"sampling": "isa", "policy": "minio", "allocation": "benefit"},
    "shared": {"sampling": "isa", "policy": "minio"},
    "aiv": {"sampling": "iis"},
    "iis-lru": {"sampling": "iis", "policy": "lru"},
    "quiver": {"sampling": "quiver"},
    "chunks": {"sampling": "chunks"},
}


def scenario_modes(scenario: str) -> tuple[str, ...]:
    return SCENARIO_MODES.get(scenario, DEFAULT_MODES)


@dataclass
class JobSpec:
    name: str
    start_s: float = 0.0  # delay after the first job starts
    width: int = 16  # TinyCNN width: wider is slower
    window: tuple[float, float] = (0.0, 1.0)  # the fraction of the samples it trains on
    latency_ms: float | None = None  # its storage's latency (None: the config's)


@dataclass
class JobsConfig:
    data: str
    jobs: int = 4
    scenario: str = "same"
    samples: int = 20_000  # the first N training samples (0: all)
    epochs: int = 2
    batch_size: int = 128
    cache_fraction: float = 0.2
    num_workers: int = 1
    latency_ms: float = 2.0
    concurrency: int = 4
    stagger_s: float = 20.0
    probe_batches: int = 10  # benefit / iis: minibatches timed without, then with, the cache
    seed: int = 0
    modes: tuple[str, ...] = ()  # default: the scenario's (scenario_modes)
    device: str = "auto"
    model: str = "tiny"  # tiny: each job's width from its spec; resnet18: one for all
    specs: list[JobSpec] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.scenario not in SCENARIOS:
            raise ConfigError(f"--scenario must be one of {SCENARIOS}, got {self.scenario!r}")
        if not 1 <= self.jobs <= 16:
            raise ConfigError(f"--jobs must be in [1, 16], got {self.jobs}")
        if not self.specs:
            self.specs = scenario_jobs(self.scenario, self.jobs, self.stagger_s)
        self.modes = tuple(self.modes) or scenario_modes(self.scenario)
        unknown = sorted(set(self.modes) - {*SERVICE_OPTIONS, "independent"})
        if unknown or len(self.modes) < 2:
            raise ConfigError(
                f"--modes: give two or more of {', '.join((*SERVICE_OPTIONS, 'independent'))}"
                + (f"; unknown: {', '.join(unknown)}" if unknown else "")
            )


def scenario_jobs(scenario: str, n: int, stagger_s: float) -> list[JobSpec]:
    jobs = [JobSpec(f"job{k}") for k in range(n)]
    for k, j in enumerate(jobs):
        if scenario == "staggered":
            j.start_s = k * stagger_s
        elif scenario == "speeds":
            j.width = (8, 16, 32, 48)[k % 4]
        elif scenario == "overlap":
            lo = 0.3 * k / max(1, n - 1)
            j.window = (lo, lo + 0.7)
        elif scenario == "benefit":
            j.window = (k / n, (k + 1) / n)
            j.width, j.latency_ms = (8, None) if k % 2 == 0 else (48, 0.0)
        elif scenario == "iis":
            j.width = (8, 48)[k % 2]
    return jobs


def _samples(cfg: JobsConfig):
    """The training split's storage and how many of its samples the jobs use."""
    from hotset.compare import open_split

    full = open_split(cfg.data, "train")
    return full, min(len(full), cfg.samples) if cfg.samples else len(full)


def _storage(cfg: JobsConfig, spec: JobSpec):
    from hotset.storage import SubsetStorage, ThrottledStorage

    full, n = _samples(cfg)
    lo, hi = int(spec.window[0] * n), int(spec.window[1] * n)
    latency = cfg.latency_ms if spec.latency_ms is None else spec.latency_ms
    return ThrottledStorage(SubsetStorage(full, np.arange(lo, hi)), latency, 0.0, cfg.concurrency)


def _run_job(
    cfg: JobsConfig, spec: JobSpec, mode: str, address: str, capacity: int, ready, out
) -> None:
    """One training job (its own process); puts its row on ``out``."""
    import torch

    from hotset.build import make_loader
    from hotset.codecs import decode_sample
    from hotset.compare import IMAGE_SIZE, load_split
    from hotset.models import TinyCNN, accuracy, make_model, resolve_device
    from hotset.service.client import connect
    from hotset.training import train_epoch

    torch.set_num_threads(1)  # several jobs share the cores
    decode = partial(decode_sample, size=IMAGE_SIZE)

    def open_loader():
        storage = _storage(cfg, spec)
        if mode != "independent":
            return connect(address, timeout_s=60).make_loader(
                storage, batch_size=cfg.batch_size, name=spec.name,
                num_workers=cfg.num_workers, decode=decode,
                persistent_workers=cfg.num_workers > 0,
            )  # fmt: skip
        return make_loader(
            storage, batch_size=cfg.batch_size, policy="lru", capacity_bytes=capacity,
            store="shared", seed=cfg.seed + zlib.crc32(spec.name.encode()) % 1000,
            num_workers=cfg.num_workers, decode=decode, persistent_workers=cfg.num_workers > 0,
        )  # fmt: skip

    # jobs that start at once register first, then all cross one start line together
    loader = open_loader() if spec.start_s == 0 else None
    ready.wait(timeout=600)
    t0 = time.time()
    if loader is None:
        time.sleep(spec.start_s)
        loader = open_loader()
    torch.manual_seed(cfg.seed)
    model = TinyCNN(width=spec.width) if cfg.model == "tiny" else make_model(cfg.model, 10)
    model = model.to(resolve_device(cfg.device))
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    started = time.time() - t0
    times, hits = [], []
    try:
        for epoch in range(cfg.epochs):
            loader.set_epoch(epoch)
            t = time.perf_counter()
            train_epoch(loader, model, opt)
            times.append(time.perf_counter() - t)
            hits.append(loader.counters()["hits"])
        c = loader.counters()
        service = {}
        if mode != "independent":
            service = loader.planner.client.stats()
            service["benefits"] = [b.as_dict() for b in loader.planner.benefits]
    finally:
        loader.close()
        if mode == "independent":
            loader.dataset.store.close(destroy=True)
    test = load_split(cfg.data, "test", decode)
    out.put(
        {
            **asdict(spec), "mode": mode, "started_s": started, "epoch_times_s": times,
            "epoch_time_s": float(np.mean(times)),
            "hits_by_epoch": np.diff(hits, prepend=0).tolist(),
            "samples_read": c["storage_reads"],
            "bytes_from_storage": c["internal"]["bytes_from_storage"], "accesses": c["accesses"],
            "hit_ratio": c["hit_ratio"], "waited_hits": c["internal"]["waited_hits"],
            "late_misses": c["late_misses"], "refused_puts": c["internal"]["refused_puts"],
            "test_accuracy": accuracy(model, *test) if test is not None else None,
            "service": service,
        }
    )  # fmt: skip


def run_jobs(cfg: JobsConfig, mode: str) -> list[dict]:
    """All of ``cfg``'s jobs at once, through the service (``SERVICE_OPTIONS[mode]``) or
    independently (``"independent"``)."""
    from hotset.service.server import start_service

    if mode not in (*SERVICE_OPTIONS, "independent"):
        raise ConfigError(f"mode must be one of {(*SERVICE_OPTIONS, 'independent')}, got {mode!r}")
    union = set()
    for spec in cfg.specs:
        union.update(_storage(cfg, spec).keys)
    sizes = _storage(cfg, JobSpec("all")).manifest
    total = int(sum(int(s) for k, s in zip(sizes.keys, sizes.sizes, strict=True) if k in union))
    capacity = int(cfg.cache_fraction * total)
    ctx = mp.get_context("spawn")
    server = None
    sockets = tempfile.mkdtemp(prefix="hotset-jobs-")  # ours: removed below
    address = f"ipc://{sockets}/service.sock"
    if mode != "independent":
        server = start_service(
            address, capacity_bytes=capacity, seed=cfg.seed, job_timeout_s=60,
            probe_batches=cfg.probe_batches if mode in ("benefit", "aiv") else 0,
            **SERVICE_OPTIONS[mode],
        )  # fmt: skip
    out = ctx.Queue()
    ready = ctx.Barrier(len(cfg.specs))
    procs = [
        ctx.Process(target=_run_job, args=(cfg, s, mode, address, capacity, ready, out))
        for s in cfg.specs
    ]
    try:
        for p in procs:
            p.start()
        rows = [out.get() for _ in procs]
        for p in procs:
            p.join()
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        if server is not None:
            server.terminate()
            server.join(10)
        shutil.rmtree(sockets, ignore_errors=True)
    return sorted(rows, key=lambda r: r["name"])


def _warm_page_cache(cfg: JobsConfig) -> None:
    """Read the samples' files once, so that the mode run first does not also pay for
    a cold disk (the throttle is the storage both modes are measured against)."""
    full, n = _samples(cfg)
    for lo in range(0, n, 1024):
        full.read_many(range(lo, min(n, lo + 1024)))


def compare_jobs(cfg: JobsConfig, out_dir: str | None = "out/jobs") -> dict:
    """Both of the scenario's modes side by side; returns and writes ``{"config", "modes",
    "rows", "totals"}``."""
    modes = cfg.modes
    _warm_page_cache(cfg)
    rows = [r for mode in modes for r in run_jobs(cfg, mode)]
    totals = {}
    for mode in modes:
        sel = [r for r in rows if r["mode"] == mode]
        totals[mode] = {
            "samples_read": sum(r["samples_read"] for r in sel),
            "bytes_from_storage": sum(r["bytes_from_storage"] for r in sel),
            "hit_ratio": sum(r["hit_ratio"] * r["accesses"] for r in sel)
            / max(1, sum(r["accesses"] for r in sel)),
            "slowest_epoch_s": max(r["epoch_time_s"] for r in sel),
            "mean_epoch_s": float(np.mean([r["epoch_time_s"] for r in sel])),
        }
    for mode in modes:  # bytes read against the baseline, the last mode
        totals[mode]["read_ratio"] = totals[mode]["bytes_from_storage"] / max(
            1, totals[modes[-1]]["bytes_from_storage"]
        )
    totals["read_ratio"] = totals[modes[0]]["read_ratio"]
    doc = {"config": asdict(cfg), "modes": list(modes), "rows": rows, "totals": totals}
    print(format_jobs_compare(doc))
    if out_dir:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        path = Path(out_dir) / f"compare-jobs-{cfg.scenario}.json"
        path.write_text(json.dumps(doc, indent=2))
        print(f"wrote {path}")
    return doc


def format_jobs_compare(doc: dict) -> str:
    head = (
        f"{'mode':<12} {'job':<6} {'width':>5} {'window':>9} {'start s':>7} {'read':>7} "
        f"{'hit':>6} {'epoch s':>8} {'last ep.':>8} {'test acc':>8}"
    )
    lines = [head, "-" * len(head)]
    for r in doc["rows"]:
        acc = f"{r['test_accuracy']:.4f}" if r["test_accuracy"] is not None else "n/a"
        window = f"{r['window'][0]:.2f}-{r['window'][1]:.2f}"
        lines.append(
            f"{r['mode']:<12} {r['name']:<6} {r['width']:>5} {window:>9} {r['started_s']:>7.1f} "
            f"{r['samples_read']:>7d} {r['hit_ratio']:>6.3f} {r['epoch_time_s']:>8.2f} "
            f"{r['epoch_times_s'][-1]:>8.2f} {acc:>8}"
        )
    t = doc["totals"]
    for mode in doc["modes"]:
        lines.append(
            f"{mode:<12} {'total':<6} read {t[mode]['samples_read']} samples, "
            f"{t[mode]['bytes_from_storage'] / 1e6:.1f} MB, hit {t[mode]['hit_ratio']:.3f}, "
            f"mean epoch {t[mode]['mean_epoch_s']:.2f} s, "
            f"slowest epoch {t[mode]['slowest_epoch_s']:.2f} s, "
            f"bytes read / {doc['modes'][-1]}: {t[mode]['read_ratio']:.3f}"
        )
    return "\n".join(lines)
