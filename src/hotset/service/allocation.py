"""Quiver's benefit-aware allocation (FAST'20, "job heterogeneity"): given the service's
byte budget, how much of it each dataset gets.

A dataset's value is the time its jobs would save per minibatch if it were all cached
(the sum of their measured ``Benefit.saving``). Cached bytes buy hits about in proportion
(each sample is read once per epoch), so the budget goes greedily to the datasets with the
most value per byte, each up to its whole size (the fractional knapsack); what is left
goes on in the same order to datasets of no measured value. A dataset not measured yet
keeps what an even split would give it (water-filling: a dataset smaller than its share
gets its size and the others share the rest), so a job that measured early gains without
waiting for the slowest job's measurement.
"""

from __future__ import annotations

import numpy as np


def _even(budget: int, sizes: np.ndarray) -> np.ndarray:
    out = np.zeros(sizes.size, np.int64)
    order = np.argsort(sizes, kind="stable")
    for n, d in enumerate(order.tolist()):
        out[d] = min(int(sizes[d]), budget // (order.size - n))
        budget -= int(out[d])
    return out


def split_budget(budget: int, sizes: np.ndarray, values: np.ndarray | None = None) -> np.ndarray:
    """Bytes for each dataset: ``sizes`` (bytes of each dataset, 0 for one without jobs),
    ``values`` (time saved per minibatch when all of it is cached; NaN or ``None``: not
    measured yet). Never more than ``budget`` in all, nor more than a dataset's size."""
    sizes = np.asarray(sizes, np.int64)
    budget = max(0, int(budget))
    values = np.full(sizes.size, np.nan) if values is None else np.asarray(values, np.float64)
    unknown = np.isnan(values)
    out = np.where(unknown, _even(budget, sizes), 0)
    left = budget - int(out.sum())
    density = np.maximum(np.nan_to_num(values), 0.0) / np.maximum(sizes, 1)
    for d in np.argsort(-density, kind="stable").tolist():
        if not unknown[d]:
            out[d] = min(int(sizes[d]), left)
            left -= int(out[d])
    return out
