"""File-per-sample storage over a local directory or any fsspec URL: a tree that
``hotset prepare`` wrote (with its ``manifest.json``), or an ImageFolder as it is."""

from __future__ import annotations

import hashlib
import json
import posixpath
from collections.abc import Sequence

import fsspec
import numpy as np

from hotset.errors import ConfigError, CorruptSampleError, MissingSampleError, StorageError
from hotset.ids import ids_within
from hotset.io.reader import Retry, read_failure
from hotset.storage.base import TAG, FsspecStorage, concurrency_for
from hotset.storage.columns import StringColumn, concat, key_column
from hotset.storage.formats import FALLBACK, Format, register_format
from hotset.storage.index_cache import cached_mapped
from hotset.storage.manifest import (
    COLUMNS_MAGIC,
    IMAGE_SUFFIXES,
    KEY_KIND,
    LOCATION_KIND,
    MANIFEST_NAME,
    Manifest,
    content_key,
    location_key,
)


class FileStorage(FsspecStorage):
    """One file per sample under ``url`` (``/data/x``, ``file://...``, ``http://...``,
    ``s3://...``: anything fsspec opens), described by ``url/manifest.json``, or else an
    ImageFolder tree (``url/<class>/<image>``) indexed from its listing alone: paths,
    sizes and labels, kept in the user's index cache (``index_cache.py``, never in the
    source tree) and refreshed when the listing changes. An ImageFolder's keys name each
    file (path, size, modification time or ETag), and a cache entry carries a digest
    of the bytes taken at first read (``Storage.content_keyed``).

    ``verify=True`` checks each read against the manifest's content digest (an
    ImageFolder's against its listed size), so a sample that changed or got corrupted
    on the storage is reported, never served. A batch's
    reads are one call with up to ``concurrency`` in flight (default: 32 on an object
    store, 8 on local files: ``storage.base.concurrency_for``), transient failures retried
    as ``retry`` says (``io/reader.py``); each process (each DataLoader worker) opens the
    filesystem and its connections itself (``node_concurrency``: in flight across the
    processes, ``FsspecStorage``). ``retries`` counts the reads tried again.
    """

    def __init__(
        self,
        url: str,
        *,
        verify: bool = True,
        concurrency: int | None = None,
        node_concurrency: int | None = None,
        storage_options: dict | None = None,
        retry: Retry | None = None,
    ) -> None:
        self.url = str(url)
        self.verify = verify
        self.retry = retry or Retry()
        self.storage_options = dict(storage_options or {})
        self._fs, self._root = fsspec.core.url_to_fs(self.url, **self.storage_options)
        self._prefix = posixpath.join(self._root, "")  # a sample's path: this + its own
        self.concurrency = concurrency_for(self._fs, concurrency)
        self._bound_node(node_concurrency)
        mpath = posixpath.join(self._root, MANIFEST_NAME)
        try:
            info = self._fs.info(mpath)  # one request: whether it is there, and its version
        except FileNotFoundError:
            info = None
        if info is not None:
            self.manifest = mapped_manifest(self._fs, mpath, info)
        else:
            self.manifest = index_imagefolder(self._fs, self._root, self.url)
        self.content_keyed = self.manifest.key_kind == KEY_KIND

    def path(self, i: int) -> str:
        return self._prefix + self.manifest.paths[i]

    def describe(self, i: int) -> str:
        return self.path(i)

    def read_many(self, ids: Sequence[int]) -> list[bytes]:
        ids = np.asarray(ids, np.int64)
        if not ids_within(ids, len(self.manifest)):
            bad = ids[(ids < 0) | (ids >= len(self.manifest))][0]
            raise IndexError(f"sample id {bad} out of range for {len(self.manifest)} samples")
        paths = [self._prefix + p for p in self.manifest.paths.take(ids)]
        out = self.reader.read(paths)
        keys = self.manifest.keys.take(ids)
        sizes = self.manifest.sizes[ids].tolist()
        for i, path, data, key, size in zip(ids.tolist(), paths, out, keys, sizes, strict=True):
            if isinstance(data, FileNotFoundError):
                raise MissingSampleError(i, path, "file not found", key) from data
            if isinstance(data, BaseException):
                raise StorageError(i, path, read_failure(data, self.retry), key) from data
            if not self.verify:
                continue
            if self.content_keyed and content_key(data) != key:
                raise CorruptSampleError(
                    i, path, f"content digest {content_key(data)} does not match manifest", key
                )
            if not self.content_keyed and len(data) + TAG != size:
                raise CorruptSampleError(
                    i, path, f"{len(data)} bytes, the index says "
                    f"{size - TAG}: changed since it was listed", key,
                )  # fmt: skip
        return out


def _version(info: dict) -> str:
    """What changes when a listed file is rewritten: its ETag or modification time."""
    for k in ("ETag", "etag", "mtime", "LastModified", "last_modified", "updated", "created"):
        if info.get(k) is not None:
            return str(info[k])
    return ""


