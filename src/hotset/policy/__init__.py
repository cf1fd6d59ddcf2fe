"""Cache policies: one file each, one base class, a registry by name.

Every module of this package is imported here, so a new policy is one new file that
registers its class with ``@register_policy`` (docs/extending.md).
"""

import importlib
import pkgutil

from hotset.policy.base import (
    POLICIES,
    AccessResult,
    Feeder,
    Policy,
    make_policy,
    policy_class,
    register_policy,
)

for _m in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_m.name}")

__all__ = [
    "POLICIES", "AccessResult", "Feeder", "Policy", "make_policy", "policy_class",
    "register_policy",
]  # fmt: skip
