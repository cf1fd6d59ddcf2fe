"""Redis store (redis-py): one pooled cache for several nodes.

Reads are one ``MGET`` per batch; puts and deletes are one Lua script per batch each,
which checks and updates the byte budget atomically on the server. All keys carry the
hash tag ``{namespace}`` so the scripts also run on a Redis Cluster slot.

If the server goes away, calls return "absent" / do nothing, ``failures`` is counted, and
the server is not asked again for ``retry_after_s`` seconds: the loader then reads from
storage and training goes on. A server out of memory (``maxmemory`` with ``noeviction``)
refuses the put, counted the same way; one that evicts keys itself (``allkeys-lru``)
leaves the budget counter high, which ``reconcile`` recounts from the keys.

Each store's entries and budget counter live under its ``namespace``: a URL that names
none (``?namespace=name``) gets a fresh one, so two jobs on one server never share a
budget, and ``close(destroy=True)`` clears only a namespace the store drew itself. A
namespace the user names is theirs: it outlives ``close`` (a resumed job finds its
entries), and one live job at a time uses it (``claim``: a second is refused). A drawn
namespace is held by a lock file in the user's private directory while its process
lives; the next store drawn on the same server clears the namespaces whose process died
(kill -9) instead of leaking them. A capacity the server cannot hold is refused.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import secrets
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from urllib.parse import parse_qsl, urlencode

from hotset.errors import ConfigError, StoreUnavailable
from hotset.store import lease
from hotset.store.base import Store

log = logging.getLogger(__name__)

_PUT = """
local used = tonumber(redis.call('GET', KEYS[1]) or '0')
local cap = tonumber(ARGV[1])
local stored, refused = 0, {}
for i = 2, #KEYS do
  local v = ARGV[i]
  if redis.call('EXISTS', KEYS[i]) == 0 then
    if used + #v <= cap then
      redis.call('SET', KEYS[i], v)
      used = used + #v
      stored = stored + 1
    else
      refused[#refused + 1] = i - 2
    end
  end
end
redis.call('SET', KEYS[1], used)
return {stored, refused}
"""

_DELETE = """
local freed = 0
for i = 2, #KEYS do
  local n = redis.call('STRLEN', KEYS[i])
  if redis.call('DEL', KEYS[i]) == 1 then freed = freed + n end
end
if freed > 0 then redis.call('DECRBY', KEYS[1], freed) end
return freed
"""


_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

_TAKE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0
"""


def _started(pid: int) -> str:
    """When process ``pid`` started (``/proc``: its pid may be reused later), or ''."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return ""


def _holder(pid: int) -> str:
    return f"{socket.gethostname()} {pid} {_started(pid)} {secrets.token_hex(4)}"


def _dead(holder: str) -> bool:
    """Whether the claim's holder is a process of this machine that is gone."""
    host, pid, started, _ = (holder.split(" ") + ["", "", "", ""])[:4]
    if host != socket.gethostname() or not pid.isdigit():
        return False
    return _started(int(pid)) != started

#: how long a job's claim on a named namespace outlives its last renewal (a killed job's)
CLAIM_TTL_S = 15.0

REDIS_LEASE = "redis-"  # lock files of drawn namespaces in the private directory
_NAMESPACE = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def split_namespace(url: str) -> tuple[str, str | None]:
    """``url`` without its ``namespace=`` query parameter, and that namespace."""
    base, sep, query = url.partition("?")
    pairs = parse_qsl(query, keep_blank_values=True)
    named = [v for k, v in pairs if k == "namespace"]
    if not named:
        return url, None
    rest = urlencode([(k, v) for k, v in pairs if k != "namespace"])
    return base + ("?" + rest if rest else ""), named[-1]


def with_namespace(url: str, namespace: str) -> str:
    return url + ("&" if "?" in url else "?") + urlencode({"namespace": namespace})


class RedisStore(Store):
    """Store in a Redis server at ``url`` (``redis://host:port/db`` or ``unix:///path``,
    ``?namespace=name`` optional), under ``namespace`` (default: the URL's, else fresh)."""

    shared_across_processes = True

    def __init__(
        self,
        capacity_bytes: int,
        url: str = "redis://localhost:6379/0",
        namespace: str | None = None,
        retry_after_s: float = 2.0,
        socket_timeout_s: float = 1.0,
    ) -> None:
        try:
            import redis  # noqa: F401
        except ImportError as exc:
            raise ConfigError(
                "the Redis store needs redis-py: pip install 'hotset[redis]'"
            ) from exc
        super().__init__(capacity_bytes)
        self.url, named = split_namespace(url)
        namespace = namespace or named
        if namespace is not None and not _NAMESPACE.fullmatch(namespace):
            # letters, digits, _.-: one namespace's keys never match another's pattern
            raise ConfigError(
                f"redis store namespace {namespace!r}: use 1 to 64 letters, digits, '_.-'"
            )
        #: whether ``close(destroy=True)`` clears it: only a namespace drawn here
        self.owns_namespace = namespace is None
        self.namespace = namespace or f"job-{secrets.token_hex(8)}"
        self.retry_after_s = retry_after_s
        self.socket_timeout_s = socket_timeout_s
        self._prefix = f"hotset:{{{self.namespace}}}:"
        self._used_key = self._prefix + "__used_bytes__"
        self._client = None
        self._pid = -1
        self._down_until = 0.0
        self._held = None
        if self.owns_namespace:
            self._sweep_and_hold()
        if capacity_bytes > 0:
            self._check_capacity()

    def _check_capacity(self) -> None:
        """Refuse, before anything is written, a capacity more than the server's machine
        holds (as every store refuses one its memory cannot hold); say so once where it
        is more than the server's ``maxmemory`` (its puts are then refused or it evicts,
        both absorbed and counted). A server that does not answer now is not checked."""
        limits = self._aside(self._memory_limits)
        if not limits:
            return
        machine, maxmemory = limits
        if machine and self.capacity_bytes > machine:
            raise ConfigError(
                f"capacity_bytes={self.capacity_bytes} is more than the redis store at "
                f"{self.url} can hold ({machine} bytes of memory on its machine): use a "
                "smaller cache_fraction or capacity_bytes"
            )
        if maxmemory and self.capacity_bytes > maxmemory:
            log.warning(
                "capacity_bytes=%d is more than the redis store at %s may use (maxmemory "
                "%d): it will refuse or evict entries before the cache is full (counted in "
                "store_failures)", self.capacity_bytes, self.url, maxmemory,
            )  # fmt: skip

    def _aside(self, fn):
        """``fn(client)``, or None where the server fails: unlike ``_call``, never marks
        the store down nor counts a failure (a check, a claim's renewal: not the data
        plane's business)."""
        import redis

        try:
            return fn(self._redis())
        except (redis.exceptions.RedisError, *self._outages(redis)) as exc:
            log.debug("redis store %s: %s", self.url, exc)
            return None

    def _memory_limits(self, r) -> tuple[int, int]:
        """The server's machine's memory and its ``maxmemory`` (0: none)."""
        info = r.info("memory")
        return int(info.get("total_system_memory") or 0), int(info.get("maxmemory") or 0)

    def claim(self, namespace: str) -> Callable[[], None]:
        """Reserve ``namespace`` on the server while the caller lives (``SET NX`` with a
        time-to-live, renewed every third of it by a thread): a second live job on the
        same named namespace is refused. A claim whose holder died on this machine is
        taken over at once; one from another machine lapses within ``CLAIM_TTL_S``. A
        server that does not answer now is not checked."""
        digest = hashlib.blake2b(namespace.encode(), digest_size=8).hexdigest()
        key, mine = f"hotset-claim:{{{self.namespace}}}:{digest}", _holder(os.getpid())
        ttl = int(CLAIM_TTL_S * 1000)
        got = self._aside(lambda r: bool(r.set(key, mine, nx=True, px=ttl)))
        if got is None:
            return lambda: None
        if not got:
            theirs = self._aside(lambda r: r.get(key))
            if not (theirs and _dead(theirs.decode()) and self._aside(
                lambda r: r.eval(_TAKE, 1, key, theirs, mine, ttl)
            )):  # fmt: skip
                raise ConfigError(
                    f"another job already trains on this dataset in the redis namespace "
                    f"{self.namespace!r} at {self.url}: two planners would evict each "
                    "other's entries. Give each job its own namespace (or none: one is "
                    "drawn), or share one cache with `hotset serve` (a claim from a job "
                    f"killed on another machine lapses within {CLAIM_TTL_S:.0f} s)"
                )
        stop = threading.Event()

        def renew() -> None:
            while not stop.wait(CLAIM_TTL_S / 3):
                self._aside(lambda r: r.pexpire(key, ttl))

        threading.Thread(target=renew, name="hotset-redis-claim", daemon=True).start()

        def release() -> None:
            stop.set()
            self._aside(lambda r: r.eval(_RELEASE, 1, key, mine))

        return release

    def _sweep_and_hold(self) -> None:
        """Clear the namespaces drawn on this server by processes that died, then hold
        this one (``lease.py``: a lock file the kernel releases when the process dies)."""
        base, tag = lease.private_base(), f"{type(self).__name__}:{self.url}".encode()
        for path, content, fd in lease.orphans(base, REDIS_LEASE):
            try:
                if content == tag:
                    namespace = os.path.basename(path)[len(REDIS_LEASE) :]
                    left = type(self)(0, url=self.url, namespace=namespace)
                    if not left._call(lambda r, left=left: left._clear(r), False):
                        break  # the server does not answer: try again another time
                    log.info("cleared the redis namespace %s a killed job left", namespace)
                    os.unlink(path)
            finally:
                os.close(fd)
        self._held = lease.hold(base, REDIS_LEASE + self.namespace, tag)
        self._held_by = os.getpid()

    @property
    def spec(self) -> str:
        """The URL that opens this store's namespace (for other ranks)."""
        return with_namespace(self.url, self.namespace)

    def _redis(self):
        if self._client is None or self._pid != os.getpid():
            import redis

            self._client = redis.Redis.from_url(
                self.url,
                socket_timeout=self.socket_timeout_s,
                socket_connect_timeout=self.socket_timeout_s,
            )
            self._put = self._client.register_script(_PUT)
            self._delete = self._client.register_script(_DELETE)
            self._pid = os.getpid()
        return self._client

    def _call(self, fn, fallback):
        """Run ``fn(client)``; on a connection failure or a server out of memory count it
        and return ``fallback``."""
        import redis

        if time.monotonic() < self._down_until:
            self.failures += 1
            return fallback
        try:
            return fn(self._redis())
        except (*self._outages(redis), StoreUnavailable) as exc:
            self.failures += 1
            self._down_until = time.monotonic() + self.retry_after_s
            self._absorbed(exc)
            return fallback
        except redis.exceptions.OutOfMemoryError as exc:
            self.failures += 1  # maxmemory reached: nothing stored, the server stays up
            log.debug("redis store %s is out of memory: %s", self.url, exc)
            return fallback

    def _absorbed(self, exc: Exception) -> None:
        """An outage absorbed (counted by the caller)."""
        log.debug("redis store %s unavailable: %s", self.url, exc)

    def _outages(self, redis) -> tuple[type[Exception], ...]:
        """The errors that mean the server is unreachable for now."""
        return (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)

    def _k(self, key: str) -> str:
        return self._prefix + key

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        if not keys:
            return []
        return self._call(lambda r: r.mget([self._k(k) for k in keys]), [None] * len(keys))

    def put(self, items: Mapping[str, bytes]) -> tuple[int, list[str]]:
        if not items:
            return 0, []
        names = list(items)
        keys = [self._used_key] + [self._k(k) for k in names]

        def put(r):
            stored, refused = self._put(keys=keys, args=[self.capacity_bytes, *items.values()])
            self.refused += len(refused)
            return int(stored), [names[int(i)] for i in refused]

        return self._call(put, (0, names))

    def list_keys(self, prefix: str = "") -> list[str]:
        n = len(self._prefix)
        keys = self._call(lambda r: [k.decode()[n:] for k in self._data_keys(r, prefix)], None)
        if keys is None:  # unknown, not empty: a planner must not forget what it holds
            raise StoreUnavailable(f"redis store {self.url} is unavailable: cannot list it")
        return keys

    def reconcile(self) -> int:
        def recount(r):
            keys = self._data_keys(r)
            pipe = r.pipeline(transaction=False)
            for k in keys:
                pipe.strlen(k)
            used = int(sum(pipe.execute())) if keys else 0
            r.set(self._used_key, used)
            return used

        return self._call(recount, self.used_bytes)

    def delete_many(self, keys: Sequence[str]) -> None:
        if keys:
            rkeys = [self._used_key] + [self._k(k) for k in keys]
            self._call(lambda r: self._delete(keys=rkeys), 0)

    def contains(self, key: str) -> bool:
        return bool(self._call(lambda r: r.exists(self._k(key)), False))

    @property
    def used_bytes(self) -> int:
        return int(self._call(lambda r: r.get(self._used_key), None) or 0)

    def _data_keys(self, r, prefix: str = "") -> list[bytes]:
        return [
            k
            for k in r.scan_iter(match=self._prefix + prefix + "*", count=1000)
            if k != self._used_key.encode()
        ]

    def __len__(self) -> int:
        return self._call(lambda r: len(self._data_keys(r)), 0)

    def _budget_keys(self, r) -> list[str]:
        """The keys that keep the byte budget (removed with the entries by ``clear``)."""
        return [self._used_key]

    def _clear(self, r) -> bool:
        keys = self._data_keys(r)
        for i in range(0, len(keys), 1000):
            r.delete(*keys[i : i + 1000])
        for k in self._budget_keys(r):  # absent: the budget is whole again
            r.delete(k)
        return True

    def clear(self) -> None:
        self._call(self._clear, None)

    def close(self, destroy: bool = False) -> None:
        cleared = destroy and self.owns_namespace and self._call(self._clear, False)
        if self._held is not None and self._held_by == os.getpid():
            if cleared:  # else kept: the next store drawn on this server clears it
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(lease.private_base(), REDIS_LEASE + self.namespace))
            os.close(self._held)
            self._held = None
        if self._client is not None and self._pid == os.getpid():
            self._client.close()
        self._client = None

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        for k in ("_client", "_put", "_delete"):
            state.pop(k, None)
        state["_held"] = None  # the lease is its maker's
        state["_client"], state["_pid"] = None, -1
        return state
