"""hotset: keep the hot set of a training dataset in memory.

The control plane (sampler + policy + planner) decides on integer sample ids what is a
hit, a miss, an admission or an eviction; the data plane (``CachedDataset`` in DataLoader
workers) executes those plans on bytes. See DESIGN.md in the repository's shared notes.
"""

from hotset.codecs import decode_array, decode_image, decode_sample, to_tensor
from hotset.errors import (
    ConfigError,
    CorruptSampleError,
    HotsetError,
    MissingSampleError,
    SampleError,
    ServiceError,
    ServiceUnavailable,
    StorageError,
)
from hotset.feedback import per_sample_loss
from hotset.importance import ScoreBoard, coarse_importance, rank_importance
from hotset.loader import Batch, CachedDataset, HotsetLoader, make_loader
from hotset.plan import BatchPlan, Planner
from hotset.policy import POLICIES, Policy, make_policy, register_policy
from hotset.sampling import SAMPLERS, Sampler, UniformSampler, make_sampler, register_sampler
from hotset.service import connect, start_service
from hotset.stats import LoaderStats
from hotset.storage import FileStorage, Manifest, Storage, ThrottledStorage
from hotset.store import MemoryStore, RedisStore, SharedStore, Store, make_store

__version__ = "0.1.0"

__all__ = [
    "POLICIES", "SAMPLERS", "Batch", "BatchPlan", "CachedDataset", "ConfigError",
    "CorruptSampleError", "FileStorage", "HotsetError", "HotsetLoader", "LoaderStats",
    "Manifest", "MemoryStore", "MissingSampleError", "Planner", "Policy", "RedisStore",
    "SampleError", "Sampler", "SharedStore", "Storage", "StorageError", "Store",
    "ThrottledStorage", "UniformSampler", "decode_array", "decode_image", "decode_sample",
    "make_loader", "make_policy", "make_sampler", "make_store", "register_policy",
    "register_sampler", "to_tensor", "per_sample_loss", "ScoreBoard", "coarse_importance",
    "rank_importance", "ServiceError", "ServiceUnavailable", "connect", "start_service",
]  # fmt: skip
