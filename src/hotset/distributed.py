"""Data-parallel training: one global plan, derived identically on every rank.

With ``torch.distributed`` initialised, every rank runs the same sampler and policy over
the *global* batches (``num_replicas`` local batches side by side, as
``DistributedSampler`` shards them: rank ``r`` takes positions ``r, r + R, ...``) and
keeps them identical by exchanging what differs between ranks:

* the feedback (ids, losses, embeddings) each rank's batches produced, all-gathered every
  ``sync_every`` steps and applied on every rank in rank order;
* each consumed plan's report (what landed in the store, what was missing), all-gathered
  so that every rank reconciles the same facts;
* validation accuracy (the mean over ranks) and, at epoch boundaries, one listing of the
  store (rank 0's, after a barrier).

So every rank draws the same global list and makes the same cache decisions: each entry
has one decision-maker (the plan), it is written by the first rank that reads it, and
every rank applies a plan's deletions before its own writes. The collectives run on a gloo
group of hotset's own, never interleaved with the model's (NCCL) ones, with the time-out
the user gave ``init_process_group`` (torch's default otherwise): a rank that hangs or
dies ends the others' wait with a ``RankError`` naming the collective, not a 30-minute
stall. Every rank must make the same calls (iterate the loader, ``feedback``,
``report_accuracy``, ``close``) or the others wait for it until that time-out.
"""

from __future__ import annotations

import os
import pickle
import socket
from datetime import timedelta

import numpy as np

from hotset.errors import ConfigError, RankError


def user_timeout(dist) -> timedelta | None:
    """The time-out the job's default group was made with (``init_process_group``)."""
    group = dist.group.WORLD
    for device in getattr(group, "_device_types", ()):
        try:
            return group._get_backend(device).options._timeout
        except (AttributeError, RuntimeError):
            continue
    return None


#: what a RankError says of a loader that one rank makes alone
ALONE = ("a loader that one rank makes alone, a validation loader on rank 0, takes "
         "make_loader(..., distributed=False)")


class RankGroup:
    """The ranks of an initialised ``torch.distributed`` job, for the control plane."""

    def __init__(self, group=None, timeout: timedelta | None = None) -> None:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            raise ConfigError("RankGroup needs torch.distributed.init_process_group first")
        self._dist = dist
        self.world = dist.get_world_size()
        self.rank = dist.get_rank()
        self.timeout = timeout or user_timeout(dist)
        # a gloo group of our own: CPU objects, and never between the model's collectives
        self.owned = group is None
        self.group = dist.new_group(backend="gloo", timeout=self.timeout) if self.owned else group

    @classmethod
    def over(cls, group, rank: int, world: int, timeout: timedelta) -> RankGroup:
        """Ranks over a process group made directly (``ProcessGroupGloo``, not registered
        with ``torch.distributed``: the planner processes', ``plan_process.py``)."""
        self = cls.__new__(cls)
        self._dist, self.group, self.owned = _Unregistered(), group, False
        self.rank, self.world, self.timeout = rank, world, timeout
        return self

    #: the collectives this rank has made
    calls = 0
    #: whether this process plans for a node's ranks (``NodeRanks``), not for one rank
    node = False

    @property
    def here(self) -> tuple[int, ...]:
        """The ranks this process plans for: itself."""
        return (self.rank,)

    def _collective(self, name: str, fn, *args, **kwargs) -> None:
        self.calls += 1
        try:
            fn(*args, group=self.group, **kwargs)
        except RuntimeError as exc:  # gloo: a time-out, or a peer that went away
            raise RankError(
                f"hotset's {name} across {self.world} ranks failed on rank {self.rank} "
                f"(time-out {self.timeout}): a rank hung, died, or did not make the same "
                f"call (every rank iterates the loader, calls feedback, report_accuracy and "
                f"close alike; {ALONE}). {str(exc).splitlines()[0] if str(exc) else ''}"
            ) from exc

    def all_gather(self, obj, call: str = "all_gather") -> list:
        """Every rank's ``obj``, in rank order (a collective: all ranks call it). ``call``
        names what it is for and rides with it: ranks that made different calls get a
        ``RankError`` naming each rank's, never another call's objects."""
        out: list = [None] * self.world
        self._collective(call, self._dist.all_gather_object, out, (call, obj))
        calls = [c for c, _ in out]
        if any(c != call for c in calls):
            self._mismatch(call, ", ".join(f"rank {r} {c}" for r, c in enumerate(calls)))
        return [o for _, o in out]

    def broadcast(self, obj, src: int = 0, call: str = "broadcast"):
        """Rank ``src``'s ``obj`` on every rank (``call`` as in ``all_gather``: a rank
        whose call differs from rank ``src``'s gets a ``RankError``)."""
        box = [(call, obj)]
        self._collective(call, self._dist.broadcast_object_list, box, src=src)
        theirs, obj = box[0]
        if theirs != call:
            self._mismatch(call, f"rank {src} {theirs}")
        return obj

    def _mismatch(self, mine: str, theirs: str) -> None:
        raise RankError(
            f"hotset's collectives differ across {self.world} ranks: rank {self.rank} called "
            f"{mine}, {theirs}. Every rank must make the same hotset calls in the same "
            f"order (iterate the loader, feedback, report_accuracy, close): one made on "
            f"some ranks only stops here; {ALONE}"
        )

    def barrier(self) -> None:
        self._collective("barrier", self._dist.barrier)

    def close(self) -> None:
        """Destroy the group this made (its sockets and threads)."""
        if self.owned and self.group is not None:
            self._dist.destroy_process_group(self.group)
            self.group = None

    def hosts(self) -> int:
        """How many machines the ranks run on (a collective)."""
        return len(nodes_of(self))


