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
    """The batch reports and feedback not yet exchanged, of the ranks this process plans
    for (``ranks.here``: itself, or a node's ranks under ``NodeRanks``); each entry holds
    one per rank, in that order."""

    def __init__(self, ranks: RankGroup, sync_every: int) -> None:
        self.ranks, self.sync_every = ranks, int(sync_every)
        self.feedback: list[list[tuple]] = []
        self.reports: list[tuple[int, list[PlanReport]]] = []

    def add_feedback(self, items: list[tuple]) -> bool:
        """Keep one batch's feedback (``(ids, losses, embeddings)`` of each rank here);
        whether an exchange is due."""
        self.feedback.append(items)
        return len(self.feedback) >= self.sync_every

    def add_report(self, seq: int, reports: list[PlanReport], with_feedback: bool) -> bool:
        """Keep one batch's reports (each rank's shard here); whether an exchange is due
        (after twice as many steps where no feedback is coming)."""
        self.reports.append((seq, reports))
        return len(self.reports) >= self.sync_every * (2 if with_feedback else 1)

    def pending(self) -> bool:
        return bool(self.reports or self.feedback)

    def oldest_report(self) -> int | None:
        """The oldest plan whose report waits for the exchange."""
        return self.reports[0][0] if self.reports else None

    def exchange(self, shared) -> tuple[list[tuple[int, PlanReport]], list[tuple], list]:
        """All ranks' reports and feedback since the last exchange, and each planning
        process's ``shared`` (``Sampler.shared``), in one collective: the reports of each
        batch (every rank's shard joined, in rank order) in batch order, the feedback in
        rank order (each rank's batches in turn), the shared values in the processes'
        order. Each process calls it at the same step."""
        gathered = self.ranks.all_gather(
            (self.ranks.here, self.reports, self.feedback, shared), call="the feedback sync"
        )
        self.reports, self.feedback = [], []
        counts = {len(g[1]) for g in gathered}
        if len(counts) != 1:
            raise RankError(
                f"ranks reported {sorted(counts)} batches between two exchanges: every rank "
                "must iterate the loader alike"
            )
        reports = []
        for k in range(counts.pop()):
            shards = _by_rank((here, batches[k][1]) for here, batches, _, _ in gathered)
            reports.append((gathered[0][1][k][0], PlanReport(
                stored=np.concatenate([r.stored for r in shards]),
                lost=np.concatenate([r.lost for r in shards]),
                absent=np.concatenate([r.absent for r in shards]),
            )))  # fmt: skip
        per_rank = _by_rank(
            (here, [[step[j] for step in steps] for j in range(len(here))])
            for here, _, steps, _ in gathered
        )
        return reports, [item for steps in per_rank for item in steps], [g[3] for g in gathered]

    def mean(self, values: list[float]) -> float:
        """The mean of every rank's value (``values``: those of the ranks here; a
        collective)."""
        gathered = self.ranks.all_gather(
            (self.ranks.here, [float(v) for v in values]), call="report_accuracy"
        )
        return float(np.mean(_by_rank(gathered)))


def _by_rank(pairs) -> list:
    """Each process's ``(ranks, one value per rank)`` as one list in rank order."""
    pairs = [(r, v) for here, vs in pairs for r, v in zip(here, vs, strict=True)]
    return [v for _, v in sorted(pairs, key=lambda p: p[0])]
