"""Samplers: which ids a job reads, in which order."""

from hotset.sampling import uniform  # noqa: F401 - register
from hotset.sampling.base import SAMPLERS, Sampler, make_sampler, register_sampler
from hotset.sampling.uniform import UniformSampler

__all__ = ["SAMPLERS", "Sampler", "UniformSampler", "make_sampler", "register_sampler"]
