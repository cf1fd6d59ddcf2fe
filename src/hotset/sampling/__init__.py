"""Samplers: which ids a job reads, in which order."""

from hotset.sampling import iis, pads, spider, uniform  # noqa: F401 - register
from hotset.sampling.base import SAMPLERS, Sampler, make_sampler, register_sampler
from hotset.sampling.pads import PADSSampler
from hotset.sampling.uniform import UniformSampler

__all__ = [
    "SAMPLERS",
    "PADSSampler",
    "Sampler",
    "UniformSampler",
    "make_sampler",
    "register_sampler",
]
