"""File-per-sample storage over a local directory or any fsspec URL, with a manifest."""

from __future__ import annotations

import posixpath

import fsspec

from hotset.errors import ConfigError, CorruptSampleError, MissingSampleError, StorageError
from hotset.storage.base import Storage
from hotset.storage.manifest import IMAGE_SUFFIXES, MANIFEST_NAME, Manifest, content_key


class FileStorage(Storage):
    """One file per sample under ``url`` (``/data/x``, ``file://...``, ``memory://...``,
    ``s3://...``: anything fsspec opens), described by ``url/manifest.json``.

    ``verify=True`` checks each read against the manifest's content digest, so a sample
    that changed or got corrupted on the storage is reported, never served.
    """

    def __init__(
        self,
        url: str,
        *,
        verify: bool = True,
        concurrency: int = 8,
        build_manifest: bool = False,
        storage_options: dict | None = None,
    ) -> None:
        self.url = str(url)
        self.verify = verify
        self.concurrency = int(concurrency)
        self._fs, self._root = fsspec.core.url_to_fs(self.url, **(storage_options or {}))
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

    def read(self, i: int) -> bytes:
        i = int(i)
        if not 0 <= i < len(self.manifest):
            raise IndexError(f"sample id {i} out of range for {len(self.manifest)} samples")
        path = self.path(i)
        key = self.manifest.keys[i]
        try:
            data = self._fs.cat_file(path)
        except FileNotFoundError as exc:
            raise MissingSampleError(i, path, "file not found", key) from exc
        except OSError as exc:
            raise StorageError(i, path, f"read failed: {exc}", key) from exc
        if self.verify and content_key(data) != key:
            raise CorruptSampleError(
                i, path, f"content digest {content_key(data)} does not match manifest", key
            )
        return data


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
