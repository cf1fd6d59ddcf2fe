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
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence

from hotset.errors import StoreUnavailable
from hotset.store.redis_store import RedisStore

SCHEME = "redis+cluster://"


class RedisClusterStore(RedisStore):
    """Store on the Redis Cluster one of whose nodes is at ``url``
    (``redis+cluster://host:port``)."""

    def __init__(self, capacity_bytes: int, url: str, namespace: str = "hotset", **options):
        super().__init__(capacity_bytes, url=url, namespace=namespace, **options)
        self._prefix = f"hotset:{namespace}:"  # no hash tag: keys spread over all slots
        self._used_key = f"hotset:{{{namespace}}}:__used_bytes__"
        self._node_down: dict[str, float] = {}  # master -> not asked again until

    def _outages(self, redis) -> tuple[type[Exception], ...]:
        # a master down, the cluster not ok, slots moving: the loader reads from storage
        return (redis.exceptions.RedisError, redis.exceptions.RedisClusterException)

    def _redis(self):
        if self._client is None or self._pid != os.getpid():
            from redis.backoff import NoBackoff
            from redis.cluster import RedisCluster
            from redis.retry import Retry

            self._client = RedisCluster.from_url(
                "redis://" + self.url[len(SCHEME) :],
                socket_timeout=self.socket_timeout_s,
                socket_connect_timeout=self.socket_timeout_s,
                retry=Retry(NoBackoff(), 1),  # a master down: absorbed, not waited for
            )
            self._pid = os.getpid()
        return self._client

    def _per_master(self, r, keys: Sequence[str], fn) -> None:
        """``fn(positions)`` for the positions of ``keys`` on each master in turn; a
        master that fails (or failed less than ``retry_after_s`` ago) is skipped, counted."""
        import redis

        by_node: dict[str, list[int]] = {}
        for pos, key in enumerate(keys):  # the client's slot map: no request
            by_node.setdefault(r.get_node_from_key(self._k(key)).name, []).append(pos)
        for node, where in by_node.items():
            if time.monotonic() < self._node_down.get(node, 0.0):
                self.failures += 1
                continue
            try:
                fn(where)
            except self._outages(redis):
                self.failures += 1
                self._node_down[node] = time.monotonic() + self.retry_after_s

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        out: list[bytes | None] = [None] * len(keys)

        def read(r, where):
            values = r.mget_nonatomic([self._k(keys[p]) for p in where])
            for p, value in zip(where, values, strict=True):
                out[p] = value

        if keys:
            self._call(lambda r: self._per_master(r, keys, lambda where: read(r, where)), None)
        return out

    def put(self, items: Mapping[str, bytes]) -> tuple[int, list[str]]:
        names = list(items)
        stored, taken = [0], set()  # the rest are refused: over budget, or a master down

        def put(r, where):
            mine = [names[p] for p in where]
            pipe = r.pipeline()
            for name in mine:
                pipe.exists(self._k(name))
            new = [n for n, there in zip(mine, pipe.execute(), strict=True) if not there]
            pipe = r.pipeline()
            for name in new:  # reserve each new entry's bytes in turn
                pipe.incrby(self._used_key, len(items[name]))
            fits = [total <= self.capacity_bytes for total in pipe.execute()]
            over = [n for n, ok in zip(new, fits, strict=True) if not ok]
            pipe = r.pipeline()
            for name in (n for n, ok in zip(new, fits, strict=True) if ok):
                pipe.set(self._k(name), items[name], nx=True)
            written = iter(pipe.execute())
            # bytes reserved for nothing: over the budget, or written meanwhile by another
            unused = [n for n, ok in zip(new, fits, strict=True) if not ok or not next(written)]
            if unused:
                r.decrby(self._used_key, sum(len(items[n]) for n in unused))
            self.refused += len(over)
            stored[0] += len(new) - len(unused)
            taken.update(set(mine) - set(over))

        if names:
            self._call(lambda r: self._per_master(r, names, lambda where: put(r, where)), None)
        return stored[0], [n for n in names if n not in taken]

    def delete_many(self, keys: Sequence[str]) -> None:
        if not keys:
            return

        def delete(r):
            pipe = r.pipeline()
            for k in keys:
                pipe.strlen(self._k(k))
                pipe.delete(self._k(k))
            out = pipe.execute()
            freed = sum(n for n, gone in zip(out[::2], out[1::2], strict=True) if gone)
            if freed:
                r.decrby(self._used_key, freed)

        self._call(delete, None)

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
            except self._outages(redis):
                self.failures += 1
                self._node_down[node.name] = time.monotonic() + self.retry_after_s
        if not answered:
            raise StoreUnavailable(f"no master of redis cluster {self.url} answers")
        return keys
