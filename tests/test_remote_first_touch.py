"""The first touch of remote tar shards, over HTTP servers the tests start: a shard
that is cut, empty, not a tar, missing, forbidden or unreachable is an error naming the
shard and what happened (never fewer samples without a word); indexing survives a
faulty server (retried, counted); a server without Range support serves exact bytes
with one warning; a bad argument to ``make_loader`` is refused before anything opens; a
streamed first epoch (``first_epoch="stream"``) serves each sample once, under the ids
the index gives it, before the last shard has landed."""

from __future__ import annotations

import gc
import io
import logging
import sys
import tarfile
import time
from pathlib import Path

import aiohttp
import numpy as np
import pytest
import torch
from PIL import Image

import hotset
from hotset import TarStorage, make_loader
from hotset.errors import ConfigError, ShardError
from hotset.io.reader import Retry, failure_kind
from hotset.testing import DelayProxy, FaultyHTTPServer, PlainHTTPServer

OPTIONS = {"client_kwargs": {"timeout": aiohttp.ClientTimeout(total=1.0)}}
SHARDS, PER_SHARD = 4, 25


def _png(rng: np.random.Generator) -> bytes:
    size = tuple(int(v) for v in rng.integers(6, 20, 2))
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (*size, 3), np.uint8)).save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    """``ok/`` four good shards (PNG + cls + json, images of mixed sizes); ``bad/`` the
    first cut or spoilt each way a shard arrives broken."""
    root = tmp_path_factory.mktemp("first-touch")
    (root / "ok").mkdir()
    (root / "bad").mkdir()
    rng = np.random.default_rng(0)
    for s in range(SHARDS):
        with tarfile.open(root / "ok" / f"shard-{s:03d}.tar", "w") as tf:
            for k in range(PER_SHARD):
                i = s * PER_SHARD + k
                for name, data in ((f"s{i:04d}.png", _png(rng)), (f"s{i:04d}.cls", b"%d" % (i % 5)),
                                   (f"s{i:04d}.json", b'{"i": %d}' % i)):  # fmt: skip
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
    good = (root / "ok" / "shard-000.tar").read_bytes()
    with tarfile.open(root / "ok" / "shard-000.tar") as tf:
        member = tf.getmembers()[30]
    cuts = {
        "boundary": good[: member.offset],  # at a member boundary: no end-of-archive block
        "header": good[: member.offset + 200],  # mid-header
        "payload": good[: member.offset_data + 10],  # mid-payload
        "empty": b"",
        "garbage": b"not a tar at all " * 64,
    }
    for name, data in cuts.items():
        (root / "bad" / f"{name}.tar").write_bytes(data)
    (root / "forbidden").mkdir()
    (root / "forbidden" / "shard.tar").write_bytes(good)
    return root


@pytest.fixture
def plain(shards):
    server = PlainHTTPServer(shards)
    yield server
    server.stop()


KINDS = {"boundary": "truncated", "header": "truncated", "payload": "truncated",
         "empty": "empty", "garbage": "not a tar"}  # fmt: skip


@pytest.mark.parametrize("name", sorted(KINDS))
def test_a_spoilt_shard_is_named_with_what_is_wrong(shards, plain, name):
    for url in (str(shards / "bad" / f"{name}.tar"), f"{plain.url}/bad/{name}.tar"):
        with pytest.raises(ShardError, match=rf"{name}\.tar: {KINDS[name]}") as err:
            TarStorage(url)
        assert err.value.kind == KINDS[name] and err.value.url == url


def test_missing_forbidden_and_unreachable_shards_are_told_apart(shards, plain):
    cases = {
        f"{plain.url}/ok/shard-999.tar": "not found",
        f"{plain.url}/forbidden/shard.tar": "forbidden",
        "http://127.0.0.1:9/shard-000.tar": "unreachable",  # (the discard port: refused)
        str(shards / "ok" / "shard-999.tar"): "not found",
    }
    for url, kind in cases.items():
        t = time.monotonic()
        with pytest.raises(ShardError) as err:
            TarStorage(url, retry=Retry(attempts=3, base_s=0.01))
        assert (err.value.url, err.value.kind) == (url, kind), str(err.value)
        assert time.monotonic() - t < 10
    with pytest.raises(ShardError, match="unreachable"):  # detected by make_loader too
        make_loader("http://127.0.0.1:9/data/", batch_size=4, cache_fraction=0.1)


