"""Storage: manifest, file backend over fsspec, throttle, prepare, errors naming samples."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from conftest import make_imagefolder
from hotset import (
    ConfigError,
    CorruptSampleError,
    FileStorage,
    MissingSampleError,
    ThrottledStorage,
    decode_image,
)
from hotset.storage import content_key
from hotset.storage.prepare import prepare_imagefolder


def test_fashion_mnist_prepared_with_manifest(fmnist_dir):
    train = FileStorage(str(fmnist_dir / "train"))
    test = FileStorage(str(fmnist_dir / "test"))
    assert len(train) == 1000 and len(test) == 1000
    assert train.classes[9] == "Ankle boot"
    # every key is the digest of the bytes the storage returns, sizes are the byte counts
    for i in (0, 17, 999):
        data = train.read(i)
        assert content_key(data) == train.key(i)
        assert len(data) == train.size(i)
        x = decode_image(data)
        assert x.shape == (1, 28, 28) and x.dtype == np.uint8
    assert set(np.unique(train.labels)) == set(range(10))


def test_keys_are_global_across_jobs(fmnist_dir, tmp_path):
    """Two storages over copies of the same data address each sample by the same key."""
    a = FileStorage(str(fmnist_dir / "train"))
    copy = tmp_path / "copy"
    import shutil

    shutil.copytree(fmnist_dir / "train", copy)
    b = FileStorage(str(copy))
    assert a.keys == b.keys


def test_read_many_concurrent_and_ordered(fmnist_dir):
    s = FileStorage(str(fmnist_dir / "train"), concurrency=4)
    ids = [5, 3, 999, 3, 0]
    assert s.read_many(ids) == [s.read(i) for i in ids]


def test_fsspec_url(fmnist_dir):
    """The same backend over an fsspec URL (file:// here; memory:// below)."""
    s = FileStorage(f"file://{fmnist_dir / 'train'}")
    assert s.read(1) == FileStorage(str(fmnist_dir / "train")).read(1)


def test_imagefolder_on_a_memory_filesystem_is_indexed_outside_the_tree(tmp_path, monkeypatch):
    import fsspec

    monkeypatch.setenv("HOTSET_CACHE_DIR", str(tmp_path / "cache"))
    src = make_imagefolder(tmp_path / "src")
    fs = fsspec.filesystem("memory")
    for p in src.rglob("*.png"):
        fs.pipe_file(f"/tree/{p.parent.name}/{p.name}", p.read_bytes())
    s = FileStorage("memory://tree")
    assert len(s) == 15 and s.classes == ["cat", "dog", "eel"]
    assert not fs.exists("/tree/manifest.json")  # nothing written into the source
    assert FileStorage("memory://tree").keys == s.keys  # the cached index, read back
    assert s.read(3) == fs.cat_file(f"/tree/{s.manifest.paths[3]}")
    fs.pipe_file("/tree/cat/new.png", (src / "cat" / "img0.png").read_bytes())
    assert len(FileStorage("memory://tree")) == 16  # the listing changed: indexed again


def test_an_imagefolder_indexed_a_class_at_a_time_is_its_whole_listing(tmp_path, monkeypatch):
    """The index built a class at a time (columns, no object per file) holds what the
    whole listing says: each image under its class's label, in path order, with its
    location key and size; a class without images keeps its label; a file rewritten at
    the same path with other bytes gets a new key."""
    import fsspec

    from hotset.storage.base import TAG
    from hotset.storage.files import index_imagefolder, list_imagefolder
    from hotset.storage.manifest import location_key

    monkeypatch.setenv("HOTSET_CACHE_DIR", str(tmp_path / "cache"))
    src = make_imagefolder(tmp_path / "src", classes=("cat", "dog", "eel"), per_class=4)
    (src / "dog" / "deep").mkdir()
    (src / "dog" / "img0.png").rename(src / "dog" / "deep" / "img9.png")
    (src / "bat").mkdir()  # (a class of no images: its label is kept)
    (src / "bat" / "notes.txt").write_text("no image here")
    fs, root = fsspec.core.url_to_fs(str(src))
    classes, files = list_imagefolder(fs, root)
    m = index_imagefolder(fs, root, "file://src")
    assert m.classes == classes == ["bat", "cat", "dog", "eel"]
    assert list(m.paths) == [rel for rel, _, _ in files] and "dog/deep/img9.png" in m.paths
    assert m.labels.tolist() == [label for _, label, _ in files] and 0 not in m.labels
    assert m.sizes.tolist() == [info["size"] + TAG for _, _, info in files]
    assert list(m.keys) == [location_key("file://src", rel, info["size"], info["mtime"])
                            for rel, _, info in files]  # fmt: skip
    before = list(m.keys)
    os.utime(src / "eel" / "img1.png", (1, 1))  # (rewritten: another version)
    after = list(index_imagefolder(fs, root, "file://src").keys)
    changed = [p for p, a, b in zip(m.paths, before, after, strict=True) if a != b]
    assert changed == ["eel/img1.png"]


def test_prepare_imagefolder_splits_and_copies(tmp_path):
    src = make_imagefolder(tmp_path / "src", per_class=10)
    out = tmp_path / "out"
    result = prepare_imagefolder(str(src), str(out), test_fraction=0.2)
    assert len(result["train"]) == 24 and len(result["test"]) == 6
    train, test = FileStorage(str(out / "train")), FileStorage(str(out / "test"))
    assert not set(train.keys) & set(test.keys)
    for i in range(len(train)):
        assert train.read(i) == (src / train.manifest.paths[i]).read_bytes()
    assert np.bincount(test.labels).tolist() == [2, 2, 2]


def test_missing_file_names_sample_and_path(fmnist_dir, tmp_path):
    import shutil

    root = tmp_path / "d"
    shutil.copytree(fmnist_dir / "train", root)
    s = FileStorage(str(root))
    (root / s.manifest.paths[7]).unlink()
    with pytest.raises(MissingSampleError) as err:
        s.read(7)
    assert err.value.sample_id == 7
    assert "sample 7" in str(err.value) and s.manifest.paths[7] in str(err.value)


def test_corrupt_png_names_sample(fmnist_dir, tmp_path):
    import shutil

    root = tmp_path / "d"
    shutil.copytree(fmnist_dir / "train", root)
    s = FileStorage(str(root))
    path = root / s.manifest.paths[3]
    path.write_bytes(path.read_bytes()[:40])  # truncated PNG
    with pytest.raises(CorruptSampleError, match=r"sample 3 .*does not match"):
        s.read(3)
    # without digest checks the decoder still names the sample (CachedDataset below)
    unverified = FileStorage(str(root), verify=False)
    assert unverified.read(3) == path.read_bytes()


def test_no_manifest_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="manifest.json"):
        FileStorage(str(tmp_path))


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"paths": ["../../../../etc/hostname"]}, r"paths\[0\] = '../../../../etc/hostname'"),
        ({"paths": ["/etc/hostname"]}, r"paths\[0\] = '/etc/hostname' leaves"),
        ({"paths": ["a/../../secret"]}, r"paths\[0\].*leaves the dataset"),
        ({"paths": ["file:///etc/hostname"]}, r"paths\[0\].*leaves the dataset"),
        ({"keys": None}, r"missing required field `keys`"),
        ({"labels": ["1"]}, r"Expected `int`, got `str` - at `\$.labels\[0\]`"),
        ({"labels": [7]}, r"labels\[0\] = 7 is not a class index"),
        ({"sizes": [-1]}, r"`\$.sizes\[0\]`"),
        ({"format": "other/1"}, r"format 'other/1'"),
    ],
)
def test_a_manifest_that_escapes_or_lies_is_refused_with_the_field_named(
    tmp_path, change, named
):
    """A manifest is untrusted input: a key path outside the dataset, a missing field, a
    label of the wrong type or outside the class list: refused when it is loaded, with a
    ConfigError naming the field, before any sample is read."""
    import json

    (tmp_path / "secret").write_bytes(b"not part of the dataset")
    doc = {"format": "hotset-manifest/1", "paths": ["a/0.png"], "keys": ["0" * 32],
           "sizes": [10], "labels": [0], "classes": ["a", "b"]}  # fmt: skip
    doc.update(change)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "manifest.json").write_text(
        json.dumps({k: v for k, v in doc.items() if v is not None})
    )
    with pytest.raises(ConfigError, match=named):
        FileStorage(str(tmp_path / "data"))


