"""The ranks' one collective: each batch's reports and the feedback, exchanged together.

With ranks (``distributed.py``) the sampler draws the global list, every rank plans the
same global batches and serves its shard of each (``batch.shard``). What each rank's
shard did and the losses it fed back are exchanged every ``sync_every`` steps in one
``all_gather``, and every rank applies all of it alike, so the ranks' plans stay equal.
"""

from __future__ import annotations

import numpy as np

from hotset.distributed import RankGroup
from hotset.errors import RankError
from hotset.plan.batch import PlanReport


class RankSync:
    """This rank's batch reports and feedback not yet exchanged."""

    def __init__(self, ranks: RankGroup, sync_every: int) -> None:
        self.ranks, self.sync_every = ranks, int(sync_every)
        self.feedback: list[tuple] = []
        self.reports: list[tuple[int, PlanReport]] = []

    def add_feedback(self, ids, losses, embeddings) -> bool:
        """Keep one batch's feedback; whether an exchange is due."""
        self.feedback.append((ids, losses, embeddings))
        return len(self.feedback) >= self.sync_every

    def add_report(self, seq: int, report: PlanReport, with_feedback: bool) -> bool:
        """Keep one batch's report; whether an exchange is due (after twice as many
        steps where no feedback is coming)."""
        self.reports.append((seq, report))
        return len(self.reports) >= self.sync_every * (2 if with_feedback else 1)

    def pending(self) -> bool:
        return bool(self.reports or self.feedback)

    def oldest_report(self) -> int | None:
        """The oldest plan whose report waits for the exchange."""
        return self.reports[0][0] if self.reports else None

    def exchange(self, shared) -> tuple[list[tuple[int, PlanReport]], list[tuple], list]:
        """All ranks' reports and feedback since the last exchange, and each rank's
        ``shared`` (``Sampler.shared``), in one collective: the reports of each batch
        (every rank's shard joined) in batch order, the feedback in rank order, the
        shared values in rank order. Each rank calls it at the same step."""
        gathered = self.ranks.all_gather(
            (self.reports, self.feedback, shared), call="the feedback sync"
        )
        self.reports, self.feedback = [], []
        counts = {len(g[0]) for g in gathered}
        if len(counts) != 1:
            raise RankError(
                f"ranks reported {sorted(counts)} batches between two exchanges: every rank "
                "must iterate the loader alike"
            )
        reports = []
        for k in range(counts.pop()):
            shards = [g[0][k][1] for g in gathered]
            reports.append((gathered[0][0][k][0], PlanReport(
                stored=np.concatenate([r.stored for r in shards]),
                lost=np.concatenate([r.lost for r in shards]),
                absent=np.concatenate([r.absent for r in shards]),
            )))  # fmt: skip
        feedback = [item for g in gathered for item in g[1]]
        return reports, feedback, [g[2] for g in gathered]

    def mean(self, value: float) -> float:
        """The mean of every rank's ``value`` (a collective)."""
        return float(np.mean(self.ranks.all_gather(float(value), call="report_accuracy")))
