"""Where the dataset lives: the read-only truth."""

from hotset.storage.base import Storage
from hotset.storage.files import FileStorage
from hotset.storage.manifest import Manifest, content_key
from hotset.storage.subset import SubsetStorage
from hotset.storage.throttled import ThrottledStorage

__all__ = [
    "FileStorage", "Manifest", "Storage", "SubsetStorage", "ThrottledStorage", "content_key",
]  # fmt: skip
