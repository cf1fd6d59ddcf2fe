"""Datasets in real object stores over a real network (127.0.0.1): S3-compatible
servers (moto's and s3rver, speaking the S3 HTTP API, read through s3fs) and nginx (read through
fsspec's HTTP filesystem), each started by the test. Tar shards, an ImageFolder and a
prepared tree, each through ``make_loader`` with workers; every served sample equal to a
direct read."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import hotset
from hotset.errors import StorageError
from hotset.io.reader import Retry
from hotset.storage import SubsetStorage
from hotset.storage.base import LOCAL_CONCURRENCY, REMOTE_CONCURRENCY
from hotset.testing import DelayProxy, GcsServer, NginxServer, S3Server, s3rver_binary
from test_sources import SYSTEMS, _chw, _images, _jpeg_folder, _pil_direct, _run, _write_tar

pytest.importorskip("s3fs")


@pytest.fixture(autouse=True)
def _index_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HOTSET_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def s3():
    server = S3Server()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def s3rver():
    if s3rver_binary() is None:
        pytest.skip("s3rver is not installed (`make s3rver`, from npm)")
    server = S3Server("s3rver")
    yield server
    server.stop()
    assert not Path(server.data).exists()  # its data directory goes with it


@pytest.fixture(scope="module")
def gcs():
    pytest.importorskip("gcsfs")
    pytest.importorskip("gcp_storage_emulator")
    server = GcsServer()
    yield server
    server.stop()


@pytest.fixture
def nginx(tmp_path):
    (tmp_path / "www").mkdir()
    (tmp_path / "nginx").mkdir()
    server = NginxServer(tmp_path / "www", tmp_path / "nginx")
    yield server, tmp_path / "www"
    server.stop()


def _shards(root, images):
    root.mkdir(parents=True, exist_ok=True)
    for s in range(3):
        _write_tar(root / f"shard-{s:03d}.tar", images[s * 20 : (s + 1) * 20], s * 20)


@pytest.mark.parametrize("sampler,policy", SYSTEMS)
def test_tar_shards_on_s3(tmp_path, s3, sampler, policy):
    _tar_shards_on(s3, tmp_path, sampler, policy)


def test_tar_shards_on_s3rver(tmp_path, s3rver):
    """A second S3 implementation (SigV4 checked, objects kept as files): the same ranged
    reads give the same bytes."""
    _tar_shards_on(s3rver, tmp_path, "shade", "app")


def test_tar_shards_on_gcs(tmp_path, gcs):
    """Google Cloud Storage's JSON API (gcsfs): ranged reads of tar members."""
    _tar_shards_on(gcs, tmp_path, "shade", "app")


def _tar_shards_on(server, tmp_path, sampler, policy):
    images = _images()
    _shards(tmp_path / "shards", images)
    url = f"{server.protocol}://tar-{sampler}/shards"
    server.upload(tmp_path / "shards", url)
    storage = hotset.open_storage(url, storage_options=server.storage_options)
    assert type(storage).__name__ == "TarStorage" and len(storage) == 60
    served = _run(url, lambda i: (_chw(images[i]), i % 3), sampler=sampler, policy=policy,
                  storage_options=server.storage_options)  # fmt: skip
    assert served >= 60


def test_imagefolder_on_s3(tmp_path, s3):
    _imagefolder_on(s3, tmp_path, "uniform", "minio")


def test_imagefolder_on_gcs(tmp_path, gcs):
    _imagefolder_on(gcs, tmp_path, "shade", "app")


def _imagefolder_on(server, tmp_path, sampler, policy):
    files = _jpeg_folder(tmp_path / "folder")
    url = f"{server.protocol}://folder/train"
    server.upload(tmp_path / "folder", url)
    storage = hotset.open_storage(url, storage_options=server.storage_options)

    def expect(i):
        data, label = files[storage.manifest.paths[i]]
        return _pil_direct(data, (16, 16)), label

    _run(url, expect, sampler=sampler, policy=policy, size=(16, 16),
         storage_options=server.storage_options)  # fmt: skip


def test_prepared_tree_on_s3(fmnist_dir, s3):
    """The README's ``FileStorage("s3://...")``: a tree ``hotset prepare`` wrote, on S3."""
    s3.upload(fmnist_dir / "train", "s3://prepared/train")
    local = hotset.FileStorage(str(fmnist_dir / "train"))
    remote = hotset.FileStorage("s3://prepared/train", storage_options=s3.storage_options)
    assert remote.keys == local.keys and remote.content_keyed

    def expect(i):
        return _chw(np.asarray(local_image(local, i))[..., None]), int(local.labels[i])

    _run(SubsetStorage(remote, np.arange(240)), expect, sampler="shade", policy="app")


def local_image(storage, i):
    import io

    from PIL import Image

    return Image.open(io.BytesIO(storage.read(i)))


@pytest.mark.parametrize("sampler,policy", SYSTEMS)
def test_tar_shards_over_http(nginx, sampler, policy):
    server, www = nginx
    images = _images()
    _shards(www / "shards", images)
    url = server.url + "/shards/shard-{000..002}.tar"
    served = _run(url, lambda i: (_chw(images[i]), i % 3), sampler=sampler, policy=policy)
    assert served >= 60


