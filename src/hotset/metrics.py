"""Counters where users already look: TensorBoard (:func:`log_to`) and Prometheus
(:func:`serve_prometheus`, ``pip install prometheus_client``).

The figures are the loader's counters (``HotsetLoader.counters()``) that users watch:
hit ratio, hits and misses, storage reads and bytes, late misses, store failures,
planning and storage-wait seconds. For ``hotset serve`` (``--metrics-port``) the
service's own: per job (reads, hits, epoch) and in all (cached samples and bytes,
planning seconds).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from numbers import Real
from typing import Any

#: the loader's counters exported (where the loader has them)
WATCHED = (
    "hits", "misses", "exact_hits", "substitute_hits", "late_misses", "storage_reads",
    "storage_bytes", "store_failures", "corrupt_hits", "skipped", "planning_s",
    "storage_wait_s", "accesses",
)  # fmt: skip


def scalars(counters: dict) -> dict[str, float]:
    """The watched counters as numbers, with ``hit_ratio`` (hits over accesses)."""
    out = {k: float(counters[k]) for k in WATCHED if isinstance(counters.get(k), Real)}
    served = counters.get("accesses") or (counters.get("hits", 0) + counters.get("misses", 0))
    out["hit_ratio"] = counters.get("hits", 0) / served if served else 0.0
    return out


def log_to(writer: Any, counters: dict, step: int, prefix: str = "hotset/") -> None:
    """Write the watched counters to a TensorBoard ``SummaryWriter`` (anything with
    ``add_scalar(tag, value, step)``) at ``step``."""
    for k, v in scalars(counters).items():
        writer.add_scalar(prefix + k, v, step)


class _Collector:
    """A Prometheus collector that reads the figures at each scrape."""

    def __init__(self, read: Callable[[], dict[str, dict[str, float]]], prefix: str) -> None:
        self.read = read
        self.prefix = prefix

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        families: dict[str, GaugeMetricFamily] = {}
        for job, figures in self.read().items():
            for k, v in figures.items():
                if k not in families:
                    families[k] = GaugeMetricFamily(
                        f"{self.prefix}{k}", f"hotset {k.replace('_', ' ')}", labels=["job"]
                    )
                families[k].add_metric([job], float(v))
        yield from families.values()


def serve_prometheus(
    source: Any, port: int, addr: str = "127.0.0.1", prefix: str = "hotset_", job: str = "train"
) -> Any:
    """Serve figures at ``http://addr:port/metrics`` in a registry of their own; returns
    the HTTP server (``.shutdown()`` to stop). ``source``: a loader (its watched counters,
    labelled ``job``), or a function returning ``{job: {name: value}}`` read at each
    scrape (several loaders, the service's figures)."""
    if hasattr(source, "counters"):
        loader = source

        def read() -> dict[str, dict[str, float]]:
            return {job: scalars(loader.counters())}

    elif callable(source):
        read = source
    else:
        raise TypeError(
            f"serve_prometheus takes a loader or a function returning {{job: {{name: value}}}}, "
            f"not a {type(source).__qualname__}"
        )
    try:
        from prometheus_client import CollectorRegistry, start_http_server
    except ImportError as exc:  # an extra: say which
        raise ImportError("Prometheus export needs `pip install prometheus_client`") from exc
    registry = CollectorRegistry()
    registry.register(_Collector(read, prefix))
    server, _ = start_http_server(port, addr=addr, registry=registry)
    return server


def service_figures(stats: dict) -> dict[str, dict[str, float]]:
    """The service's stats as figures per job (by name) and in all (``"all"``)."""
    out = {}
    for job in stats["jobs"].values():
        served, hits = job["reads"], job["hits"]  # samples planned, and hits among them
        out[job["name"]] = {"accesses": served, "hits": hits, "epoch": job["epoch"],
                            "hit_ratio": hits / served if served else 0.0}  # fmt: skip
    out["all"] = {k: float(stats[k]) for k in ("cached", "cached_bytes", "planning_s",
                                               "registered_samples", "phantoms")}  # fmt: skip
    out["all"]["jobs"] = float(len(stats["jobs"]))
    return out
