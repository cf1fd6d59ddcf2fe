"""Registration of jobs with the service at scale (issue 26: 14M ids in <= 5 s).

A first job brings ``N`` new keys (random 16-byte digests, as content hashes are); a
second job on the same samples then registers with its keys in the same order, shuffled,
or half of them shuffled: every key is looked up in the service's key index. A third
job then brings the second's keys again (a sweep's next run): the index is the same, and
so is what its first look-up built. Times ``JobCoordinator.register``, in-process (no
message decoding).

    python benchmarks/registration.py --sizes 1281167,14000000
"""

from __future__ import annotations

import argparse
import gc
import time

import numpy as np

from _report import report
from hotset.service.coordinator import JobCoordinator
from hotset.storage.columns import DigestColumn

CASES = ("same order", "shuffled", "half shuffled")


def second_keys(case: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """The second job's samples, as positions among the first job's."""
    if case == "same order":
        return np.arange(n)
    perm = rng.permutation(n)
    return perm if case == "shuffled" else perm[: n // 2]


def measure(n: int, sampling: str, case: str) -> dict:
    rng = np.random.default_rng(n)
    raw = rng.integers(0, 256, (n, 16), dtype=np.uint8)
    sizes = rng.integers(60_000, 180_000, n)
    take = second_keys(case, n, rng)
    first, second, third = (DigestColumn.of_raw(r) for r in (raw, raw[take], raw[take]))
    co = JobCoordinator(int(sizes.sum()) // 10, max_samples=n, sampling=sampling, seed=0)
    t0 = time.perf_counter()
    co.register("first", first, sizes, 256)
    t1 = time.perf_counter()
    co.register("second", second, sizes[take], 256)
    t2 = time.perf_counter()
    co.register("third", third, sizes[take], 256)
    t3 = time.perf_counter()
    assert len(co.keys) == n  # every key of the later jobs was found
    return {"ids": n, "sampling": sampling, "second job": case,
            "first_s": t1 - t0, "second_s": t2 - t1, "third_s": t3 - t2}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes", default="1281167,14000000")
    ap.add_argument("--sampling", default="dsa,quiver")
    ap.add_argument("--cases", default=",".join(CASES))
    args = ap.parse_args()
    rows = []
    for n in (int(s) for s in args.sizes.split(",")):
        for sampling in args.sampling.split(","):
            for case in args.cases.split(","):
                rows.append(measure(n, sampling, case))
                gc.collect()
    report(
        "registration",
        rows,
        [
            ("ids", ",d"),
            ("sampling", "s"),
            ("second job", "s"),
            ("first_s", ".2f"),
            ("second_s", ".2f"),
            ("third_s", ".2f"),
        ],  # fmt: skip
    )


if __name__ == "__main__":
    main()
