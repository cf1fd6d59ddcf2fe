"""Samplers: which ids a job reads, in which order.

Every module of this package is imported here, so a new sampler is one new file that
registers its class with ``@register_sampler`` (docs/extending.md).
"""

from hotset.registry import import_submodules
from hotset.sampling.base import (
    SAMPLERS,
    Sampler,
    make_sampler,
    register_sampler,
    sampler_class,
)

import_submodules(__name__, __path__)

from hotset.sampling.pads import PADSSampler  # noqa: E402
from hotset.sampling.uniform import UniformSampler  # noqa: E402

__all__ = [
    "SAMPLERS", "PADSSampler", "Sampler", "UniformSampler", "make_sampler",
    "register_sampler", "sampler_class",
]  # fmt: skip
