"""A single job's planner in a process of its own (``make_loader(planner_process=True)``;
hotset's option, not a paper's).

Where the control plane runs in the training process it runs on the training thread:
the DataLoader asks its ``batch_sampler`` for the next plan there, and ``feedback`` and
each batch's report are learnt there. Under ranks a rank plans the global batch (R x B
ids) and learns every rank's feedback, and with a short step (ResNet-18 on an H200,
19 ms) SHADE's and iCACHE's work at 32 ranks is as long as the step itself
(``docs/benchmarks.md``): nothing is left to overlap. Here the :class:`Planner` runs in
a forked child process and plans one batch ahead of the DataLoader's requests, on
another core, beside the step; the training process only passes on what the loop
reports and takes plans.

Every call the loader makes reaches the child in the order it is made, and the child
plans batch ``i + 1`` as soon as batch ``i`` is handed out: a plan is made a batch
earlier than in the training process and sees the feedback learnt by then. The same
sequence of events on every rank, so the ranks' planners decide alike. Under ranks the children
form a gloo group of their own (over a TCP store that rank 0's training process serves)
and make the planner's collectives there. With ``planner_process="node"`` one child plans
for all the ranks of a node (``distributed.NodeRanks``), each rank's training process
connected to it over a Unix socket; the children of the nodes form that group.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing as mp
import os
import queue
import signal
import socket
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from datetime import timedelta
from multiprocessing.connection import Client, Listener
from typing import TYPE_CHECKING

from hotset.distributed import NodeRanks, RankGroup, nodes_of
from hotset.errors import ConfigError, HotsetError, RankError
from hotset.plan.batch import shard

if TYPE_CHECKING:
    import numpy as np

    from hotset.plan import BatchPlan, Planner, PlanReport

#: the wait for a collective where the job's group gives none (torch's default)
DEFAULT_TIMEOUT = timedelta(minutes=30)


class PlannerGone(HotsetError):
    """hotset's planner process ended while the training process still needed it."""


