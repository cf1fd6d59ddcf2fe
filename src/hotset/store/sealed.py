"""Content-addressed, sealed entries (Quiver's secure sharing, FAST'20 section 4.3).

A sample's content digest (its manifest key) is the capability to read it: the entry is
stored under a one-way hash of the digest, and its bytes are XORed with a keystream
derived from the digest (convergent encryption, SHAKE-256). A process that can list the
store but does not hold a sample's digest sees neither the digest nor the bytes; a job
that registered the dataset (and so has the digests) reads them. Every read is checked
against the digest, so a tampered or mixed-up entry is dropped (``rejected``), never
served.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

import numpy as np

from hotset.storage.manifest import content_key
from hotset.store.base import Store


def sealed_id(key: str) -> str:
    """Where the entry of the sample with content ``key`` is stored."""
    return hashlib.blake2b(key.encode(), digest_size=16, person=b"hotset-id").hexdigest()


def _xor(key: str, data: bytes) -> bytes:
    stream = hashlib.shake_256(b"hotset-seal:" + key.encode()).digest(len(data))
    return (np.frombuffer(data, np.uint8) ^ np.frombuffer(stream, np.uint8)).tobytes()


class SealedStore(Store):
    """Wraps a store: entries under ``sealed_id(key)``, bytes sealed with ``key``."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner.capacity_bytes)
        self.inner = inner
        self.shared_across_processes = inner.shared_across_processes
        self.rejected = 0  # entries whose unsealed bytes did not match their digest

    @property
    def failures(self) -> int:  # the backend's counters are the ones that matter
        return self.inner.failures

    @failures.setter
    def failures(self, value: int) -> None:
        pass

    @property
    def refused(self) -> int:
        return self.inner.refused

    @refused.setter
    def refused(self, value: int) -> None:
        pass

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        out: list[bytes | None] = []
        for k, v in zip(keys, self.inner.get_many([sealed_id(k) for k in keys]), strict=True):
            data = None if v is None else _xor(k, v)
            if data is not None and content_key(data) != k:
                self.rejected += 1
                data = None
            out.append(data)
        return out

    def put_many(self, items: Mapping[str, bytes]) -> int:
        return self.inner.put_many({sealed_id(k): _xor(k, v) for k, v in items.items()})

    def delete_many(self, keys: Sequence[str]) -> None:
        self.inner.delete_many([sealed_id(k) for k in keys])

    def delete_store_keys(self, keys: Sequence[str]) -> None:
        self.inner.delete_many(keys)  # already sealed ids (from the service)

    def contains(self, key: str) -> bool:
        return self.inner.contains(sealed_id(key))

    @property
    def used_bytes(self) -> int:
        return self.inner.used_bytes

    def __len__(self) -> int:
        return len(self.inner)

    def clear(self) -> None:
        self.inner.clear()

    def close(self, destroy: bool = False) -> None:
        self.inner.close(destroy=destroy)
