"""The policy base class and registry (one file per policy, as cachetools' caches).

A policy is the control plane's view of the cache: it decides, per sample id, whether an
access hits, whether a missed sample is admitted and which residents are evicted. It
works on integer ids and byte sizes only; it never touches bytes (DESIGN.md, "Rules").
Subclasses implement ``_access`` as one tight loop over a Python list of ids: that loop
is the whole per-sample cost of the control plane.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Container, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from hotset.errors import ConfigError


@dataclass(frozen=True)
class AccessResult:
    """What one batch of accesses did: a hit mask over the ids, and the net admissions and
    evictions the data plane must apply to the store (admit after reading, evict after)."""

    hits: np.ndarray  # bool, one per accessed id
    admitted: np.ndarray  # int64 ids resident after the batch that were put by it
    evicted: np.ndarray  # int64 ids not resident after the batch that must be deleted
    #: substituting policies: the ids served in place of the requested ones (``hits``
    #: then refers to these), and which positions were substituted
    served: np.ndarray | None = None
    substituted: np.ndarray | None = None
    #: ids to read from storage and put although nobody requested them (prefetch)
    fetch: np.ndarray | None = None


class Policy(ABC):
    """Byte-capacity cache policy over sample ids ``0 .. len(sizes) - 1``."""

    name: ClassVar[str]
    #: policies that need the planned access sequence (``set_future``) before accesses
    needs_future: ClassVar[bool] = False
    #: policies that read importance scores (``attach_scores`` with a ScoreBoard)
    needs_scores: ClassVar[bool] = False
    #: policies whose cache is partly filled off the batch path (iCACHE's L-cache
    #: packages): the planner needs a feeder that loads what ``l_next_package`` asks
    needs_feeder: ClassVar[bool] = False

    def __init__(self, capacity_bytes: int, sizes: np.ndarray | Sequence[int], seed: int = 0):
        sizes = np.asarray(sizes, dtype=np.int64)
        if sizes.ndim != 1 or sizes.size == 0:
            raise ConfigError("sizes must be a non-empty 1-D array of per-sample byte sizes")
        if (sizes < 0).any():
            raise ConfigError("sizes must be >= 0")
        if int(capacity_bytes) < 0:
            raise ConfigError(f"capacity_bytes must be >= 0, got {capacity_bytes}")
        self.capacity_bytes = int(capacity_bytes)
        self.num_samples = int(sizes.size)
        self._sizes: list[int] = sizes.tolist()
        self.seed = seed
        self.used = 0  # bytes of resident samples, per the manifest sizes

    @property
    @abstractmethod
    def _resident(self) -> Container[int]:
        """The resident ids, as a container with fast ``in`` and ``len``."""

    def _access(
        self, ids: list[int], hits: list[bool], admitted: list[int], evicted: list[int]
    ) -> None:
        """Process ``ids`` in order, appending a hit flag per id and the admitted/evicted
        ids. (A substituting policy overrides ``access`` instead.)"""
        raise TypeError(f"{type(self).__name__} must override _access or access")

    def access(self, ids: np.ndarray | Sequence[int]) -> AccessResult:
        """Access ``ids`` in order; returns hits and the net store changes of the batch."""
        ids_list = np.asarray(ids, dtype=np.int64).tolist()
        hits: list[bool] = []
        admitted: list[int] = []
        evicted: list[int] = []
        self._access(ids_list, hits, admitted, evicted)
        resident = self._resident
        return AccessResult(
            hits=np.array(hits, dtype=bool),
            admitted=np.array([i for i in dict.fromkeys(admitted) if i in resident], np.int64),
            evicted=np.array([i for i in dict.fromkeys(evicted) if i not in resident], np.int64),
        )

    def __contains__(self, i: int) -> bool:
        return int(i) in self._resident

    def __len__(self) -> int:
        return len(self._resident)  # type: ignore[arg-type]

    def cached_ids(self) -> np.ndarray:
        return np.fromiter(self._resident, dtype=np.int64)  # type: ignore[arg-type]

    def set_sizes(self, ids: np.ndarray, sizes: np.ndarray) -> None:
        """Byte sizes of ids registered after construction (a shared service's policy
        covers ids of datasets that arrive later). A resident's size cannot change."""
        for i, s in zip(np.asarray(ids).tolist(), np.asarray(sizes).tolist(), strict=True):
            if self._sizes[i] != s and i in self._resident:
                raise ConfigError(f"sample {i} is cached with {self._sizes[i]} bytes, not {s}")
            self._sizes[i] = int(s)

    def shrink_to(self, capacity_bytes: int) -> list[int]:
        """Set a new capacity, evicting residents (this policy's victims first) until they
        fit; returns the evicted ids. A multi-job service resizes a dataset's share."""
        raise ConfigError(f"policy {self.name!r} cannot be resized")

    def set_future(self, sequence: np.ndarray) -> None:  # noqa: B027 - optional hook
        """Tell the policy the planned accesses from now on (used by offline policies)."""

    def apply_hints(self, hints: dict) -> None:  # noqa: B027 - optional hook
        """What the sampler tells the cache (iCACHE's H-list, SpiderCache's homophily
        candidates and cache ratio); see ``Sampler.cache_hints``."""

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(capacity_bytes={self.capacity_bytes}, "
            f"resident={len(self)}, used={self.used})"
        )


POLICIES: dict[str, type[Policy]] = {}


def register_policy(cls: type[Policy]) -> type[Policy]:
    """Class decorator: make ``cls`` available to :func:`make_policy` by ``cls.name``."""
    POLICIES[cls.name] = cls
    return cls


def make_policy(
    name: str,
    capacity_bytes: int,
    sizes: np.ndarray | Sequence[int] | None = None,
    num_samples: int | None = None,
    **options,
) -> Policy:
    """A policy by registry name: ``make_policy("lru", 64 << 20, sizes=manifest.sizes)``
    (per-sample bytes), or ``make_policy("lru", 6000, num_samples=60000)`` for items of
    equal size, when the capacity counts items."""
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ConfigError(
            f"unknown policy {name!r}; choose from: {', '.join(sorted(POLICIES))}"
        ) from None
    if sizes is None:
        if num_samples is None:
            raise ConfigError(f"policy {name!r}: give sizes= (bytes per sample) or num_samples=")
        sizes = np.ones(int(num_samples), np.int64)
    try:
        return cls(capacity_bytes, sizes, **options)
    except TypeError as exc:
        raise ConfigError(f"policy {name!r}: {exc}") from exc