class PlannerProcess:
    """A :class:`~hotset.plan.PlanSource` whose :class:`Planner` (made by ``build`` with
    the planner processes' ranks, ``None`` without) runs in a child process; ``dataset``
    is what it reconciles with the store at epoch boundaries (``None``: nothing), over a
    store shared across processes. ``planner_wait_s`` counts the time the training
    process waited for a plan (the planning that did not overlap the step)."""

    owns_cache = True

    def __init__(
        self,
        build: Callable[[RankGroup | NodeRanks | None], Planner],
        dataset,
        ranks: RankGroup | None = None,
        per_node: bool = False,
    ) -> None:
        if "fork" not in mp.get_all_start_methods():
            raise ConfigError("planner_process needs the fork start method (Linux)")
        self.ranks = ranks
        self._server = None  # rank 0's: the TCP store where the children meet
        ctx = mp.get_context("fork")
        if per_node and ranks is not None:
            self._conn, proc, self._server = _node_planner(ctx, build, dataset, ranks)
        else:
            meet = None
            if ranks is not None:
                meet, self._server = _meeting_point(ranks, ranks.rank, ranks.world)
            self._conn, theirs = ctx.Pipe()
            proc = ctx.Process(
                target=_serve, args=(theirs, self._conn, build, dataset, meet),
                name="hotset-planner", daemon=True,
            )  # fmt: skip
            proc.start()
            theirs.close()
        self._proc = proc  # (None: another rank's process plans for this node)
        self._ahead: deque[BatchPlan | None] = deque()  # answers to plan requests, not taken
        self._asked = 0  # plan requests not answered yet
        self.planner_wait_s = 0.0
        self._closed = False
        self._finalizer = weakref.finalize(self, _stop, proc, self._conn)
        try:
            self.wants_embeddings, readahead = self._call("facts")
        except BaseException:  # (it could not make the planner: the error names why)
            self.close()
            raise
        self.readahead = True if readahead else None  # (the loader drops what it staged)

    # -- the plans --------------------------------------------------------------------

    def __iter__(self) -> Iterator[BatchPlan]:
        self._settle()  # an abandoned epoch's plans asked ahead: the child releases them
        self._send("iter")
        self._ask()
        self._ask()  # the one after: planned while the loader uses this one
        while True:
            plan = self._take()
            if plan is None:
                return
            self._ask()
            yield plan

    def _ask(self) -> None:
        self._send("next")
        self._asked += 1

    def _take(self) -> BatchPlan | None:
        """The oldest plan asked for (``None``: the epoch is over), waiting for it."""
        if not self._ahead:
            start = time.perf_counter()
            while not self._ahead:
                self._answer()
            self.planner_wait_s += time.perf_counter() - start
        return self._ahead.popleft()

    def _settle(self) -> None:
        """Take every plan asked for, and drop them (nobody will serve them)."""
        while self._asked:
            self._answer()
        self._ahead.clear()

    # -- what the loop reports, and the rest of PlanSource ----------------------------

    def set_epoch(self, epoch: int) -> None:
        self._send("cast", "set_epoch", (int(epoch),))

    def feedback(
        self, ids: np.ndarray, losses: np.ndarray, embeddings: np.ndarray | None = None
    ) -> None:
        self._send("cast", "feedback", (ids, losses, embeddings))

    def batch_consumed(self, report: PlanReport | None = None) -> None:
        self._send("cast", "batch_consumed", (report,))

    def report_accuracy(self, accuracy: float) -> None:
        self._send("cast", "report_accuracy", (float(accuracy),))

    def __len__(self) -> int:
        return self._call("__len__")

    def resumed_batches(self) -> int:
        return self._call("resumed_batches")

    def flush(self) -> None:
        self._call("flush")

    def reconcile_store(self, dataset) -> bool:
        """The child lists and reconciles with its own handle on the same store."""
        return self._call("reconcile_store")

    def drain(self, timeout: float = 60.0) -> None:
        self._call("drain", timeout)

    def counters(self) -> dict:
        out = self._call("counters")
        out["planner_wait_s"] = self.planner_wait_s
        return out

    def state_dict(self, trained: int | None = None) -> dict:
        return self._call("state_dict", trained)

    def load_state_dict(self, state: dict) -> None:
        self._call("load_state_dict", state)

    def close(self) -> None:
        """Stop the child (its planner's threads first), and leave the ranks' groups."""
        if self._closed:
            return
        try:
            self._settle()
            self._call("close")
        except Exception:
            pass  # it failed or is gone already: what it held goes with it
        finally:
            self._closed = True
            self._finalizer()
            if self.ranks is not None:
                self.ranks.close()
            self._server = None

    # -- the pipe ---------------------------------------------------------------------

    def _send(self, *message) -> None:
        if self._closed:
            raise HotsetError("the loader is closed: its planner process has ended")
        try:
            self._conn.send(message)
        except (BrokenPipeError, OSError) as exc:
            raise self._gone() from exc

    def _answer(self):
        """The child's next answer: a plan is queued in ``_ahead``, an error raised; a
        call's value is returned."""
        try:
            kind, value = self._conn.recv()
        except (EOFError, OSError) as exc:
            raise self._gone() from exc
        if kind == "error":
            raise value
        if kind == "plan":
            self._asked -= 1
            self._ahead.append(value)
        return kind, value

    def _call(self, method: str, *args):
        self._send("call", method, args)
        while True:  # (the plans asked before this call come first)
            kind, value = self._answer()
            if kind == "value":
                return value

    def _gone(self) -> PlannerGone:
        if self._proc is None:
            which = "this node's planner process (its first rank's child) ended"
        else:
            self._proc.join(1.0)
            which = (f"hotset's planner process (pid {self._proc.pid}) ended (exit code "
                     f"{self._proc.exitcode})")  # fmt: skip
        return PlannerGone(
            f"{which} while the loader needed it: it was killed, ran out of memory, or a "
            "rank it plans for ended; the plans it held are lost (the store is reconciled "
            "when a new loader starts)"
        )


def _stop(proc, conn) -> None:
    """End the child: it exits when its pipe closes; killed where it does not."""
    conn.close()
    if proc is None:
        return
    proc.join(10.0)
    if proc.is_alive():
        proc.kill()
        proc.join()


