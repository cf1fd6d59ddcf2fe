"""A planner's saved state checked before any of it is used, and the rest of a saved epoch
re-cut for another number of ranks or another per-rank batch."""

from __future__ import annotations

from dataclasses import fields, replace

import numpy as np

from hotset.errors import ConfigError
from hotset.plan.batch import BatchPlan


def checked(
    state: dict, num_samples: int, this_world: int, batch_size: int, drop_last: bool
) -> tuple[np.ndarray, int, list[BatchPlan], int]:
    """The state's order, consumed batches, saved plans and padding, checked against
    each other and the dataset before any of it is used: an edited or forged state is
    a ``ConfigError`` naming what does not fit, never samples skipped, repeated or out
    of range. The plans' package bytes are dropped (a resumed worker reads those
    samples from the source). A state of another number of ranks, or of another per-rank
    batch size, is re-cut (``recut``) for ``this_world`` ranks of ``batch_size``."""

    def bad(what: str) -> ConfigError:
        return ConfigError(f"this state cannot be loaded: {what} (was it edited, or "
                           "saved by another program?)")  # fmt: skip

    def ids_of(value, what: str) -> np.ndarray:
        a = np.asarray(value)
        if a.ndim != 1 or (a.size and a.dtype.kind not in "iu"):
            raise bad(f"{what} is not a list of sample ids")
        a = a.astype(np.int64)
        if a.size and (a.min() < 0 or a.max() >= num_samples):
            raise bad(f"{what} names ids outside the dataset's {num_samples} samples")
        return a

    order = ids_of(state["order"], "its order")
    consumed, world, pad = state["consumed"], state["world"], state["padded"]
    batch = state["batch_size"]
    if not isinstance(world, int | np.integer) or world < 1:
        raise bad(f"world={world!r} is not a number of ranks")
    if not isinstance(batch, int | np.integer) or batch < 1:
        raise bad(f"batch_size={batch!r} is not a batch size")
    step = int(batch) * int(world)
    if not isinstance(consumed, int | np.integer) or not (
        0 <= consumed <= -(-order.size // step)
    ):  # fmt: skip
        raise bad(f"consumed={consumed!r} is not a batch count of its order")
    if not isinstance(pad, int | np.integer) or not 0 <= pad < world or pad > order.size:
        raise bad(f"padded={pad!r} is not a padding of its order for {world} ranks")
    if (world, batch) != (this_world, batch_size):
        rest, pad = recut(order[int(consumed) * step : order.size - int(pad)], batch_size,
                          this_world, drop_last)  # fmt: skip
        return rest, 0, [], pad
    names, replay = {f.name for f in fields(BatchPlan)}, []
    for k, saved in enumerate(state.get("made", ())):
        if not isinstance(saved, dict) or not set(saved) <= names:
            raise bad(f"saved plan {k} is not a plan")
        plan = BatchPlan(**{**saved, "package": ()})
        plan = replace(plan, **{
            f: ids_of(getattr(plan, f), f"saved plan {k}'s {f}")
            for f in ("ids", "admitted", "evicted", "fetch", "loads", "stage", "staged")
        })  # fmt: skip
        at = int(consumed) + k
        drawn = plan.ids if plan.requested is None else ids_of(plan.requested, "requested")
        hits = np.asarray(plan.hits)
        if (plan.index != at or hits.dtype != bool or hits.shape != plan.ids.shape
                or not np.array_equal(drawn, order[at * step : (at + 1) * step])):  # fmt: skip
            raise bad(f"saved plan {k} is not batch {at} of its order")
        replay.append(plan)
    return order, int(consumed), replay, int(pad)


def recut(
    rest: np.ndarray, batch_size: int, world: int, drop_last: bool
) -> tuple[np.ndarray, int]:
    """What a job of other ranks had not served of its epoch (``rest``, in its order,
    its padding left out), as this job's order from its first batch: served once
    across these ranks (the last batch's first ranks may take one sample more,
    ``shard``), cut to whole batches with ``drop_last``, and padded by wrapping only
    where the last batch would leave a rank without a sample. The plans the other job
    made ahead are made again (their decisions are in the policy's state: the store's
    listing, at the epoch's start, corrects what they had not done). Returns the
    order and the ids that pad it."""
    step = batch_size * world
    if drop_last:
        return rest[: (rest.size // step) * step].copy(), 0
    last = rest.size % step
    short = world - last if 0 < last < world else 0
    return np.concatenate([rest, np.resize(rest, short)]), short
