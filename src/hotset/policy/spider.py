"""SpiderCache's semantic-aware cache (ICPP'25 section 4.2, Algorithm 1 lines 4-13, 22).

* **Importance Cache**: a min-heap by graph importance score (a ``pq`` policy inside);
  it changes only on a double miss: the sample read from storage is admitted if its
  score exceeds the top's, which is evicted (Figure 9, cases 2 and 4).
* **Homophily Cache**: a FIFO of high-degree nodes, each with its neighbour-id list
  (the sampler's hints, one node per scored batch). A request for a listed neighbour
  that misses the Importance Cache is served the cached node (case 3); the planner puts
  a new node into the store with the next batch (``fetch``).

The caches are exclusive: a node already held by one is not added to the other. The
split between them is ``imp_ratio`` (the elastic manager's hint, section 4.3).

A new node serves its neighbours once the data plane reports its fetch landed
(``reconcile``): DataLoader workers run several plans at once, and a substitute must be
a real store hit, not a late miss. A node that plans in flight serve (it is pinned) is
not dropped from the FIFO until they have run.
"""

from __future__ import annotations

import numpy as np

from hotset.errors import ConfigError
from hotset.policy.base import AccessResult, Policy, register_policy
from hotset.policy.priority import PriorityPolicy


@register_policy
class SpiderPolicy(Policy):
    name = "spider"
    needs_scores = True

    def __init__(
        self,
        capacity_bytes,
        sizes,
        seed: int = 0,
        imp_ratio: float = 0.9,
    ) -> None:
        super().__init__(capacity_bytes, sizes, seed)
        self._pending: set[int] = set()  # nodes whose fetch has not landed yet
        self.importance = PriorityPolicy(int(capacity_bytes * imp_ratio), sizes, seed)
        self.share_pins(self.importance)  # one count of pins for both caches
        self.homophily: dict[int, np.ndarray] = {}  # node -> neighbour ids, FIFO order
        self.owner = np.full(self.num_samples, -1, np.int64)  # neighbour -> its node
        self.hom_used = 0
        self._fetch: list[int] = []
        self._evicted: list[int] = []
        self._due: set[int] = set()  # ids the coverage floor needs trained as themselves
        self.set_ratio(imp_ratio)

    @property
    def _resident(self):
        return set(self.cached_ids().tolist())

    def __contains__(self, i: int) -> bool:
        return int(i) in self.importance or int(i) in self.homophily

    def __len__(self) -> int:
        return len(self.importance) + len(self.homophily)

    def cached_ids(self) -> np.ndarray:
        hom = np.fromiter(self.homophily, np.int64, len(self.homophily))
        return np.concatenate([self.importance.cached_ids(), hom])

    def attach_scores(self, board) -> None:
        self.importance.attach_scores(board)

    def scores_updated(self, ids: np.ndarray) -> None:
        """Nothing: the Importance Cache is keyed at admission, updated on double misses."""

    # -- the elastic split and the homophily candidates ----------------------------------
    def set_ratio(self, imp_ratio: float) -> None:
        if not 0.0 <= imp_ratio <= 1.0:
            raise ConfigError(f"imp_ratio must be in [0, 1], got {imp_ratio}")
        self.imp_ratio = float(imp_ratio)
        imp_cap = int(self.capacity_bytes * imp_ratio)
        self.hom_capacity = self.capacity_bytes - imp_cap
        self._evicted += self.importance.shrink_to(imp_cap)
        self.importance.capacity_bytes = imp_cap
        self._make_room(0)

    def _make_room(self, nbytes: int) -> bool:
        """Drop the oldest unpinned nodes until ``nbytes`` more fit; whether they do."""
        for node in list(self.homophily):
            if self.hom_used + nbytes <= self.hom_capacity:
                break
            if not self.pinned[node]:
                self._drop_node(node)
        return self.hom_used + nbytes <= self.hom_capacity

    def _drop_node(self, node: int, evict: bool = True) -> None:
        self._pending.discard(node)
        nbrs = self.homophily.pop(node)
        mine = nbrs[self.owner[nbrs] == node]
        self.owner[mine] = -1
        self.hom_used -= self._sizes[node]
        if evict:
            self._evicted.append(node)

    def add_node(self, node: int, neighbours: np.ndarray) -> bool:
        """Line 22: the batch's highest-degree node joins the FIFO (oldest out)."""
        s = self._sizes[node]
        if node in self.importance or node in self.homophily or s > self.hom_capacity:
            return False
        if not self._make_room(s):
            return False
        nbrs = np.asarray(neighbours, np.int64)
        self.homophily[node] = nbrs
        self._pending.add(node)
        self.hom_used += s
        self._fetch.append(node)
        return True

    def apply_hints(self, hints: dict) -> None:
        if "due" in hints:  # the coverage floor: served as themselves this epoch
            self._due = set(np.asarray(hints["due"], np.int64).tolist())
        if "imp_ratio" in hints:
            self.set_ratio(hints["imp_ratio"])
        for node, neighbours in hints.get("homophily", ()):
            self.add_node(int(node), neighbours)

    # -- accesses ----------------------------------------------------------------------
    def reconcile(self, stored: np.ndarray, lost: np.ndarray) -> list[int]:
        """Fetched nodes that landed start serving their neighbours; lost ones go."""
        for node in np.asarray(stored, np.int64).tolist():
            if node in self._pending:
                self._pending.discard(node)
                nbrs = self.homophily[node]
                self.owner[nbrs] = node
        return self.discard(lost)

    def discard(self, ids) -> list[int]:
        ids = np.asarray(ids, np.int64)
        out = self.importance.discard(ids)
        for node in ids.tolist():
            if node in self.homophily:
                self._drop_node(node, evict=False)
                out.append(node)
        self.used = self.importance.used + self.hom_used
        return out

    def access(self, ids) -> AccessResult:
        pending = self._pending
        ids_list = np.asarray(ids, np.int64).tolist()
        n = len(ids_list)
        served, hits, sub = list(ids_list), [False] * n, [False] * n
        imp, hom, owner, due = self.importance, self.homophily, self.owner, self._due
        rest, rest_pos = [], []
        for p, i in enumerate(ids_list):
            if i in imp:
                pass  # line 5: an Importance Cache hit (the inner policy reports it)
            elif i in hom:
                hits[p] = i not in pending  # the node itself (from storage until fetched)
                continue
            elif owner[i] >= 0 and i not in due:  # line 7: a neighbour gets the cached node
                served[p], hits[p], sub[p] = int(owner[i]), True, True
                continue
            rest.append(i)
            rest_pos.append(p)
        inner = self.importance.access(rest)  # line 10
        for p, h in zip(rest_pos, inner.hits.tolist(), strict=True):
            hits[p] = h
        self._evicted += inner.evicted.tolist()
        self.used = self.importance.used + self.hom_used
        evicted = [i for i in dict.fromkeys(self._evicted) if i not in self]
        fetch = [i for i in dict.fromkeys(self._fetch) if i in hom]
        self._evicted, self._fetch = [], []
        return AccessResult(
            hits=np.array(hits, bool),
            admitted=inner.admitted,
            evicted=np.array(evicted, np.int64),
            served=np.array(served, np.int64),
            substituted=np.array(sub, bool),
            fetch=np.array(fetch, np.int64),
        )
