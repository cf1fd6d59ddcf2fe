"""Misses -> range requests (``io/requests.py``) and their use by tar shards: every
sample's bytes come out right whatever is merged, adjacent samples are one request, far
ones are not, and the cost model's gap is what a request costs in transferred bytes."""

from __future__ import annotations

import io
import tarfile
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hotset.io.requests import CostModel, coalesce
from hotset.storage.records import decode_record
from hotset.storage.tar import TarStorage

ranges = st.lists(
    st.tuples(st.integers(0, 3), st.integers(0, 10_000), st.integers(1, 500)),
    min_size=1, max_size=60,
)  # fmt: skip


@given(ranges, st.integers(0, 2_000))
def test_coalesced_requests_cover_each_range_once_and_merge_only_small_gaps(rs, gap):
    objects = np.array([o for o, _, _ in rs])
    starts = np.array([s for _, s, _ in rs])
    ends = starts + np.array([n for _, _, n in rs])
    groups = coalesce(objects, starts, ends, gap)
    served = sorted(k for g in groups for k in g.members)
    assert served == list(range(len(rs)))  # every range in exactly one request
    for g in groups:
        for k in g.members:
            assert objects[k] == g.object and g.start <= starts[k] and ends[k] <= g.end
    by_object: dict[int, list] = {}
    for g in groups:
        by_object.setdefault(g.object, []).append(g)
    for gs in by_object.values():  # requests of one object: apart by more than the gap
        gs.sort(key=lambda g: g.start)
        for a, b in zip(gs, gs[1:], strict=False):
            assert b.start > a.end + gap
    # no request reads more than its ranges and the gaps it was allowed to merge
    for g in groups:
        spans = sorted((int(starts[k]), int(ends[k])) for k in g.members)
        covered, reach = 0, spans[0][0]
        for s, e in spans:
            covered += max(0, e - max(s, reach))
            reach = max(reach, e)
        assert g.end - g.start - covered <= gap * (len(spans) - 1)


def test_the_cost_model_merges_a_gap_cheaper_than_a_request():
    cost = CostModel(latency_ms=2.0, bandwidth_mb_s=100.0)
    assert cost.merge_gap == 200_000
    near, far = 150_000, 250_000
    for gap, requests in ((near, 1), (far, 2)):
        groups = coalesce(np.zeros(2), np.array([0, 1000 + gap]), np.array([1000, 2000 + gap]),
                          cost.merge_gap)  # fmt: skip
        assert len(groups) == requests
        merged = cost.cost_s(1, 2000 + gap)
        apart = cost.cost_s(2, 2000)
        assert (merged < apart) == (requests == 1)


def _shard(path, sizes, seed=0):
    rng = np.random.default_rng(seed)
    payloads = []
    with tarfile.open(path, "w") as tf:
        for k, n in enumerate(sizes):
            data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
            payloads.append(data)
            for name, blob in ((f"s{k:04d}.bin", data), (f"s{k:04d}.cls", str(k).encode())):
                info = tarfile.TarInfo(name)
                info.size = len(blob)
                tf.addfile(info, io.BytesIO(blob))
    return payloads


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.integers(0, 3000), min_size=1, max_size=30),
    st.integers(0, 20_000),
    st.data(),
)
def test_tar_reads_are_right_whatever_is_merged(tmp_path_factory, sizes, gap, data):
    root = tmp_path_factory.mktemp("shards")
    payloads = _shard(root / "a.tar", sizes)
    storage = TarStorage(str(root / "a.tar"), merge_gap=gap)
    ids = data.draw(st.lists(st.integers(0, len(sizes) - 1), min_size=1, max_size=40))
    out = storage.read_many(ids)
    for i, rec in zip(ids, out, strict=True):
        fields = decode_record(rec)
        assert fields["bin"] == payloads[i] and fields["cls"] == str(i).encode()
        assert len(rec) + 16 == storage.size(i)  # the index knew the record's size
    assert storage.requests <= len(set(ids))


@given(st.dictionaries(st.text(min_size=1, max_size=40), st.integers(0, 70_000), max_size=20))
def test_a_record_is_the_size_its_index_says(fields):
    from hotset.storage.records import encode_record, record_size

    blobs = {k: b"x" * n for k, n in fields.items()}
    assert len(encode_record(blobs)) == record_size((k, len(v)) for k, v in blobs.items())


def test_emulated_storage_charges_each_range_request_once(tmp_path):
    """ThrottledStorage pays latency per request a storage makes: a tar shard's adjacent
    samples are one request on the emulated wire, as they would be on a network."""
    from hotset.storage import ThrottledStorage

    payloads = _shard(tmp_path / "a.tar", [300] * 12)
    tar = TarStorage(str(tmp_path / "a.tar"), merge_gap=0)
    paid = []
    throttled = ThrottledStorage(tar, latency_ms=0.0, concurrency=2)
    through = throttled._through
    throttled._wired = tar.with_wire(lambda request: paid.append(1) or through(request))
    out = throttled.read_many(list(range(12)))
    assert [decode_record(r)["bin"] for r in out] == payloads
    assert len(paid) == 1 and throttled.requests == 1
    throttled.read_many([0, 11])
    assert len(paid) == 3
    tar.read_many([0, 11])  # the storage itself stays unthrottled (another job may read it)
    assert len(paid) == 3 and tar.requests == 2