def test_imagefolder_over_http(nginx):
    server, www = nginx
    files = _jpeg_folder(www / "folder")
    storage = hotset.open_storage(server.url + "/folder/")
    assert storage.classes == ["cat", "dog", "eel"] and len(storage) == 60
    # an object store's requests wait on the network: dozens in flight by default
    assert storage.concurrency == REMOTE_CONCURRENCY
    assert hotset.open_storage(str(www / "folder")).concurrency == LOCAL_CONCURRENCY

    def expect(i):
        data, label = files[storage.manifest.paths[i]]
        return _pil_direct(data, (16, 16)), label

    _run(server.url + "/folder/", expect, sampler="shade", policy="app", size=(16, 16))


def _through(s3, wire) -> dict:
    """s3fs's options to reach ``s3`` through ``wire`` (botocore's retries off: s3fs
    retries a SlowDown or a dropped connection 5 times itself, then hotset's reader)."""
    return {
        **s3.storage_options,
        "client_kwargs": {"endpoint_url": wire.url, "region_name": "eu-west-1"},
        "config_kwargs": {"retries": {"max_attempts": 1, "mode": "standard"}},
    }  # fmt: skip


def _faults_retried(server, tmp_path, through) -> tuple[list, str, int]:
    """Tar shards on ``server`` read through a wire that answers 30% of the sample reads
    with a 503 or drops the connection (``through(server, wire)``: the storage options
    that reach it): every sample of two epochs arrives right. Returns the images, the
    shards' URL and the server's port."""
    images = _images()
    _shards(tmp_path / "shards", images)
    url = f"{server.protocol}://faulty/shards"
    server.upload(tmp_path / "shards", url)
    hotset.open_storage(url, storage_options=server.storage_options)  # indexed
    port = int(server.endpoint.rsplit(":", 1)[1])
    wire = DelayProxy(port, latency_ms=1.0, bandwidth_mb_s=0, faults=0.3)
    try:
        storage = hotset.open_storage(url, storage_options=through(server, wire))
        served = _run(storage, lambda i: (_chw(images[i]), i % 3), sampler="uniform",
                      policy="lru", readahead_bytes=0)  # fmt: skip
        assert served == 120 and wire.stats()["faults"] >= 3
    finally:
        wire.stop()
    return images, url, port


def test_s3_faults_are_retried_and_a_shard_that_keeps_failing_is_named(tmp_path, s3):
    """Faults are retried by s3fs or hotset's reader (``_faults_retried``). A shard whose
    every read fails stops the epoch with an error naming a sample of it, after the
    retries."""
    images, url, port = _faults_retried(s3, tmp_path, _through)
    wire = DelayProxy(port, latency_ms=1.0, bandwidth_mb_s=0, failing="shard-001")
    try:
        storage = hotset.open_storage(url, storage_options=_through(s3, wire))
        storage.retry = Retry(attempts=2, base_s=0.01)
        with pytest.raises(StorageError, match=r"shard-001\.tar#s000\d\d.*after 2 attempts"):
            _run(storage, lambda i: (_chw(images[i]), i % 3), sampler="uniform",
                 policy="lru", epochs=1)  # fmt: skip
    finally:
        wire.stop()


def test_gcs_faults_are_retried_and_a_shard_that_keeps_failing_is_named(
    tmp_path, gcs, monkeypatch
):
    """Faults are retried (``_faults_retried``): gcsfs retries each itself, after 0.5 to
    1.5 s, then hotset's reader. A shard whose every read fails stops the epoch with an
    error naming a sample of it once gcsfs's own six attempts are spent; hotset's reader
    is left one attempt. gcsfs's backoff (not configurable: 31-36 s for six attempts) is
    cut to a hundredth here, in this process and the workers it forks."""

    def through(server, wire):
        return {**server.storage_options, "endpoint_url": wire.url}

    import gcsfs.retry

    images, url, port = _faults_retried(gcs, tmp_path, through)
    sleep = asyncio.sleep
    monkeypatch.setattr(gcsfs.retry, "asyncio", SimpleNamespace(sleep=lambda s: sleep(s / 100)))
    wire = DelayProxy(port, latency_ms=1.0, bandwidth_mb_s=0, failing="shard-001")
    try:
        storage = hotset.open_storage(url, storage_options=through(gcs, wire))
        storage.retry = Retry(attempts=1)
        with pytest.raises(StorageError, match=r"shard-001\.tar#s000\d\d.*after 1 attempt"):
            _run(storage, lambda i: (_chw(images[i]), i % 3), sampler="uniform",
                 policy="lru", epochs=1)  # fmt: skip
        assert wire.stats()["faults"] >= 6  # gcsfs's attempts, each answered with a fault
    finally:
        wire.stop()


def test_a_wrong_url_says_what_is_wrong(tmp_path, s3):
    """One slash after the scheme, a bucket that does not exist and a prefix that does
    not exist in one that does: three messages."""
    _shards(tmp_path / "shards", _images())
    s3.upload(tmp_path / "shards", "s3://there/shards")
    options = s3.storage_options
    with pytest.raises(hotset.ConfigError, match=r"two slashes after 's3:' \(s3://there"):
        hotset.open_storage("s3:/there/shards", storage_options=options)
    with pytest.raises(hotset.ConfigError, match="no such bucket 'nowhere'"):
        hotset.open_storage("s3://nowhere/shards", storage_options=options)
    with pytest.raises(hotset.ConfigError, match="no such file or directory"):
        hotset.open_storage("s3://there/elsewhere", storage_options=options)
