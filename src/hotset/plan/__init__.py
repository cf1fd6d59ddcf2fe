"""The control plane's plans: what a batch is (``batch.py``), what a loader talks to
(``source.py``), and the single-job Planner (``planner.py``) over its stages."""

from hotset.plan.batch import BatchPlan, PlanReport, shard
from hotset.plan.planner import COUNTERS, Planner
from hotset.plan.position import KEPT_PLANS
from hotset.plan.source import PlanSource

__all__ = ["COUNTERS", "KEPT_PLANS", "BatchPlan", "PlanReport", "PlanSource", "Planner", "shard"]
