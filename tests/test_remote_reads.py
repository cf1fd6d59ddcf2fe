"""Reads over a real network that fail for a moment: a dataset served over HTTP by a
server on 127.0.0.1 that answers 503, drops connections and stalls; every epoch ends
with every sample right (retried with backoff, counted), and a sample that never comes
is the sample's error after a bounded number of attempts."""

from __future__ import annotations

import multiprocessing
import random
import time
from concurrent.futures import ThreadPoolExecutor

import aiohttp
import fsspec
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hotset import FileStorage, decode_image, make_loader, to_tensor
from hotset.errors import ConfigError, StorageError
from hotset.io.reader import BatchReader, NodeSlots, Retry, transient
from hotset.testing import FaultyHTTPServer

OPTIONS = {"client_kwargs": {"timeout": aiohttp.ClientTimeout(total=1.0)}}


@pytest.fixture
def faulty(fmnist_dir):
    server = FaultyHTTPServer(fmnist_dir / "train", faulty=0.2, always="0/00001.png")
    yield server
    server.stop()


@pytest.mark.parametrize(
    ("system", "node"), [(("uniform", "minio"), None), (("shade", "app"), 4)]
)
def test_an_epoch_over_a_faulty_http_server_serves_every_sample_right(
    fmnist_dir, faulty, system, node
):
    """``node``: the workers share that many requests in flight (``node_concurrency``),
    each read on a thread of its own (not one ``cat_ranges``)."""
    local = FileStorage(str(fmnist_dir / "train"))
    remote = FileStorage(faulty.url, storage_options=OPTIONS, retry=Retry(attempts=4),
                         concurrency=16, node_concurrency=node)  # fmt: skip
    assert len(remote) == len(local)
    sampler, policy = system
    loader = make_loader(remote, batch_size=50, sampler=sampler, policy=policy,
                         cache_fraction=0.2, num_workers=2, on_error="skip")  # fmt: skip
    bad = [i for i in range(len(local)) if local.manifest.paths[i] == "0/00001.png"][0]
    for epoch in range(2):
        loader.set_epoch(epoch)
        for x, _, ids in loader:
            truth = torch.stack([to_tensor(decode_image(local.read(i))) for i in ids.tolist()])
            assert torch.equal(x, truth)
            assert bad not in ids.tolist()
            loader.feedback(ids, torch.rand(len(ids)))
    c = loader.counters()
    loader.close()
    assert c["storage_retries"] > 50  # a fifth of the files failed once: tried again
    assert c["skipped"] >= 1  # the file that never comes: skipped after 4 attempts


def test_a_sample_that_never_comes_is_its_error_after_bounded_attempts(fmnist_dir, faulty):
    remote = FileStorage(faulty.url, storage_options=OPTIONS, retry=Retry(attempts=3))
    bad = [i for i in range(len(remote)) if remote.manifest.paths[i] == "0/00001.png"][0]
    with pytest.raises(StorageError, match=r"sample \d+ .*0/00001.png.*after 3 attempts"):
        remote.read(bad)
    assert remote.retries == 2


def _in_flight(slots: NodeSlots, now, most, threads: int) -> None:
    """``threads`` requests at once through ``slots``, each counting itself in flight."""

    def request() -> bytes:
        with now.get_lock():
            now.value += 1
            most.value = max(most.value, now.value)
        time.sleep(0.05)
        with now.get_lock():
            now.value -= 1
        return b""

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda _: slots(request), range(3 * threads)))


def test_node_slots_bound_the_requests_in_flight_across_processes():
    """Four processes of three threads each (a DataLoader's workers, each with its
    reader's threads) never have more than the node's 2 requests in flight, and one
    process alone uses both slots when the others are idle."""
    ctx = multiprocessing.get_context("fork")
    slots, now, most = NodeSlots(2), ctx.Value("i", 0), ctx.Value("i", 0)
    _in_flight(slots, now, most, 2)
    assert most.value == 2  # one process, both slots
    most.value = 0
    procs = [ctx.Process(target=_in_flight, args=(slots, now, most, 3)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    assert [p.exitcode for p in procs] == [0] * 4
    assert most.value == 2
    with pytest.raises(ConfigError, match="node_concurrency"):
        FileStorage(".", node_concurrency=0)


def test_what_is_tried_again():
    class Answer(Exception):
        def __init__(self, status):
            self.status = status

    assert transient(TimeoutError()) and transient(ConnectionResetError())
    assert transient(Answer(503)) and transient(Answer(429)) and not transient(Answer(403))
    assert not transient(FileNotFoundError()) and not transient(PermissionError())


@settings(max_examples=40, deadline=None)
@given(
    ranges=st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 4000), st.integers(0, 600)),
        min_size=1, max_size=40,
    ),
    slow=st.booleans(),
)
def test_local_reads_in_the_calling_thread_or_on_threads_return_the_same_bytes(
    tmp_path_factory, ranges, slow
):
    """Fast local reads are made in the calling thread, slow ones on threads, a share of
    the batch each: either way each range's bytes come back in order, a missing file as
    its FileNotFoundError."""
    root = tmp_path_factory.mktemp("local")
    blobs = [bytes(random.Random(k).randbytes(4096)) for k in range(3)]
    for k, b in enumerate(blobs):
        (root / f"{k}.bin").write_bytes(b)
    reader = BatchReader(fsspec.filesystem("file"), concurrency=4)
    reader._read_s = 1.0 if slow else 0.0  # what the reader measured of earlier reads
    paths = [str(root / f"{k}.bin") for k, _, _ in ranges]
    starts = [s for _, s, _ in ranges]
    ends = [s + n for _, s, n in ranges]
    got = reader.read(paths, starts, ends)
    for (k, s, n), data in zip(ranges, got, strict=True):
        if k == 3:
            assert isinstance(data, FileNotFoundError)
        else:
            assert data == blobs[k][s : s + n]
    assert reader.requests == len(ranges) and reader.retries == 0
