"""How bytes move from storage: batched reads that overlap and survive transient faults."""

from hotset.io.reader import BatchReader, Retry

__all__ = ["BatchReader", "Retry"]
