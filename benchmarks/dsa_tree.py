"""Dependent sampling tree operations at ImageNet scale (JOADER appendix A.4).

Jobs on random datasets of 1-2M elements of a 2M-element universe are inserted one by
one, sampled round by round, then deleted. The paper's figures, per operation: insertion
of a dataset 0.57 s, sampling 54 us per element, deletion 1.05 us.

    python benchmarks/dsa_tree.py [--jobs 4,8] [--universe 2000000] [--rounds 2000]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

from _report import report  # noqa: E402
from hotset.sampling.dsa import DependentSampling  # noqa: E402

PAPER = {"insert_s": 0.57, "sample_us_per_element": 54.0, "delete_s": 1.05e-6}


def run(jobs: int, universe: int, rounds: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1_000_000, 2_000_001, jobs)
    datasets = [rng.permutation(universe)[:s] for s in sizes]
    dsa = DependentSampling(universe, seed=seed)
    insert = []
    for j, d in enumerate(datasets):
        t = time.perf_counter()
        dsa.add_job(j, d)
        insert.append(time.perf_counter() - t)
    picks = 0
    t = time.perf_counter()
    for _ in range(rounds):
        picks += len(dsa.round())
    sample_s = time.perf_counter() - t
    delete = []
    for j in range(jobs):
        t = time.perf_counter()
        dsa.remove_job(j)
        delete.append(time.perf_counter() - t)
    return {
        "jobs": jobs,
        "buckets": len(dsa.buckets),
        "dataset_elements": int(sizes.mean()),
        "insert_s": float(np.mean(insert)),
        "sample_us_per_element": 1e6 * sample_s / max(1, picks),
        "delete_s": float(np.mean(delete)),
        "delete_us_per_element": 1e6 * float(np.sum(delete)) / float(sizes.sum()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", default="4,8")
    ap.add_argument("--universe", type=int, default=2_000_000)
    ap.add_argument("--rounds", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rows = [run(int(n), args.universe, args.rounds, args.seed) for n in args.jobs.split(",")]
    report(
        "dsa_tree",
        rows,
        [
            ("jobs", "d"),
            ("dataset_elements", "d"),
            ("insert_s", ".3f"),
            ("sample_us_per_element", ".2f"),
            ("delete_s", ".3f"),
            ("delete_us_per_element", ".4f"),
        ],
        meta={"paper": PAPER, "universe": args.universe, "rounds": args.rounds},
    )


if __name__ == "__main__":
    main()
