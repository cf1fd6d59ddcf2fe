"""From decoded samples to a batch: what is the input and what the target, then one
stacked tensor (or the user's ``collate_fn``).

A decoded sample is an array (an image, a ``.npy``), a dict of fields (a WebDataset group,
a table row) or a pair (a torch Dataset's item). Its input and target are, in order: the
storage's ``input_field`` / ``target_field`` of a dict; the two items of a pair; the
sample itself with the storage's label (none where the storage has no labels).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import default_collate

from hotset.codecs import to_tensor
from hotset.errors import ConfigError


def split_sample(storage, i: int, sample: Any, label: int) -> tuple[Any, Any]:
    """``(input, target)`` of sample ``i`` of ``storage`` (``label`` < 0: none known).
    Raises KeyError naming a field the sample lacks."""
    if isinstance(sample, dict):
        field = storage.input_field
        if field is not None:
            target = storage.target_field
            return _fields(sample, field), (
                _fields(sample, target) if target is not None else _label(label)
            )
    elif isinstance(sample, list | tuple) and len(sample) == 2:
        return sample[0], sample[1]
    return sample, _label(label)


def _fields(sample: dict, field: str | tuple[str, ...]) -> Any:
    """``sample[field]``, or a dict of the fields named (a tuple of names)."""
    try:
        return sample[field] if isinstance(field, str) else {f: sample[f] for f in field}
    except KeyError as exc:
        raise KeyError(f"no field {exc.args[0]!r} (it has {sorted(sample)})") from None


def _label(label: int) -> int | None:
    return int(label) if label >= 0 else None


def _stack(ids: Sequence[int], xs: list, describe: Callable[[int], str]) -> torch.Tensor:
    shapes = [tuple(x.shape) for x in xs]
    odd = next((k for k, s in enumerate(shapes) if s != shapes[0]), None)
    if odd is not None:
        raise ConfigError(
            f"samples of one batch differ in shape: {describe(ids[0])} is {shapes[0]}, "
            f"{describe(ids[odd])} is {shapes[odd]}; give make_loader size=(width, height) "
            "to resize images as they are decoded, or a transform= (or collate_fn=) that "
            "makes them one shape"
        )
    if isinstance(xs[0], torch.Tensor):
        return to_tensor(torch.stack(xs))
    return to_tensor(np.stack(xs))


def collate(
    ids: Sequence[int],
    samples: list[tuple[Any, Any]],
    describe: Callable[[int], str],
    transform: Callable | None = None,
    collate_fn: Callable | None = None,
) -> tuple[Any, Any]:
    """The batch's ``(inputs, targets)`` from the served samples' ``(input, target)``
    pairs. Arrays become one float tensor (uint8 pixels scaled to [0, 1]); ``transform``
    runs per input first; integer targets become an int64 array; targets that are
    arrays, dicts or text are collated as torch's ``default_collate`` does; no target
    at all gives ``None``. ``collate_fn`` (given the pairs, as a DataLoader's is given
    its items) replaces all of this: its result is the inputs, or a pair of inputs and
    targets."""
    if collate_fn is not None:
        if transform is not None:
            samples = [(transform(_tensor(x)), y) for x, y in samples]
        out = collate_fn(samples)
        return tuple(out) if isinstance(out, tuple | list) and len(out) == 2 else (out, None)
    if not samples:
        return torch.empty(0), np.empty(0, np.int64)
    xs = [x for x, _ in samples]
    if transform is not None:
        xs = [transform(_tensor(x)) for x in xs]
    if all(isinstance(x, np.ndarray | torch.Tensor) for x in xs):
        inputs = _stack(ids, xs, describe)
    else:
        inputs = default_collate(xs)
    ys = [y for _, y in samples]
    if all(y is None for y in ys):
        return inputs, None
    if all(isinstance(y, int | np.integer) for y in ys):
        return inputs, np.asarray(ys, np.int64)
    return inputs, default_collate(ys)


def _tensor(x: Any) -> Any:
    return to_tensor(x) if isinstance(x, np.ndarray | torch.Tensor) else x
