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
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from hotset.store.redis_store import RedisStore

SCHEME = "redis+cluster://"


class RedisClusterStore(RedisStore):
    """Store on the Redis Cluster one of whose nodes is at ``url``
    (``redis+cluster://host:port``)."""

    def __init__(self, capacity_bytes: int, url: str, namespace: str = "hotset", **options):
        super().__init__(capacity_bytes, url=url, namespace=namespace, **options)
        self._prefix = f"hotset:{namespace}:"  # no hash tag: keys spread over all slots
        self._used_key = f"hotset:{{{namespace}}}:__used_bytes__"

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

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        if not keys:
            return []
        return self._call(
            lambda r: r.mget_nonatomic([self._k(k) for k in keys]), [None] * len(keys)
        )

    def put(self, items: Mapping[str, bytes]) -> tuple[int, list[str]]:
        if not items:
            return 0, []
        names = list(items)

        def put(r):
            pipe = r.pipeline()
            for name in names:
                pipe.exists(self._k(name))
            new = [n for n, there in zip(names, pipe.execute(), strict=True) if not there]
            pipe = r.pipeline()
            for name in new:  # reserve each new entry's bytes in turn
                pipe.incrby(self._used_key, len(items[name]))
            fits = [total <= self.capacity_bytes for total in pipe.execute()]
            refused = [n for n, ok in zip(new, fits, strict=True) if not ok]
            pipe = r.pipeline()
            for name in (n for n, ok in zip(new, fits, strict=True) if ok):
                pipe.set(self._k(name), items[name], nx=True)
            written = iter(pipe.execute())
            # bytes reserved for nothing: over the budget, or written meanwhile by another
            unused = [n for n, ok in zip(new, fits, strict=True) if not ok or not next(written)]
            if unused:
                r.decrby(self._used_key, sum(len(items[n]) for n in unused))
            self.refused += len(refused)
            return len(new) - len(unused), refused

        return self._call(put, (0, names))

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
        return list(r.scan_iter(match=self._prefix + prefix + "*", count=1000))
