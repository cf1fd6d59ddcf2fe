"""Sweeps of systems x cache fractions in the simulator, with a loss oracle: the table
and plot of SHADE's Figure 7 (hit ratio vs cache size per policy)."""

from __future__ import annotations

import posixpath
from pathlib import Path

import numpy as np

from hotset.errors import ConfigError
from hotset.plotting import pyplot
from hotset.sim.oracle import LossOracle
from hotset.sim.simulate import simulate
from hotset.storage import FileStorage
from hotset.systems import resolve_system

FIGURE7 = ("lru", "belady", "sh_pq", "sh_lru", "sh_lfu", "sh_rand", "sh_app", "shade")
SYSTEMS = (*FIGURE7, "icache", "spider")
FRACTIONS = (0.1, 0.25, 0.5, 0.75)


def sweep(
    oracle: LossOracle,
    systems=FIGURE7,
    fractions=FRACTIONS,
    epochs: int | None = None,
    batch_size: int = 128,
    seed: int = 0,
) -> list[dict]:
    """One simulated run per system and cache fraction over the oracle's dataset.

    Sample sizes come from the recorded dataset's manifest when it is at hand (iCACHE's
    packages are counted in bytes), else all samples count alike.
    """
    sizes = _dataset_sizes(oracle)
    rows = []
    for name in systems:
        system = resolve_system(name)
        for f in fractions:
            r = simulate(
                system.policy,
                oracle.num_samples,
                epochs or oracle.epochs,
                cache_fraction=f,
                sampler=system.sampler,
                batch_size=batch_size,
                seed=seed,
                sampler_options=system.sampler_options,
                oracle=oracle if system.sampler != "uniform" else None,
                sizes=sizes,
            )
            rows.append(
                {
                    "system": name,
                    "cache_fraction": f,
                    "hit_ratio": r["hit_ratio"],
                    "steady_hit_ratio": r["steady_hit_ratio"],
                    "substitute_hits": r["substitute_hits"],
                    "accesses": r["accesses"],
                    "accesses_per_s": r["accesses_per_s"],
                }
            )
    return rows


def _dataset_sizes(oracle: LossOracle) -> np.ndarray | None:
    data = oracle.meta.get("data")
    try:
        sizes = FileStorage(posixpath.join(data, "train")).sizes if data else None
    except ConfigError:
        return None
    return sizes if sizes is not None and sizes.size == oracle.num_samples else None


def format_sweep(rows: list[dict]) -> str:
    fractions = sorted({r["cache_fraction"] for r in rows})
    systems = list(dict.fromkeys(r["system"] for r in rows))
    by = {(r["system"], r["cache_fraction"]): r["hit_ratio"] for r in rows}
    head = f"{'system':<10}" + "".join(f"{f:>8.0%}" for f in fractions)
    lines = [head, "-" * len(head)]
    for s in systems:
        lines.append(f"{s:<10}" + "".join(f"{by[(s, f)]:>8.3f}" for f in fractions))
    return "\n".join(lines)


def plot_sweep(rows: list[dict], path: Path) -> None:
    plt = pyplot(path)
    if plt is None:
        return

    fractions = sorted({r["cache_fraction"] for r in rows})
    systems = list(dict.fromkeys(r["system"] for r in rows))
    by = {(r["system"], r["cache_fraction"]): r["hit_ratio"] for r in rows}
    x = np.arange(len(fractions))
    width = 0.8 / len(systems)
    fig, ax = plt.subplots(figsize=(10, 4))
    for k, s in enumerate(systems):
        ax.bar(x + k * width, [by[(s, f)] for f in fractions], width, label=s)
    ax.set_xticks(x + width * (len(systems) - 1) / 2, [f"{f:.0%}" for f in fractions])
    ax.set_xlabel("cache size (fraction of the working set)")
    ax.set_ylabel("read hit ratio")
    ax.set_title("Hit ratio by policy and cache size (simulated with a loss oracle)")
    ax.legend(ncol=4, fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
