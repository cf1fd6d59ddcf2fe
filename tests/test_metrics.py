"""Counters where users look: a real TensorBoard event file read back, a real Prometheus
endpoint scraped over HTTP, for a loader and for `hotset serve`."""

from __future__ import annotations

import re
import socket
import time
import urllib.request
from pathlib import Path

import pytest

import hotset
from hotset.metrics import scalars, serve_prometheus
from hotset.service.server import start_service
from hotset.storage import FileStorage


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int, timeout: float = 20.0) -> dict[tuple[str, str], float]:
    """``{(metric, job): value}`` from http://127.0.0.1:PORT/metrics."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    out = {}
    for m in re.finditer(r'^(\w+)\{job="([^"]*)"\} (\S+)$', text.decode(), flags=re.M):
        out[(m[1], m[2])] = float(m[3])
    return out


def trained_loader(fmnist_dir, epochs: int, each_epoch=None):
    loader = hotset.make_loader(str(fmnist_dir / "train"), batch_size=100, system="minio",
                                cache_fraction=0.3, store="memory", num_workers=0)  # fmt: skip
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for _ in loader:
            pass
        if each_epoch:
            each_epoch(loader)
    return loader


def test_tensorboard_event_file_holds_the_counters_per_epoch(fmnist_dir, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path))
    seen = []
    loader = trained_loader(fmnist_dir, 2, lambda ld: (ld.log_to(writer),
                                                       seen.append(scalars(ld.counters()))))
    writer.close()
    loader.close()
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    hit = [(e.step, e.value) for e in events.Scalars("hotset/hit_ratio")]
    reads = [e.value for e in events.Scalars("hotset/storage_reads")]
    assert [s for s, _ in hit] == [0, 1]  # one point per epoch, at the epoch
    assert [v for _, v in hit] == pytest.approx([s["hit_ratio"] for s in seen])
    assert reads == [s["storage_reads"] for s in seen] and reads[1] > reads[0] > 0
    assert hit[1][1] > 0.1  # MinIO hits from the second epoch on


@pytest.mark.parametrize("given", ["loader", "function"])
def test_prometheus_endpoint_serves_a_loaders_counters(fmnist_dir, given):
    loader = trained_loader(fmnist_dir, 2)
    port = free_port()
    source = loader if given == "loader" else (lambda: {"train": scalars(loader.counters())})
    server = serve_prometheus(source, port)
    try:
        got = scrape(port)
    finally:
        server.shutdown()
        loader.close()
    c = loader.counters()
    assert got[("hotset_hits", "train")] == c["hits"] > 0
    assert got[("hotset_storage_reads", "train")] == c["storage_reads"]
    assert got[("hotset_hit_ratio", "train")] == pytest.approx(c["hits"] / c["accesses"])
    with pytest.raises(TypeError, match="a loader or a function"):
        serve_prometheus({"train": 1.0}, free_port())


def test_service_exports_figures_per_job(fmnist_dir, tmp_path):
    port = free_port()
    address = f"ipc://{tmp_path}/svc.sock"
    proc = start_service(address, capacity_bytes=400_000, metrics_port=port)
    client = hotset.connect(address, timeout_s=20)
    storage = FileStorage(str(fmnist_dir / "train"))
    try:
        with client.make_loader(storage, batch_size=50, num_workers=0, name="sweep-a") as ld:
            for epoch in range(2):
                ld.set_epoch(epoch)
                for _ in ld:
                    pass
            got = scrape(port)
    finally:
        proc.terminate()
        proc.join(10)
        client.close()
    assert got[("hotset_accesses", "sweep-a")] == 2 * len(storage)
    assert got[("hotset_hits", "sweep-a")] > 0
    assert got[("hotset_jobs", "all")] == 1.0 and got[("hotset_cached", "all")] > 0


def test_the_monitoring_guides_examples_run_as_written(fmnist_dir, tmp_path, monkeypatch):
    """docs/monitoring.md's TensorBoard and Prometheus blocks, run on a trained loader:
    the event file holds a point per epoch, the endpoint serves the loader's counters."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    guide = (Path(__file__).resolve().parents[1] / "docs" / "monitoring.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", guide, flags=re.S)
    tensorboard = next(b for b in blocks if "SummaryWriter" in b)
    prometheus = next(b for b in blocks if "serve_prometheus" in b)
    monkeypatch.chdir(tmp_path)
    loader = trained_loader(fmnist_dir, 0)
    exec(tensorboard, {"loader": loader, "epochs": 2})  # noqa: S102 - our own docs
    events = EventAccumulator(str(tmp_path / "runs" / "shade"))
    events.Reload()
    assert [e.step for e in events.Scalars("hotset/hit_ratio")] == [0, 1]
    port = free_port()
    scope = {"loader": loader}
    exec(prometheus.replace("9100", str(port)).replace("...\n", "got = scrape(PORT)\n"),  # noqa: S102
         {**scope, "scrape": scrape, "PORT": port}, scope)  # fmt: skip
    loader.close()
    assert scope["got"][("hotset_hits", "train")] == loader.counters()["hits"] > 0
