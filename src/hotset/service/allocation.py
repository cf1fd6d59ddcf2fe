"""Quiver's benefit-aware allocation (FAST'20, "job heterogeneity"): given the service's
byte budget, how much of it each dataset gets.

A dataset's value is the time its jobs would save per minibatch if it were all cached
(the sum of their measured ``Benefit.saving``). Cached bytes buy hits about in proportion
(each sample is read once per epoch), so the budget goes greedily to the datasets with the
most value per byte, each up to its whole size (the fractional knapsack); what is left
goes on in the same order to datasets of no measured value. Until every dataset with a
job has a measurement, the budget is split evenly (water-filling: a dataset smaller than
its share gets its size and the rest is shared by the others).
"""

from __future__ import annotations

import numpy as np


def split_budget(budget: int, sizes: np.ndarray, values: np.ndarray | None = None) -> np.ndarray:
    """Bytes for each dataset: ``sizes`` (bytes of each dataset), ``values`` (time saved
    per minibatch when all of it is cached; ``None``: not measured yet, split evenly).
    Never more than ``budget`` in all, nor more than a dataset's size."""
    sizes = np.asarray(sizes, np.int64)
    out = np.zeros(sizes.size, np.int64)
    left = max(0, int(budget))
    if values is None:
        order = np.argsort(sizes, kind="stable")
        for n, d in enumerate(order.tolist()):
            out[d] = min(int(sizes[d]), left // (order.size - n))
            left -= int(out[d])
        return out
    values = np.maximum(np.asarray(values, np.float64), 0.0)
    density = values / np.maximum(sizes, 1)
    for d in np.argsort(-density, kind="stable").tolist():
        out[d] = min(int(sizes[d]), left)
        left -= int(out[d])
    return out