def imagefolder_classes(fs: fsspec.AbstractFileSystem, root: str) -> list[str]:
    """An ImageFolder tree's classes (``root/<class>/``), sorted by name."""
    classes = sorted(
        posixpath.basename(p.rstrip("/")) for p in fs.ls(root, detail=False) if fs.isdir(p)
    )
    if not classes:
        raise ConfigError(
            f"{root}: neither a {MANIFEST_NAME} nor class sub-folders (an ImageFolder is "
            "root/<class>/<image>); name another format with format="
        )
    return classes


def class_files(fs: fsspec.AbstractFileSystem, root: str, cls: str) -> list[tuple[str, dict]]:
    """``(relative path, listing info)`` of one class's image files, sorted by path."""
    found = fs.find(posixpath.join(root, cls), detail=True)
    return [(posixpath.relpath(f, root), found[f]) for f in sorted(found)
            if f.lower().endswith(IMAGE_SUFFIXES)]  # fmt: skip


def _no_images(root: str) -> ConfigError:
    return ConfigError(f"{root}: no image files ({', '.join(IMAGE_SUFFIXES)}) in class folders")


def list_imagefolder(
    fs: fsspec.AbstractFileSystem, root: str
) -> tuple[list[str], list[tuple[str, int, dict]]]:
    """Classes (sorted by name) and ``(relative path, label, listing info)`` of an
    ImageFolder tree (``root/<class>/<image>``), from the listing alone."""
    classes = imagefolder_classes(fs, root)
    files = [(rel, label, info) for label, cls in enumerate(classes)
             for rel, info in class_files(fs, root, cls)]  # fmt: skip
    if not files:
        raise _no_images(root)
    return classes, files


def index_imagefolder(fs: fsspec.AbstractFileSystem, root: str, url: str) -> Manifest:
    """The manifest of an ImageFolder tree from its listing (no file is read), kept in the
    user's index cache under the URL and a fingerprint of the listing. The listing is
    taken a class at a time and kept as columns (paths, sizes, versions), so a tree of
    millions of files never holds a Python object per file; a cached index is mapped."""
    classes = imagefolder_classes(fs, root)
    fingerprint = hashlib.blake2b(json.dumps([COLUMNS_MAGIC.decode(), classes]).encode())
    parts = []  # per class: its label, paths, sizes and versions
    for label, cls in enumerate(classes):
        files = class_files(fs, root, cls)
        if not files:
            continue
        sizes = [info.get("size") for _, info in files]
        if any(s is None for s in sizes):  # a listing without sizes (HTTP): ask per file
            sizes = [s if s is not None else fs.size(posixpath.join(root, rel))
                     for s, (rel, _) in zip(sizes, files, strict=True)]  # fmt: skip
        rels, versions = [rel for rel, _ in files], [_version(info) for _, info in files]
        sizes = [int(size) for size in sizes]
        fingerprint.update(json.dumps([rels, sizes, versions]).encode())
        parts.append((label, StringColumn(rels), np.asarray(sizes, np.int64),
                      StringColumn(versions)))  # fmt: skip
    if not parts:
        raise _no_images(root)

    def build() -> bytes:
        keys = [key_column(location_key(url, rel, size, version) for rel, size, version
                           in zip(paths, sizes.tolist(), versions, strict=True))
                for _, paths, sizes, versions in parts]  # fmt: skip
        return Manifest(
            concat(*(p[1] for p in parts)), concat(*keys),
            np.concatenate([p[2] for p in parts]) + TAG,
            np.concatenate([np.full(len(p[1]), p[0], np.int64) for p in parts]),
            classes, posixpath.basename(root.rstrip("/")), LOCATION_KIND,
        ).to_columns()  # fmt: skip

    return _mapped("imagefolder", url, fingerprint.hexdigest(), build, f"index of {url}")


def _mapped(kind: str, url: str, fingerprint: str, build, where: str) -> Manifest:
    """The manifest kept as columns in the index cache, mapped; a damaged file there
    (hotset's own, not the user's data) is built again once."""
    return cached_mapped(kind, url, fingerprint, lambda tmp: tmp.write_bytes(build()),
                         lambda path: Manifest.map_columns(str(path), where), where)  # fmt: skip


def mapped_manifest(fs: fsspec.AbstractFileSystem, mpath: str, info: dict) -> Manifest:
    """``manifest.json`` at ``mpath``, checked once and kept as columns in the user's
    index cache (named by its URL, size and version): the node's ranks and workers map
    that one file, none parses the JSON again or holds a copy (``info``: its listing)."""
    fingerprint = json.dumps([COLUMNS_MAGIC.decode(), info.get("size"), _version(info)])

    def build() -> bytearray:
        return Manifest.from_json(fs.cat_file(mpath).decode(), mpath).to_columns()

    return _mapped("manifest", fs.unstrip_protocol(mpath), fingerprint, build, mpath)


register_format(Format("files", FileStorage, marker=frozenset({MANIFEST_NAME})))
register_format(Format(FALLBACK, FileStorage))  # class sub-folders of image files
