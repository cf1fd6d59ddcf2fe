"""The `hotset` command: prepare, simulate, compare, record, sweep, simulate-jobs, serve."""

from __future__ import annotations

import argparse
import json
import logging
import os
import posixpath
import sys

import numpy as np

from hotset import __version__
from hotset.errors import ConfigError, HotsetError
from hotset.plotting import written
from hotset.service.modes import ALLOCATION, SAMPLING

DEFAULT_DATA = os.environ.get("HOTSET_DATA", "data/fashion-mnist")
#: an option left unset is not passed on: the function or constructor it feeds decides
DEFAULT = "default: the library's"
SHOWN = "(default: %(default)s)"  # argparse fills it in


def _given(args: argparse.Namespace, *names: str, **renamed: str) -> dict:
    """The options the user set, as keyword arguments (``renamed``: keyword=option)."""
    pairs = [(n, n) for n in names] + list(renamed.items())
    return {k: getattr(args, o) for k, o in pairs if getattr(args, o) is not None}


def _csv(cast):
    def parse(text: str):
        try:
            return [cast(t) for t in text.split(",") if t.strip()]
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from exc

    return parse


def _size(text: str) -> tuple[int, int]:
    size = _csv(int)(text)
    if len(size) != 2 or min(size) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give W,H (two positive ints)")
    return size[0], size[1]


def cmd_prepare(args: argparse.Namespace) -> None:
    from hotset.storage.open import open_storage
    from hotset.storage.prepare import prepare_fashion_mnist, prepare_imagefolder

    if args.kind == "fashion-mnist":
        if args.dir2 is not None:
            raise HotsetError("usage: hotset prepare fashion-mnist DIR")
        result = prepare_fashion_mnist(args.dir, **_given(args, "source", "limit", fmt="format"))
        out = args.dir
    else:
        if args.dir2 is None:
            raise HotsetError("usage: hotset prepare imagefolder SRC DIR")
        result = prepare_imagefolder(args.dir, args.dir2, **_given(args, "test_fraction"))
        out = args.dir2
    for split in result:
        s = open_storage(posixpath.join(out, split))
        print(
            f"{out}/{split}: {len(s)} samples ({type(s).__name__}), "
            f"{s.manifest.total_bytes / 1e6:.1f} MB, {len(s.classes)} classes"
        )


def cmd_simulate(args: argparse.Namespace) -> None:
    from hotset.sim import LossOracle, simulate, simulate_trace
    from hotset.systems import resolve_system

    oracle = LossOracle.load(args.oracle) if args.oracle else None
    if args.system:
        system = resolve_system(args.system)
        args.policy, args.sampler = system.policy, system.sampler
        sampler_options = system.sampler_options
    else:
        sampler_options = {}
    if args.policy is None:
        raise HotsetError("give --policy NAME (or --system NAME)")
    if args.dataset_size is None and oracle is not None:
        args.dataset_size = oracle.num_samples
    if args.trace:
        if args.capacity_items is None:
            raise HotsetError("--trace needs --capacity-items K")
        result = simulate_trace(
            np.load(args.trace), args.policy, args.capacity_items,
            **_given(args, "batch_size", "seed"),
        )  # fmt: skip
    else:
        if args.dataset_size is None:
            raise HotsetError("give --dataset-size N (or --trace FILE.npy)")
        result = simulate(
            args.policy,
            args.dataset_size,
            args.epochs,
            cache_fraction=args.cache_fraction,
            capacity_items=args.capacity_items if args.cache_fraction is None else None,
            sampler_options=sampler_options,
            oracle=oracle,
            **_given(args, "sampler", "batch_size", "seed"),
        )
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"{result['policy']}: {result['hits']}/{result['accesses']} hits "
            f"(hit ratio {result['hit_ratio']:.4f}), "
            f"{result['accesses_per_s'] / 1e6:.2f}M accesses/s"
        )