def _meeting_point(ranks: RankGroup, rank: int, world: int) -> tuple[tuple, object]:
    """Where the planner processes (``world`` of them, this one ``rank``) meet: a TCP
    store that rank 0 serves (on a port of the system's choosing, at ``MASTER_ADDR`` or
    its host name), its address broadcast to the job's ``ranks``; returns it and rank
    0's server (kept alive by its training process)."""
    import torch.distributed as dist

    timeout = ranks.timeout or DEFAULT_TIMEOUT
    server, address = None, None
    if ranks.rank == 0:
        server = dist.TCPStore("0.0.0.0", 0, world, True, timeout=timeout, wait_for_workers=False)
        address = (os.environ.get("MASTER_ADDR") or socket.gethostname(), server.port)
    host, port = ranks.broadcast(address, call="the planner process's address")
    return (host, port, rank, world, timeout), server


def _join(meet: tuple) -> RankGroup:
    """This child's place in the planner processes' own gloo group."""
    import torch.distributed as dist

    host, port, rank, world, timeout = meet
    store = dist.TCPStore(host, port, world, False, timeout=timeout)
    group = dist.ProcessGroupGloo(store, rank, world, timeout)
    return RankGroup.over(group, rank, world, timeout)


def _node_planner(ctx, build: Callable, dataset, ranks: RankGroup) -> tuple:
    """``planner_process="node"``: the first rank of each node forks the node's planner
    process, which listens on a Unix socket (in multiprocessing's private directory, its
    key sent over the job's group) for every rank of the node, itself included. Returns
    this rank's connection, the process (``None`` on the node's other ranks) and rank
    0's meeting point (collectives of all ranks)."""
    nodes = nodes_of(ranks)
    here = next(n for n in nodes if ranks.rank in n)
    meet, server = _meeting_point(ranks, nodes.index(here), len(nodes))
    proc = address = None
    if ranks.rank == here[0]:
        key = os.urandom(32)
        told, theirs = ctx.Pipe(duplex=False)
        proc = ctx.Process(
            target=_serve_node, args=(theirs, key, build, dataset, meet, here, ranks.world),
            name="hotset-node-planner", daemon=True,
        )  # fmt: skip
        proc.start()
        theirs.close()
        with contextlib.suppress(EOFError):
            address = (told.recv(), key)
        told.close()
    addresses = ranks.all_gather(address, call="the node planner's address")
    if addresses[here[0]] is None:
        raise PlannerGone(f"the planner process of rank {here[0]}'s node could not start")
    path, key = addresses[here[0]]
    conn = Client(path, family="AF_UNIX", authkey=key)
    conn.send(ranks.rank)
    return conn, proc, server


def _serve(conn, parents, build: Callable, dataset, meet: tuple | None) -> None:
    """The child of ``planner_process=True``: make the planner and answer its training
    process (``_answer``)."""
    parents.close()  # (its end, copied by the fork: else the pipe never ends here)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the training process's
    _answer([conn], lambda: build(None if meet is None else _join(meet)), dataset, None)


