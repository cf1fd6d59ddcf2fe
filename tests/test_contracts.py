"""Declared contracts: every policy keeps them for resizing, late sizes and hints; a
policy or sampler that implements only its own part works everywhere through the
bases' defaults; the planners are one PlanSource; registries refuse a taken name."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.test_policies import make_policy

from hotset import POLICIES, ConfigError, ScoreBoard
from hotset.plan import Planner, PlanSource
from hotset.policy.base import Policy, register_policy
from hotset.sampling.base import Sampler, make_sampler, register_sampler
from hotset.service.coordinator import JobCoordinator
from hotset.sim import simulate

N = 20
sizes_st = st.lists(st.integers(1, 50), min_size=N, max_size=N)
seq_st = st.lists(st.integers(0, N - 1), min_size=1, max_size=120)


def residents(p: Policy) -> set[int]:
    return set(p.cached_ids().tolist())


def check_accounting(p: Policy) -> None:
    assert p.used == sum(p.size_of(i) for i in residents(p))
    assert p.used <= p.capacity_bytes


def warm(p: Policy, seq: list[int]) -> None:
    if p.needs_future:
        p.set_future(np.asarray(seq * 2))
    for lo in range(0, len(seq), 7):
        p.access(seq[lo : lo + 7])


@pytest.mark.parametrize("name", list(POLICIES))
@settings(max_examples=40, deadline=None)
@given(seq=seq_st, sizes=sizes_st, capacity=st.integers(0, 300), smaller=st.floats(0, 1))
def test_shrink_to_evicts_to_fit_or_refuses_and_changes_nothing(
    name, seq, sizes, capacity, smaller
):
    p = make_policy(name, capacity, sizes=sizes, seed=1)
    warm(p, seq)
    before, used = residents(p), p.used
    target = int(capacity * smaller)
    try:
        evicted = p.shrink_to(target)
    except ConfigError as exc:
        assert name in str(exc)  # names the policy
        assert residents(p) == before and p.used == used and p.capacity_bytes == capacity
        return
    assert p.capacity_bytes == target
    assert set(evicted) <= before and residents(p) == before - set(evicted)
    check_accounting(p)
    if not p.needs_future:  # it goes on within the new capacity
        for lo in range(0, len(seq), 7):
            p.access(seq[lo : lo + 7])
            check_accounting(p)


@pytest.mark.parametrize("name", list(POLICIES))
@settings(max_examples=30, deadline=None)
@given(seq=seq_st, sizes=sizes_st, new=st.integers(1, 50), capacity=st.integers(1, 300))
def test_set_sizes_applies_to_new_ids_and_refuses_a_resident(name, seq, sizes, new, capacity):
    p = make_policy(name, capacity, sizes=sizes, seed=2)
    warm(p, seq)
    res = residents(p)
    outside = [i for i in range(N) if i not in res]
    p.set_sizes(np.array(outside, np.int64), np.full(len(outside), new))
    assert all(p.size_of(i) == new for i in outside)
    changed = [i for i in res if p.size_of(i) != new]
    if changed:
        with pytest.raises(ConfigError, match=f"sample {changed[0]} is cached"):
            p.set_sizes(np.array(changed[:1]), np.array([new]))
    check_accounting(p)


def hints_st():
    hot = st.lists(st.booleans(), min_size=N, max_size=N)
    imp = st.lists(st.floats(0, 1), min_size=N, max_size=N)
    icache = st.builds(lambda h, i: {"hot": np.array(h), "importance": np.array(i)}, hot, imp)
    spider = st.builds(
        lambda r, node, nbrs: {"imp_ratio": r, "homophily": [(node, np.array(nbrs))]},
        st.floats(0, 1),
        st.integers(0, N - 1),
        st.lists(st.integers(0, N - 1), min_size=1, max_size=5),
    )
    return st.one_of(st.just({}), icache, spider)


@pytest.mark.parametrize("name", [n for n, c in POLICIES.items() if not c.needs_future])
@settings(max_examples=40, deadline=None)
@given(seq=seq_st, sizes=sizes_st, capacity=st.integers(0, 300), hints=hints_st())
def test_any_sampler_hints_keep_the_accounting_and_reach_the_store(
    name, seq, sizes, capacity, hints
):
    """Every policy takes every sampler's hints (ignoring those it has no use for); what
    a hint drops or adds reaches the store through the next access's plan."""
    p = make_policy(name, capacity, sizes=sizes, seed=3)
    warm(p, seq)
    before = residents(p)
    p.apply_hints(hints)
    if not hints:
        assert residents(p) == before
    r = p.access(seq[:7])
    added = set(r.admitted.tolist()) | set(() if r.fetch is None else r.fetch.tolist())
    assert residents(p) == (before - set(r.evicted.tolist())) | added
    check_accounting(p)


# -- a policy and a sampler that implement only their own part -----------------------
@register_policy
class LowestIdPolicy(Policy):
    """Keeps the lowest ids: a miss evicts the highest resident above it."""

    name = "test-lowest-id"

    def __init__(self, capacity_bytes, sizes, seed: int = 0):
        super().__init__(capacity_bytes, sizes, seed)
        self._members: set[int] = set()

    @property
    def _resident(self):
        return self._members

    def _victim(self, p: int, i: int) -> int:
        top = max(self._members)
        if top < i:
            return -1
        self._members.discard(top)
        return top

    def _insert(self, p: int, i: int) -> None:
        self._members.add(i)

    def _restore(self, victims: list[int]) -> None:
        self._members.update(victims)


