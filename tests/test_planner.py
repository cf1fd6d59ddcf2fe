"""The planner's tracking of plans in flight, over as many plans as its columns count."""

from __future__ import annotations

import json
import multiprocessing as mp
from collections import deque
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hotset.plan import Planner, PlanReport
from hotset.policy.base import make_policy
from hotset.sampling.base import make_sampler
from hotset.store import MemoryStore


class NarrowPlanner(Planner):
    tracking_dtype = np.int8  # rebased every 127 plans


class WidePlanner(Planner):
    tracking_dtype = np.int64  # never rebased


def _run(cls: type[Planner], seed: int, depth: int, lost: float, quit_at: int,
         n: int = 120, capacity: int = 12, **options) -> list:  # fmt: skip
    """Eight epochs of a loader that keeps ``depth`` plans in flight, loses a share of
    each plan's writes and of its hits, and gives up the fourth epoch after ``quit_at``
    plans; every plan's decisions, the phantoms and the cache at the end (LRU over
    ``n`` ids of a byte, ``capacity`` bytes). ``options``: the planner's (``ranks``,
    ``sync_every``)."""
    batch = 3
    policy = make_policy("lru", capacity, sizes=np.ones(n, np.int64))
    planner = cls(make_sampler("uniform", n, seed=seed), policy, batch, store=MemoryStore(1),
                  **options)  # fmt: skip
    rng = np.random.default_rng(seed)
    seen = []

    def consume(plan) -> None:
        writes = np.concatenate([plan.admitted, plan.fetch])
        gone = rng.random(writes.size) < lost
        absent = plan.ids[plan.hits][rng.random(int(plan.hits.sum())) < lost]
        planner.batch_consumed(PlanReport(stored=writes[~gone], lost=writes[gone], absent=absent))

    for epoch in range(8):
        planner.set_epoch(epoch)
        pending: deque = deque()
        for k, plan in enumerate(planner):
            seen.append((plan.ids, plan.hits, plan.admitted, plan.evicted, plan.fetch,
                         plan.wait_s))  # fmt: skip
            pending.append(plan)
            while len(pending) > depth:
                consume(pending.popleft())
            if epoch == 3 and k == quit_at:
                break  # abandoned: the plans in flight are never reported
        else:
            while pending:
                consume(pending.popleft())
    planner.flush()  # (with ranks: the reports still to exchange)
    seen.append((planner.phantoms, np.sort(policy.cached_ids())))
    planner.close()
    return seen


def _same(narrow: list, wide: list) -> None:
    assert len(narrow) == len(wide)
    for a, b in zip(narrow, wide, strict=True):
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x, y)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    depth=st.sampled_from([0, 1, 3, 9, 40]),
    lost=st.sampled_from([0.0, 0.1, 0.5]),
    quit_at=st.integers(0, 39),
)
def test_plans_are_the_same_whichever_columns_track_those_in_flight(seed, depth, lost, quit_at):
    """Rebased every 127 plans (int8) or never (int64), the planner decides alike: the
    same served ids, hits, writes, deletions and waits for every plan, the same phantoms
    and the same cache, over 320 plans (two rebases) with up to 40 in flight, writes lost and
    reported absent, and an epoch abandoned with plans in flight."""
    narrow = _run(NarrowPlanner, seed, depth, lost, quit_at)
    _same(narrow, _run(WidePlanner, seed, depth, lost, quit_at))


def test_plans_unreconciled_past_the_columns_range_widen_them():
    """More plans in flight than an int8 counts (130): the columns widen, and the plans
    are those of columns that never needed to."""
    _same(_run(NarrowPlanner, 3, 130, 0.1, 39), _run(WidePlanner, 3, 130, 0.1, 39))


def _rank(rank: int, init: str, out: str) -> None:
    import torch.distributed as dist

    from hotset.distributed import RankGroup

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    runs = {}
    for cls in (NarrowPlanner, WidePlanner):
        plans = _run(cls, 5, 1, 0.3, 17, n=480, capacity=120, ranks=RankGroup(), sync_every=9)
        runs[cls.__name__] = [[np.asarray(x).tolist() for x in plan] for plan in plans]
    Path(out, f"rank{rank}.json").write_text(json.dumps(runs))
    dist.destroy_process_group()