def test_a_server_without_range_serves_exact_bytes_reading_each_shard_once(
    shards, plain, caplog
):
    local = TarStorage(str(shards / "ok"))
    remote = TarStorage(f"{plain.url}/ok/shard-{{000..003}}.tar")
    assert len(remote) == len(local)  # (keys name where each sample lives: they differ)
    ids = np.random.default_rng(1).permutation(len(local))
    with caplog.at_level(logging.WARNING, logger="hotset"):
        for batch in np.array_split(ids, 5):
            before = remote.requests
            assert remote.read_many(batch) == local.read_many(batch)
            # after the first answer, one whole read per shard the batch touches
            assert remote.requests - before <= len(set(remote.extents[0][batch])) + (
                len(batch) if before == 0 else 0
            )
    warned = [r for r in caplog.records if "ignores Range" in r.getMessage()]
    assert len(warned) == 1


def test_indexing_through_a_faulty_server_is_retried_and_counted(shards):
    """Every shard's first answer is a fault (a 503, a dropped connection, a reset
    mid-body or a stall): the loader starts, counts the retries, serves exact bytes."""
    server = FaultyHTTPServer(shards / "ok", faulty=1.0)
    try:
        local = TarStorage(str(shards / "ok"))
        url = f"{server.url}/shard-{{000..003}}.tar"
        loader = make_loader(url, batch_size=20, cache_fraction=0.2, num_workers=0,
                             store="memory", storage_options=OPTIONS, size=(12, 12))  # fmt: skip
        # shard 0's first answer resets mid-body, shard 3's stalls: each tried again
        # (aiohttp itself retries a request whose connection dropped before an answer)
        assert loader.counters()["storage_retries"] >= 2
        seen = []
        for x, y, ids in loader:
            for k, i in enumerate(ids.tolist()):
                sample = hotset.decode_sample(local.read(i), size=(12, 12))
                assert torch.equal(x[k], hotset.to_tensor(sample["png"]))
                assert int(y[k]) == sample["cls"]
            seen += ids.tolist()
        assert sorted(seen) == list(range(len(local)))
        loader.close()
    finally:
        server.stop()


def test_a_shard_that_always_fails_ends_the_start_naming_it(shards):
    server = FaultyHTTPServer(shards / "ok", faulty=0.0, always="shard-002.tar")
    try:
        t = time.monotonic()
        with pytest.raises(ShardError, match=r"shard-002\.tar: failed .*after 4 attempts"):
            TarStorage(f"{server.url}/shard-{{000..003}}.tar", storage_options=OPTIONS)
        assert time.monotonic() - t < 60
    finally:
        server.stop()


def test_failure_kinds():
    class Answer(Exception):
        def __init__(self, status):
            self.status = status

    assert failure_kind(Answer(403)) == "forbidden" and failure_kind(Answer(404)) == "not found"
    assert failure_kind(TimeoutError()) == "timed out"
    assert failure_kind(ConnectionRefusedError()) == "unreachable"
    assert failure_kind(ConnectionResetError()) == "cut off"
    assert failure_kind(aiohttp.ClientPayloadError("reset")) == "cut off"
    assert failure_kind(Answer(503)) == "failed"


def test_fields_by_name_and_several_as_a_dict(shards):
    url = str(shards / "ok")
    loader = make_loader(url, batch_size=10, cache_fraction=0.1, num_workers=0, store="memory",
                         target_field=["cls", "json"], size=(12, 12))  # fmt: skip
    x, y, ids = next(iter(loader))
    assert y["cls"].tolist() == [i % 5 for i in ids.tolist()]
    assert y["json"]["i"].tolist() == ids.tolist()
    loader.close()
    with pytest.raises(ConfigError, match=r"input_field='jpg': no field 'jpg'.*\['png', 'cls'"):
        make_loader(url, batch_size=10, cache_fraction=0.1, input_field="jpg")


@pytest.mark.parametrize(
    "bad,error,match",
    [
        ({"shufle": True}, TypeError, r"'shufle' \(did you mean 'shuffle'\?\)"),
        ({"num_workers": -1}, ConfigError, "num_workers"),
        ({"num_workers": 0, "prefetch_factor": 2}, ConfigError, "prefetch_factor"),
        ({"target_feild": "cls"}, TypeError, "did you mean 'target_field'"),
    ],
)
def test_a_bad_argument_is_refused_before_anything_opens(shards, bad, error, match):
    unraisable = []
    hook, sys.unraisablehook = sys.unraisablehook, unraisable.append
    try:
        with pytest.raises(error, match=match):
            make_loader(str(shards / "ok"), batch_size=10, cache_fraction=0.1, **bad)
        gc.collect()
    finally:
        sys.unraisablehook = hook
    assert not unraisable  # (a lease closed twice printed "Bad file descriptor")


