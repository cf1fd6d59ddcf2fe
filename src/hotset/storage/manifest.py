"""The manifest of a dataset: per-sample path, global key, size in bytes and label.

Built once (reading every sample to digest it) and stored as ``manifest.json`` beside
the data, so every job addresses a sample by the same global key (docs/design.md: keys are
content digests, so jobs on overlapping datasets share cache entries).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from hotset.errors import ConfigError

MANIFEST_NAME = "manifest.json"
FORMAT = "hotset-manifest/1"
KEY_KIND = "blake2b-128"
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm")


def content_key(data: bytes) -> str:
    """Global key of a sample: the BLAKE2b-128 digest of its bytes, in hex."""
    return hashlib.blake2b(data, digest_size=16).hexdigest()


@dataclass
class Manifest:
    paths: list[str]
    keys: list[str]
    sizes: np.ndarray  # int64 bytes
    labels: np.ndarray  # int64 class index
    classes: list[str] = field(default_factory=list)
    name: str = ""

    def __post_init__(self) -> None:
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
                "paths": self.paths,
                "keys": self.keys,
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