def test_reports_waiting_for_the_ranks_exchange_keep_their_plans_tracked(tmp_path):
    """Two ranks (gloo) exchange their reports every 9 steps: a rebase keeps the plans
    whose reports wait for the exchange, and each rank plans with int8 columns as with
    int64 ones (640 global plans, writes lost, an epoch abandoned)."""
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank, args=(r, f"file://{tmp_path}/pg", str(tmp_path)))
             for r in range(2)]  # fmt: skip
    for p in procs:
        p.start()
    for p in procs:
        p.join(240)
    assert [p.exitcode for p in procs] == [0, 0]
    for r in range(2):
        runs = json.loads((tmp_path / f"rank{r}.json").read_text())
        _same(runs["NarrowPlanner"], runs["WidePlanner"])


def test_plan_hashes_check_a_change_that_leaves_the_plans_alone(tmp_path):
    """``scripts/plan_hashes.py`` (docs/extending.md) hashes the same plans run to run, so
    ``--check`` passes where nothing changed and fails where a plan did."""
    import subprocess
    import sys

    script = Path(__file__).parents[1] / "scripts" / "plan_hashes.py"
    recorded = tmp_path / "plans.json"

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(script), *args, "lru", "shade-disk"],
                              capture_output=True, text=True, timeout=300)  # fmt: skip

    assert run("--write", str(recorded)).returncode == 0
    assert run("--check", str(recorded)).returncode == 0
    hashes = json.loads(recorded.read_text())
    recorded.write_text(json.dumps({**hashes, "lru": "0" * 16}))
    changed = run("--check", str(recorded))
    assert changed.returncode == 1 and "plans changed: lru" in changed.stdout


def test_a_planner_without_a_store_keeps_its_last_plans_not_the_epochs():
    """Without a store (the simulator) a plan counts as consumed when handed out: the
    planner keeps the last few plans, not every plan of the epoch (at 100M ids, 390k
    plans), and a state taken mid-epoch resumes after the plans handed out."""
    from hotset.plan.position import KEPT_PLANS

    n, batch = 3000, 10
    planner = Planner(make_sampler("uniform", n, seed=0),
                      make_policy("lru", 300, sizes=np.ones(n, np.int64)), batch)  # fmt: skip
    plans = iter(planner)
    served = [next(plans).ids for _ in range(40)]
    assert len(planner.at.made) <= KEPT_PLANS
    state = planner.state_dict()
    rest = np.concatenate([p.ids for p in plans])
    assert len(planner.at.made) <= KEPT_PLANS
    again = Planner(make_sampler("uniform", n, seed=0),
                    make_policy("lru", 300, sizes=np.ones(n, np.int64)), batch)  # fmt: skip
    again.load_state_dict(state)
    assert np.array_equal(np.concatenate([p.ids for p in again]), rest)
    assert np.array_equal(np.sort(np.concatenate([*served, rest])), np.arange(n))


def test_a_cache_aware_sampler_of_your_own_is_told_the_cached_ids_at_each_epoch_start():
    """docs/extending.md: ``set_cached(ids)`` at each epoch start, the policy's residents."""
    from hotset.sampling.base import Sampler

    class Told(Sampler):
        cache_aware = True

        def global_order(self, epoch):
            return np.random.default_rng([self.seed, epoch]).permutation(self.num_samples)

        def set_cached(self, ids):
            told.append(np.sort(ids).tolist())

    told = []
    policy = make_policy("lru", 40, sizes=np.ones(100, np.int64))
    planner = Planner(Told(100, seed=0), policy, 10)
    residents = []
    for epoch in range(2):
        planner.set_epoch(epoch)
        residents.append(sorted(policy.cached_ids().tolist()))
        for _ in planner:
            pass
    assert told == residents and len(told[1]) == 40
