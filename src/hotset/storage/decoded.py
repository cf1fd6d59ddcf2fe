"""Samples cached decoded (``make_loader(cache_decoded=True)``; hotset's option, not a
paper's): the cache holds each sample as its decoded arrays, so a hit costs a
``frombuffer`` instead of a PNG or JPEG decode, at the price of more bytes per sample
(Fashion-MNIST: ~360 B of PNG, 912 B decoded)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

import numpy as np

from hotset.codecs import npy_bytes
from hotset.errors import ConfigError, CorruptSampleError
from hotset.storage.base import TAG, Storage
from hotset.storage.columns import DigestColumn
from hotset.storage.manifest import LOCATION_KIND, Manifest, location_key
from hotset.storage.records import encode_record
from hotset.storage.wrapper import StorageWrapper

#: samples decoded at construction to learn the decoded size
PROBE = 16


class DecodedStorage(StorageWrapper):
    """``inner``'s samples as the bytes of ``decode``'s result: an array as ``.npy``,
    anything else (a record's decoded fields, a pair) as a record; ``decode_sample``
    reads both back without decoding an image again.

    Keys are the inner keys turned by a digest of ``identity`` (what decodes: the
    decoder, the size and mode), so entries of two decodings, or of the encoded
    samples, never meet in a store; each entry carries a digest of its bytes (``seal``).
    The size of every sample is what the first ``PROBE`` decode to (the largest of
    them): a dataset whose samples decode to sizes that differ is refused (give
    ``size=`` so that images decode to one shape)."""

    def __init__(self, inner: Storage, decode: Callable[[bytes], object], identity: str) -> None:
        super().__init__(inner)
        self.decode = decode
        self.content_keyed = False
        probe = self.read_many(range(min(PROBE, len(inner))))
        lengths = [len(b) for b in probe]
        if lengths and max(lengths) > 1.01 * min(lengths) + 64:
            raise ConfigError(
                f"cache_decoded=True: samples decode to different sizes (the first "
                f"{len(lengths)}: {min(lengths):,} to {max(lengths):,} bytes); give size=(width, "
                "height) so that every image decodes to one shape, or cache the encoded bytes"
            )
        m = inner.manifest
        self.decoded_size = max(lengths, default=0) + TAG
        self.manifest = Manifest(
            m.paths, _turned(m.keys, identity), np.full(len(m), self.decoded_size, np.int64),
            m.labels, m.classes, m.name, LOCATION_KIND,
        )  # fmt: skip

    def _decoded(self, i: int, data: bytes) -> bytes:
        try:
            x = self.decode(data)
        except Exception as exc:  # noqa: BLE001 - any decoder failure names the sample
            key = self.inner.manifest.keys[i]
            raise CorruptSampleError(i, self.describe(i), f"cannot decode: {exc}", key) from exc
        return npy_bytes(x) if isinstance(x, np.ndarray) else encode_record(x)

    def read_many(self, ids: Sequence[int]) -> list[bytes]:
        ids = [int(i) for i in ids]
        return [self._decoded(i, b) for i, b in zip(ids, self.inner.read_many(ids), strict=True)]

    def read(self, i: int) -> bytes:
        return self.read_many([i])[0]

    def kept(self, ids: Sequence[int]) -> list[bytes | None]:
        ids = [int(i) for i in ids]
        return [None if b is None else self._decoded(i, b)
                for i, b in zip(ids, self.inner.kept(ids), strict=True)]  # fmt: skip


def _turned(keys, identity: str):
    """Each key turned by a digest of ``identity``: one-to-one, vectorised for digests."""
    if isinstance(keys, DigestColumn):
        tweak = np.frombuffer(
            hashlib.blake2b(identity.encode(), digest_size=16, person=b"hotset-dec").digest(),
            np.uint8,
        )
        return DigestColumn.of_raw(keys.raw ^ tweak)
    return [location_key("decoded", identity, k) for k in keys]
