"""An epoch's order drawn in a thread during the tail of the epoch before, for a sampler
whose orders are fixed in advance (``Sampler.order_known_ahead``): numpy's permutation
releases the GIL, so the next epoch starts without waiting for a permutation of all its
ids (100M ids: seconds) and with the same order it would have drawn at its start."""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np


class OrderAhead:
    """``make(epoch)`` running in a daemon thread; :meth:`result` waits for it."""

    def __init__(self, make: Callable[[int], np.ndarray], epoch: int) -> None:
        self.epoch = int(epoch)
        self._out: np.ndarray | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._run, args=(make,), name=f"hotset-order-{epoch}", daemon=True
        )
        self._thread.start()

    def _run(self, make: Callable[[int], np.ndarray]) -> None:
        try:
            self._out = make(self.epoch)
        except BaseException as exc:  # raised again where the order is taken
            self._error = exc

    def result(self) -> np.ndarray:
        """The order (its error, raised here, where the epoch starts)."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._out
