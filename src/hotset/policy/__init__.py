"""Cache policies: one file each, one base class, a registry by name.

Every module of this package is imported here, so a new policy is one new file that
registers its class with ``@register_policy`` (docs/extending.md).
"""

from hotset.policy.base import (
    POLICIES,
    AccessResult,
    Feeder,
    Policy,
    make_policy,
    policy_class,
    register_policy,
)
from hotset.registry import import_submodules

import_submodules(__name__, __path__)

__all__ = [
    "POLICIES", "AccessResult", "Feeder", "Policy", "make_policy", "policy_class",
    "register_policy",
]  # fmt: skip
