"""Users' formats as they are (issue "your data, where it lives"): an ImageFolder of RGB
JPEGs of mixed sizes, WebDataset tar shards, Parquet, a Hugging Face dataset saved to
disk, a map-style torch Dataset. Each through ``make_loader`` with workers, SHADE and
MinIO, every served sample equal to a direct read of the source."""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import hotset
from hotset.errors import ConfigError
from hotset.storage.open import detect_format, open_storage

N = 60
SYSTEMS = [("shade", "app"), ("uniform", "minio")]


@pytest.fixture(autouse=True)
def _index_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HOTSET_CACHE_DIR", str(tmp_path / "cache"))


def _images(n=N, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (10, 12, 3), dtype=np.uint8) for _ in range(n)]


def _png(img: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="PNG")
    return buf.getvalue()


def _chw(img: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(img.transpose(2, 0, 1).copy()).float() / 255.0


def _run(source, expect, *, sampler, policy, epochs=2, **kw) -> int:
    """Serve ``epochs`` epochs; every served input and target must be ``expect(id)``'s."""
    served = 0
    with hotset.make_loader(
        source, batch_size=8, sampler=sampler, policy=policy, cache_fraction=0.3,
        num_workers=2, seed=1, **kw,
    ) as loader:  # fmt: skip
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            for inputs, targets, ids in loader:
                for k, i in enumerate(ids.tolist()):
                    x, y = expect(i)
                    assert torch.equal(inputs[k], x), f"sample {i}"
                    assert int(targets[k]) == y
                served += len(ids)
                loader.feedback(ids, torch.rand(len(ids)))
        stats = loader.counters()
    assert stats["corrupt_hits"] == 0 and stats["hits"] > 0
    return served


def _write_tar(path: Path, images, start: int) -> None:
    with tarfile.open(path, "w") as tf:
        for k, img in enumerate(images):
            i = start + k
            for name, data in ((f"s{i:05d}.png", _png(img)), (f"s{i:05d}.cls", str(i % 3).encode()),
                               (f"s{i:05d}.json", b'{"i": %d}' % i)):  # fmt: skip
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))


@pytest.mark.parametrize("sampler,policy", SYSTEMS)
def test_webdataset_tar_shards(tmp_path, sampler, policy):
    images = _images()
    for s in range(3):
        _write_tar(tmp_path / f"shard-{s:03d}.tar", images[s * 20 : (s + 1) * 20], s * 20)
    url = str(tmp_path / "shard-{000..002}.tar")
    storage = open_storage(url)
    assert type(storage).__name__ == "TarStorage" and len(storage) == N
    assert storage.fields == ["png", "cls", "json"]
    assert _run(url, lambda i: (_chw(images[i]), i % 3), sampler=sampler, policy=policy) > 0


def test_tar_index_reads_headers_only_and_is_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("HOTSET_CACHE_DIR", str(tmp_path / "cache"))
    """The index comes from the headers (payload bytes are never read) and is kept in
    the user's cache, not beside the shards; a rewritten shard is indexed again."""
    images = [np.random.default_rng(k).integers(0, 256, (64, 64, 3), np.uint8) for k in range(12)]
    shard = tmp_path / "data" / "a.tar"
    shard.parent.mkdir()
    _write_tar(shard, images, 0)
    real_open = hotset.storage.tar.tarfile.open
    read = []

    class Counting(io.RawIOBase):
        def __init__(self, f):
            self.f = f

        def read(self, n=-1):
            data = self.f.read(n)
            read.append(len(data))
            return data

        def seek(self, *a):
            return self.f.seek(*a)

        def tell(self):
            return self.f.tell()

        def seekable(self):
            return True

        def readable(self):
            return True

    monkeypatch.setattr(hotset.storage.tar.tarfile, "open",
                        lambda fileobj, mode: real_open(fileobj=Counting(fileobj), mode=mode))
    storage = hotset.TarStorage(str(shard))
    payload = sum(int(s) for s in storage.sizes)
    # the 36 members' headers (and tarfile's one-byte end-of-data probe), no payload
    assert sum(read) <= 36 * (512 + 1) + 3 * 512 < payload / 5
    assert os.listdir(shard.parent) == ["a.tar"]
    kinds = ["tar-set-v1", "tar-v3"]  # the shard's index, and the set's (its shards' joined)
    assert sorted(f.rsplit("-", 2)[0] for f in os.listdir(tmp_path / "cache" / "index")) == kinds
    read.clear()
    assert hotset.TarStorage(str(shard)).keys == storage.keys and not read  # from the cache
    monkeypatch.undo()
    _write_tar(shard, images[:6], 0)
    os.utime(shard, (1, 1))
    assert len(hotset.TarStorage(str(shard))) == 6
    assert hotset.TarStorage(str(shard)).read(5)
    # the stale indexes removed
    assert sorted(f.rsplit("-", 2)[0] for f in os.listdir(tmp_path / "cache" / "index")) == kinds


