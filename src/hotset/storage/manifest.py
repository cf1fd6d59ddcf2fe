"""The manifest of a dataset: per-sample path, global key, size in bytes and label.

Built once (reading every sample to digest it) and stored as ``manifest.json`` beside
the data, so every job addresses a sample by the same global key (docs/design.md: keys are
content digests, so jobs on overlapping datasets share cache entries).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Annotated

import msgspec
import numpy as np

from hotset.errors import ConfigError
from hotset.storage import column_file
from hotset.storage.columns import DigestColumn, StringColumn, key_column, text_column

MANIFEST_NAME = "manifest.json"
FORMAT = "hotset-manifest/1"
COLUMNS_MAGIC = column_file.MAGIC  # a manifest's columns, mapped by every process that opens it
KEY_KIND = "blake2b-128"  # keys are digests of the samples' bytes
LOCATION_KIND = "location-blake2b-128"  # keys name where samples live (location_key)
KEY_KINDS = (KEY_KIND, LOCATION_KIND)
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm")


class _Document(msgspec.Struct):
    """``manifest.json`` as declared: a field missing or of the wrong type is named."""

    format: str
    paths: list[str]
    keys: list[str]
    sizes: list[Annotated[int, msgspec.Meta(ge=0)]]
    labels: list[int]
    classes: list[str] = []
    name: str = ""
    key_kind: str = KEY_KIND


#: what a relative path inside the dataset never holds (each path is framed by newlines)
_ESCAPES = ("\n/", "/../", "\n../", "/..\n", "\n..\n", "\\", "://", "\n\n", "\x00")


def _check_paths(paths: list[str], where: str) -> None:
    """Every path stays inside the dataset's root: relative, no ``..`` step, no URL."""
    framed = "\n" + "\n".join(paths) + "\n"
    if not any(bad in framed for bad in _ESCAPES):
        return
    for i, p in enumerate(paths):  # only on failure: name the first offender
        if any(bad in f"\n{p}\n" for bad in _ESCAPES):
            raise ConfigError(
                f"{where}: paths[{i}] = {p!r} leaves the dataset's directory (absolute, "
                "'..', a URL or empty): refusing the manifest"
            )


def content_key(data: bytes) -> str:
    """Global key of a sample: the BLAKE2b-128 digest of its bytes, in hex."""
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def location_key(*parts: object) -> str:
    """Key of a sample known by where it lives (source, member, size, version...) before
    its bytes are read: a BLAKE2b-128 digest of the parts, in hex."""
    return location_digest(*parts).hex()


def location_digest(*parts: object) -> bytes:
    """``location_key``'s 16 raw bytes."""
    text = "\x00".join(str(p) for p in parts)
    return hashlib.blake2b(text.encode(), digest_size=16, person=b"hotset-loc").digest()


