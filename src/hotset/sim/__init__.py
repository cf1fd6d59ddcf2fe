"""The simulator: replay samplers and policies on ids, without bytes."""

from hotset.sim.oracle import LossOracle
from hotset.sim.simulate import simulate, simulate_trace
from hotset.sim.sweep import sweep

__all__ = ["LossOracle", "simulate", "simulate_trace", "sweep"]