def cmd_compare(args: argparse.Namespace) -> None:
    from hotset.compare import CompareConfig, run_compare

    if args.jobs:
        from hotset.compare_jobs import JobsConfig, compare_jobs

        if args.size is not None:
            raise ConfigError("--size: --jobs runs its scenario's Fashion-MNIST images at 28x28")

        jobs = JobsConfig(
            data=args.data, jobs=args.jobs,
            **_given(args, "scenario", "samples", "epochs", "batch_size", "num_workers",
                     "latency_ms", "concurrency", "stagger_s", "probe_batches", "seed",
                     "device", "model", "modes"),
        )  # fmt: skip
        if args.cache_fractions is not None:
            jobs.cache_fraction = args.cache_fractions[0]
        doc = compare_jobs(jobs, out_dir=args.out)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(doc, f, indent=2)
        return
    cfg = CompareConfig(
        data=args.data,
        policies=args.policies,
        cache_fractions=args.cache_fractions or [0.1, 0.2],
        progress=not args.no_progress,
        sampler_options=parse_options(args.sampler_option, "--sampler-option"),
        policy_options=parse_options(args.policy_option, "--policy-option"),
        peers=args.peers, peer_python=args.peer_python,
        **_given(args, "epochs", "batch_size", "num_workers", "latency_ms", "bandwidth_mb_s",
                 "concurrency", "store", "seed", "device", "model", "size", "val_fraction",
                 "seeds", "target_accuracy"),
    )  # fmt: skip
    run_compare(cfg, out_dir=args.out, json_path=args.json, verbose=args.verbose)


def parse_options(items: list[str] | None, flag: str) -> dict:
    """``KEY=VALUE`` pairs as keyword arguments; a VALUE is read as JSON where it parses
    (``3``, ``0.5``, ``true``, ``[1, 2]``) or as Python's ``True``, ``False``, ``None``,
    else kept as a string."""
    python = {"True": True, "False": False, "None": None}
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.isidentifier():
            raise HotsetError(f"{flag} {item!r}: give KEY=VALUE")
        try:
            out[key] = python[value] if value in python else json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def cmd_record(args: argparse.Namespace) -> None:
    from hotset.compare import record_oracle

    oracle = record_oracle(
        args.data, args.epochs, args.out,
        **_given(args, "batch_size", "seed", "num_workers", "device", "model", "size",
                 "val_fraction", "embedding_dims"),
    )  # fmt: skip
    print(f"wrote {args.out}: losses of {oracle.num_samples} samples over {oracle.epochs} epochs")


def cmd_sweep(args: argparse.Namespace) -> None:
    from hotset.sim import LossOracle
    from hotset.sim.sweep import format_sweep, plot_sweep, sweep

    oracle = LossOracle.load(args.oracle)
    rows = sweep(
        oracle,
        **_given(args, "systems", "epochs", "batch_size", "seed", fractions="cache_fractions"),
    )
    _write_rows(rows, format_sweep, plot_sweep, args.out, "sweep")


def _write_rows(rows: list[dict], table, plot, out_dir: str, name: str) -> None:
    """Print ``table(rows)``, write OUT/NAME.json and plot OUT/NAME.png."""
    from pathlib import Path

    print(table(rows))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(rows, indent=2))
    plot(rows, out / f"{name}.png")
    print(f"wrote {written(out, name)}")


def cmd_simulate_jobs(args: argparse.Namespace) -> None:
    from hotset.sim.jobs import format_jobs_table, plot_jobs, sweep_jobs, table2_cases

    cases = table2_cases(**_given(args, "seed"))
    if args.cases:
        unknown = sorted(set(args.cases) - set(cases))
        if unknown:
            raise HotsetError(f"unknown case(s) {unknown}; choose from: {', '.join(cases)}")
        cases = {c: cases[c] for c in args.cases}
    speeds = None
    if args.speeds:
        speeds = {c: args.speeds for c, d in cases.items() if len(d) == len(args.speeds)}
    rows = sweep_jobs(
        cases, speeds=speeds, **_given(args, "samplers", "policies", "capacities", "seed")
    )
    _write_rows(rows, format_jobs_table, plot_jobs, args.out, "jobs")


