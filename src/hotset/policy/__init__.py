"""Cache policies: one file each, one base class, a registry by name."""

from hotset.policy import belady, fifo, lfu, lru, minio, random_evict  # noqa: F401 - register
from hotset.policy.base import POLICIES, AccessResult, Policy, make_policy, register_policy

__all__ = ["POLICIES", "AccessResult", "Policy", "make_policy", "register_policy"]
