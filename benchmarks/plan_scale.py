"""Planning cost per sample and memory per id as the dataset grows (60k, 1.28M, 10M ids),
for every system: the baselines under uniform shuffling, SHADE, iCACHE, SpiderCache,
and the service's Quiver and JOADER (two jobs on one dataset), 10% cache.

Each (system, size) runs in a fresh process: the manifest (content keys, paths, sizes,
labels, as ``Manifest`` holds them), then the control plane (sampler + policy + planner,
or the service's coordinator) is built, and two (``--epochs``) epoch starts each followed
by ``--batches`` batches are planned with feedback (synthetic per-sample losses,
class-clustered 16-d embeddings for SpiderCache), as a training loop would. Reported:

* ``manifest_B_per_id``: memory the manifest keeps in each process, per id
  (``tracemalloc``): it is mapped from its columns file, as a node's ranks and workers
  share it; ``node_B_per_id``: that file, once per node;
* ``state_B_per_id``: resident memory the control plane adds after the two windows, per id
  (``peak_B_per_id``: its peak);
* ``compiled_MB``: what making the system's policy takes whatever the ids (numba and the
  compiled loops of SHADE's, RefCnt's and iCACHE's caches: about 41 MB traced, about 0
  for the others), once per process: measured before the run and not in the figures per id;
* ``epoch_start_ms``: the second epoch's start up to its first batch (per-epoch work: new
  orders, importance distributions, H-lists), and ``us_per_sample``: planning + feedback
  per planned sample in the windows' other batches; ``amortised_us`` adds the epoch start
  spread over an epoch of n samples; ``later_start_ms`` (``--epochs 3`` or more): the
  longest start of the epochs after the second (the second epoch's start is the first in
  the process to make its arrays of n, and on some machines pays their first page faults,
  0.3-0.7 s at 14M ids here); ``package_ms``: iCACHE's composition of a package;
  ``longest_batch_ms``: the longest a batch took to plan (and feed back), every batch
  but the epochs' first (the ``--warm`` fill included); ``numpy_madvise_hugepage``: the
  ``NUMPY_MADVISE_HUGEPAGE`` the run had (docs/benchmarks.md: on this VM a huge page's
  first touch is slow, and the second epoch's start pays it).

``--to-end``: the planner's systems plan each epoch on to its end after its window,
untimed, with feedback, as training does: the last quarter of an epoch draws the next
epoch's order where it is fixed in advance (uniform), so the next start does not.

``--window-at S``: the planner's systems time each window from a share S of its epoch
(planned up to there untimed): SHADE serves an epoch's cached samples first, so a window
at its start times hits only, and one at 0.5 its misses, an admission and an eviction
each with the cache full (``--warm``).

``--scored``: every id gets a loss before the windows, as after a whole first epoch
(by default only the windows' batches are scored, so IIS ranks 25,600 losses where a
real second epoch ranks them all). ``--warm``: the first epoch goes on past its window
until the cache is full (or the epoch ends), and only the second epoch's window is
timed: a window of 100 batches fills 2% of a 10% cache at 1.28M ids, so without it no
policy evicts while it is timed. ``--stagger F`` (the service): the second job registers
once the first has planned a share F of its first epoch (a sweep's next run), and only
that epoch's window, the two jobs out of step, is timed (the later epochs start both).

    python benchmarks/plan_scale.py [--sizes 60000,1281167,10000000] [--systems ...]
        [--scored] [--warm] [--epochs 2] [--stagger 0.5] [--window-at 0.5] [--to-end]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

from _report import report  # noqa: E402

PLANNER_SYSTEMS = ["lru", "lfu", "fifo", "random", "minio", "belady", "shade", "icache", "spider"]
SERVICE_SYSTEMS = {"quiver": "quiver", "joader": "dsa"}
CLASSES = 1000
DIM = 16


def traced() -> int:
    """Bytes traced now, while the control plane is alive (0 when not tracing)."""
    return tracemalloc.get_traced_memory()[0] if tracemalloc.is_tracing() else 0


def make_manifest(n: int):
    """A manifest of ``n`` samples as ``hotset prepare`` writes one (keys, paths, sizes,
    labels), built straight into its columns."""
    from hotset.storage.manifest import Manifest

    rng = np.random.default_rng(0)
    labels = rng.integers(0, CLASSES, n)
    sizes = rng.integers(60_000, 180_000, n)  # ImageNet-like JPEGs
    keys = (f"{i:032x}" for i in range(n))
    paths = (f"train/n{c:08d}/{i:08d}.JPEG" for i, c in enumerate(labels.tolist()))
    return Manifest(paths, keys, sizes, labels, [str(c) for c in range(CLASSES)])


def mapped_manifest(n: int, path: Path):
    """The manifest of ``make_manifest(n)`` as a loader opens one: its columns file
    (written here once), mapped."""
    from hotset.storage.manifest import Manifest

    path.write_bytes(make_manifest(n).to_columns())
    return Manifest.map_columns(str(path))


def losses_of(ids: np.ndarray, progress: float) -> np.ndarray:
    """Per-sample losses: a persistent difficulty per id, shrinking as training goes."""
    hard = ((ids * 2654435761) % 997) / 997.0 + 0.05
    return hard * 0.7**progress


def embeddings_of(ids: np.ndarray, labels: np.ndarray, centers: np.ndarray) -> np.ndarray:
    noise = np.sin(np.outer(ids, np.arange(1, centers.shape[1] + 1)) * 0.37).astype(np.float32)
    return centers[labels[ids]] + 0.3 * noise


def score_all(sampler, n: int) -> None:
    """Feed back a loss for every id, as a whole first epoch of training would have
    (``--scored``), so that the measured epoch start works on 14M scores, not on the
    windows' few: a sampler that needs embeddings is left as it is (graph scoring of
    every id is an epoch of its own)."""
    if not sampler.learns_from_feedback or sampler.needs_embeddings:
        return
    for ids in np.array_split(np.arange(n), max(1, n >> 20)):
        sampler.feedback(ids, losses_of(ids, 0.5))


def fullness(policy) -> float:
    """The share of the cache's bytes in use (a service's policy: all its partitions')."""
    capacity = sum(policy.capacities()) if hasattr(policy, "capacities") else policy.capacity_bytes
    return policy.used / max(1, capacity)


