"""RefCnt's cost per access as the cache grows (issue 14: the whole-cache scan cost 57 us
per access at 2k cached and 7.2 ms at 200k). Residents sit in a keyed heap now, so the
cost should stay flat. Two cases per size: every miss is admitted (the newcomer has as
many references as the resident with the fewest: it evicts it) and none is (every
resident outranks it: the top is looked at and kept).

    python benchmarks/refcnt_eviction.py [--sizes 2000,20000,200000]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import report  # noqa: E402
from hotset.policy import make_policy  # noqa: E402


def per_access_us(cached: int, newcomer_wins: bool, accesses: int = 50_000) -> float:
    n = 4 * cached
    p = make_policy("refcnt", cached, sizes=np.ones(n, np.int64))
    p.add_references(np.arange(n), 4)
    if not newcomer_wins:
        p.add_references(np.arange(cached), 2)  # the residents are read more often
    p.access(np.arange(cached))  # fill
    ids = np.random.default_rng(0).integers(cached, n, accesses)
    start = time.perf_counter()
    for b in range(0, ids.size, 256):
        p.access(ids[b : b + 256])
    assert p.used <= p.capacity_bytes
    return 1e6 * (time.perf_counter() - start) / ids.size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="2000,20000,200000")
    args = ap.parse_args()
    rows = [
        {"cached": int(c), "evicts_us": per_access_us(int(c), True),
         "keeps_us": per_access_us(int(c), False)}
        for c in args.sizes.split(",")
    ]  # fmt: skip
    report("refcnt_eviction", rows, [("cached", "d"), ("evicts_us", ".2f"), ("keeps_us", ".2f")])


if __name__ == "__main__":
    main()