class _Unregistered:
    """``torch.distributed``'s object collectives that ``RankGroup`` calls, over a process
    group that is not registered with it (the default group's registry belongs to the
    process that forked this one): each object pickled to bytes, sizes exchanged first."""

    @staticmethod
    def all_gather_object(out: list, obj, group) -> None:
        import torch

        data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in out]
        group.allgather([sizes], [torch.tensor([data.numel()])]).wait()
        longest = int(max(sizes))
        bufs = [torch.empty(longest, dtype=torch.uint8) for _ in out]
        padded = torch.zeros(longest, dtype=torch.uint8)
        padded[: data.numel()] = data
        group.allgather([bufs], [padded]).wait()
        for i, (buf, size) in enumerate(zip(bufs, sizes, strict=True)):
            out[i] = pickle.loads(buf[: int(size)].numpy().tobytes())

    @staticmethod
    def broadcast_object_list(box: list, src: int, group) -> None:
        import torch

        data = pickle.dumps(box[0]) if group.rank() == src else b""
        size = torch.tensor([len(data)])
        group.broadcast(size, src).wait()
        buf = torch.zeros(int(size), dtype=torch.uint8)
        if data:
            buf[:] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        group.broadcast(buf, src).wait()
        box[0] = pickle.loads(buf.numpy().tobytes())

    @staticmethod
    def barrier(group) -> None:
        group.barrier().wait()


class NodeRanks:
    """The ranks of one node, seen from the one process that plans for all of them
    (``make_loader(planner_process="node")``, hotset's): ``here`` are their global ranks,
    ``rank`` the first of them; its collectives run over ``nodes``, a group of one such
    process per node, in the order of their first ranks (node 0 holds rank 0)."""

    node = True

    def __init__(self, nodes: RankGroup, here: tuple[int, ...], world: int) -> None:
        self.nodes, self.here, self.world = nodes, tuple(here), int(world)
        self.rank, self.timeout = self.here[0], nodes.timeout

    @property
    def calls(self) -> int:
        return self.nodes.calls

    def all_gather(self, obj, call: str = "all_gather") -> list:
        """Every node's ``obj``, in the nodes' order."""
        return self.nodes.all_gather(obj, call=call)

    def broadcast(self, obj, src: int = 0, call: str = "broadcast"):
        """Rank 0's node's ``obj`` on every node."""
        if src != 0:
            raise ValueError("a node's planner broadcasts from rank 0's node alone")
        return self.nodes.broadcast(obj, 0, call=call)

    def barrier(self) -> None:
        self.nodes.barrier()

    def close(self) -> None:
        self.nodes.close()


def nodes_of(ranks: RankGroup) -> list[tuple[int, ...]]:
    """The job's ranks grouped by machine (``node_name``), each node's in rank order,
    the nodes in the order of their first ranks (a collective)."""
    names = ranks.all_gather(node_name(), call="the ranks' nodes")
    return sorted(
        tuple(r for r, n in enumerate(names) if n == name) for name in set(names)
    )


def node_name() -> str:
    """This process's machine: the host name, and torchrun's node rank where it is set
    (two agents on one host are two nodes to it)."""
    return f"{socket.gethostname()}/{os.environ.get('GROUP_RANK', '')}"


def detect_ranks(distributed: bool | None = None) -> RankGroup | None:
    """The job's ranks when ``torch.distributed`` is initialised with more than one
    (``distributed=None``: if so; ``False``: never; ``True``: required)."""
    import torch.distributed as dist

    if distributed is False:
        return None
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return RankGroup()
    if distributed:
        raise ConfigError("distributed=True needs torch.distributed initialised, 2+ ranks")
    return None


def owners(ids: np.ndarray, served: np.ndarray, world: int) -> np.ndarray:
    """The rank that writes each of ``ids`` in a global batch serving ``served``: the
    rank of its first position there, or ``id % world`` for an id nobody serves (a
    fetch)."""
    if not served.size:
        return ids % world
    uniq, first = np.unique(served, return_index=True)
    k = np.minimum(np.searchsorted(uniq, ids), uniq.size - 1)
    return np.where(uniq[k] == ids, first[k] % world, ids % world)
