"""Cache policies: one file each, one base class, a registry by name."""

from hotset.policy import (  # noqa: F401 - register
    app,
    belady,
    fifo,
    icache,
    lfu,
    lru,
    minio,
    priority,
    random_evict,
    refcnt,
    spider,
)
from hotset.policy.base import POLICIES, AccessResult, Policy, make_policy, register_policy

__all__ = ["POLICIES", "AccessResult", "Policy", "make_policy", "register_policy"]
