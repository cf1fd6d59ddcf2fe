"""hotset: keep the hot set of a training dataset in memory.

The control plane (sampler + policy + planner) decides on integer sample ids what is a
hit, a miss, an admission or an eviction; the data plane (``CachedDataset`` in DataLoader
workers) executes those plans on bytes. See docs/design.md.
"""

# ruff: noqa: F401 - the TYPE_CHECKING imports below re-export the lazy names

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.2.0"

# name -> the module that defines it, imported on first use (PEP 562), so that the
# control plane alone (``hotset simulate``) does not import torch, zmq or lmdb
_EXPORTS = {
    "hotset.codecs": ["decode_array", "decode_image", "decode_sample", "to_tensor"],
    "hotset.errors": [
        "ConfigError", "CorruptSampleError", "HotsetError", "LoaderClosed",
        "MissingSampleError", "RankError", "SampleError", "ServiceError",
        "ServiceUnavailable", "ShardError", "StorageError",
    ],
    "hotset.feedback": ["per_sample_loss"],
    "hotset.importance": ["ScoreBoard", "coarse_importance", "rank_importance"],
    "hotset.build": ["make_loader"],
    "hotset.loader": ["Batch", "CachedDataset", "HotsetLoader"],
    "hotset.plan": ["BatchPlan", "PlanSource", "Planner"],
    "hotset.policy": ["POLICIES", "Policy", "make_policy", "register_policy"],
    "hotset.sampling": [
        "SAMPLERS", "Sampler", "UniformSampler", "make_sampler", "register_sampler",
    ],
    "hotset.service.client": ["connect"],
    "hotset.service.server": ["start_service"],
    "hotset.stats": ["EpochStats", "LoaderStats"],
    "hotset.systems": ["SYSTEMS", "resolve_system"],
    "hotset.storage": ["FileStorage", "Manifest", "Storage", "ThrottledStorage"],
    "hotset.storage.open": ["from_dataset", "open_storage"],
    "hotset.storage.tar": ["TarStorage"],
    "hotset.storage.parquet": ["ArrowStorage", "ParquetStorage"],
    "hotset.store": ["MemoryStore", "RedisStore", "SharedStore", "Store", "make_store"],
}  # fmt: skip
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
# written out, for type checkers (mypy --strict, pyright): the names of _EXPORTS
__all__ = [
    "ArrowStorage", "Batch", "BatchPlan", "CachedDataset", "ConfigError",
    "CorruptSampleError", "EpochStats", "FileStorage", "HotsetError", "HotsetLoader",
    "LoaderClosed", "LoaderStats", "Manifest", "MemoryStore", "MissingSampleError",
    "POLICIES", "ParquetStorage", "PlanSource", "Planner", "Policy", "RankError",
    "RedisStore", "SAMPLERS", "SYSTEMS", "SampleError", "Sampler", "ScoreBoard",
    "ServiceError", "ServiceUnavailable", "ShardError", "SharedStore", "Storage",
    "StorageError", "Store", "TarStorage", "ThrottledStorage", "UniformSampler",
    "coarse_importance", "connect", "decode_array", "decode_image", "decode_sample",
    "from_dataset", "make_loader", "make_policy", "make_sampler", "make_store",
    "open_storage", "per_sample_loss", "rank_importance", "register_policy",
    "register_sampler", "resolve_system", "start_service", "to_tensor",
]  # fmt: skip


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module 'hotset' has no attribute {name!r}")
    value = getattr(importlib.import_module(_MODULE_OF[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])


if TYPE_CHECKING:  # the same names, for type checkers and IDEs
    from hotset.build import make_loader
    from hotset.codecs import decode_array, decode_image, decode_sample, to_tensor
    from hotset.errors import (
        ConfigError,
        CorruptSampleError,
        HotsetError,
        LoaderClosed,
        MissingSampleError,
        RankError,
        SampleError,
        ServiceError,
        ServiceUnavailable,
        ShardError,
        StorageError,
    )
    from hotset.feedback import per_sample_loss
    from hotset.importance import ScoreBoard, coarse_importance, rank_importance
    from hotset.loader import Batch, CachedDataset, HotsetLoader
    from hotset.plan import BatchPlan, Planner, PlanSource
    from hotset.policy import POLICIES, Policy, make_policy, register_policy
    from hotset.sampling import (
        SAMPLERS,
        Sampler,
        UniformSampler,
        make_sampler,
        register_sampler,
    )
    from hotset.service.client import connect
    from hotset.service.server import start_service
    from hotset.stats import EpochStats, LoaderStats
    from hotset.storage import FileStorage, Manifest, Storage, ThrottledStorage
    from hotset.storage.open import from_dataset, open_storage
    from hotset.storage.parquet import ArrowStorage, ParquetStorage
    from hotset.storage.tar import TarStorage
    from hotset.store import MemoryStore, RedisStore, SharedStore, Store, make_store
    from hotset.systems import SYSTEMS, resolve_system