def test_a_tar_index_cached_by_the_version_before_is_converted_without_reading_the_shard(
    tmp_path, monkeypatch
):
    """An index of the kind before (names and keys as numpy text) is converted at the
    first opening: the same samples and keys, the shard's headers not read again."""
    from hotset.storage import tar
    from hotset.storage.index_cache import index_path

    shard = tmp_path / "a.tar"
    _write_tar(shard, _images(12), 0)
    first = hotset.TarStorage(str(shard))
    url, version = first.urls[0], first._versions[first.urls[0]]
    new = index_path(tar.INDEX_KIND, url, version)
    arrays = tar.load_index(new.read_bytes())
    arrays["names"] = np.asarray(list(arrays["names"]), dtype=str)
    arrays["keys"] = np.asarray(list(arrays["keys"]))
    old = index_path(tar.OLD_INDEX_KIND, url, version)
    with open(old, "wb") as f:
        np.savez(f, **arrays)
    new.unlink()
    monkeypatch.setattr(tar, "index_shard", lambda *a: pytest.fail("the shard was indexed again"))
    again = hotset.TarStorage(str(shard))
    assert again.keys == first.keys and again.manifest.paths == first.manifest.paths
    assert again.read_many(range(12)) == first.read_many(range(12))
    assert new.exists() and not old.exists()


def test_shards_of_other_fields_name_widths_and_none_join_into_one_index(tmp_path):
    """Shards whose fields differ, whose names vary in width, and one with no sample,
    joined into the set's index: every sample is read whole, with its own fields, under
    its own shard's name, from the index and again from the cached indexes."""
    from hotset.storage.records import decode_record

    want = {}
    shards = [[("a", {"cls": b"1"}), ("bb", {"cls": b"2"})], [],
              [("c", {"txt": b"x" * 700, "cls": b"3"}), ("dddd", {"txt": b"yy"})]]  # fmt: skip
    for s, samples in enumerate(shards):
        with tarfile.open(tmp_path / f"shard-{s}.tar", "w") as tf:
            for name, members in samples:
                for field, data in members.items():
                    info = tarfile.TarInfo(f"{name}.{field}")
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
                want[f"shard-{s}.tar#{name}"] = members
    for _ in range(2):  # indexed, then from the cache
        storage = hotset.TarStorage(str(tmp_path / "shard-{0..2}.tar"))
        assert storage.fields == ["cls", "txt"] and list(storage.manifest.paths) == list(want)
        got = [decode_record(r) for r in storage.read_many(range(len(want)))]
        assert got == list(want.values())


def test_a_tar_sets_index_is_one_file_that_every_later_opening_maps(tmp_path, monkeypatch):
    """The shards' indexes joined once into the set's index file; a later opening (another
    rank or run) maps it read-only and serves the same samples, joining nothing."""
    from hotset.storage import tar

    for s in range(3):
        _write_tar(tmp_path / f"shard-{s}.tar", _images(4, seed=s), 4 * s)
    url = str(tmp_path / "shard-{0..2}.tar")
    first = hotset.TarStorage(url)
    monkeypatch.setattr(tar, "write_set_index", lambda *a: pytest.fail("joined again"))
    again = hotset.TarStorage(url)
    records = first.read_many(range(12))
    assert again.keys == first.keys and again.read_many(range(12)) == records
    assert not again.extents[1].flags.writeable and not again.sizes.flags.writeable  # mapped
    monkeypatch.undo()
    cut = again._set_index.with_name("cut")  # damaged (cut short): made again, once
    cut.write_bytes(again._set_index.read_bytes()[:100])
    os.replace(cut, again._set_index)
    assert hotset.TarStorage(url).read_many(range(12)) == records