@dataclass(eq=False)
class Manifest:
    """Per-sample columns, held compactly (``columns.py``: ~16 B per key, the path's text
    plus 8 B, 8 B each for size and label), so a manifest of 10M samples stays in numpy
    buffers; ``paths`` and ``keys`` accept any iterables of strings."""

    paths: Sequence[str]
    keys: Sequence[str]
    sizes: np.ndarray  # int64 bytes
    labels: np.ndarray  # int64 class index
    classes: list[str] = field(default_factory=list)
    name: str = ""
    key_kind: str = KEY_KIND

    def __post_init__(self) -> None:
        self.paths = text_column(self.paths)
        self.keys = key_column(self.keys)
        self.sizes = np.asarray(self.sizes, dtype=np.int64)
        self.labels = np.asarray(self.labels, dtype=np.int64)
        n = len(self.paths)
        if not (len(self.keys) == n == len(self.sizes) == len(self.labels)):
            raise ConfigError("manifest: paths, keys, sizes and labels differ in length")

    def __len__(self) -> int:
        return len(self.paths)

    @property
    def total_bytes(self) -> int:
        return int(self.sizes.sum())

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": FORMAT,
                "key_kind": self.key_kind,
                "name": self.name,
                "classes": self.classes,
                "paths": list(self.paths),
                "keys": list(self.keys),
                "sizes": self.sizes.tolist(),
                "labels": self.labels.tolist(),
            }
        )

    @classmethod
    def from_json(cls, text: str, where: str = "manifest") -> Manifest:
        """Parse and check a manifest (untrusted input): fields and types as declared,
        paths inside the dataset, labels within the class list, keys of the known kind."""
        try:
            doc = msgspec.json.decode(text, type=_Document)
        except msgspec.DecodeError as exc:  # ValidationError names the field
            raise ConfigError(f"{where}: {exc}") from exc
        if doc.format != FORMAT:
            raise ConfigError(f"{where}: format {doc.format!r}, expected {FORMAT!r}")
        if doc.key_kind not in KEY_KINDS:
            raise ConfigError(f"{where}: key_kind {doc.key_kind!r}, expected one of {KEY_KINDS}")
        _check_paths(doc.paths, where)
        labels = np.asarray(doc.labels, dtype=np.int64)
        if doc.classes and labels.size:
            bad = np.flatnonzero((labels < 0) | (labels >= len(doc.classes)))
            if bad.size:
                raise ConfigError(
                    f"{where}: labels[{bad[0]}] = {labels[bad[0]]} is not a class index "
                    f"(0..{len(doc.classes) - 1}, {len(doc.classes)} classes)"
                )
        return cls(doc.paths, doc.keys, doc.sizes, labels, doc.classes, doc.name, doc.key_kind)

    @classmethod
    def from_samples(
        cls, samples: Iterable[tuple[str, bytes, int]], classes: list[str], name: str = ""
    ) -> Manifest:
        """Build from ``(relative path, bytes, label)`` triples."""
        paths, keys, sizes, labels = [], [], [], []
        for path, data, label in samples:
            paths.append(path)
            keys.append(content_key(data))
            sizes.append(len(data))
            labels.append(label)
        return cls(paths, keys, sizes, labels, classes, name)

    def to_columns(self) -> bytearray:
        """The manifest as one file of columns (``map_columns``, ``column_file.py``; the
        columns copied once, into the file's bytes)."""
        paths = self.paths if isinstance(self.paths, StringColumn) else StringColumn(self.paths)
        parts = {"sizes": self.sizes, "labels": self.labels, "path_ends": paths._ends,
                 "path_blob": np.frombuffer(paths._blob, np.uint8)}  # fmt: skip
        if isinstance(self.keys, DigestColumn):
            parts["keys"] = self.keys.raw
        else:
            keys = StringColumn(self.keys)
            parts["key_ends"] = keys._ends
            parts["key_blob"] = np.frombuffer(keys._blob, np.uint8)
        out, columns = column_file.new_buffer(
            {k: (a.dtype, a.shape) for k, a in parts.items()},
            {"format": FORMAT, "n": len(self), "classes": self.classes, "name": self.name,
             "key_kind": self.key_kind},
        )  # fmt: skip
        for k, a in parts.items():
            columns[k][...] = a
        return out

    @classmethod
    def map_columns(cls, path: str, where: str = "manifest") -> Manifest:
        """The manifest ``to_columns`` wrote at ``path``, its columns mapped read-only: the
        processes of a node that open it share its pages (no copy per rank or worker)."""
        try:
            header, column = column_file.map_file(path, FORMAT, "a manifest's columns")
            paths = StringColumn._of(column["path_blob"], column["path_ends"])
            if "keys" in column:
                keys = DigestColumn.of_raw(column["keys"])
            else:
                keys = StringColumn._of(column["key_blob"], column["key_ends"])
            return cls(paths, keys, column["sizes"], column["labels"], header["classes"],
                       header["name"], header["key_kind"])  # fmt: skip
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from exc
        except (KeyError, TypeError) as exc:
            raise ConfigError(f"{where}: {path} is not a manifest's columns ({exc})") from exc

    def take(self, idx: np.ndarray, name: str = "") -> Manifest:
        """The samples ``idx`` (in that order) as a manifest of their own."""
        idx = np.asarray(idx, np.int64)
        return Manifest(
            self.paths.take(idx), self.keys.take(idx), self.sizes[idx], self.labels[idx],
            self.classes, name or self.name, self.key_kind,
        )  # fmt: skip
