"""Several jobs, one cache, no bytes: JOADER's appendix A.2 (Table 2) replayed.

Each case is a list of datasets (id sets of one universe). The jobs sample one element
each per round, with independent shuffles (ISA, PyTorch's default) or with dependent
sampling (DSA); the rounds' reads go, in order, through one shared cache policy. A miss
is a read the cache could not serve: the minimum is ``|D_1 u ... u D_n|`` (each element
read from storage once), the maximum ``|D_1| + ... + |D_n|``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from hotset.errors import ConfigError
from hotset.plotting import pyplot
from hotset.policy.base import make_policy
from hotset.sampling.dsa import DependentSampling

SAMPLERS = ("isa", "dsa")


def _sample(n: int, size: int, seed: int) -> np.ndarray:
    return np.sort(np.random.default_rng(seed).choice(n, size, replace=False))


def table2_cases(seed: int = 0) -> dict[str, list[np.ndarray]]:
    """The datasets of JOADER's Table 2 (``[a, b]`` read as the ids a .. b - 1):
    ``overlap-K``, two jobs of 10,000 sharing K%; ``overlap-random-x4``, four random
    10,000-subsets of 13,333; ``size-K``, 10,000 and its first K%; ``size-x4``, four
    nested prefixes of 100/75/50/25%."""
    r = np.arange
    cases = {
        f"overlap-{100 - k}": [r(10_000), r(k * 100, 10_000 + k * 100)] for k in (0, 25, 50, 75)
    }
    cases["overlap-random-x4"] = [_sample(13_333, 10_000, seed + k) for k in range(4)]
    for k in (75, 50, 25):
        cases[f"size-{k}"] = [r(10_000), r(k * 100)]
    cases["size-x4"] = [r(10_000), r(7_500), r(5_000), r(2_500)]
    return cases


def _participates(round_no: int, speed: float) -> bool:
    """Whether a job running at ``speed`` (rounds per round of the fastest) reads now."""
    return int((round_no + 1) * speed) > int(round_no * speed)


def access_sequence(
    datasets: Sequence[np.ndarray],
    sampler: str,
    seed: int = 0,
    speeds: Sequence[float] | None = None,
) -> np.ndarray:
    """Every job reads its dataset once; returns the reads in order, round by round."""
    if sampler not in SAMPLERS:
        raise ConfigError(f"sampler must be one of {SAMPLERS}, got {sampler!r}")
    speeds = [1.0] * len(datasets) if speeds is None else list(speeds)
    if len(speeds) != len(datasets) or not all(0 < s <= 1 for s in speeds):
        raise ConfigError("speeds: one per job, each in (0, 1]")
    jobs = range(len(datasets))
    out: list[int] = []
    if sampler == "isa":
        rng = np.random.default_rng(seed)
        orders = [rng.permutation(d).tolist() for d in datasets]
        done = [0] * len(datasets)
        r = 0
        while any(done[j] < len(orders[j]) for j in jobs):
            for j in jobs:
                if done[j] < len(orders[j]) and _participates(r, speeds[j]):
                    out.append(orders[j][done[j]])
                    done[j] += 1
            r += 1
        return np.array(out, np.int64)
    dsa = DependentSampling(int(max(d.max() for d in datasets)) + 1, seed=seed)
    for j in jobs:
        dsa.add_job(j, datasets[j])
    r = 0
    while any(dsa.left.values()):
        picks = dsa.round([j for j in jobs if _participates(r, speeds[j])])
        out.extend(picks[j] for j in jobs if j in picks)  # each job reads its pick
        r += 1
    return np.array(out, np.int64)


def replay(
    datasets: Sequence[np.ndarray],
    sequence: np.ndarray,
    policy: str,
    capacity_items: int,
    seed: int = 0,
) -> int:
    """Misses of ``policy`` with room for ``capacity_items`` elements on ``sequence``."""
    universe = int(max(d.max() for d in datasets)) + 1
    p = make_policy(policy, capacity_items, num_samples=universe, seed=seed)
    for d in datasets:  # every job will read each of its elements (RefCnt counts them)
        p.add_references(d)
    hits = sum(
        int(p.access(sequence[lo : lo + 256]).hits.sum()) for lo in range(0, sequence.size, 256)
    )
    return int(sequence.size) - hits


def sweep_jobs(
    cases: dict[str, list[np.ndarray]] | None = None,
    samplers: Sequence[str] = SAMPLERS,
    policies: Sequence[str] = ("lru", "fifo", "random", "refcnt"),
    capacities: Sequence[int] = (1, 1000, 2500, 5000, 7500, 10_000, 12_500),
    seed: int = 0,
    speeds: dict[str, Sequence[float]] | None = None,
) -> list[dict]:
    """Misses per case x sampler x policy x cache size (one row each)."""
    cases = table2_cases(seed) if cases is None else cases
    rows = []
    for case, datasets in cases.items():
        union = int(np.unique(np.concatenate(datasets)).size)
        total = int(sum(d.size for d in datasets))
        for sampler in samplers:
            t0 = time.perf_counter()
            seq = access_sequence(datasets, sampler, seed, (speeds or {}).get(case))
            sample_s = time.perf_counter() - t0
            for policy in policies:
                for cap in capacities:
                    rows.append(
                        {
                            "case": case,
                            "jobs": len(datasets),
                            "sampler": sampler,
                            "policy": policy,
                            "capacity_items": int(cap),
                            "misses": replay(datasets, seq, policy, cap, seed),
                            "min_misses": union,
                            "max_misses": total,
                            "sampling_us_per_read": 1e6 * sample_s / max(1, seq.size),
                        }
                    )
    return rows


def format_jobs_table(rows: list[dict]) -> str:
    caps = sorted({r["capacity_items"] for r in rows})
    head = f"{'case':<18} {'sampler':<7} {'policy':<7} {'min':>6} {'max':>6} " + " ".join(
        f"{c:>7}" for c in caps
    )
    lines = [head, "-" * len(head)]
    keys = dict.fromkeys((r["case"], r["sampler"], r["policy"]) for r in rows)
    for case, sampler, policy in keys:
        sel = {
            r["capacity_items"]: r
            for r in rows
            if (r["case"], r["sampler"], r["policy"]) == (case, sampler, policy)
        }
        lo, hi = next(iter(sel.values()))["min_misses"], next(iter(sel.values()))["max_misses"]
        lines.append(
            f"{case:<18} {sampler:<7} {policy:<7} {lo:>6} {hi:>6} "
            + " ".join(f"{sel[c]['misses']:>7}" if c in sel else " " * 7 for c in caps)
        )
    return "\n".join(lines)


def plot_jobs(rows: list[dict], path) -> None:
    """Misses vs cache size, one panel per case, one line per sampler + policy."""
    plt = pyplot(path)
    if plt is None:
        return

    cases = list(dict.fromkeys(r["case"] for r in rows))
    cols = min(5, len(cases))
    nrows = -(-len(cases) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(3.6 * cols, 3.0 * nrows), squeeze=False)
    for ax, case in zip(axes.flat, cases, strict=False):
        sel = [r for r in rows if r["case"] == case]
        for sampler, policy in dict.fromkeys((r["sampler"], r["policy"]) for r in sel):
            pts = sorted(
                (r["capacity_items"], r["misses"])
                for r in sel
                if (r["sampler"], r["policy"]) == (sampler, policy)
            )
            style = "-" if sampler == "dsa" else ":"
            ax.plot(*zip(*pts, strict=True), style, marker=".", label=f"{sampler}+{policy}")
        ax.axhline(sel[0]["min_misses"], color="grey", lw=0.8)
        ax.set_title(case, fontsize=9)
        ax.set_xlabel("cache size (elements)", fontsize=8)
        ax.set_ylabel("misses", fontsize=8)
    for ax in list(axes.flat)[len(cases) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
