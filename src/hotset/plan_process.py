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
and make the planner's collectives there.
"""

from __future__ import annotations

import contextlib
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
from typing import TYPE_CHECKING

from hotset.distributed import RankGroup
from hotset.errors import ConfigError, HotsetError

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
        build: Callable[[RankGroup | None], Planner],
        dataset,
        ranks: RankGroup | None = None,
    ) -> None:
        if "fork" not in mp.get_all_start_methods():
            raise ConfigError("planner_process=True needs the fork start method (Linux)")
        self.ranks = ranks
        self._server = None  # rank 0's: the TCP store where the children meet
        meet = None
        if ranks is not None:
            meet, self._server = _meeting_point(ranks)
        ctx = mp.get_context("fork")
        self._conn, theirs = ctx.Pipe()
        proc = ctx.Process(
            target=_serve, args=(theirs, self._conn, build, dataset, meet), name="hotset-planner",
            daemon=True,
        )  # fmt: skip
        proc.start()
        theirs.close()
        self._proc = proc
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
        self._proc.join(1.0)
        return PlannerGone(
            f"hotset's planner process (pid {self._proc.pid}) ended (exit code "
            f"{self._proc.exitcode}) while the loader needed it: it was killed, or ran out "
            "of memory; the plans it held are lost (the store is reconciled when a new "
            "loader starts)"
        )


def _stop(proc, conn) -> None:
    """End the child: it exits when its pipe closes; killed where it does not."""
    conn.close()
    proc.join(10.0)
    if proc.is_alive():
        proc.kill()
        proc.join()


def _meeting_point(ranks: RankGroup) -> tuple[tuple, object]:
    """Where the ranks' planner processes meet: a TCP store that rank 0 serves (on a
    port of the system's choosing, at ``MASTER_ADDR`` or its host name), its address
    broadcast; returns it and rank 0's server (kept alive by its training process)."""
    import torch.distributed as dist

    timeout = ranks.timeout or DEFAULT_TIMEOUT
    server, address = None, None
    if ranks.rank == 0:
        server = dist.TCPStore(
            "0.0.0.0", 0, ranks.world, True, timeout=timeout, wait_for_workers=False
        )
        address = (os.environ.get("MASTER_ADDR") or socket.gethostname(), server.port)
    host, port = ranks.broadcast(address, call="the planner process's address")
    return (host, port, ranks.rank, ranks.world, timeout), server


def _join(meet: tuple) -> RankGroup:
    """This child's place in the planner processes' own gloo group."""
    import torch.distributed as dist

    host, port, rank, world, timeout = meet
    store = dist.TCPStore(host, port, world, False, timeout=timeout)
    group = dist.ProcessGroupGloo(store, rank, world, timeout)
    return RankGroup.over(group, rank, world, timeout)


def _serve(conn, parents, build: Callable, dataset, meet: tuple | None) -> None:
    """The child: make the planner, then answer the training process's messages in
    their order until it asks to close or the pipe ends; then close the planner (its
    feeder's threads stop writing to the store) and say so. An error is sent as the
    answer to the next message that wants one, and to every one after it (the planner's
    state is not trusted once a step of it failed)."""
    parents.close()  # (its end, copied by the fork: else the pipe never ends here)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the training process's
    # messages are read as they come, so that the training process never waits to send
    # while this one waits to send it a plan (each side's send blocks on a full pipe)
    inbox: queue.SimpleQueue = queue.SimpleQueue()
    threading.Thread(target=_read, args=(conn, inbox), daemon=True).start()
    failed: BaseException | None = None
    planner = plans = None
    try:
        planner = build(None if meet is None else _join(meet))
    except BaseException as exc:
        failed = exc
    while (message := inbox.get()) is not None:
        kind, answer = message[0], None
        if kind == "call" and message[1] == "close":
            break
        if failed is None:
            try:
                if kind == "next":
                    answer = ("plan", next(plans, None))
                elif kind == "iter":
                    plans = iter(planner)
                else:
                    value = _run(planner, dataset, message[1], message[2])
                    answer = ("value", value) if kind == "call" else None
            except BaseException as exc:
                failed = exc
        if failed is not None and kind in ("call", "next"):
            answer = ("error", _portable(failed))
        if answer is not None:
            try:
                conn.send(answer)
            except OSError:
                break  # the training process is gone
    if planner is not None:
        with contextlib.suppress(Exception):  # (an error that stopped it is told already)
            planner.close()
    if message is not None:  # asked to close: closed
        with contextlib.suppress(OSError):
            conn.send(("value", None))
    conn.close()


def _read(conn, inbox: queue.SimpleQueue) -> None:
    """Move the training process's messages to ``inbox`` (``None``: the pipe ended)."""
    try:
        while True:
            inbox.put(conn.recv())
    except (EOFError, OSError):
        inbox.put(None)


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