def test_throttle_costs_latency_and_bounds_concurrency(fmnist_dir):
    inner = FileStorage(str(fmnist_dir / "train"))
    slow = ThrottledStorage(inner, latency_ms=20, concurrency=2)
    start = time.perf_counter()
    out = slow.read_many(list(range(8)))
    elapsed = time.perf_counter() - start
    assert out == inner.read_many(list(range(8)))
    # 8 reads, 2 in flight, 20 ms each: at least 4 rounds
    assert elapsed >= 0.075
    with pytest.raises(ConfigError, match="concurrency"):
        ThrottledStorage(inner, concurrency=0)
    with pytest.raises(ConfigError, match="concurrency must be an int >= 1, got 0"):
        FileStorage(str(fmnist_dir / "train"), concurrency=0)


def test_throttle_charges_the_clients_cpu_per_request(fmnist_dir):
    """``client_cpu_ms``: each request burns at least that much CPU in the thread that
    makes it (an S3 client's signing and parsing), and the bytes are the storage's."""
    inner = FileStorage(str(fmnist_dir / "train"))
    slow = ThrottledStorage(inner, latency_ms=0, concurrency=1, client_cpu_ms=15.0)
    start = time.process_time()  # the reading threads' CPU with this one's
    assert slow.read_many(list(range(8))) == [inner.read(i) for i in range(8)]
    assert time.process_time() - start >= 8 * 0.015
    with pytest.raises(ConfigError, match="client_cpu_ms must be >= 0"):
        ThrottledStorage(inner, client_cpu_ms=-1)


def test_throttle_bandwidth(fmnist_dir):
    inner = FileStorage(str(fmnist_dir / "train"))
    size = inner.size(0)
    slow = ThrottledStorage(inner, latency_ms=0, bandwidth_mb_s=size / 1e6 / 0.05, concurrency=1)
    start = time.perf_counter()
    slow.read(0)
    assert time.perf_counter() - start >= 0.045


def test_npy_format_decodes_to_the_same_pixels(fmnist_dir, tmp_path):
    from hotset import decode_array, decode_sample
    from hotset.storage.prepare import prepare_fashion_mnist

    prepare_fashion_mnist(str(tmp_path / "npy"), limit=50, fmt="npy")
    npy = FileStorage(str(tmp_path / "npy" / "train"))
    png = FileStorage(str(fmnist_dir / "train"))
    assert npy.manifest.paths[0].endswith(".npy")
    for i in range(50):
        a = decode_array(npy.read(i))
        assert a.shape == (1, 28, 28) and a.dtype == np.uint8
        assert np.array_equal(a, decode_image(png.read(i)))
        assert np.array_equal(decode_sample(npy.read(i)), decode_sample(png.read(i)))
    assert npy.labels.tolist() == png.labels[:50].tolist()
    with pytest.raises(ValueError, match="magic"):
        decode_array(png.read(0))
    with pytest.raises(ValueError):
        decode_array(npy.read(0)[:-10])  # truncated