def test_the_latency_is_measured_and_the_gap_follows_it(tmp_path, monkeypatch):
    """Behind a wire of 20 ms per request, a prior of 5 ms: the planner measures about
    20 ms from the batches' reports and hands the workers a gap four times the prior's."""
    import torch

    from hotset import make_loader
    from hotset.storage import ThrottledStorage
    from test_sources import _chw, _images, _write_tar

    monkeypatch.setenv("HOTSET_CACHE_DIR", str(tmp_path / "cache"))
    images = _images(120)
    _write_tar(tmp_path / "a.tar", images, 0)
    prior = CostModel(latency_ms=5.0, bandwidth_mb_s=100.0, in_flight=1)
    tar = TarStorage(str(tmp_path / "a.tar"), cost=prior, concurrency=1)
    wire = ThrottledStorage(tar, latency_ms=20.0, bandwidth_mb_s=100.0, concurrency=1)
    with make_loader(wire, batch_size=4, cache_fraction=0.1, num_workers=0, store="memory",
                     readahead_bytes=0) as loader:  # fmt: skip
        for inputs, _, ids in loader:  # served right, whatever gap the workers were given
            for k, i in enumerate(ids.tolist()):
                assert torch.equal(inputs[k], _chw(images[i]))
        c = loader.counters()["internal"]
    # at least the wire's 20 ms (a busy machine only adds): no upper bound, not a speed
    assert c["request_latency_ms"] > 17.0, c["request_latency_ms"]
    assert c["merge_gap"] > 3 * prior.merge_gap
    assert tar.merge_gap == prior.merge_gap  # the user's storage is left as it was


def test_the_latency_fit_sees_through_queueing():
    """Batches whose requests waited for slots other workers held read long; the fit
    takes the link's latency from the batches that waited least, where a mean of all
    sat at the bound (issue: 160 ms measured behind a 20 ms link)."""
    from hotset.io.requests import LatencyFit

    prior = CostModel(latency_ms=10.0, bandwidth_mb_s=100.0, in_flight=8)
    fit = LatencyFit(prior, concurrency=1)
    rng = np.random.default_rng(0)
    for _ in range(200):  # 20 ms each, and 0-150 ms in a queue for most batches
        queued = 0.0 if rng.random() < 0.3 else rng.uniform(0.0, 0.15)
        fit.observe(requests=4, nbytes=0, seconds=4 * (0.020 + queued))
    assert 19.0 <= fit.model.latency_ms <= 25.0, fit.model.latency_ms
    assert fit.model.merge_gap < 2 * CostModel(20.0, 100.0, 8).merge_gap


def test_the_latency_fit_takes_each_requests_own_time_where_the_slots_measure_it():
    """With the node's slots shared (``node_concurrency``), a worker's 8 requests may
    each wait for a slot in every batch: no batch's wall time tells the latency, and the
    fit from it sits at its bound (8x the prior); the time each request held its slot
    (``NodeSlots.in_flight_s``) does tell it."""
    from hotset.io.reader import NodeSlots
    from hotset.io.requests import LatencyFit

    prior = CostModel(latency_ms=10.0, bandwidth_mb_s=100.0, in_flight=8)
    told, blind = LatencyFit(prior, concurrency=8), LatencyFit(prior, concurrency=8)
    rng = np.random.default_rng(0)
    for _ in range(100):  # 20 ms each, after 0.1-0.3 s in a queue
        seconds = float(rng.uniform(0.1, 0.3)) + 0.020
        told.observe(requests=8, nbytes=0, seconds=seconds, in_flight_s=8 * 0.020)
        blind.observe(requests=8, nbytes=0, seconds=seconds)
    assert told.model.latency_ms == pytest.approx(20.0)
    assert blind.model.latency_ms == 8 * prior.latency_ms
    slots = NodeSlots(1)
    for _ in range(3):
        slots(lambda: time.sleep(0.02))
    assert 0.06 <= slots.in_flight_s < 0.2


def test_the_emulated_link_shares_its_bandwidth_between_processes(fmnist_dir):
    """``ThrottledStorage``'s bandwidth is one link's: two processes that read at once
    take twice as long as one (a per-stream bandwidth would take as long)."""
    import multiprocessing
    import time

    from hotset.storage import FileStorage, ThrottledStorage

    inner = FileStorage(str(fmnist_dir / "train"))
    size = inner.size(0)
    # 40 ms of link per read; 4 slots, so only the link can make them wait
    wire = ThrottledStorage(inner, latency_ms=0, bandwidth_mb_s=size / 1e6 / 0.04, concurrency=4)
    ctx = multiprocessing.get_context("fork")
    start = time.monotonic()
    procs = [ctx.Process(target=lambda: [wire.read(0) for _ in range(3)]) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    assert all(p.exitcode == 0 for p in procs)
    assert time.monotonic() - start >= 6 * 0.04 * 0.95  # six reads, one after another


def test_the_latency_fit_charges_a_large_read_its_transfer_over_the_whole_link():
    """A whole 290 KB shard read in 4.9 ms behind 2 ms and 100 MB/s: the latency is the
    2 ms, not the nothing a transfer at an eighth of the link would leave."""
    from hotset.io.requests import LatencyFit

    fit = LatencyFit(CostModel(latency_ms=2.0, bandwidth_mb_s=100.0, in_flight=8), 1)
    for _ in range(10):
        fit.observe(requests=1, nbytes=290_000, seconds=0.0049)
    assert 1.8 <= fit.model.latency_ms <= 2.2, fit.model.latency_ms
