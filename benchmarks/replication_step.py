"""What a data-parallel rank pays for planning the global batch, against a real training
step on this machine's GPU.

Under ranks every rank plans the global batch (R ranks x B samples) and learns every
rank's feedback (docs/distributed.md): its control plane does R times a single job's
work. Here one process trains a real model in README's loop (per-sample losses,
backward, step, ``feedback``) on synthetic images resident on the device (the data path
is not what is measured), and plans with each system's control plane as a rank of R
does: a ``Planner`` of global batches of R x B over a synthetic ImageNet-like manifest of
``--ids`` ids (``plan_scale.py``'s), with the options a loader gives it under ranks and
the store's tracking of plans in flight, each plan's report reconciled as the loader
does, and fed back R x B losses a step (the B this model computed at the rank's
positions, the other ranks' simulated) through the loader's ``DeferredFeedback``: at once
(``sync``: the loop waits for the step to finish, then plans) or one batch later
(``deferred``, the default for losses on a GPU: the planning runs while the GPU works),
or deferred to a planner in a process of its own (``process``: ``planner_process=True``,
planning a batch ahead beside the step; the global plan and the global batch's
feedback cross its pipe, where a real rank's carry its shard and its own losses).
Not in it: the exchange between ranks (one all-gather a step whose bytes follow the
batch: ``distributed_plan.py --ids`` measures it) and the data plane.

Before the timed steps the cache is filled (the first epoch is planned until it is) and
every id scored, as after a real first epoch, so the policies evict as they do
mid-training. Each model times an epoch of its own (the second, the third) at
``--rounds`` places spread over it, ``--steps`` each (the planner goes on to the next
place untimed, with no training step): an epoch's cost changes along it (SHADE serves
the cached samples first, then its misses, each an admission and an eviction with the
cache full). The variants (no control plane at all; each system at each R and each
``--feedback`` way) alternate within each round, so that the machine's drift falls on
all alike. Reported per variant: the step's mean over the rounds (the epoch's), the
control plane's milliseconds per step (planning, feedback, reconciling: on the training
thread), and the step against the same system and feedback at R=1 (what replication
costs) and against no control plane (what hotset costs the step).

    python benchmarks/replication_step.py --device cuda --models resnet50,resnet18
    python benchmarks/replication_step.py --device cpu --models tiny --ids 60000 \\
        --ranks 1,4 --steps 3 --rounds 2 --batch-size 32 --image-size 32   # a smoke run
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from _report import report  # noqa: E402
from hotset.build import _deterministic  # noqa: E402
from hotset.feedback import DeferredFeedback, per_sample_loss  # noqa: E402
from hotset.plan import Planner, PlanReport  # noqa: E402
from hotset.plan_process import PlannerProcess  # noqa: E402
from hotset.policy.base import make_policy  # noqa: E402
from hotset.sampling.base import make_sampler  # noqa: E402
from hotset.store import MemoryStore  # noqa: E402
from hotset.systems import resolve_system  # noqa: E402
from plan_scale import CLASSES, fullness, losses_of, make_manifest, score_all  # noqa: E402

WARM_STEPS = 2  # per variant and round, untimed (the GPU's clocks, the allocator)


def make_net(name: str, device: torch.device) -> torch.nn.Module:
    """An ImageNet model: torchvision's where it is installed, else hotset's ResNet-18
    (``resnet18``) or TinyCNN (``tiny``, for a smoke run on a CPU)."""
    try:
        import torchvision

        net = getattr(torchvision.models, name)(num_classes=CLASSES)
    except (ImportError, AttributeError):
        from hotset.models import make_model

        net = make_model(name, CLASSES, in_channels=3)
    return net.to(device, memory_format=torch.channels_last)


def warmed_planner(
    system: str, ranks: int, manifest, batch_size: int, ahead: int = 0, **policy_options
) -> Planner:
    """``system``'s planner of global batches as a rank of ``ranks`` makes them, its
    first epoch planned until the cache is full (each plan consumed and fed back
    ``ahead`` plans after it was taken, as under a DataLoader's prefetch), every id
    scored."""
    sysdef = resolve_system(system)
    s_opts, p_opts = _deterministic(sysdef.sampler, sysdef.policy, sysdef.sampler_options,
                                    policy_options)  # fmt: skip
    n = len(manifest)
    policy = make_policy(sysdef.policy, int(0.1 * manifest.total_bytes),
                         sizes=manifest.sizes, seed=0, **p_opts)  # fmt: skip
    sampler = make_sampler(sysdef.sampler, n, seed=0, **s_opts)
    planner = Planner(sampler, policy, batch_size * ranks, store=MemoryStore(1))
    planner.set_epoch(0)
    prefetch = Prefetch(planner, ahead, 0.5)
    plans = iter(planner)
    for plan in plans:
        prefetch.take(plan)
        if fullness(policy) >= 0.99:
            break
    prefetch.drain()
    plans.close()
    score_all(sampler, n)
    return planner


class Prefetch:
    """Plans taken ahead of the one trained, as by a DataLoader's prefetch: each is
    consumed (its report, and losses at ``progress`` fed back) ``ahead`` plans after it
    was taken."""

    def __init__(self, planner: Planner, ahead: int, progress: float) -> None:
        self.planner, self.ahead, self.progress = planner, ahead, progress
        self.taken: deque = deque()

    def take(self, plan) -> None:
        self.taken.append(plan)
        while len(self.taken) > self.ahead:
            self._consume()

    def drain(self) -> None:
        while self.taken:
            self._consume()

    def _consume(self) -> None:
        old = self.taken.popleft()
        self.planner.batch_consumed(PlanReport(stored=old.admitted))
        self.planner.feedback(old.ids, losses_of(old.ids, self.progress))


class Variant:
    """One system's control plane as a rank of ``ranks`` runs it, its feedback learnt at
    once (``sync``), deferred (``deferred``), or deferred to a planner in a process of
    its own (``process``, ``planner_process=True``) (``system=None``: none)."""

    def __init__(self, system: str | None, ranks: int, mode: str, manifest,
                 batch_size: int, in_flight: int = 0) -> None:  # fmt: skip
        self.system, self.ranks, self.mode = system, ranks, mode
        self.in_flight = in_flight  # plans taken ahead of the one trained (a prefetch)
        self.ahead: deque = deque()
        self.steps_ms: list[float] = []
        self.control_ms: list[float] = []
        self.plans = None
        self.at = 0
        self.learn_s = 0.0  # seconds in ``learn``: the planner's share of the feedback
        if system is None:
            return
        if mode == "process":  # (made, filled and scored there)
            self.planner = PlannerProcess(
                lambda _: warmed_planner(system, ranks, manifest, batch_size), None
            )
        else:
            self.planner = warmed_planner(system, ranks, manifest, batch_size)
        self.feedback = DeferredFeedback(self.learn, mode != "sync")
        self.fed: deque = deque()  # the plans whose feedback is on its way
        self.epoch = 0

    def seek(self, epoch: int, share: float, steps: int) -> None:
        """Plan on, untimed and with no training step, to ``share`` of ``epoch``'s steps
        before its last ``steps`` (its start, where it is not begun yet)."""
        if self.system is None:
            return
        if epoch != self.epoch:
            if self.plans is not None:
                self.plans.close()
            self.ahead.clear()  # (an abandoned epoch's: the planner releases them)
            self.planner.set_epoch(epoch)
            self.epoch, self.plans, self.at = epoch, iter(self.planner), 0
            self.size = len(self.planner)
        target = int(share * (self.size - steps))
        if target < self.at or self.size - self.at - self.in_flight < steps:
            raise SystemExit(f"{self.name}: cannot time {steps} steps from {target} of an "
                             f"epoch of {self.size} at {self.at}: fewer --steps")  # fmt: skip
        while self.at < target:
            self.untimed(self.trained(), 1.5)
            self.at += 1

    def trained(self):
        """The next plan trained: ``in_flight`` plans after it are taken first, as a
        DataLoader's prefetch takes them (their reads and writes pinned meanwhile)."""
        while len(self.ahead) <= self.in_flight:
            self.ahead.append(next(self.plans))
        return self.ahead.popleft()

    def untimed(self, plan, progress: float) -> None:
        """A plan's report (every admission landed) and the global batch's feedback."""
        self.planner.batch_consumed(PlanReport(stored=plan.admitted))
        self.planner.feedback(plan.ids, losses_of(plan.ids, progress))

    def learn(self, ids: np.ndarray, losses: np.ndarray, _emb) -> None:
        """This rank's losses of the oldest plan fed back, with the other ranks' (as the
        exchange hands them over): the global batch's feedback to the planner."""
        start = time.perf_counter()
        plan = self.fed.popleft()
        fed = losses_of(plan.ids, 1.5)
        fed[:: self.ranks] = losses
        self.planner.feedback(plan.ids, fed)
        self.learn_s += time.perf_counter() - start

    @property
    def name(self) -> str:
        if self.system is None:
            return "none"
        return f"{self.system} R={self.ranks} {self.mode}"

    def run(self, step, steps: int, device: torch.device, timed: bool) -> None:
        """``steps`` training steps, each with this variant's control plane: the plan
        (the loader's batch sampler), its report as the batch reaches the loop, the
        step, the feedback of the global batch (the step's losses at this rank's
        positions)."""
        sync(device)
        t0, control, learnt = time.perf_counter(), 0.0, self.learn_s
        for _ in range(steps):
            c = time.perf_counter()
            if self.plans is not None:
                plan = self.trained()
                self.planner.batch_consumed(PlanReport(stored=plan.admitted))
            control += time.perf_counter() - c
            losses = step()  # this rank's B losses, where the step computes them
            if self.plans is not None:
                own = plan.ids[:: self.ranks]  # this rank's positions in the global batch
                self.fed.append(plan)
                self.feedback.put(own, losses[: own.size])  # (waits for the GPU, or not)
                self.at += 1
        if self.plans is not None:
            self.feedback.flush()
            control += self.learn_s - learnt  # the planner's work, not the wait for the GPU
        sync(device)
        if timed:
            self.steps_ms.append(1e3 * (time.perf_counter() - t0) / steps)
            self.control_ms.append(1e3 * control / steps)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_step(net: torch.nn.Module, args, device: torch.device):
    """README's loop body: per-sample losses, backward, step (launched, not waited for
    on a GPU); returns the losses."""
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(args.batch_size, 3, args.image_size, args.image_size, device=device,
                    generator=g).contiguous(memory_format=torch.channels_last)  # fmt: skip
    y = torch.randint(0, CLASSES, (args.batch_size,), device=device, generator=g)
    autocast = torch.autocast(device.type, torch.bfloat16, enabled=device.type == "cuda")

    def step() -> torch.Tensor:
        with autocast:
            losses = per_sample_loss(net(x), y)
        opt.zero_grad(set_to_none=True)
        losses.mean().backward()
        opt.step()
        return losses.detach().double()

    return step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--models", default="resnet50")
    ap.add_argument("--systems", default="minio,shade,icache")
    ap.add_argument("--ranks", default="1,8,32")
    ap.add_argument("--ids", type=int, default=1_281_167)
    ap.add_argument("--batch-size", type=int, default=256, help="per rank")
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--steps", type=int, default=15, help="timed steps per variant and round")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--in-flight", type=int, default=0,
                    help="plans taken ahead of the one trained (a DataLoader's prefetch: "
                         "num_workers x prefetch_factor)")  # fmt: skip
    ap.add_argument("--feedback", default="sync,deferred,process",
                    help="where and when the control plane learns: sync, deferred, "
                         "process (a planner process, deferred)")  # fmt: skip
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cpu":
        print("no GPU: the step and the planning share the CPU's cores, so the figures say "
              "nothing of a GPU run (a smoke run: --models tiny --ids 60000 --image-size 32 "
              "--batch-size 32)", file=sys.stderr)  # fmt: skip
    torch.backends.cudnn.benchmark = True
    t = time.perf_counter()
    manifest = make_manifest(args.ids)
    variants = [Variant(None, 1, "-", manifest, args.batch_size)]
    for system in args.systems.split(","):
        for r in map(int, args.ranks.split(",")):
            for mode in args.feedback.split(","):
                variants.append(Variant(system, r, mode, manifest, args.batch_size,
                                        args.in_flight))  # fmt: skip
    print(f"{len(variants)} control planes ready in {time.perf_counter() - t:.1f} s",
          file=sys.stderr)  # fmt: skip
    rows = []
    for m, model in enumerate(args.models.split(",")):
        net = make_net(model, device)
        step = make_step(net, args, device)
        for _ in range(5):  # cudnn's choice of kernels
            step()
        for v in variants:
            v.steps_ms, v.control_ms = [], []
        epoch = m + 1  # an epoch of its own for each model
        for r in range(args.rounds):  # at shares 0, 1/rounds, ... of the epoch
            for v in variants:
                v.seek(epoch, r / args.rounds, WARM_STEPS + args.steps)
                v.run(step, WARM_STEPS, device, timed=False)
                v.run(step, args.steps, device, timed=True)
        none = statistics.mean(variants[0].steps_ms)
        alone = {(v.system, v.mode): statistics.mean(v.steps_ms)
                 for v in variants if v.ranks == 1}  # fmt: skip
        for v in variants:
            ms = statistics.mean(v.steps_ms)
            rows.append({
                "model": model, "system": v.system or "none", "ranks": v.ranks,
                "feedback": "-" if v.system is None else v.mode,
                "global_batch": v.ranks * args.batch_size, "step_ms": ms,
                "steps_ms": v.steps_ms, "control_ms": statistics.mean(v.control_ms),
                "vs_r1_pct": 100 * (ms / alone.get((v.system, v.mode), np.nan) - 1),
                "vs_none_pct": 100 * (ms / none - 1),
            })  # fmt: skip
        print(f"  {model} done", file=sys.stderr)
        del net, step
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    report("replication_step", rows, [
        ("model", "s"), ("system", "s"), ("ranks", "d"), ("feedback", "s"),
        ("global_batch", ",d"),
        ("step_ms", ".1f"), ("control_ms", ".1f"), ("vs_r1_pct", "+.1f"),
        ("vs_none_pct", "+.1f"),
    ], meta={"device": name, "ids": args.ids, "batch_size_per_rank": args.batch_size,
             "image_size": args.image_size, "steps": args.steps,
             "rounds": args.rounds, "in_flight": args.in_flight})  # fmt: skip


if __name__ == "__main__":
    main()