def batch_numbers(epoch: int, batches: int, n: int, batch_size: int, warm: bool, policy):
    """The batch numbers of an epoch's window: ``--warm``'s first epoch runs on until
    ``policy`` is full (or the epoch ends)."""
    if not (warm and epoch == 0):
        yield from range(batches)
        return
    for k in range(-(-n // batch_size)):
        if k >= batches and fullness(policy) >= 0.99:
            return
        yield k


def run_planner(system: str, manifest, batches: int, batch_size: int, scored: bool,
                warm: bool = False, epochs: int = 2, window_at: float = 0.0,
                to_end: bool = False) -> dict:  # fmt: skip
    from hotset.plan import Planner
    from hotset.policy.base import make_policy
    from hotset.sampling.base import make_sampler
    from hotset.systems import resolve_system

    n = len(manifest)
    sysdef = resolve_system(system)
    opts = dict(sysdef.sampler_options)
    centers = np.random.default_rng(1).normal(size=(CLASSES, DIM)).astype(np.float32)
    if sysdef.sampler == "spider":
        opts.update(labels=manifest.labels, background=False, total_epochs=10)
    capacity = int(0.1 * manifest.total_bytes)
    policy = make_policy(sysdef.policy, capacity, sizes=manifest.sizes, seed=0)
    sampler = make_sampler(sysdef.sampler, n, seed=0, **opts)
    planner = Planner(sampler, policy, batch_size, feed_future=False)
    composed: list[float] = []  # iCACHE: seconds per package composition
    if hasattr(policy, "l_next_package"):
        compose = policy._compose  # what a package's ids cost to choose

        def timed(*args, **kwargs):
            t = time.perf_counter()
            out = compose(*args, **kwargs)
            composed.append(time.perf_counter() - t)
            return out

        policy._compose = timed
    if policy.needs_future and window_at:
        raise SystemExit(f"--window-at: not with {system} (its future is the windows')")
    if policy.needs_future:  # Belady: the windows' accesses, known in advance
        window = batches * batch_size
        policy.set_future(np.concatenate([sampler.epoch_order(e)[:window] for e in range(2)]))
    if scored:
        score_all(sampler, n)

    def learn(plan, progress: float) -> None:
        emb = embeddings_of(plan.ids, manifest.labels, centers) if sampler.needs_embeddings \
            else None  # fmt: skip
        planner.feedback(plan.ids, losses_of(plan.ids, progress), emb)

    starts, planned, busy, longest, last = [], 0, 0.0, 0.0, 0.0
    for epoch in range(epochs):
        t0 = time.perf_counter()
        planner.set_epoch(epoch)
        it = iter(planner)
        timed = not (warm and epoch == 0)
        numbers = batch_numbers(epoch, batches, n, batch_size, warm, policy)
        for k, plan in zip(numbers, it, strict=False):
            if k == 0:  # the epoch's start: lazily, with its first batch
                starts.append(time.perf_counter() - t0)
                if timed and window_at:  # on to the window's place, untimed
                    learn(plan, epoch)
                    for _ in range(int(window_at * len(planner)) - 1):
                        learn(next(it), epoch)
                    plan = next(it)
                t0 = time.perf_counter()
            else:
                planned += plan.ids.size if timed else 0
            learn(plan, epoch + k / batches)
            now = time.perf_counter()
            if k > 0:  # from the last batch's feedback to this one's
                longest = max(longest, now - last)
            last = now
        if timed:
            busy += time.perf_counter() - t0
        if to_end:  # the epoch's rest, untimed: its tail draws the next epoch's order
            for plan in it:
                learn(plan, epoch + 1)
        it.close()
    package_ms = 1e3 * float(np.mean(composed)) if composed else float("nan")
    return {
        "starts_s": starts,
        "planned": planned,
        "busy_s": busy,
        "package_ms": package_ms,
        "longest_s": longest,
        "full": fullness(policy),
        "held": traced(),  # while the control plane is alive
    }


#: the service's second epoch is also reported per this many batches (µs per sample, the
#: longest batch in ms): a start whose work is spread over the first batches shows there
BLOCK = 50


def run_service(mode: str, manifest, batches: int, batch_size: int, scored: bool,
                warm: bool = False, epochs: int = 2, stagger: float = 0.0) -> dict:  # fmt: skip
    from hotset.service.coordinator import JobCoordinator

    n = len(manifest)
    co = JobCoordinator(int(0.1 * manifest.total_bytes), max_samples=n, sampling=mode, seed=0)
    jobs = [co.register("job0", manifest.keys, manifest.sizes, batch_size)]
    for _ in range(int(stagger * n / batch_size)):  # the second job joins mid-epoch
        co.plan(jobs[0], 0)
    jobs.append(co.register("job1", manifest.keys, manifest.sizes, batch_size))
    starts, planned, busy, longest = [], 0, 0.0, 0.0
    blocks: list[tuple[float, float]] = []  # the second epoch's, per BLOCK batches
    for epoch in range(epochs):
        t0 = time.perf_counter()
        for j in jobs:  # the epoch's start, with the first batch
            co.plan(j, epoch)
        starts.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        timed = epoch == 0 if stagger else not (warm and epoch == 0)
        block = [0, 0.0, 0.0]  # samples, seconds, longest
        for k in batch_numbers(epoch, batches, n, batch_size, warm, co.policy):
            for j in jobs:
                last = time.perf_counter()
                size = co.plan(j, epoch)["gids"].size
                took = time.perf_counter() - last
                longest = max(longest, took)
                planned += size if timed else 0
                block = [block[0] + size, block[1] + took, max(block[2], took)]
            if epoch and (k + 1) % BLOCK == 0:
                blocks.append((1e6 * block[1] / max(1, block[0]), 1e3 * block[2]))
                block = [0, 0.0, 0.0]
        if timed:
            busy += time.perf_counter() - t0
    return {
        "blocks": blocks,
        "starts_s": starts,
        "planned": planned,
        "busy_s": busy,
        "package_ms": float("nan"),
        "longest_s": longest,
        "full": fullness(co.policy),
        "held": traced(),
    }


def one(system: str, n: int, batches: int, batch_size: int, memory: bool, scored: bool,
        warm: bool = False, epochs: int = 2, stagger: float = 0.0,
        window_at: float = 0.0, to_end: bool = False) -> dict:  # fmt: skip
    """One run; ``memory``: traced by ``tracemalloc`` (numpy reports its buffers too), which
    slows allocations, so the times come from a run without it."""
    make_manifest(10)  # imports are not the manifest's memory
    from hotset.systems import resolve_system

    policy = "refcnt" if system in SERVICE_SYSTEMS else resolve_system(system).policy
    compiled = compiled_bytes(policy) if memory else 0
    with tempfile.TemporaryDirectory() as tmp:
        columns = Path(tmp) / "columns"
        r = _one(system, n, batches, batch_size, memory, scored, warm, epochs, stagger,
                 window_at, to_end, columns)  # fmt: skip
    return {**r, "compiled_MB": compiled / 1e6} if memory else r


def compiled_bytes(policy: str) -> int:
    """The bytes that making a ``policy`` takes whatever the ids: importing numba and
    loading the compiled loops, for SHADE's, RefCnt's and iCACHE's caches (about 0 for
    the others); once per process, so measured here, before the run, not counted per id."""
    from hotset.policy.base import make_policy

    tracemalloc.start()
    make_policy(policy, 1 << 30, sizes=np.ones(2, np.int64))
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return held


def _one(system, n, batches, batch_size, memory, scored, warm, epochs, stagger, window_at,
         to_end, columns: Path):  # fmt: skip
    if memory:
        tracemalloc.start()
    manifest = mapped_manifest(n, columns)
    if memory:
        manifest_bytes = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
    args = (manifest, batches, batch_size, scored, warm, epochs)
    if system in SERVICE_SYSTEMS and (window_at or to_end):
        raise SystemExit(f"--window-at, --to-end: the planner's systems only, not {system}")
    if system in SERVICE_SYSTEMS:
        r = run_service(SERVICE_SYSTEMS[system], *args, stagger=stagger)
    elif stagger:
        raise SystemExit(f"--stagger: the service's systems only, not {system}")
    else:
        r = run_planner(system, *args, window_at=window_at, to_end=to_end)
    if memory:
        top = tracemalloc.get_traced_memory()[1]
        return {
            "manifest_B_per_id": manifest_bytes / n,
            "node_B_per_id": columns.stat().st_size / n,
            "state_B_per_id": (r["held"] - manifest_bytes) / n,
            "peak_B_per_id": (top - manifest_bytes) / n,
        }
    us = 1e6 * r["busy_s"] / max(1, r["planned"])
    return {
        "system": system,
        "ids": n,
        "epoch_start_ms": 1e3 * r["starts_s"][1],
        "later_start_ms": 1e3 * max(r["starts_s"][2:], default=float("nan")),
        "us_per_sample": us,
        "amortised_us": us + 1e6 * r["starts_s"][1] / n,
        "planned": r["planned"],
        "package_ms": r["package_ms"],
        "longest_batch_ms": 1e3 * r["longest_s"],
        "blocks": r.get("blocks", []),
        "cache_full": r["full"],
        # numpy's huge pages for large arrays (on by default): where their first touch is
        # slow (this VM), a process's first epoch of large new arrays pays for it
        "numpy_madvise_hugepage": os.environ.get("NUMPY_MADVISE_HUGEPAGE", "default"),
    }


def child(*args: str) -> dict | None:
    out = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True)
    if out.returncode:
        print(f"{' '.join(args)} failed:\n{out.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads(out.stdout.splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes", default="60000,1281167,10000000")
    ap.add_argument("--systems", default=",".join([*PLANNER_SYSTEMS, *SERVICE_SYSTEMS]))
    ap.add_argument("--batches", type=int, default=100)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--one", nargs=2, metavar=("SYSTEM", "IDS"), help=argparse.SUPPRESS)
    ap.add_argument("--memory", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--scored", action="store_true",
                    help="every id scored before the windows, as after a first epoch")  # fmt: skip
    ap.add_argument("--warm", action="store_true",
                    help="the first epoch fills the cache; the second's is timed")  # fmt: skip
    ap.add_argument("--stagger", type=float, default=0.0,
                    help="the service's second job joins after this share of the first's "
                         "first epoch, which alone is timed")  # fmt: skip
    ap.add_argument("--window-at", type=float, default=0.0,
                    help="the planner's systems: the timed windows start at this share of "
                         "their epoch (planned up to there untimed)")  # fmt: skip
    ap.add_argument("--epochs", type=int, default=2,
                    help="epochs run (3 or more: later_start_ms, the longest start after "
                         "the second epoch's)")  # fmt: skip
    ap.add_argument("--to-end", action="store_true",
                    help="the planner's systems: each epoch planned to its end after its "
                         "window, untimed (its tail draws the next epoch's order)")  # fmt: skip
    args = ap.parse_args()
    if args.epochs < 2:
        ap.error("--epochs must be >= 2 (the second epoch's start is the one reported)")
    sizes = ["--batches", str(args.batches), "--batch-size", str(args.batch_size)]
    sizes += ["--epochs", str(args.epochs)]
    sizes += ["--scored"] if args.scored else []
    sizes += ["--warm"] if args.warm else []
    sizes += ["--stagger", str(args.stagger)] if args.stagger else []
    sizes += ["--window-at", str(args.window_at)] if args.window_at else []
    sizes += ["--to-end"] if args.to_end else []
    if not 0.0 <= args.window_at < 1.0:
        ap.error("--window-at takes a share in [0, 1)")
    if not 0.0 <= args.stagger < 1.0 or (args.stagger and args.warm):
        ap.error("--stagger takes a share in [0, 1), and not with --warm")
    if args.one:
        r = one(args.one[0], int(args.one[1]), args.batches, args.batch_size, args.memory,
                args.scored, args.warm, args.epochs, args.stagger, args.window_at,
                args.to_end)  # fmt: skip
        print(json.dumps(r))
        return
    rows = []
    for n in (int(s) for s in args.sizes.split(",")):
        for system in args.systems.split(","):
            timed = child("--one", system, str(n), *sizes)
            traced = child("--one", system, str(n), "--memory", *sizes)
            if timed and traced:
                rows.append({**timed, **traced})
                print(f"  {system:8s} {n:>10,d} ids done", file=sys.stderr)
    report(
        "plan_scale",
        rows,
        [
            ("system", "s"),
            ("ids", ",d"),
            ("manifest_B_per_id", ".0f"),
            ("node_B_per_id", ".0f"),
            ("state_B_per_id", ".0f"),
            ("peak_B_per_id", ".0f"),
            ("compiled_MB", ".0f"),
            ("epoch_start_ms", ".1f"),
            ("later_start_ms", ".1f"),
            ("us_per_sample", ".2f"),
            ("amortised_us", ".2f"),
            ("package_ms", ".2f"),
            ("longest_batch_ms", ".1f"),
            ("cache_full", ".2f"),
        ],
        meta={"batches": args.batches, "batch_size": args.batch_size, "cache_fraction": 0.1,
              "scored": args.scored, "warm": args.warm, "epochs": args.epochs,
              "stagger": args.stagger, "window_at": args.window_at,
              "to_end": args.to_end},  # fmt: skip
    )


if __name__ == "__main__":
    main()
