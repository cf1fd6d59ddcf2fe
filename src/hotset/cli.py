"""The `hotset` command: prepare, simulate, compare."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

import numpy as np

from hotset.errors import HotsetError

DEFAULT_DATA = os.environ.get("HOTSET_DATA", "data/fashion-mnist")


def _csv(cast):
    def parse(text: str):
        try:
            return [cast(t) for t in text.split(",") if t.strip()]
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from exc

    return parse


def cmd_prepare(args: argparse.Namespace) -> None:
    from hotset.storage.prepare import prepare_fashion_mnist, prepare_imagefolder

    if args.kind == "fashion-mnist":
        if args.dir2 is not None:
            raise HotsetError("usage: hotset prepare fashion-mnist DIR")
        result = prepare_fashion_mnist(
            args.dir, source=args.source, limit=args.limit, fmt=args.format
        )
        out = args.dir
    else:
        if args.dir2 is None:
            raise HotsetError("usage: hotset prepare imagefolder SRC DIR")
        result = prepare_imagefolder(args.dir, args.dir2, test_fraction=args.test_fraction)
        out = args.dir2
    for split, m in result.items():
        print(
            f"{out}/{split}: {len(m)} samples, {m.total_bytes / 1e6:.1f} MB, "
            f"{len(m.classes)} classes"
        )


def cmd_simulate(args: argparse.Namespace) -> None:
    from hotset.sim import simulate, simulate_trace

    if args.trace:
        if args.capacity_items is None:
            raise HotsetError("--trace needs --capacity-items K")
        result = simulate_trace(
            np.load(args.trace),
            args.policy,
            args.capacity_items,
            batch_size=args.batch_size,
            seed=args.seed,
        )
    else:
        if args.dataset_size is None:
            raise HotsetError("give --dataset-size N (or --trace FILE.npy)")
        result = simulate(
            args.policy,
            args.dataset_size,
            args.epochs,
            cache_fraction=args.cache_fraction,
            capacity_items=args.capacity_items if args.cache_fraction is None else None,
            sampler=args.sampler,
            batch_size=args.batch_size,
            seed=args.seed,
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

    cfg = CompareConfig(
        data=args.data,
        policies=args.policies,
        cache_fractions=args.cache_fractions,
        epochs=args.epochs,
        batch_size=args.batch_size,
        num_workers=args.num_workers,
        latency_ms=args.latency_ms,
        bandwidth_mb_s=args.bandwidth_mb_s,
        concurrency=args.concurrency,
        store=args.store,
        seed=args.seed,
        progress=not args.no_progress,
    )
    run_compare(cfg, out_dir=args.out, json_path=args.json)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hotset", description=__doc__)
    p.add_argument("-v", "--verbose", action="store_true")
    sub = p.add_subparsers(dest="command", required=True)

    pr = sub.add_parser("prepare", help="write a dataset as one file per sample + manifest")
    pr.add_argument("kind", choices=["fashion-mnist", "imagefolder"])
    pr.add_argument("dir", help="output DIR (fashion-mnist) or SRC tree (imagefolder)")
    pr.add_argument("dir2", nargs="?", help="output DIR (imagefolder)")
    pr.add_argument("--source", default="/usr/share/datasets/fashion-mnist")
    pr.add_argument("--limit", type=int, default=None, help="first N samples of each split")
    pr.add_argument("--test-fraction", type=float, default=0.1)
    pr.add_argument(
        "--format",
        choices=["png", "npy"],
        default="png",
        help="fashion-mnist: one PNG or one .npy array per sample",
    )
    pr.set_defaults(func=cmd_prepare)

    si = sub.add_parser("simulate", help="replay sampling and caching without bytes")
    si.add_argument("--policy", required=True)
    si.add_argument("--sampler", default="uniform")
    si.add_argument("--dataset-size", type=int)
    si.add_argument("--epochs", type=int, default=3)
    si.add_argument("--cache-fraction", type=float)
    si.add_argument("--capacity-items", type=int)
    si.add_argument("--trace", help="FILE.npy of int ids (items of equal size)")
    si.add_argument("--batch-size", type=int, default=256)
    si.add_argument("--seed", type=int, default=0)
    si.add_argument("--json", action="store_true", help="print one JSON object")
    si.set_defaults(func=cmd_simulate)

    co = sub.add_parser("compare", help="train through hotset per policy and cache size")
    co.add_argument("--data", default=DEFAULT_DATA, help="a directory made by `hotset prepare`")
    co.add_argument("--policies", type=_csv(str), default=["lru", "minio", "belady"])
    co.add_argument("--cache-fractions", type=_csv(float), default=[0.1, 0.2])
    co.add_argument("--epochs", type=int, default=3)
    co.add_argument("--batch-size", type=int, default=128)
    co.add_argument("--num-workers", type=int, default=2)
    co.add_argument("--latency-ms", type=float, default=2.0)
    co.add_argument("--bandwidth-mb-s", type=float, default=0.0, help="0: unlimited")
    co.add_argument("--concurrency", type=int, default=4, help="reads in flight on the storage")
    co.add_argument("--store", default="shared", help="memory | shared | redis://host:port/db")
    co.add_argument("--seed", type=int, default=0)
    co.add_argument("--out", default="out", help="directory for compare.json and compare.png")
    co.add_argument("--json", help="also write the rows to this file")
    co.add_argument("--no-progress", action="store_true")
    co.set_defaults(func=cmd_compare)
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
