"""FIFO: evict the resident admitted first; hits do not change the order."""

from __future__ import annotations

from hotset.policy.base import register_policy
from hotset.policy.lru import LRUPolicy


@register_policy
class FIFOPolicy(LRUPolicy):
    name = "fifo"
    refresh_on_hit = False
