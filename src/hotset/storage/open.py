"""A path, URL or torch Dataset -> the Storage that reads it (``format=`` names one, else
it is detected from what is there)."""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Sequence
from typing import Any

import fsspec

from hotset.errors import ConfigError, ShardError
from hotset.io.reader import Retry, remote_call
from hotset.storage.base import Storage
from hotset.storage.manifest import MANIFEST_NAME

FORMATS = ("files", "imagefolder", "tar", "parquet", "hf")


def storage_class(fmt: str) -> type[Storage]:
    if fmt in ("files", "imagefolder"):
        from hotset.storage.files import FileStorage as cls
    elif fmt == "tar":
        from hotset.storage.tar import TarStorage as cls
    elif fmt == "parquet":
        from hotset.storage.parquet import ParquetStorage as cls
    elif fmt == "hf":
        from hotset.storage.parquet import ArrowStorage as cls
    else:
        raise ConfigError(f"format={fmt!r}: one of {FORMATS}")
    return cls


def detect_format(url: str | Sequence[str], storage_options: dict | None = None) -> str:
    """What lies at ``url``: ``files`` (a ``manifest.json``), ``hf`` (``save_to_disk``),
    ``tar`` / ``parquet`` (such files, or a directory or glob of them), else
    ``imagefolder``."""
    if not isinstance(url, str):
        url = str(url[0])
    name = url.rstrip("/").lower()
    for ext, fmt in ((".tar", "tar"), (".parquet", "parquet")):
        if name.endswith(ext) or name.endswith(ext + "}"):
            return fmt
    one_slash = re.match(r"^([a-z][a-z0-9+.-]+):/(?!/)", url)
    if one_slash:
        scheme = one_slash.group(1)
        raise ConfigError(f"{url}: a URL takes two slashes after '{scheme}:' "
                          f"({scheme}://{url[len(scheme) + 2 :]})")  # fmt: skip
    fs, root = fsspec.core.url_to_fs(url, **(storage_options or {}))
    try:  # (retried, and a failure named: unreachable, forbidden, ...)
        listing = remote_call(fs, url, lambda: fs.ls(root, detail=False), Retry())
    except ShardError as exc:
        if exc.kind == "not found":
            raise ConfigError(f"{url}: {_missing(fs, url, root)}") from exc
        raise
    if not fs.isdir(root):
        raise ConfigError(f"{url}: a file hotset cannot read; name its format= ({FORMATS})")
    names = {posixpath.basename(p.rstrip("/")) for p in listing}
    if MANIFEST_NAME in names:
        return "files"
    if "state.json" in names and "dataset_info.json" in names:
        return "hf"
    for ext, fmt in ((".tar", "tar"), (".parquet", "parquet")):
        if any(n.endswith(ext) for n in names):
            return fmt
    return "imagefolder"


def _missing(fs: fsspec.AbstractFileSystem, url: str, root: str) -> str:
    """What is missing at ``url``: its bucket (on an object store), or the path in it."""
    bucket = root.split("/", 1)[0]
    if "://" in url and not url.startswith(("file:", "http")) and bucket != root.rstrip("/"):
        try:
            if not fs.exists(bucket):
                return f"no such bucket {bucket!r}"
        except Exception:  # noqa: BLE001 - (the plain message then)
            pass
    return "no such file or directory"


def open_storage(
    source: Any, format: str | None = None, storage_options: dict[str, Any] | None = None,
    **options: Any,
) -> Storage:
    """The storage of ``source``: a ``Storage`` as it is, a map-style torch ``Dataset``
    (``from_dataset``), or a path / URL / list of shard URLs in ``format`` (detected when
    not given). ``options`` go to the storage's constructor (``keep`` to tar shards'
    alone)."""
    if isinstance(source, Storage):
        return source
    if isinstance(source, str | os.PathLike) or (
        isinstance(source, list | tuple) and source and isinstance(source[0], str | os.PathLike)
    ):
        url = os.fspath(source) if isinstance(source, str | os.PathLike) else list(source)
        fmt = format or detect_format(url, storage_options)
        if storage_options:
            options["storage_options"] = storage_options
        if fmt != "tar":
            options.pop("keep", None)  # (only a tar set reads whole shards to index them)
            options.pop("kept", None)
        return storage_class(fmt)(url, **options)
    if hasattr(source, "__getitem__") and hasattr(source, "__len__"):
        from hotset.storage.torch_dataset import DatasetStorage

        return DatasetStorage(source, **options)
    raise ConfigError(
        f"cannot read a {type(source).__qualname__}: give a Storage, a path or URL, or a "
        "map-style torch Dataset"
    )


def from_dataset(dataset: Any, *, name: str | None = None, probe: int = 8) -> Storage:
    """A map-style torch ``Dataset`` as a storage hotset caches (``torch_dataset.py``)."""
    from hotset.storage.torch_dataset import DatasetStorage

    return DatasetStorage(dataset, name=name, probe=probe)