def test_processes_asking_for_one_index_at_once_make_it_once(tmp_path, monkeypatch):
    """``cached_file``: the node's processes that ask for an index none has made yet wait
    for the one that makes it."""
    import subprocess
    import sys

    monkeypatch.setenv("HOTSET_CACHE_DIR", str(tmp_path / "cache"))
    code = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from hotset.storage.index_cache import cached_file\n"
        "def write(p):\n"
        "    with open(sys.argv[1], 'a') as f: f.write('made\\n')\n"
        "    time.sleep(0.5); p.write_bytes(b'index')\n"
        "print(cached_file('k', 'url', 'v1', write).read_bytes().decode())\n"
    )
    log = tmp_path / "made"
    procs = [subprocess.Popen([sys.executable, "-c", code, str(log)], stdout=subprocess.PIPE,
                              text=True) for _ in range(3)]  # fmt: skip
    outs = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert outs == ["index"] * 3 and log.read_text() == "made\n"


def test_an_index_is_made_where_the_file_system_has_no_locks(tmp_path, monkeypatch, caplog):
    """An index cache on a file system without ``flock`` (some NFS homes): the index is
    made all the same, and the missing lock is said."""
    import errno

    from hotset.storage import index_cache

    def no_locks(*a):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(index_cache.fcntl, "flock", no_locks)
    for s in range(2):
        _write_tar(tmp_path / f"shard-{s}.tar", _images(3, seed=s), 3 * s)
    storage = hotset.TarStorage(str(tmp_path / "shard-{0..1}.tar"))
    assert len(storage) == 6 and storage.read_many(range(6))
    assert "no lock" in caplog.text


def test_tar_reads_neighbours_in_one_request(tmp_path):
    images = _images(20)
    _write_tar(tmp_path / "a.tar", images, 0)
    storage = hotset.TarStorage(str(tmp_path / "a.tar"), merge_gap=0)
    assert storage.read_many(list(range(20))) and storage.requests == 1
    far = hotset.TarStorage(str(tmp_path / "a.tar"), merge_gap=0)
    far.read_many([0, 19])
    assert far.requests == 2


@pytest.mark.parametrize("sampler,policy", SYSTEMS)
def test_parquet(tmp_path, sampler, policy):
    import pyarrow as pa
    import pyarrow.parquet as pq

    images = _images()
    table = pa.table({
        "image": [_png(x) for x in images], "label": [i % 3 for i in range(N)],
        "caption": [f"sample {i}" for i in range(N)],
    })  # fmt: skip
    pq.write_table(table, tmp_path / "part-0.parquet", row_group_size=16)
    storage = open_storage(str(tmp_path))
    assert type(storage).__name__ == "ParquetStorage"
    assert storage.input_field == "image" and storage.target_field == "label"
    assert storage.labels.tolist() == [i % 3 for i in range(N)]
    assert _run(str(tmp_path), lambda i: (_chw(images[i]), i % 3), sampler=sampler, policy=policy)


@pytest.mark.parametrize("sampler,policy", SYSTEMS)
def test_hugging_face_dataset_saved_to_disk(tmp_path, sampler, policy):
    datasets = pytest.importorskip("datasets")
    images = _images()
    ds = datasets.Dataset.from_dict(
        {"image": [Image.fromarray(x) for x in images], "label": [i % 3 for i in range(N)]},
        features=datasets.Features(
            {"image": datasets.Image(), "label": datasets.ClassLabel(names=["a", "b", "c"])}
        ),
    )
    ds.save_to_disk(str(tmp_path / "hf"))
    assert detect_format(str(tmp_path / "hf")) == "hf"
    storage = open_storage(str(tmp_path / "hf"))
    assert storage.classes == ["a", "b", "c"]
    assert _run(str(tmp_path / "hf"), lambda i: (_chw(images[i]), i % 3), sampler=sampler,
                policy=policy)  # fmt: skip


def _jpeg_folder(root: Path, n=N) -> dict[str, tuple[bytes, int]]:
    rng = np.random.default_rng(3)
    files = {}
    for i in range(n):
        cls = ("cat", "dog", "eel")[i % 3]
        (root / cls).mkdir(parents=True, exist_ok=True)
        h, w = int(rng.integers(14, 30)), int(rng.integers(14, 30))
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(buf, "JPEG")
        (root / cls / f"{i:04d}.jpg").write_bytes(buf.getvalue())
        files[f"{cls}/{i:04d}.jpg"] = (buf.getvalue(), i % 3)
    return files


