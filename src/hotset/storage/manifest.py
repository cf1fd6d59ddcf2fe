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

import numpy as np

from hotset.errors import ConfigError
from hotset.storage.columns import key_column, text_column

MANIFEST_NAME = "manifest.json"
FORMAT = "hotset-manifest/1"
KEY_KIND = "blake2b-128"
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm")


def content_key(data: bytes) -> str:
    """Global key of a sample: the BLAKE2b-128 digest of its bytes, in hex."""
    return hashlib.blake2b(data, digest_size=16).hexdigest()


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
                "key_kind": KEY_KIND,
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
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{where}: not valid JSON ({exc})") from exc
        if doc.get("format") != FORMAT:
            raise ConfigError(f"{where}: format {doc.get('format')!r}, expected {FORMAT!r}")
        return cls(
            paths=doc["paths"],
            keys=doc["keys"],
            sizes=doc["sizes"],
            labels=doc["labels"],
            classes=doc.get("classes", []),
            name=doc.get("name", ""),
        )

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

    def take(self, idx: np.ndarray, name: str = "") -> Manifest:
        """The samples ``idx`` (in that order) as a manifest of their own."""
        idx = np.asarray(idx, np.int64)
        return Manifest(
            self.paths.take(idx), self.keys.take(idx), self.sizes[idx], self.labels[idx],
            self.classes, name or self.name,
        )  # fmt: skip
