"""What moves each importance system's result: its two most telling knobs swept in the
simulator, replaying a recorded loss oracle (losses and embeddings per epoch), at one
cache size. Per run: the steady hit ratio (epochs 2 on), the share of hits served by a
substitute, the share of samples trained per epoch (the mean after epoch 0, and the
lowest), and what the coverage floor did.

* SHADE: the repetition ``r`` x the order of the list (the prototype's hits first, or
  shuffled), with ``shade+``'s floor (K = 4); and ``r = 3`` with other floors
  (``K=None``: none, the paper's ``shade``).
* iCACHE: the H-list's size (fit to the cache, the paper's reading, or the prototype's
  fixed shares) x the package size in samples.
* SpiderCache: how the edge threshold is set (the default: normalised embeddings and a
  fixed threshold; the calibrated quantile, ours; the raw absolute Eq. 1) x ``k``.

    python benchmarks/sensitivity.py [--oracle data/oracles/resnet18_gpu.npz | synthetic]
        [--samples 20000] [--epochs 8] [--cache-fraction 0.2] [--systems shade,icache,spider]

An oracle with fewer epochs than ``--epochs`` replays its last epoch's losses after it.
Record one with ``hotset record`` (``--epochs 10 --embedding-dims 64``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

from _report import report  # noqa: E402
from hotset.sim.oracle import LossOracle  # noqa: E402
from hotset.sim.simulate import simulate  # noqa: E402
from hotset.systems import resolve_system  # noqa: E402

SHADE = [  # with the floor of shade+ (K = 4); the last row, K = None, is the paper's
    (f"r={r} {order}, floor K=4", {"repetition": float(r), "order": order, "coverage_epochs": 4},
     {})
    for r in (1, 3, 6)
    for order in ("hits_first", "shuffled")
] + [
    (f"r=3 hits_first, floor K={k}", {"repetition": 3.0, "coverage_epochs": k}, {})
    for k in (2, 8, 16, None)
]
ICACHE = [
    (f"H-list {h_name}, packages of {p} samples", {"h_fraction": h}, {"package_bytes": p})
    for h_name, h in (("fit to cache", None), ("0.7", 0.7), ("0.4", 0.4), ("0.2", 0.2))
    for p in (64, 512)
]
SPIDER = [
    (f"{mode}, k={k}", {**options, "k": k}, {})
    for mode, options in (
        ("normalised (default)", {}),
        ("quantile 0.5 (ours)", {"calibrate": True, "normalize": False}),
        ("raw absolute", {"normalize": False}),
    )
    for k in (32, 500)
]
KNOBS = {"shade": SHADE, "icache": ICACHE, "spider": SPIDER}


def subset(oracle: LossOracle, n: int) -> LossOracle:
    if n >= oracle.num_samples:
        return oracle
    emb = None if oracle.embeddings is None else oracle.embeddings[:, :n]
    labels = None if oracle.labels is None else oracle.labels[:n]
    return LossOracle(oracle.losses[:, :n], oracle.meta, embeddings=emb, labels=labels)


def synthetic(n: int, epochs: int) -> LossOracle:
    """Losses without a model: each sample's a gamma(0.5) draw (a few hard samples, most
    easy), times log-normal noise each epoch, shrinking by 0.8 an epoch (no embeddings)."""
    rng = np.random.default_rng(0)
    base = rng.gamma(0.5, size=n)
    return LossOracle(np.stack([base * rng.lognormal(0, 0.3, n) * 0.8**e for e in range(epochs)]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--oracle", default="data/oracles/resnet18_gpu.npz",
                    help="a recorded oracle, or 'synthetic' (losses only: SHADE, iCACHE)")
    ap.add_argument("--samples", type=int, default=20_000)
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--cache-fraction", type=float, default=0.2)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--systems", default="shade,icache,spider")
    ap.add_argument("--name", default="sensitivity")
    args = ap.parse_args()
    if args.oracle == "synthetic":
        oracle = synthetic(args.samples, args.epochs)
    elif not Path(args.oracle).exists():
        sys.exit(
            f"no oracle at {args.oracle}: record one with `hotset record --epochs 10 "
            f"--embedding-dims 64 --out {args.oracle}`, or give --oracle synthetic"
        )
    else:
        oracle = subset(LossOracle.load(args.oracle), args.samples)
    n = oracle.num_samples
    rows = []
    for name in args.systems.split(","):
        system = resolve_system(name)
        for label, sampler_options, policy_options in KNOBS[name]:
            start = time.perf_counter()
            r = simulate(
                system.policy, n, args.epochs, cache_fraction=args.cache_fraction,
                sampler=system.sampler, batch_size=args.batch_size, oracle=oracle,
                sampler_options={**system.sampler_options, **sampler_options},
                policy_options=policy_options,
            )  # fmt: skip
            trained = r["trained_share_per_epoch"][1:]
            c = r["sampler_counters"]
            rows.append({
                "system": name, "setting": label,
                "steady_hit": r["steady_hit_ratio"],
                "substituted": r["substitute_hits"] / max(1, r["hits"]),
                "trained_mean": float(np.mean(trained)), "trained_min": float(np.min(trained)),
                "oldest_untrained": c.get("oldest_untrained_epochs", 0),
                "floor_added": c.get("coverage_added", 0),
                "mean_degree": c.get("graph_mean_degree", float("nan")),
                "seconds": time.perf_counter() - start,
            })  # fmt: skip
            print(f"{name:7s} {label:34s} hit {r['steady_hit_ratio']:.3f}", flush=True)
    report(
        args.name, rows,
        [("system", "s"), ("setting", "s"), ("steady_hit", ".3f"), ("substituted", ".3f"),
         ("trained_mean", ".3f"), ("trained_min", ".3f"), ("oldest_untrained", "d"),
         ("floor_added", "d"), ("mean_degree", ".1f"), ("seconds", ".0f")],
        {"oracle": args.oracle, "samples": n, "epochs": args.epochs,
         "cache_fraction": args.cache_fraction, "batch_size": args.batch_size},
    )  # fmt: skip


if __name__ == "__main__":
    main()
