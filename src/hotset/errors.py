"""Errors hotset raises: each names the sample, path or setting at fault."""

from __future__ import annotations


class HotsetError(Exception):
    """Base class of every error hotset raises on purpose."""


class ConfigError(HotsetError, ValueError):
    """A setting has a wrong value; the message names the setting and the accepted values."""


#: what a sample's error says a loader can do instead of stopping
SKIP_HINT = "make_loader(on_error='skip') trains on without it, counted in 'skipped'"


class SampleError(HotsetError):
    """A sample could not be read or decoded; names the sample id, its path and its key."""

    def __init__(
        self, sample_id: int | str, path: str | None = None, reason: str = "", key: str = ""
    ):
        if path is None:  # message-only form, used when PyTorch re-raises a worker's error
            super().__init__(str(sample_id))
            self.sample_id, self.path, self.key, self.reason = -1, "", "", str(sample_id)
            return
        self.sample_id = int(sample_id)
        self.path = path
        self.key = key
        self.reason = reason
        keypart = f", key {key}" if key else ""
        super().__init__(f"sample {sample_id} ({path}{keypart}): {reason} "
                         f"[{SKIP_HINT}]")  # fmt: skip

    def __reduce__(self):  # keep the fields across pickling
        return (type(self), (self.sample_id, self.path, self.reason, self.key))


class LoaderClosed(HotsetError, RuntimeError):
    """A loader was used after ``close()``."""


class ServiceError(HotsetError):
    """The hotset service refused a request; the message is the service's."""


class UnknownJob(ServiceError, ConfigError):
    """The service does not know the job (it timed out, or the service restarted): the
    client registers again."""


class ServiceUnavailable(ServiceError):
    """The hotset service did not answer in time (it is down, or the address is wrong)."""


class StoreUnavailable(HotsetError):
    """The cache store cannot answer now: what it holds is unknown (not empty)."""


class RankError(HotsetError):
    """A collective of hotset's did not complete across the job's ranks (a rank hung,
    died, or did not make the same call); names the collective, the rank, the time-out."""


class MissingSampleError(SampleError):
    """The sample's file does not exist in the storage."""


class CorruptSampleError(SampleError):
    """The sample's bytes do not match its manifest digest, or cannot be decoded."""


class StorageError(SampleError):
    """The storage failed to read the sample (I/O error, permission, network)."""


class ShardError(HotsetError):
    """A shard (a tar or Parquet file, or the listing that names them) could not be
    listed, indexed or read; names the shard and what happened: ``kind`` is ``not
    found``, ``forbidden``, ``unreachable``, ``timed out``, ``cut off``, ``truncated``,
    ``empty``, ``not a tar`` or ``failed`` (``io/reader.failure_kind``)."""

    def __init__(self, url: str, kind: str, detail: str = "") -> None:
        self.url, self.kind, self.detail = url, kind, detail
        super().__init__(f"{url}: {kind}" + (f" ({detail})" if detail else ""))

    def __reduce__(self):
        return (type(self), (self.url, self.kind, self.detail))


class SkipLimitError(HotsetError):
    """``on_error="skip"`` dropped more than a batch may lose, or a whole epoch served
    nothing; the message gives the first cause."""