def _pil_direct(data: bytes, size) -> torch.Tensor:
    img = Image.open(io.BytesIO(data)).convert("RGB").resize(size)
    return _chw(np.asarray(img))


@pytest.mark.parametrize("sampler,policy", SYSTEMS)
def test_imagefolder_of_rgb_jpegs_of_mixed_sizes(tmp_path, sampler, policy):
    root = tmp_path / "folder"
    files = _jpeg_folder(root)
    before = sorted(str(p) for p in root.rglob("*"))
    storage = open_storage(str(root))
    assert not storage.content_keyed and storage.classes == ["cat", "dog", "eel"]

    def expect(i):
        data, label = files[storage.manifest.paths[i]]
        return _pil_direct(data, (16, 16)), label

    assert _run(str(root), expect, sampler=sampler, policy=policy, size=(16, 16))
    assert sorted(str(p) for p in root.rglob("*")) == before  # nothing written in the tree


def test_mixed_sizes_without_size_name_the_samples(tmp_path):
    root = tmp_path / "folder"
    _jpeg_folder(root, 12)
    loader = hotset.make_loader(
        str(root), batch_size=12, cache_fraction=0.2, num_workers=0, store="memory"
    )
    with loader, pytest.raises(ConfigError, match=r"differ in shape.*size=\(width, height\)"):
        next(iter(loader))


class _Items(torch.utils.data.Dataset):
    """A user's map-style Dataset: a tensor image and an int label per item."""

    def __init__(self, images):
        self.images = images

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        return _chw(self.images[i]), i % 3


@pytest.mark.parametrize("sampler,policy", SYSTEMS)
def test_torch_dataset(sampler, policy):
    images = _images()
    assert _run(_Items(images), lambda i: (_chw(images[i]), i % 3), sampler=sampler,
                policy=policy)  # fmt: skip


def test_tensor_dataset_targets_keep_their_shape():
    """A TensorDataset's 0-d class targets batch as (B,), as a DataLoader's do (a 0-d
    array written as .npy once came back (1,): cross_entropy refused the batch)."""
    from torch.utils.data import TensorDataset

    x = torch.randn(40, 1, 4, 4)
    y = torch.arange(40) % 3
    source = hotset.from_dataset(TensorDataset(x, y))
    with hotset.make_loader(source, batch_size=8, system="minio", cache_fraction=0.5,
                            num_workers=0) as loader:  # fmt: skip
        for epoch in range(2):  # from storage, then hits
            loader.set_epoch(epoch)
            for xb, yb, ids in loader:
                assert yb.shape == (8,) and torch.equal(yb, y[ids])
                assert torch.equal(xb, x[ids])
                hotset.per_sample_loss(torch.randn(8, 3), yb)  # takes the targets as they are
        assert loader.counters()["hits"] > 0


def test_dict_samples_with_a_collate_fn(tmp_path):
    """Tar samples keep all their fields; a user's collate_fn gets them all."""
    images = _images(16)
    _write_tar(tmp_path / "a.tar", images, 0)

    def collate(pairs):
        return {"n": len(pairs)}, [y for _, y in pairs]

    seen = []
    with hotset.make_loader(str(tmp_path / "a.tar"), batch_size=4, cache_fraction=0.5,
                            num_workers=0, store="memory", collate_fn=collate) as loader:
        for inputs, targets, ids in loader:
            assert inputs == {"n": len(ids)} and targets == [i % 3 for i in ids.tolist()]
            seen += ids.tolist()
    assert sorted(seen) == list(range(16))


def test_a_changed_file_is_never_served_from_the_cache(tmp_path):
    """ImageFolder keys name files; an entry written for a key never serves other bytes,
    and a file that changed size since it was listed is reported, naming it."""
    root = tmp_path / "folder"
    _jpeg_folder(root, 6)
    storage = open_storage(str(root))
    entry = storage.to_entry(storage.keys[0], b"bytes")
    assert storage.from_entry(storage.keys[0], entry) == b"bytes"
    assert storage.from_entry(storage.keys[1], entry) is None  # another sample's key
    assert storage.from_entry(storage.keys[0], entry[:-1] + b"X") is None
    Path(root, storage.manifest.paths[2]).write_bytes(b"short")
    with pytest.raises(hotset.CorruptSampleError, match=storage.manifest.paths[2]):
        storage.read(2)


