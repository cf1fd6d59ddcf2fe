"""Loader counters: produced per batch in the workers, summed in the training process."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class LoaderStats:
    """Counters of what really happened on the data plane (docs/design.md, "the flow").

    * ``hits``: samples served from the store as planned; ``substitute_hits`` of them
      were served in place of a missed sample (``exact_hits`` = the others).
    * ``misses``: samples the plan sent to storage.
    * ``late_misses``: planned hits absent from the store (another worker had not written
      them yet, or the store was unreachable), read from storage instead.
    * ``waited_hits``: planned hits that arrived while the worker waited for another
      job's fetch (the multi-job service's co-operative misses); counted in ``hits``.
    * ``store_failures``: store calls that failed (e.g. Redis went away) and were absorbed.
    * ``refused_puts``: admissions and prefetches that did not land in the store (its
      budget, a store failure, an unreadable sample); the planner forgets them.
    * ``corrupt_hits``: store entries whose bytes did not match the sample's digest: never
      served, deleted, the sample read from storage (counted in ``late_misses`` too).
    * ``disk_hits``, ``disk_bytes``: samples (and bytes) that storage reads found in the
      node's disk tier (``make_loader(disk_dir=...)``) instead of reading the source; they
      are not in ``storage_reads`` or ``bytes_from_storage``. ``disk_failures``: the
      tier's writes a full disk refused and its I/O errors (those samples came from the
      source and were not kept).
    * ``skipped``: unreadable samples dropped from their batch (``on_error="skip"``).
    * ``storage_retries``: storage calls tried again after a transient failure: reads,
      and the listing and indexing of the storage when it was opened.
    * ``storage_requests``: requests made to the storage for the batches' samples, where
      it counts them (a range request of a tar shard may serve several samples).
    * ``wire_bytes``: bytes those requests moved (the gaps a range request read through
      included), where the storage counts them.
    * ``in_flight_s``: seconds those requests held a slot that the node's workers share
      (``node_concurrency``), summed: their own time, not their wait for a slot.
    * ``prefetched``: samples read and cached that no batch requested (a homophily node,
      or a sample a range request read through that the policy took).
    * ``readahead_staged``: later batches' misses read with a batch's (``io/readahead.py``)
      and staged; ``readahead_served``: misses served from there (no request of their
      own); ``readahead_lost``: staged misses not found there (read from storage).

    The control plane adds its own in ``HotsetLoader.counters()``: ``planning_s`` and
    ``feedback_s`` (its seconds), ``service_failures`` (plans the multi-job service did
    not answer; the rest of that epoch was read from storage), iCACHE's ``package_*``
    (packages written and loaded, and their bytes), SpiderCache's ``graph_*``. There, the
    counters a user watches (``hotset.loader.USER_COUNTERS``) are at the top, the others
    under ``"internal"``.
    """

    batches: int = 0
    samples: int = 0
    hits: int = 0
    substitute_hits: int = 0
    misses: int = 0
    late_misses: int = 0
    waited_hits: int = 0
    store_failures: int = 0
    refused_puts: int = 0
    corrupt_hits: int = 0
    skipped: int = 0
    storage_retries: int = 0
    storage_requests: int = 0
    wire_bytes: int = 0
    prefetched: int = 0
    readahead_staged: int = 0
    readahead_served: int = 0
    readahead_lost: int = 0
    bytes_from_storage: int = 0
    bytes_from_store: int = 0
    disk_hits: int = 0
    disk_bytes: int = 0
    disk_failures: int = 0
    storage_wait_s: float = 0.0
    in_flight_s: float = 0.0
    store_s: float = 0.0
    decode_s: float = 0.0

    @property
    def accesses(self) -> int:
        return self.hits + self.misses + self.late_misses

    @property
    def exact_hits(self) -> int:
        return self.hits - self.substitute_hits

    @property
    def hit_ratio(self) -> float:
        return self.hits / self.accesses if self.accesses else 0.0

    def add(self, other: dict) -> None:
        for k, v in other.items():
            setattr(self, k, getattr(self, k) + v)

    def as_dict(self) -> dict:
        """The fields plus the derived ``accesses`` and ``hit_ratio``."""
        d = asdict(self)
        d["accesses"] = self.accesses
        d["exact_hits"] = self.exact_hits
        d["hit_ratio"] = self.hit_ratio
        return d


@dataclass(frozen=True)
class EpochStats:
    """What one epoch's iteration did (``HotsetLoader.epoch_stats``): the counters users
    watch, as the difference over that epoch rather than the run's totals."""

    epoch: int
    seconds: float  # the iteration's wall time (training steps included)
    samples: int  # served (hits, misses and late misses)
    hits: int
    misses: int
    late_misses: int
    hit_ratio: float
    storage_reads: int
    storage_bytes: int
    storage_retries: int
    store_failures: int
    skipped: int
    storage_wait_s: float  # worker-seconds waiting on storage
    planning_s: float
    disk_hits: int = 0  # storage reads the node's disk tier served

    @classmethod
    def between(cls, epoch: int, seconds: float, before: dict, after: dict) -> EpochStats:
        """The epoch ``epoch`` from the loader's ``counters()`` before and after it."""

        def d(key: str) -> float:
            return after.get(key, 0) - before.get(key, 0)

        served, hits = int(d("accesses")), int(d("hits"))
        return cls(
            epoch=epoch, seconds=seconds, samples=served, hits=hits, misses=int(d("misses")),
            late_misses=int(d("late_misses")), hit_ratio=hits / served if served else 0.0,
            storage_reads=int(d("storage_reads")), storage_bytes=int(d("storage_bytes")),
            storage_retries=int(d("storage_retries")), store_failures=int(d("store_failures")),
            skipped=int(d("skipped")), storage_wait_s=float(d("storage_wait_s")),
            planning_s=float(d("planning_s")), disk_hits=int(d("disk_hits")),
        )  # fmt: skip
