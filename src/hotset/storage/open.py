"""A path, URL or torch Dataset -> the Storage that reads it (``format=`` names one of the
registered formats, ``storage/formats.py``; else it is detected from what is there)."""

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
from hotset.storage.formats import by_suffix, formats, in_directory


def detect_format(url: str | Sequence[str], storage_options: dict | None = None) -> str:
    """The format of what lies at ``url``, by its name or the names in it
    (``storage/formats.py``)."""
    if not isinstance(url, str):
        url = str(url[0])
    named = by_suffix(url)
    if named is not None:
        return named
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
        raise ConfigError(
            f"{url}: a file hotset cannot read; name its format= ({', '.join(formats())})"
        )
    return in_directory(posixpath.basename(p.rstrip("/")) for p in listing)


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
        known = formats().lookup(fmt)
        if not known.indexes_whole:
            options.pop("keep", None)
            options.pop("wants", None)
        return known.opens(url, **options)
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
