"""Redis Cluster store (redis-py's ``RedisCluster``): the pooled tier across nodes, with
its entries spread over every slot and master.

``RedisStore`` puts one hash tag on every key so that its Lua scripts can run on one
slot, which on a cluster puts the whole cache on one master. Here keys carry no tag: each
lands on the master its own hash slot names, reads are ``mget_nonatomic`` (one request
per master), and the byte budget is a counter the puts reserve against before writing
(``INCRBY``, given back when over the budget or when the key already exists): it holds
with no cross-slot script. The budget itself is the planner's (one plan decides every
entry); the counter keeps a stray writer from overfilling the cluster.

Slot moves (MOVED/ASK) are followed by the client; a master that is down, a cluster
that is not ok, or any other Redis error is absorbed like ``RedisStore``'s outages:
``failures`` counted, absent reads, nothing stored, no request for ``retry_after_s``.
Reads go to each master on their own: a master that is down costs only its keys (not
asked again for ``retry_after_s``), the others still hit. Run a cache cluster with
``cluster-require-full-coverage no``, else every master refuses once one is down.

The budget is spread over the masters, so that a master down costs its keys only (one
counter on one slot would stop every write with its master): each master keeps the
tokens (bytes still free) of its share, proportional to the slots it owns, in a key of
a slot it owns. A put takes tokens from its key's master; a master short of them borrows
from the others (taken from the lender before they are given, so tokens plus stored
bytes never exceed the capacity); a delete gives them back to the key's master. A
lender that is down lends nothing; ``reconcile`` recounts each live master's tokens.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from collections.abc import Mapping, Sequence

from hotset.errors import StoreUnavailable
from hotset.store.redis_store import RedisStore

log = logging.getLogger(__name__)

SCHEME = "redis+cluster://"


def _seeds(url: str) -> tuple[str, list[tuple[str, int]]]:
    """``redis+cluster://a:1,b:2/...``: the first seed with the URL's rest, and the others
    as (host, port): a client starts from whichever answers."""
    rest = url[len(SCHEME) :]
    cut = min((rest.index(c) for c in "/?" if c in rest), default=len(rest))
    first, *more = rest[:cut].split(",")
    others = []
    for node in more:
        host, _, port = node.rpartition(":")
        others.append((host, int(port)))
    return first + rest[cut:], others


class RedisClusterStore(RedisStore):
    """Store on the Redis Cluster one of whose nodes is at ``url``
    (``redis+cluster://host:port``, or several seeds ``host:port,host:port``)."""

    def __init__(self, capacity_bytes: int, url: str, namespace: str | None = None, **options):
        self._node_down: dict[str, float] = {}  # master -> not asked again until
        self._warned_coverage = False
        self._budgets: tuple[int, dict[str, tuple[str, int]]] = (0, {})
        self._seeds: list[tuple[str, int]] = []  # nodes seen: a new process (a worker)
        # starts from any of them, not only the URL's, which may be the master that died
        super().__init__(capacity_bytes, url=url, namespace=namespace, **options)
        self._prefix = f"hotset:{self.namespace}:"  # no hash tag: keys spread over all slots

    def _memory_limits(self, r) -> tuple[int, int]:
        """What the masters' machines hold together, and their ``maxmemory`` together
        (0: one has none)."""
        nodes = list(r.info("memory", target_nodes=r.PRIMARIES).values())
        maxmemory = [int(i.get("maxmemory") or 0) for i in nodes]
        machine = sum(int(i.get("total_system_memory") or 0) for i in nodes)
        return machine, (sum(maxmemory) if all(maxmemory) else 0)

    def _outages(self, redis) -> tuple[type[Exception], ...]:
        # a master down, the cluster not ok, slots moving: the loader reads from storage
        return (redis.exceptions.RedisError, redis.exceptions.RedisClusterException)

    def _redis(self):
        if self._client is None or self._pid != os.getpid():
            from redis.backoff import NoBackoff
            from redis.cluster import ClusterNode, RedisCluster
            from redis.retry import Retry

            first, more = _seeds(self.url)
            self._client = RedisCluster.from_url(
                "redis://" + first,
                startup_nodes=[ClusterNode(h, p) for h, p in [*more, *self._seeds]],
                socket_timeout=self.socket_timeout_s,
                socket_connect_timeout=self.socket_timeout_s,
                retry=Retry(NoBackoff(), 1),  # a master down: absorbed, not waited for
            )
            self._pid = os.getpid()
            self._seeds = [(n.host, n.port) for n in self._client.get_nodes()]
        return self._client

    def _node_failed(self, node: str, exc: Exception) -> None:
        """A master that failed: counted, not asked again for ``retry_after_s``."""
        self.failures += 1
        self._node_down[node] = time.monotonic() + self.retry_after_s
        self._absorbed(exc)

    def _absorbed(self, exc: Exception) -> None:
        """As a Redis outage; a cluster that refuses everything while one master is down
        is named once, with the setting to change."""
        super()._absorbed(exc)
        if "cluster is down" in str(exc).lower() and not self._warned_coverage:
            self._warned_coverage = True
            log.warning(
                "redis cluster %s refuses every command while a master is down "
                "(cluster-require-full-coverage yes, Redis's default): run a cache cluster "
                "with 'cluster-require-full-coverage no' so that a dead master costs only "
                "its keys", self.url,
            )  # fmt: skip

    def _per_master(self, r, keys: Sequence[str], fn) -> None:
        """``fn(master, positions)`` for the positions of ``keys`` on each master in turn;
        a master that fails (or failed less than ``retry_after_s`` ago) is skipped,
        counted."""
        import redis

        by_node: dict[str, list[int]] = {}
        for pos, key in enumerate(keys):  # the client's slot map: no request
            by_node.setdefault(r.get_node_from_key(self._k(key)).name, []).append(pos)
        for node, where in by_node.items():
            if time.monotonic() < self._node_down.get(node, 0.0):
                self.failures += 1
                continue
            try:
                fn(node, where)
            except self._outages(redis) as exc:
                self._node_failed(node, exc)

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        out: list[bytes | None] = [None] * len(keys)

        def read(r, where):
            values = r.mget_nonatomic([self._k(keys[p]) for p in where])
            for p, value in zip(where, values, strict=True):
                out[p] = value

        if keys:
            self._call(lambda r: self._per_master(r, keys, lambda _, w: read(r, w)), None)
        return out

    def _budget(self, r) -> dict[str, tuple[str, int]]:
        """Per master: the key of its tokens (in a slot it owns) and its share of the
        budget; worked out again when the client's slot map changes."""
        slots = r.nodes_manager.slots_cache
        if self._budgets[0] != id(slots):
            owned = Counter(nodes[0].name for nodes in slots.values())
            keys: dict[str, str] = {}
            for i in range(100 * len(owned) + 1000):  # a tag in each master's slots
                key = f"hotset:{{{self.namespace}.budget.{i}}}"
                keys.setdefault(slots[r.keyslot(key)][0].name, key)
                if len(keys) == len(owned):
                    break
            share, done = {}, 0  # by cumulative slots: the shares add up to the capacity
            for m, n in sorted(owned.items()):
                share[m] = self.capacity_bytes * (done + n) // len(slots) - (
                    self.capacity_bytes * done // len(slots)
                )
                done += n
            self._budgets = (id(slots), {m: (keys[m], share[m]) for m in owned})
        return self._budgets[1]

    def _budget_keys(self, r) -> list[str]:
        return [key for key, _ in self._budget(r).values()]

    def _take(self, r, node: str, sizes: list[int]) -> list[bool]:
        """Reserve each size in turn from ``node``'s tokens; whether each fits."""
        key, share = self._budget(r)[node]
        pipe = r.pipeline()
        pipe.set(key, share, nx=True)  # first use, or its master restarted empty
        for n in sizes:
            pipe.decrby(key, n)
        fits = [left >= 0 for left in pipe.execute()[1:]]
        over = sum(n for n, ok in zip(sizes, fits, strict=True) if not ok)
        if over:
            r.incrby(key, over)  # not taken: given back
        return fits

    def _borrow(self, r, node: str, need: int) -> None:
        """Move up to ``need`` tokens from the other masters to ``node``'s: each lender
        gives what it has free, taken from it before they are given."""
        key, left = self._budget(r)[node][0], [need]

        def lend(lender: str, lkey: str, lshare: int) -> None:
            if lender == node or left[0] <= 0:
                return
            r.set(lkey, lshare, nx=True)
            free = min(left[0], int(r.get(lkey) or 0))
            if free <= 0:
                return
            if r.decrby(lkey, free) >= 0:
                r.incrby(key, free)
                left[0] -= free
            else:
                r.incrby(lkey, free)  # taken meanwhile by another writer: given back

        self._each_budget(r, lend)

    def put(self, items: Mapping[str, bytes]) -> tuple[int, list[str]]:
        names = list(items)
        stored, taken = [0], set()  # the rest are refused: over budget, or a master down

        def put(r, node, where):
            mine = [names[p] for p in where]
            pipe = r.pipeline()
            for name in mine:
                pipe.exists(self._k(name))
            new = [n for n, there in zip(mine, pipe.execute(), strict=True) if not there]
            fits = self._take(r, node, [len(items[n]) for n in new])
            short = [n for n, ok in zip(new, fits, strict=True) if not ok]
            if short:  # this master's share is spent: borrow from the others, try again
                self._borrow(r, node, sum(len(items[n]) for n in short))
                again = dict(zip(short, self._take(r, node, [len(items[n]) for n in short]),
                                 strict=True))  # fmt: skip
                fits = [ok or again[n] for n, ok in zip(new, fits, strict=True)]
            pipe = r.pipeline()
            for name in (n for n, ok in zip(new, fits, strict=True) if ok):
                pipe.set(self._k(name), items[name], nx=True)
            written = iter(pipe.execute())
            # tokens taken for nothing: written meanwhile by another writer
            unused = [n for n, ok in zip(new, fits, strict=True) if ok and not next(written)]
            if unused:
                r.incrby(self._budget(r)[node][0], sum(len(items[n]) for n in unused))
            over = [n for n, ok in zip(new, fits, strict=True) if not ok]
            self.refused += len(over)
            stored[0] += len(new) - len(over) - len(unused)
            taken.update(set(mine) - set(over))

        if names:
            self._call(lambda r: self._per_master(r, names, lambda n, w: put(r, n, w)), None)
        return stored[0], [n for n in names if n not in taken]

    def delete_many(self, keys: Sequence[str]) -> None:
        def delete(r, node, where):
            pipe = r.pipeline()
            for p in where:
                pipe.strlen(self._k(keys[p]))
                pipe.delete(self._k(keys[p]))
            out = pipe.execute()
            freed = sum(n for n, gone in zip(out[::2], out[1::2], strict=True) if gone)
            if freed:  # back to the tokens of the master that held them
                r.incrby(self._budget(r)[node][0], freed)

        if keys:
            self._call(lambda r: self._per_master(r, keys, lambda n, w: delete(r, n, w)), None)

    def _each_budget(self, r, fn) -> None:
        """``fn(master, tokens key, share)`` for each master that answers (one that fails
        is counted and not asked again for ``retry_after_s``)."""
        import redis

        for node, (key, share) in self._budget(r).items():
            if time.monotonic() < self._node_down.get(node, 0.0):
                continue
            try:
                fn(node, key, share)
            except self._outages(redis) as exc:
                self._node_failed(node, exc)

    def reconcile(self) -> int:
        """Recount each live master's tokens from the entries it holds: its share less
        its bytes (below zero where it borrowed), so the live masters' tokens are the
        capacity they hold less what they store."""

        def recount(r):
            keys = self._data_keys(r)
            pipe = r.pipeline()
            for k in keys:
                pipe.strlen(k)
            used: Counter[str] = Counter()
            for k, n in zip(keys, pipe.execute() if keys else [], strict=True):
                used[r.get_node_from_key(k).name] += n
            self._each_budget(r, lambda node, key, share: r.set(key, share - used[node]))
            return sum(used.values())

        return self._call(recount, self.used_bytes)

    @property
    def used_bytes(self) -> int:
        """Bytes held on the masters that answer: each master's share less its tokens."""

        def used(r):
            total = [0]

            def add(node, key, share):
                tokens = r.get(key)
                total[0] += 0 if tokens is None else share - int(tokens)

            self._each_budget(r, add)
            return total[0]

        return int(self._call(used, 0))

    def _data_keys(self, r, prefix: str = "") -> list[bytes]:
        """The keys of every master that answers: a master that is down holds nothing
        the cache can use (its entries are forgotten); none answering is unknown."""
        import redis

        keys, answered = [], 0
        for node in r.get_primaries():
            try:
                keys += r.scan_iter(
                    match=self._prefix + prefix + "*", count=1000, target_nodes=node
                )
                answered += 1
            except self._outages(redis) as exc:
                self._node_failed(node.name, exc)
        if not answered:
            raise StoreUnavailable(f"no master of redis cluster {self.url} answers")
        return keys