@register_sampler
class EvenFirstSampler(Sampler):
    """Even ids, then odd ones: an order known ahead, nothing learnt."""

    name = "test-even-first"

    def global_order(self, epoch: int) -> np.ndarray:
        ids = np.arange(self.num_samples)
        return np.concatenate([ids[::2], ids[1::2]])


def test_a_new_policy_and_sampler_run_everywhere_through_the_declared_defaults():
    r = simulate("test-lowest-id", 100, 2, cache_fraction=0.2, sampler="test-even-first")
    assert r["steady_hit_ratio"] == pytest.approx(0.2)  # ids 0-19 stay, hit once per epoch
    planner = Planner(make_sampler("test-even-first", 50), make_policy("test-lowest-id", 10,
                      sizes=np.ones(50)), batch_size=8)  # fmt: skip
    assert isinstance(planner, PlanSource) and not planner.wants_embeddings
    planner.feedback(np.arange(8), np.ones(8))  # no-op hooks, no errors
    planner.report_accuracy(0.5)
    planner.drain()
    assert [len(p) for p in planner] == [8] * 6 + [2]
    assert set(planner.counters()) == {
        "planning_s",
        "feedback_s",
        "phantoms",
        "sync_fixes",
        "sync_s",
        "sync_calls",
        "offered",
        "refilled",
    }
    planner.set_epoch(3)
    other = Planner(make_sampler("test-even-first", 50), make_policy("test-lowest-id", 10,
                    sizes=np.ones(50)), batch_size=8)  # fmt: skip
    other.load_state_dict(planner.state_dict())  # the declared defaults save and restore
    assert other.sampler.epoch == 3 and set(other.policy.cached_ids()) == set(range(10))
    planner.close()
    co = JobCoordinator(20, max_samples=100, policy="test-lowest-id", sampling="isa")
    job = co.register("a", [f"k{i}" for i in range(40)], np.ones(40), batch_size=10)
    while co.plan(job, 0)["gids"].size:  # a partition made by new_partition's default
        pass
    assert co.policy.used == 20 and set(co.policy.cached_ids().tolist()) == set(range(20))
    with pytest.raises(ConfigError, match="'test-lowest-id' cannot be resized"):
        JobCoordinator(20, policy="test-lowest-id", allocation="benefit").register(
            "b", ["x", "y"], np.ones(2), batch_size=1
        )


def test_registries_refuse_a_taken_name():
    with pytest.raises(ConfigError, match="'lru' is taken by LRUPolicy"):

        @register_policy
        class Other(LowestIdPolicy):
            name = "lru"

    with pytest.raises(ConfigError, match="'uniform' is taken by UniformSampler"):

        @register_sampler
        class Another(EvenFirstSampler):
            name = "uniform"

    assert register_policy(LowestIdPolicy) is LowestIdPolicy  # the same class again: fine


def test_a_score_keyed_policy_is_attached_to_its_samplers_board():
    board_policy = [n for n, c in POLICIES.items() if c.needs_scores]
    for name in board_policy:
        p = make_policy(name, 10, sizes=np.ones(30))
        with pytest.raises(ConfigError, match="has none"):
            Planner(make_sampler("uniform", 30), p, 4)
        planner = Planner(make_sampler("shade", 30), p, 4)
        assert isinstance(planner.sampler.board, ScoreBoard)


def test_the_simulator_imports_neither_torch_nor_zmq_nor_lmdb():
    code = (
        "import sys; from hotset.cli import main; "
        "main(['simulate', '--policy', 'lru', '--dataset-size', '2000', '--epochs', '1', "
        "'--cache-fraction', '0.1', '--json']); "
        "print(sorted(m for m in ('torch', 'zmq', 'lmdb') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_the_loader_reads_of_its_planner_only_what_plan_source_declares():
    """docs/design.md: nothing probes for attributes. Every ``self.planner.X`` the loader
    reads is declared on ``PlanSource``, and each planner (in process, in a process of its
    own, the service's) has it."""
    import inspect
    import re
    import typing

    from hotset import loader
    from hotset.plan_process import PlannerProcess
    from hotset.service.client import RemotePlanner

    text = Path(loader.__file__).read_text()
    used = set(re.findall(r"self\.planner\.([a-z_]+)", text))
    declared = set(typing.get_type_hints(PlanSource)) | {
        k for k in vars(PlanSource) if not k.startswith("_")}  # fmt: skip
    assert used and used <= declared, used - declared
    assert "getattr(self.planner" not in text
    for kind in (Planner, PlannerProcess, RemotePlanner):
        source = inspect.getsource(kind)
        missing = {k for k in declared if not hasattr(kind, k)
                   and not re.search(rf"self\.{k}(: [^=]+)? = |self\.{k}, ", source)}  # fmt: skip
        assert not missing, (kind.__name__, missing)
