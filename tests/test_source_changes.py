"""A source rewritten under hotset: a tar shard rewritten in place with the same size (and
the same modification time, as a server without an ETag shows it) is never served cut at
the old offsets; the member headers a range read already holds are checked."""

from __future__ import annotations

import io
import os
import tarfile

import numpy as np
import pytest

import hotset
from hotset.errors import CorruptSampleError
from hotset.storage.records import decode_record


def write_npy_tar(path, arrays, names) -> None:
    with tarfile.open(path, "w") as tf:
        for name, arr in zip(names, arrays, strict=True):
            buf = io.BytesIO()
            np.save(buf, arr)
            for field, data in (("npy", buf.getvalue()), ("cls", b"1")):
                info = tarfile.TarInfo(f"{name}.{field}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))


def _arrays(n=9, seed=0):
    """Sizes symmetric about the middle: reversed, each member sits where another of its
    size sat (the same offsets, other names and bytes), the middle one where it sat."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 255, 100 + 700 * min(k, n - 1 - k), dtype=np.uint8)
            for k in range(n)]  # fmt: skip


def _npy(record: bytes) -> np.ndarray:
    return np.load(io.BytesIO(decode_record(record)["npy"]))


def test_a_shard_rewritten_with_the_same_size_and_time_is_never_served_cut(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("HOTSET_CACHE_DIR", str(tmp_path / "cache"))
    arrays, names = _arrays(), [f"s{k}" for k in range(9)]
    path = tmp_path / "shard-000.tar"
    write_npy_tar(path, arrays, names)
    st = os.stat(path)
    storage = hotset.open_storage(str(path))
    records = storage.read_many(range(9))
    assert all(np.array_equal(_npy(r), a) for r, a in zip(records, arrays, strict=True))

    # the same members in reverse order: the same size; its time set back as it was
    write_npy_tar(path, arrays[::-1], names[::-1])
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_size == st.st_size
    again = hotset.open_storage(str(path))  # a later job: the cached index is reused
    for s in (storage, again):
        with pytest.raises(CorruptSampleError, match="changed since it was indexed"):
            s.read_many(range(9))
    # the sample whose member sits where it sat (the middle one) is still right; no other
    # is served, and a loader that skips serves only right bytes
    assert np.array_equal(_npy(storage.read(4)), arrays[4])
    with hotset.make_loader(again, batch_size=3, capacity_bytes=0, num_workers=0,
                            store="memory", on_error="skip", max_skipped=1.0) as loader:
        served = [i for _, _, ids in loader for i in ids.tolist()]
    assert served == [4] and loader.counters()["skipped"] == 8
    # the dropped index is made again: the next loader reads the shard as it is now
    fresh = hotset.open_storage(str(path))
    by_name = dict(zip(names[::-1], arrays[::-1], strict=True))
    for i, record in enumerate(fresh.read_many(range(9))):
        name = fresh.manifest.paths[i].split("#", 1)[1]
        assert np.array_equal(_npy(record), by_name[name])
