"""The multi-job service: one ``hotset serve`` per machine, jobs connect with
``hotset.connect(address)`` and share its sampling (JOADER's DSA) and its cache."""

from hotset.service.client import RemotePlanner, ServiceClient, connect
from hotset.service.coordinator import JobCoordinator
from hotset.service.server import DEFAULT_ADDRESS, CacheService, start_service

__all__ = [
    "DEFAULT_ADDRESS", "CacheService", "JobCoordinator", "RemotePlanner", "ServiceClient",
    "connect", "start_service",
]  # fmt: skip
