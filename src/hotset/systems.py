"""Named systems: a sampler and a policy that a paper evaluates together.

A bare policy name (``lru``, ``belady``, ...) means that policy under uniform shuffling,
the papers' baseline. The ``sh_*`` names are SHADE's ablations (FAST'23 section 6.2):
default importance sampling on coarse-grained (minibatch mean) losses with another
eviction policy; ``shade`` is the full system. Each paper's name builds the paper; a
``+`` name (``shade+``, ``icache+``, ``spider+``) is that system with hotset's coverage
floor (``sampling/coverage.py``: every sample trained at least once in 4 epochs), which
no paper has.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hotset.errors import ConfigError
from hotset.policy import POLICIES
from hotset.sampling.coverage import FLOOR_EPOCHS


@dataclass(frozen=True)
class System:
    name: str
    sampler: str
    policy: str
    sampler_options: dict = field(default_factory=dict)
    description: str = ""


_COARSE = {"importance": "coarse", "repetition": 1.0}

SYSTEMS: dict[str, System] = {
    s.name: s
    for s in (
        System("shade", "shade", "app",
               {"importance": "rank", "repetition": 3.0, "repetition_mode": "repeat"},
               "SHADE: rank importance (Eq. 6) + PADS (the prototype's repetition) + APP"),
        System("icache", "iis", "icache", {},
               "iCACHE: I/O-oriented importance sampling + H-cache (heap) + L-cache packages"),
        System("spider", "spider", "spider", {},
               "SpiderCache: graph importance sampling + importance/homophily caches"),
        System("shade+", "shade", "app",
               {"importance": "rank", "repetition": 3.0, "repetition_mode": "repeat",
                "coverage_epochs": FLOOR_EPOCHS},
               "SHADE with hotset's coverage floor (every sample once in 4 epochs)"),
        System("icache+", "iis", "icache", {"coverage_epochs": FLOOR_EPOCHS},
               "iCACHE with hotset's coverage floor (every sample once in 4 epochs)"),
        System("spider+", "spider", "spider", {"coverage_epochs": FLOOR_EPOCHS},
               "SpiderCache with hotset's coverage floor (every sample once in 4 epochs)"),
        System("sh_app", "shade", "app", _COARSE, "coarse importance sampling + APP cache"),
        System("sh_pq", "shade", "pq", _COARSE, "coarse importance sampling + priority queue"),
        System("sh_lru", "shade", "lru", _COARSE, "coarse importance sampling + LRU"),
        System("sh_lfu", "shade", "lfu", _COARSE, "coarse importance sampling + LFU"),
        System("sh_rand", "shade", "random", _COARSE, "coarse importance sampling + random"),
    )
}  # fmt: skip


def resolve_system(name: str) -> System:
    """A named system, or a bare policy under uniform shuffling."""
    if name in SYSTEMS:
        return SYSTEMS[name]
    if name in POLICIES and not POLICIES[name].needs_scores:
        return System(name, "uniform", name, {}, f"uniform shuffling + {name}")
    known = sorted(SYSTEMS) + sorted(
        p for p, c in POLICIES.items() if not c.needs_scores and p not in SYSTEMS
    )
    raise ConfigError(f"unknown system or policy {name!r}; choose from: {', '.join(known)}")