def cmd_serve(args: argparse.Namespace) -> None:
    from hotset.service.server import serve

    serve(
        announce=True,
        **_given(args, "address", "capacity_bytes", "store_path", "max_samples", "policy",
                 "sampling", "lookahead", "job_timeout_s", "seed", "substitution",
                 "allocation", "probe_batches", "curve", "key_file", "metrics_port",
                 "disk_dir", "disk_bytes", "store_url"),
    )  # fmt: skip


def _model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", help="auto (default: cuda when available) | cpu | cuda")
    p.add_argument("--model", help="tiny (default) | resnet18 | your own as module:callable "
                   "(called with num_classes= and in_channels=, returns a torch Module)")
    p.add_argument("--size", type=_size, metavar="W,H",
                   help="resize images to W x H as they are decoded (default: as they are; "
                   "images of several sizes need it)")  # fmt: skip
    p.add_argument("--val-fraction", type=float,
                   help="training samples held out for decisions (default 1/12)")  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hotset", description=__doc__)
    p.add_argument("--version", action="version", version=f"hotset {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="info logs")
    sub = p.add_subparsers(dest="command", required=True)

    pr = sub.add_parser("prepare", help="write a dataset as one file per sample + manifest")
    pr.add_argument("kind", choices=["fashion-mnist", "imagefolder"], help="what to prepare")
    pr.add_argument("dir", help="output DIR (fashion-mnist) or SRC tree (imagefolder)")
    pr.add_argument("dir2", nargs="?", help="output DIR (imagefolder)")
    pr.add_argument("--source", help=f"the Debian package's files ({DEFAULT})")
    pr.add_argument("--limit", type=int, help="first N samples of each split")
    pr.add_argument("--test-fraction", type=float, help=DEFAULT)
    pr.add_argument(
        "--format",
        choices=["png", "npy", "files", "tar", "parquet"],
        help="fashion-mnist: one PNG (default; 'files') or one .npy array per sample, "
        "WebDataset tar shards, or Parquet",
    )
    pr.set_defaults(func=cmd_prepare)

    si = sub.add_parser("simulate", help="replay sampling and caching without bytes")
    si.add_argument("--policy", help="an eviction policy (lru, minio, belady, ...)")
    si.add_argument("--system", help="a named system (shade, sh_app, ...) instead of --policy")
    si.add_argument("--oracle", help="loss oracle FILE.npz from `hotset record`")
    si.add_argument("--sampler", help="uniform (default), shade, iis, spider")
    si.add_argument("--dataset-size", type=int, help="ids to simulate (default: the oracle's)")
    si.add_argument("--epochs", type=int, default=3, help=f"epochs to simulate {SHOWN}")
    si.add_argument("--cache-fraction", type=float, help="the cache as a share of the ids")
    si.add_argument("--capacity-items", type=int, help="the cache in items (equal sizes)")
    si.add_argument("--trace", help="FILE.npy of int ids (items of equal size)")
    si.add_argument("--batch-size", type=int, help=DEFAULT)
    si.add_argument("--seed", type=int, help=DEFAULT)
    si.add_argument("--json", action="store_true", help="print one JSON object")
    si.set_defaults(func=cmd_simulate)

    co = sub.add_parser("compare", help="train through hotset per system and cache size")
    co.add_argument("--data", default=DEFAULT_DATA,
                    help=f"a directory made by `hotset prepare` {SHOWN}")  # fmt: skip
    co.add_argument(
        "--systems", "--policies", dest="policies", type=_csv(str),
        default=["lru", "minio", "belady"],
        help="systems as make_loader(system=...) builds them: shade, icache, spider, or a "
        "policy under uniform shuffling (lru, minio, belady, ...); --policies: the old name "
        "(default: lru,minio,belady)",
    )  # fmt: skip
    co.add_argument("--cache-fractions", type=_csv(float), help="default: 0.1,0.2 (--jobs: 0.2)")
    co.add_argument("--epochs", type=int, help=DEFAULT)
    co.add_argument("--batch-size", type=int, help=DEFAULT)
    co.add_argument("--num-workers", type=int, help=DEFAULT)
    co.add_argument("--latency-ms", type=float, help="storage latency per read")
    co.add_argument("--bandwidth-mb-s", type=float, help="0: unlimited")
    co.add_argument("--concurrency", type=int, help="reads in flight on the storage")
    co.add_argument("--store", help="memory | shared (default) | redis://host:port/db")
    co.add_argument("--seed", type=int, help=DEFAULT)
    co.add_argument("--seeds", type=_csv(int),
                    help="runs per system (mean +- spread); default: --seed alone")  # fmt: skip
    co.add_argument("--target-accuracy", type=float,
                    help="time to this test accuracy (default: in-memory's final - 0.5 pt, "
                    "else the best run's)")  # fmt: skip
    _model_options(co)
    co.add_argument("--sampler-option", action="append", metavar="KEY=VALUE",
                    help="a sampler option (repeat), e.g. repetition=3")  # fmt: skip
    co.add_argument("--policy-option", action="append", metavar="KEY=VALUE",
                    help="a policy option (repeat), e.g. package_bytes=65536")  # fmt: skip
    co.add_argument(
        "--peers", type=_csv(str), default=[],
        help="loaders trained beside hotset's rows on the same data, model and link: "
        "streaming (MosaicML Streaming, tuned; needs --peer-python)",
    )  # fmt: skip
    co.add_argument(
        "--peer-python",
        help="a Python with mosaicml-streaming (default: $HOTSET_PEER_PYTHON, else "
        ".venv-peers/bin/python, which `make peers` builds)",
    )  # fmt: skip
    co.add_argument("--out", default="out",
                    help=f"directory for compare.json and compare.png {SHOWN}")  # fmt: skip
    co.add_argument("--json", help="also write the rows to this file")
    co.add_argument("--no-progress", action="store_true", help="a log line per epoch, no bars")
    co.add_argument("--verbose", "-v", action="store_true", default=argparse.SUPPRESS,
                    help="every counter in the table (and info logs)")  # fmt: skip
    co.add_argument(
        "--jobs",
        type=int,
        default=0,
        help="run N training jobs at once, through `hotset serve` and independently",
    )
    co.add_argument(
        "--scenario", help="with --jobs: same (default), staggered, speeds, overlap, benefit, iis"
    )
    co.add_argument(
        "--modes", type=_csv(str),
        help="--jobs: the ways to run the jobs, the baseline last (default: "
        "service,quiver,chunks,independent; benefit and iis: their own pair)",
    )  # fmt: skip
    co.add_argument("--samples", type=int, help="--jobs: the first N training samples (0: all)")
    co.add_argument(
        "--probe-batches",
        type=int,
        help="--jobs benefit|iis: minibatches timed without, then with, the cache",
    )
    co.add_argument("--stagger-s", type=float,
                    help="--jobs staggered: seconds between job starts")  # fmt: skip
    co.set_defaults(func=cmd_compare)

    rc = sub.add_parser("record", help="train uniformly and save every sample's loss per epoch")
    rc.add_argument("--data", default=DEFAULT_DATA, help=f"as `hotset compare`'s {SHOWN}")
    rc.add_argument("--epochs", type=int, default=3, help=f"epochs to record {SHOWN}")
    rc.add_argument("--out", default="out/oracle.npz", help=f"the oracle file {SHOWN}")
    rc.add_argument("--batch-size", type=int, help=DEFAULT)
    rc.add_argument("--num-workers", type=int, help=DEFAULT)
    rc.add_argument("--seed", type=int, help=DEFAULT)
    _model_options(rc)
    rc.add_argument("--embedding-dims", type=int,
                    help="keep a random projection of the embeddings to N dims")  # fmt: skip
    rc.set_defaults(func=cmd_record)

    sw = sub.add_parser("sweep", help="simulate systems x cache sizes with a loss oracle")
    sw.add_argument("--oracle", required=True, help="a loss oracle from `hotset record`")
    sw.add_argument("--systems", type=_csv(str), help="default: SHADE's Figure 7 and more")
    sw.add_argument("--cache-fractions", type=_csv(float), help=DEFAULT)
    sw.add_argument("--epochs", type=int, help="default: the oracle's")
    sw.add_argument("--batch-size", type=int, help=DEFAULT)
    sw.add_argument("--seed", type=int, help=DEFAULT)
    sw.add_argument("--out", default="out", help=f"directory for the table and plot {SHOWN}")
    sw.set_defaults(func=cmd_sweep)

    sj = sub.add_parser(
        "simulate-jobs", help="several jobs, one cache: JOADER's Table 2 cases, misses per size"
    )
    sj.add_argument("--cases", type=_csv(str), help="default: all of Table 2")
    sj.add_argument("--samplers", type=_csv(str), help="default: isa,dsa")
    sj.add_argument("--policies", type=_csv(str), help="default: lru,fifo,random,refcnt")
    sj.add_argument("--capacities", type=_csv(int), help=DEFAULT)
    sj.add_argument(
        "--speeds", type=_csv(float),
        help="rounds per round of the fastest job, one per job (cases with that many jobs)",
    )  # fmt: skip
    sj.add_argument("--seed", type=int, help=DEFAULT)
    sj.add_argument("--out", default="out/jobs", help=f"directory for the table and plot {SHOWN}")
    sj.set_defaults(func=cmd_simulate_jobs)

    sv = sub.add_parser("serve", help="the multi-job service: shared sampling and cache")
    sv.add_argument(
        "--address",
        help="ZeroMQ endpoint (default: ipc:// in a 0700 dir of "
        "yours, $XDG_RUNTIME_DIR/hotset or /tmp/hotset-UID)",
    )
    sv.add_argument("--capacity-bytes", type=int, help="default: 1 GiB")
    sv.add_argument("--store-path", help="LMDB dir on tmpfs (default: fresh)")
    sv.add_argument("--store-url", help="a redis://, unix:// or redis+cluster:// URL: the shared "
                    "store pooled across nodes, so a job's ranks may span them (default: "
                    "LMDB on this node's tmpfs)")
    sv.add_argument("--max-samples", type=int,
                    help="distinct samples, all jobs, at first (default 2^21; grows to fit)")
    sv.add_argument("--disk-dir", help="the node's disk tier (local NVMe), kept across runs; "
                    "its jobs read through it (default: $HOTSET_DISK_DIR, else none)")
    sv.add_argument("--disk-bytes", type=int,
                    help="the disk tier's budget (default: 3/4 of its free space)")
    sv.add_argument("--policy", help="refcnt (default), or pq under --sampling iis")
    sv.add_argument("--sampling", choices=list(SAMPLING), help="default: dsa")
    sv.add_argument(
        "--allocation",
        choices=list(ALLOCATION),
        help="shared (default); benefit: a partition per dataset sized by its benefit (Quiver)",
    )
    sv.add_argument("--probe-batches", type=int,
                    help="minibatches timed without, then with, the cache per epoch "
                    "(default 20 under --allocation benefit or --sampling iis)")  # fmt: skip
    sv.add_argument("--substitution", type=int,
                    help="quiver: batches of candidates looked up per batch")  # fmt: skip
    sv.add_argument("--lookahead", type=int, help="batches a slow job keeps queued")
    sv.add_argument("--job-timeout-s", type=float, help=DEFAULT)
    sv.add_argument("--seed", type=int, help=DEFAULT)
    sv.add_argument(
        "--curve",
        action=argparse.BooleanOptionalAction,
        help="ZeroMQ CURVE authentication (default: on for tcp://, off for ipc://)",
    )
    sv.add_argument("--key-file", help="CURVE keys, mode 0600 (default: in the private dir, "
                    "per port; clients read it: give it to jobs on other nodes)")  # fmt: skip
    sv.add_argument("--metrics-port", type=int,
                    help="Prometheus figures per job at http://127.0.0.1:PORT/metrics")  # fmt: skip
    sv.set_defaults(func=cmd_serve)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="hotset: %(levelname)s: %(message)s",
    )
    try:
        args.func(args)
    except HotsetError as exc:
        print(f"hotset: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
