"""The coverage floor every importance sampler honours where it is on (ours: no paper
guarantees it; the ``+`` systems turn it on, the papers' names leave it off)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hotset.errors import ConfigError
from hotset.sampling import make_sampler
from hotset.sampling.coverage import FLOOR_EPOCHS, Coverage, uniform_subset
from hotset.sim.oracle import LossOracle
from hotset.sim.simulate import simulate
from hotset.systems import resolve_system


def _trained_within(sampler, n: int, epochs: int, cached=None, losses=None) -> np.ndarray:
    """Runs ``epochs`` epochs feeding back every drawn id; returns, per id, the longest
    stretch of epochs it went untrained (counting from before epoch 0)."""
    last = np.full(n, -1)
    gap = np.zeros(n, np.int64)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        if cached is not None:
            sampler.set_cached(cached)
        order = sampler.global_order(epoch)
        trained = np.unique(order)
        gap = np.maximum(gap, epoch - last - 1)  # untrained through epochs last+1..epoch-1
        last[trained] = epoch
        loss = losses[order] if losses is not None else np.ones(order.size)
        sampler.feedback(order, loss)
    return np.maximum(gap, epochs - last - 1)


@settings(max_examples=25, deadline=None)
@given(
    cache=st.floats(0.05, 0.75),
    r=st.floats(1.0, 6.0),
    k=st.integers(1, 6),
    system=st.sampled_from(["shade", "iis"]),
)
def test_every_sample_is_trained_within_k_epochs(cache, r, k, system):
    """Whatever the cache share and the repetition (r*c >= 1 included, where SHADE's list
    is the cached samples only), no sample goes more than K-1 epochs untrained."""
    n = 400
    rng = np.random.default_rng(int(cache * 1e6) + k)
    losses = rng.gamma(0.3, size=n)  # a few hard samples, most easy
    cached = rng.choice(n, int(cache * n), replace=False)
    if system == "shade":
        smp = make_sampler(
            "shade", n, repetition=r, repetition_mode="repeat", steep_drop=10.0,
            coverage_epochs=k, seed=3,
        )  # fmt: skip
    else:
        smp = make_sampler("iis", n, keep_exponent=r, coverage_epochs=k, seed=3)
        cached = None
    gap = _trained_within(smp, n, 3 * k + 2, cached, losses)
    assert gap.max() <= k - 1
    assert smp.counters()["oldest_untrained_epochs"] <= k


def test_without_the_floor_shade_at_r_c_above_one_trains_its_cache_only():
    """The pathology the floor exists for: at r*c >= 1 (a 50% cache, r = 3) SHADE's list
    is the cached samples only (the paper's, ``shade``); the floor of ``shade+`` brings
    every sample back."""
    n = 1000
    cached = np.arange(0, n, 2)
    losses = np.random.default_rng(0).random(n)
    gaps = {}
    for name in ("shade", "shade+"):
        options = {**resolve_system(name).sampler_options, "steep_drop": 10.0}
        gaps[name] = _trained_within(make_sampler("shade", n, **options), n, 10, cached, losses)
    assert (gaps["shade"] >= 9).sum() >= 0.4 * n  # half the samples never trained after epoch 0
    assert gaps["shade+"].max() <= FLOOR_EPOCHS - 1


def test_the_floor_holds_end_to_end_with_the_app_cache_in_the_simulator():
    """SHADE with APP at a 50% cache, r = 3, replaying recorded losses: the sampler's
    counters say every sample was trained and none waited more than K epochs."""
    n, epochs = 2000, 10
    rng = np.random.default_rng(1)
    oracle = LossOracle(rng.gamma(0.5, size=(epochs, n)))
    out = simulate(
        "app", n, epochs, cache_fraction=0.5, sampler="shade", batch_size=100, oracle=oracle,
        sampler_options=resolve_system("shade+").sampler_options,
    )  # fmt: skip
    c = out["sampler_counters"]
    assert c["trained_distinct"] == n
    assert c["oldest_untrained_epochs"] <= FLOOR_EPOCHS
    assert c["coverage_added"] > 0  # the floor acted: the pathology was there to prevent


def test_coverage_epochs_is_checked():
    for bad in (0, -1, 1.5, True, "4"):
        with pytest.raises(ConfigError, match="coverage_epochs"):
            Coverage(10, bad)
    with pytest.raises(ConfigError, match="order"):
        make_sampler("shade", 10, order="random")


@pytest.mark.parametrize("system", ["icache", "spider"])
def test_a_substituting_cache_serves_a_due_sample_as_itself(system):
    """iCACHE's L-cache and SpiderCache's Homophily Cache serve another sample in place of
    a miss; told the due ids, they serve those as themselves, so the floor holds for what
    is trained (replaying losses and clustered embeddings in the simulator)."""
    n, epochs = 3000, 9
    rng = np.random.default_rng(2)
    labels = rng.integers(0, 5, n)
    centres = rng.normal(size=(5, 8))
    emb = centres[labels] * 4 + 0.2 * rng.normal(size=(epochs, n, 8))
    oracle = LossOracle(rng.gamma(0.5, size=(epochs, n)), embeddings=emb, labels=labels)
    s = resolve_system(system + "+")
    out = simulate(
        s.policy, n, epochs, cache_fraction=0.2, sampler=s.sampler, batch_size=100,
        oracle=oracle, sampler_options={**s.sampler_options, "k": 32} if system == "spider"
        else {**s.sampler_options, "keep_exponent": 3.0},
    )  # fmt: skip
    c = out["sampler_counters"]
    assert out["substitute_hits"] > 0  # substitution is there
    assert c["trained_distinct"] == n
    assert c["oldest_untrained_epochs"] <= FLOOR_EPOCHS


@settings(max_examples=60, deadline=None)
@given(size=st.integers(0, 200), m=st.integers(0, 250), seed=st.integers(0, 2**32 - 1))
def test_uniform_subset_takes_m_distinct_elements(size, m, seed):
    pool = np.arange(size) * 3 + 1
    got = uniform_subset(np.random.default_rng(seed), pool, m)
    assert got.size == min(m, size)
    assert np.unique(got).size == got.size and np.isin(got, pool).all()


def test_uniform_subset_makes_every_subset_equally_likely():
    """All 10 pairs of 5 elements equally often (chi-square, 9 degrees of freedom)."""
    rng = np.random.default_rng(5)
    trials = 10_000
    codes = [tuple(np.sort(uniform_subset(rng, np.arange(5), 2))) for _ in range(trials)]
    counts = np.unique(np.asarray(codes), axis=0, return_counts=True)[1]
    assert counts.size == 10
    chi2 = float(((counts - trials / 10) ** 2 / (trials / 10)).sum())
    assert chi2 < 27.9  # p = 0.001


def test_each_papers_name_leaves_the_floor_off_and_its_plus_turns_it_on():
    for name in ("shade", "icache", "spider"):
        assert resolve_system(name).sampler_options.get("coverage_epochs") is None
        assert resolve_system(name + "+").sampler_options["coverage_epochs"] == FLOOR_EPOCHS
        plain = {k: v for k, v in resolve_system(name + "+").sampler_options.items()
                 if k != "coverage_epochs"}  # fmt: skip
        assert plain == resolve_system(name).sampler_options  # the floor is all it adds
