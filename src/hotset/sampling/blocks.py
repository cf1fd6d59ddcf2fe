"""``order="blocks"``: an epoch drawn as its system draws it, then read shard by shard.

hotset's option, in no paper: the order MosaicML Streaming's ``py1b`` shuffle gives a
uniform epoch, applied to any system's draw. The epoch's ids (the multiset the sampler
drew: importance-sampled repeats and iCACHE's subset included) are grouped by the shard
(object) each lives in, the shards in a random order; then the ids are shuffled within
windows of ``block_size`` consecutive positions. A window then spans about
``block_size / samples per shard + 1`` shards, so its misses are read as a few whole
shards (one request each) where a draw across all shards makes about one request per
missed sample; what it gives up is the mixing: a batch holds samples of a few shards,
and shards written class by class give batches of few classes.
"""

from __future__ import annotations

import numpy as np

from hotset.errors import ConfigError

#: the epoch orders a loader accepts: the paper's draw, or that draw read by shard blocks
ORDERS = ("paper", "blocks")


def check_order(order: str, block_size: int) -> None:
    if order not in ORDERS:
        raise ConfigError(f"order must be one of {ORDERS}, got {order!r}")
    whole = isinstance(block_size, int | np.integer) and not isinstance(block_size, bool)
    if not whole or block_size < 1:
        raise ConfigError(f"block_size must be an int >= 1, got {block_size!r}")


def block_order(
    order: np.ndarray, objects: np.ndarray, block_size: int, rng: np.random.Generator
) -> np.ndarray:
    """``order``'s ids (the same multiset) grouped by ``objects[id]`` in a random order of
    objects, random within an object, then shuffled within each window of ``block_size``
    consecutive positions (Streaming's ``py1b``)."""
    order = np.asarray(order, np.int64)
    n = order.size
    if not n:
        return order.copy()
    shard = np.asarray(objects)[order]
    rank = rng.permutation(int(shard.max()) + 1)[shard]  # each id's shard's place
    grouped = order[np.lexsort((rng.random(n), rank))]
    window = np.arange(n) // int(block_size)
    return grouped[np.lexsort((rng.random(n), window))]


def epoch_rng(seed: int, epoch: int) -> np.random.Generator:
    """The block order's random draws for ``epoch``: a function of the seed and the epoch
    alone, so a resumed run and a policy told the next epoch's order see the same one."""
    return np.random.default_rng([int(seed), int(epoch), 0xB10C])