def _serve_node(told, key: bytes, build: Callable, dataset, meet: tuple,
                here: tuple[int, ...], world: int) -> None:  # fmt: skip
    """The node's planner process: listen, take each of the node's ranks' connection,
    make the planner for them all (``NodeRanks``) and answer them (``_answer``)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    listener = Listener(family="AF_UNIX", backlog=len(here), authkey=key)
    told.send(listener.address)
    told.close()
    conns = {}
    while len(conns) < len(here):
        conn = listener.accept()
        conns[conn.recv()] = conn
    listener.close()
    _answer([conns[r] for r in here], lambda: build(NodeRanks(_join(meet), here, world)),
            dataset, (here, world))  # fmt: skip


#: calls that read the planner, made by any rank at any time (a rank's counters, the
#: state rank 0 saves): answered once the planner stands where that rank's calls put it
QUERIES = frozenset({"counters", "state_dict", "__len__", "resumed_batches", "drain"})
CLOSE = ("call", "close")


def _answer(conns: list, make: Callable[[], Planner], dataset, node: tuple | None) -> None:
    """Make the planner, then answer the training processes' messages (one connection
    each, the node's ranks under ``node``: their ranks and the job's world) until they
    ask to close or their connections end; then close the planner (its feeder's threads
    stop writing to the store) and say so. Each process sends the same sequence of
    steps: the k-th of each is applied once, as one call of all (``_apply``), and a plan
    is sent each process's shard of it; a query (``QUERIES``) is answered when every
    step its process sent before it is applied. An error is sent as the answer to the
    next message that wants one, and to every one after it (the planner's state is not
    trusted once a step of it failed)."""
    # messages are read as they come, so that a training process never waits to send
    # while this one waits to send it a plan (each side's send blocks on a full pipe)
    inbox: queue.SimpleQueue = queue.SimpleQueue()
    for j, conn in enumerate(conns):
        threading.Thread(target=_read, args=(conn, j, inbox), daemon=True).start()
    state = _Steps(conns, dataset, node)
    try:
        state.planner = make()
    except BaseException as exc:
        state.failed = exc
    while state.live:
        state.take(*inbox.get())
        state.advance()
    if state.planner is not None:
        with contextlib.suppress(Exception):  # (an error that stopped it is told already)
            state.planner.close()
    for j in state.closing:  # asked to close: closed
        _send(conns[j], ("value", None))
    for conn in conns:
        conn.close()


class _Steps:
    """The planner process's account of its training processes: the steps each sent
    and not applied yet, the queries waiting for their step, who is still there."""

    def __init__(self, conns: list, dataset, node: tuple | None) -> None:
        self.conns, self.dataset, self.node = conns, dataset, node
        self.planner: Planner | None = None
        self.plans: Iterator | None = None
        self.failed: BaseException | None = None
        self.live, self.closing = list(range(len(conns))), []
        self.steps: list[deque] = [deque() for _ in conns]
        self.queries: list[deque] = [deque() for _ in conns]
        self.sent, self.applied = [0] * len(conns), 0

    def take(self, j: int, message) -> None:
        """Process ``j``'s next message (``None``: its connection ended)."""
        if message is None:
            self._leave([j], closed=False)
        elif message[0] == "call" and message[1] in QUERIES:
            self.queries[j].append((self.sent[j], message))
        else:
            self.steps[j].append(message)
            self.sent[j] += 1

    def _leave(self, gone: list[int], closed: bool) -> None:
        """``gone`` closed their loaders (``closed``: they are told so at the end, or at
        once where others go on) or ended; the steps of those left fail from here."""
        self.live = [j for j in self.live if j not in gone]
        if closed:
            self.closing += gone
        if self.live:
            if self.failed is None:
                self.failed = RankError(_left(self.node, len(self.conns), self.live))
            for k in self.closing:  # (it must not wait for the others)
                _send(self.conns[k], ("value", None))
            self.closing = []

    def advance(self) -> None:
        """Answer the queries whose step has come, and apply every step all have sent."""
        while True:
            for j in list(self.live):
                while self.queries[j] and self.queries[j][0][0] == self.applied:
                    _, (_, method, args) = self.queries[j].popleft()
                    read = functools.partial(_run, self.planner, self.dataset, method, args)
                    self._tell([j], "call", self._do(read))
            if not self.live or not all(self.steps[j] for j in self.live):
                return
            messages = [self.steps[j].popleft() for j in self.live]
            self.applied += 1
            self._step(messages)

    def _step(self, messages: list) -> None:
        """Apply the step every live process sent: one call of all."""
        closers = [j for j, m in zip(self.live, messages, strict=True) if m[:2] == CLOSE]
        if closers:
            messages = [m for m in messages if m[:2] != CLOSE]
            self._leave(closers, closed=True)
        if len({m[:1] if m[0] in ("next", "iter") else m[:2] for m in messages}) > 1:
            if self.failed is None:
                self.failed = RankError(_differ(self.node, self.live, messages))
            for j, m in zip(list(self.live), messages, strict=True):
                self._tell([j], m[0], None)  # (the error, to each that waits for an answer)
            return
        if not self.live:
            return
        kind = messages[0][0]
        if kind == "iter":
            self.plans = self._do(lambda: iter(self.planner))
        elif kind == "next":
            plan = self._do(lambda: next(self.plans, None))
            for j in list(self.live):
                self._tell([j], "next", self._do(lambda j=j: _shard(plan, self.node, j)))
        else:
            self._tell(self.live, kind, self._do(
                lambda: _apply(self.planner, self.dataset, messages)))  # fmt: skip

    def _do(self, fn: Callable):
        """``fn()``, unless a step failed before (the planner is not trusted after it);
        an error it raises is kept as that failure."""
        if self.failed is None:
            try:
                return fn()
            except BaseException as exc:
                self.failed = exc
        return None

    def _tell(self, to: list[int], kind: str, value) -> None:
        """Answer a ``call`` (its value) or a ``next`` (its plan), or the failure once a
        step failed; a ``cast`` wants no answer."""
        if kind not in ("call", "next"):
            return
        answer = ("plan" if kind == "next" else "value", value)
        if self.failed is not None:
            answer = ("error", _portable(self.failed))
        for j in list(to):
            if not _send(self.conns[j], answer) and j in self.live:
                self.live.remove(j)  # that training process is gone