def _fresh_index(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("HOTSET_CACHE_DIR", str(tmp_path / "index"))


def _streamed(url: str, **kw):
    kw = {"num_workers": 2, **kw}
    return make_loader(url, batch_size=16, cache_fraction=0.2, size=(12, 12),
                       storage_options=OPTIONS, first_epoch="stream", **kw)  # fmt: skip


def test_a_streamed_first_epoch_serves_each_sample_once_under_the_indexed_ids(
    shards, monkeypatch, tmp_path
):
    """Every shard's first answer is a fault; the epoch streams the shards anyway (retried,
    counted), serves every sample once with its exact bytes under the id the index gives
    it, in an order the seed decides; then the system's own loader takes over with the
    epoch's losses learnt, and the index the epoch kept costs no shard read again."""
    _fresh_index(monkeypatch, tmp_path)
    local = TarStorage(str(shards / "ok"))
    server = FaultyHTTPServer(shards / "ok", faulty=1.0)
    url = f"{server.url}/shard-{{000..003}}.tar"
    try:
        loader = _streamed(url, system="shade")
        assert type(loader).__name__ == "StreamedStart"
        with pytest.raises(TypeError, match="streamed first epoch"):
            len(loader)
        spool, order = loader._spool.dir, []
        for x, y, ids in loader:
            for k, i in enumerate(ids.tolist()):
                sample = hotset.decode_sample(local.read(i), size=(12, 12))
                assert torch.equal(x[k], hotset.to_tensor(sample["png"]))
                assert int(y[k]) == sample["cls"]
            order += ids.tolist()
            loader.feedback(ids, torch.as_tensor(ids, dtype=torch.float32))  # loss = id
        assert sorted(order) == list(range(len(local))) and order != sorted(order)
        assert not spool.exists()  # the spool goes with the epoch
        first = loader.epoch_stats[0]
        assert first.samples == len(local) and first.storage_retries >= 2
        assert len(loader) == -(-len(local) // 16)  # the system's loader now
        learnt = loader.planner.sampler.board.loss  # SHADE learnt the streamed epoch's losses
        assert np.array_equal(learnt, np.arange(len(local)))
        loader.set_epoch(1)
        assert sum(ids.numel() for _, _, ids in loader) == len(local)
        # each epoch's counters, the streamed one first, and the run's sum over them
        assert [e.epoch for e in loader.epoch_stats] == [0, 1]
        assert loader.epoch_stats[1].samples == len(local)
        assert loader.stats.samples == 2 * len(local)
        loader.close()
        again = _streamed(url, system="shade")  # indexed now: no epoch streamed
        assert type(again).__name__ == "HotsetLoader"
        again.close()
        _fresh_index(monkeypatch, tmp_path / "2")
        replay = _streamed(url, system="shade", num_workers=0, store="memory")
        assert [i for _, _, ids in replay for i in ids.tolist()] == order  # seed, not timing
        replay.close()
    finally:
        server.stop()


def test_the_first_streamed_batch_comes_before_the_last_shard_lands(
    shards, monkeypatch, tmp_path
):
    """Behind a 1 MB/s link the four shards take ~0.5 s to cross; the first batch waits
    for the first shard alone. A state taken then starts the epoch again; another
    dataset's loader refuses it, naming it."""
    _fresh_index(monkeypatch, tmp_path)
    server = FaultyHTTPServer(shards / "ok", faulty=0.0)
    wire = DelayProxy(int(server.url.rsplit(":", 1)[1]), 20.0, 1.0)
    url = f"{wire.url}/shard-{{000..003}}.tar"
    try:
        loader = _streamed(url, num_workers=0, store="memory")
        batches = iter(loader)
        next(batches)
        assert loader._spool.requests < 2 * SHARDS  # HEADs, and fewer GETs than shards
        state = loader.state_dict()
        loader.close()
        resumed = _streamed(url, num_workers=0, store="memory")
        resumed.load_state_dict(state)
        assert sum(ids.numel() for _, _, ids in resumed) == SHARDS * PER_SHARD
        resumed.close()
        for other in (make_loader(str(shards / "ok"), batch_size=16, cache_fraction=0.2,
                                  size=(12, 12), num_workers=0, store="memory"),
                      _streamed(f"{wire.url}/shard-{{000..002}}.tar", num_workers=0,
                                store="memory")):  # fmt: skip
            with pytest.raises(ConfigError, match="streamed first epoch of other tar shards"):
                other.load_state_dict(state)
            other.close()
    finally:
        wire.stop()
        server.stop()


def test_a_streamed_shard_that_always_fails_is_named(shards, monkeypatch, tmp_path):
    _fresh_index(monkeypatch, tmp_path)
    server = FaultyHTTPServer(shards / "ok", faulty=0.0, always="shard-002.tar")
    try:
        loader = _streamed(f"{server.url}/shard-{{000..003}}.tar")
        with pytest.raises(ShardError, match=r"shard-002\.tar: failed .*after 4 attempts"):
            for _ in loader:
                pass
        loader.close()
    finally:
        server.stop()
