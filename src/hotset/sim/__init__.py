"""The simulator: replay samplers and policies on ids, without bytes."""

from hotset.sim.simulate import simulate, simulate_trace

__all__ = ["simulate", "simulate_trace"]
