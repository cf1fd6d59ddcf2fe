"""Progress of long work (an epoch, indexing shards, preparing data): a tqdm bar on a
terminal; elsewhere (a job's log file, a notebook's captured output) a line on stderr
every ``EVERY_S`` seconds and at the end, so that a batch job's log shows it too."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any, Generic, TypeVar

from tqdm import tqdm

T = TypeVar("T")

#: seconds between two progress lines where there is no terminal
EVERY_S = 10.0


def progress(
    items: Iterable[T], total: int | None, desc: str, unit: str = "it", enabled: bool = True
) -> Any:
    """``items``, reported as they are taken (``enabled=False``: as they are); on a
    terminal or not, the result has tqdm's ``set_postfix``."""
    if not enabled:
        return items
    if sys.stderr.isatty():
        return tqdm(items, total=total, desc=desc, unit=unit, leave=False)
    return _Lines(items, total, desc, unit)


class _Lines(Generic[T]):
    """``items`` with a progress line on stderr every ``EVERY_S`` seconds and at the end
    (``set_postfix`` as tqdm's: figures appended to the line)."""

    def __init__(self, items: Iterable[T], total: int | None, desc: str, unit: str) -> None:
        self.items, self.total, self.desc, self.unit, self.postfix = items, total, desc, unit, ""

    def set_postfix(self, **figures: object) -> None:
        self.postfix = ", " + ", ".join(f"{k}={v}" for k, v in figures.items())

    def __iter__(self) -> Iterator[T]:
        start = last = time.monotonic()
        total, unit = self.total, self.unit
        for n, item in enumerate(self.items, 1):
            yield item
            now = time.monotonic()
            if now - last >= EVERY_S or n == total:
                last = now
                of = f"/{total} {unit} ({100 * n / total:.0f}%)" if total else f" {unit}"
                print(f"{self.desc}: {n}{of}, {now - start:.1f} s{self.postfix}",
                      file=sys.stderr, flush=True)  # fmt: skip
