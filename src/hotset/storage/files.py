"""File-per-sample storage over a local directory or any fsspec URL, with a manifest."""

from __future__ import annotations

import os
import posixpath
from collections.abc import Sequence

import fsspec

from hotset.errors import ConfigError, CorruptSampleError, MissingSampleError, StorageError
from hotset.io.reader import BatchReader, Retry, reader_of
from hotset.storage.base import Storage
from hotset.storage.manifest import IMAGE_SUFFIXES, MANIFEST_NAME, Manifest, content_key


class FileStorage(Storage):
    """One file per sample under ``url`` (``/data/x``, ``file://...``, ``http://...``,
    ``s3://...``: anything fsspec opens), described by ``url/manifest.json``.

    ``verify=True`` checks each read against the manifest's content digest, so a sample
    that changed or got corrupted on the storage is reported, never served. A batch's
    reads are one call with up to ``concurrency`` in flight, transient failures retried
    as ``retry`` says (``io/reader.py``); each process (each DataLoader worker) opens the
    filesystem and its connections itself. ``retries`` counts the reads tried again.
    """

    def __init__(
        self,
        url: str,
        *,
        verify: bool = True,
        concurrency: int = 8,
        build_manifest: bool = False,
        storage_options: dict | None = None,
        retry: Retry | None = None,
    ) -> None:
        self.url = str(url)
        self.verify = verify
        self.concurrency = int(concurrency)
        self.retry = retry or Retry()
        self.storage_options = dict(storage_options or {})
        self._fs, self._root = fsspec.core.url_to_fs(self.url, **self.storage_options)
        mpath = posixpath.join(self._root, MANIFEST_NAME)
        if self._fs.exists(mpath):
            self.manifest = Manifest.from_json(self._fs.cat_file(mpath).decode(), mpath)
        elif build_manifest:
            self.manifest = scan_imagefolder(self._fs, self._root)
            self._fs.pipe_file(mpath, self.manifest.to_json().encode())
        else:
            raise ConfigError(
                f"no {MANIFEST_NAME} in {self.url}: prepare the data with `hotset prepare`, "
                "or pass build_manifest=True for an ImageFolder-layout tree"
            )

    def path(self, i: int) -> str:
        return posixpath.join(self._root, self.manifest.paths[i])

    def describe(self, i: int) -> str:
        return self.path(i)

    @property
    def reader(self) -> BatchReader:
        """This process's reader (its own filesystem instance and connections)."""

        def make() -> BatchReader:
            fs = self._fs
            if fs.__dict__.get("_pid", os.getpid()) != os.getpid():  # an async one, forked
                fs = fsspec.core.url_to_fs(self.url, **self.storage_options)[0]
            return BatchReader(fs, self.concurrency, self.retry)

        return reader_of(self, make)

    @property
    def retries(self) -> int:
        return self.reader.retries

    def read(self, i: int) -> bytes:
        return self.read_many([i])[0]

    def read_many(self, ids: Sequence[int]) -> list[bytes]:
        ids = [int(i) for i in ids]
        for i in ids:
            if not 0 <= i < len(self.manifest):
                raise IndexError(f"sample id {i} out of range for {len(self.manifest)} samples")
        paths = [self.path(i) for i in ids]
        out = self.reader.read(paths)
        for i, path, data in zip(ids, paths, out, strict=True):
            key = self.manifest.keys[i]
            if isinstance(data, FileNotFoundError):
                raise MissingSampleError(i, path, "file not found", key) from data
            if isinstance(data, BaseException):
                raise StorageError(
                    i, path, f"read failed after {self.retry.attempts} attempts: {data!r}", key
                ) from data
            if self.verify and content_key(data) != key:
                raise CorruptSampleError(
                    i, path, f"content digest {content_key(data)} does not match manifest", key
                )
        return out

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        state.pop("_batch_reader", None)
        state.pop("_batch_reader_pid", None)
        return state


def list_imagefolder(
    fs: fsspec.AbstractFileSystem, root: str
) -> tuple[list[str], list[tuple[str, int]]]:
    """Classes (sorted by name) and ``(relative path, label)`` of an ImageFolder tree
    (``root/<class>/<image>``)."""
    classes = sorted(
        posixpath.basename(p.rstrip("/")) for p in fs.ls(root, detail=False) if fs.isdir(p)
    )
    if not classes:
        raise ConfigError(f"{root}: no class sub-folders (expected root/<class>/<image>)")
    files = [
        (posixpath.relpath(f, root), label)
        for label, cls in enumerate(classes)
        for f in sorted(fs.find(posixpath.join(root, cls)))
        if f.lower().endswith(IMAGE_SUFFIXES)
    ]
    if not files:
        raise ConfigError(f"{root}: no image files ({', '.join(IMAGE_SUFFIXES)}) in class folders")
    return classes, files


def scan_imagefolder(fs: fsspec.AbstractFileSystem, root: str, name: str = "") -> Manifest:
    """Manifest of an ImageFolder tree, reading every file once to digest it."""
    classes, files = list_imagefolder(fs, root)
    samples = ((rel, fs.cat_file(posixpath.join(root, rel)), label) for rel, label in files)
    return Manifest.from_samples(samples, classes, name or posixpath.basename(root.rstrip("/")))
