"""An existing map-style torch ``Dataset`` as a storage: ``hotset.from_dataset(ds)``.

Each item is serialised at its first read (``records.py``: arrays, tensors, PIL images,
numbers, text, lists and dicts; nothing pickled) and cached as those bytes, so a hit
costs a store read and a decode instead of the dataset's ``__getitem__`` (its file
reads, its decoding, its transforms: a random transform is then frozen into the cache,
so give such transforms to ``make_loader(transform=...)`` instead). Keys name the item
(the dataset's name and the index); each entry carries a digest taken at first read.

Sizes are not known before an item is read: they are estimated from the first
``probe`` items (serialised once when the storage is made), which the policies budget
with; the store counts the real bytes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hotset.errors import ConfigError, CorruptSampleError
from hotset.storage.base import TAG, Storage
from hotset.storage.manifest import LOCATION_KIND, Manifest, location_key
from hotset.storage.records import encode_record


class DatasetStorage(Storage):
    """The items of ``dataset`` (``len`` and ``[i]``), read in this process (each
    DataLoader worker has its copy, as with a plain DataLoader). ``name`` identifies the
    dataset in the keys (default: its class and length): two datasets of one name and
    length share cache entries, so name them apart."""

    content_keyed = False
    concurrency = 1  # a user's __getitem__ is not assumed thread-safe

    def __init__(self, dataset, *, name: str | None = None, probe: int = 8) -> None:
        if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
            raise ConfigError(
                f"from_dataset: {type(dataset).__qualname__} is not a map-style Dataset "
                "(it needs __len__ and __getitem__)"
            )
        n = len(dataset)
        if n == 0:
            raise ConfigError("from_dataset: the dataset is empty")
        self.dataset = dataset
        kind = type(dataset)
        self.name = name or f"{kind.__module__}.{kind.__qualname__}[{n}]"
        probed = [len(self._encode(i)) for i in range(min(probe, n))]
        size = int(np.mean(probed)) + TAG
        labels = getattr(dataset, "targets", None)  # torchvision's datasets keep them
        try:
            labels = np.asarray(labels, np.int64).reshape(n) if labels is not None else None
        except (TypeError, ValueError):
            labels = None
        classes = list(getattr(dataset, "classes", []) or [])
        self.manifest = Manifest(
            [f"[{i}]" for i in range(n)],
            [location_key("torch-dataset", self.name, i) for i in range(n)],
            np.full(n, size, np.int64),
            labels if labels is not None else np.full(n, -1, np.int64),
            classes if labels is not None else [], self.name, LOCATION_KIND,
        )  # fmt: skip

    def describe(self, i: int) -> str:
        return f"{self.name}[{i}]"

    def _encode(self, i: int) -> bytes:
        try:
            item = self.dataset[i]
        except Exception as exc:  # noqa: BLE001 - the user's __getitem__, named
            raise CorruptSampleError(
                i, f"{self.name}[{i}]", f"the dataset's __getitem__ failed: {exc!r}"
            ) from exc
        try:
            return encode_record(item)
        except TypeError as exc:
            raise ConfigError(f"from_dataset: item {i} of {self.name}: {exc}") from exc

    def read(self, i: int) -> bytes:
        return self._encode(int(i))

    def read_many(self, ids: Sequence[int]) -> list[bytes]:
        return [self._encode(int(i)) for i in ids]