def _send(conn, answer) -> bool:
    """Send ``answer``; whether the training process was there to take it."""
    try:
        conn.send(answer)
    except OSError:
        return False
    return True


def _shard(plan: BatchPlan | None, node: tuple | None, j: int) -> BatchPlan | None:
    """What the ``j``-th connection serves of ``plan``: itself, or under ``node`` the
    shard of that rank of the node."""
    if plan is None or node is None:
        return plan
    here, world = node
    return shard(plan, here[j], world)


def _apply(planner: Planner, dataset, messages: list):
    """One call of the planner's made by every connection alike: what each rank reports
    is passed on together (``Planner.*_of_ranks``), the rest is called once."""
    _, method, args = messages[0]
    if method == "feedback":
        return planner.feedback_of_ranks([m[2] for m in messages])
    if method == "batch_consumed":
        reports = [m[2][0] for m in messages]
        return planner.consumed_of_ranks(None if reports[0] is None else reports)
    if method == "report_accuracy":
        return planner.accuracy_of_ranks([m[2][0] for m in messages])
    return _run(planner, dataset, method, args)


def _left(node: tuple | None, every: int, live: list[int]) -> str:
    ranks = node[0] if node else range(every)
    gone = [r for j, r in enumerate(ranks) if j not in live]
    return (f"ranks {gone} of this node closed their loader or ended while ranks "
            f"{[ranks[j] for j in live]} still plan with it: every rank makes the same "
            "calls (iterate the loader, feedback, close)")  # fmt: skip


def _differ(node: tuple | None, live: list[int], messages: list) -> str:
    ranks = node[0] if node else range(len(messages))
    calls = ", ".join(f"rank {ranks[j]} {m[1] if m[0] in ('cast', 'call') else m[0]}"
                      for j, m in zip(live, messages, strict=True))  # fmt: skip
    return (f"the ranks of this node made different calls of their planner: {calls}; every "
            "rank must make the same hotset calls in the same order")


def _read(conn, j: int, inbox: queue.SimpleQueue) -> None:
    """Move connection ``j``'s messages to ``inbox`` (``None``: the connection ended)."""
    try:
        while True:
            inbox.put((j, conn.recv()))
    except (EOFError, OSError):
        inbox.put((j, None))


def _run(planner: Planner, dataset, method: str, args: tuple):
    """One of the planner's methods that the training process called."""
    if method == "facts":
        return planner.wants_embeddings, planner.readahead is not None
    if method == "reconcile_store":
        return dataset is not None and planner.reconcile_store(dataset)
    return getattr(planner, method)(*args)


def _portable(exc: BaseException) -> BaseException:
    """``exc`` as the training process can receive it (the planner process named)."""
    import pickle

    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        exc = HotsetError(f"{type(exc).__name__}: {exc}")
    if not any("planner process" in n for n in getattr(exc, "__notes__", ())):
        exc.add_note(f"(raised in hotset's planner process, pid {os.getpid()})")
    return exc