def test_targets_from_the_sample_a_segmentation_mask(tmp_path):
    """Samples whose target is an array (a mask) and no class list: the target field is
    named, and the batch's targets are the stacked masks."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from hotset.codecs import npy_bytes

    images = _images(24)
    masks = [(x[..., 0] > 127).astype(np.uint8) for x in images]
    pq.write_table(
        pa.table({"image": [_png(x) for x in images], "mask": [npy_bytes(m) for m in masks]}),
        tmp_path / "seg.parquet", row_group_size=8,
    )  # fmt: skip
    storage = open_storage(str(tmp_path / "seg.parquet"), target_field="mask")
    assert storage.labels.tolist() == [-1] * 24 and storage.classes == []
    seen = 0
    with hotset.make_loader(storage, batch_size=6, cache_fraction=0.5, num_workers=2) as loader:
        for inputs, targets, ids in loader:
            for k, i in enumerate(ids.tolist()):
                assert torch.equal(inputs[k], _chw(images[i]))
                assert torch.equal(targets[k], torch.from_numpy(masks[i]))
            seen += len(ids)
    assert seen == 24


def _mapped(pid: int, path) -> bool:
    """Whether process ``pid`` maps the file ``path``."""
    with open(f"/proc/{pid}/maps") as f:
        return str(path) in f.read()


def test_a_manifest_is_mapped_from_one_file_the_node_shares(fmnist_dir, tmp_path):
    """``manifest.json`` is checked once and kept as columns in the user's index cache:
    the loader's workers and another process (a second rank) map that one file
    read-only, no process parses the JSON again or holds a copy; a rewritten manifest
    gets a new file and the stale one goes; a damaged file is built again."""
    import shutil
    import subprocess
    import sys

    from hotset.storage import FileStorage

    data = tmp_path / "data"
    shutil.copytree(fmnist_dir / "train", data)
    storage = FileStorage(str(data))
    cache = tmp_path / "cache" / "index"
    (columns,) = cache.glob("manifest-*")
    assert not storage.manifest.sizes.flags.writeable  # a view of the mapped file
    assert _mapped(os.getpid(), columns)
    children = Path(f"/proc/self/task/{os.getpid()}/children")
    before = set(children.read_text().split())  # (a server another test started)
    with hotset.make_loader(storage, batch_size=50, num_workers=2, persistent_workers=True,
                            cache_fraction=0.2) as loader:  # fmt: skip
        loader.set_epoch(0)
        next(iter(loader))
        workers = [int(p) for p in set(children.read_text().split()) - before]
        assert workers and all(_mapped(w, columns) for w in workers)
    rank = subprocess.run(
        [sys.executable, "-c", "import os, hotset; s = hotset.FileStorage(os.sys.argv[1]); "
         "print(int(str(os.sys.argv[2]) in open('/proc/self/maps').read()), len(s))",
         str(data), str(columns)],
        capture_output=True, text=True, env={**os.environ},
    )  # fmt: skip
    assert rank.stdout.split() == ["1", str(len(storage))], rank.stderr
    assert list(cache.glob("manifest-*")) == [columns]  # the same file, not a second
    manifest = json.loads((data / "manifest.json").read_text())
    manifest["labels"][0] = (manifest["labels"][0] + 1) % len(manifest["classes"])
    (data / "manifest.json").write_text(json.dumps(manifest) + " ")
    assert FileStorage(str(data)).manifest.labels[0] == manifest["labels"][0]
    (fresh,) = cache.glob("manifest-*")
    assert fresh != columns
    (tmp_path / "cut").write_bytes(fresh.read_bytes()[:200])
    fresh.write_bytes(fresh.read_bytes()[:200])  # cut short: hotset's file, built again
    assert FileStorage(str(data)).manifest.labels[0] == manifest["labels"][0]
    with pytest.raises(ConfigError, match="cut is not a manifest's columns"):
        hotset.storage.manifest.Manifest.map_columns(str(tmp_path / "cut"))
