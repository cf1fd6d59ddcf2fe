"""How much SpiderCache's graph importance lengthens a training step (issue #4: <= 10%).

Real TinyCNN steps on Fashion-MNIST batches held in memory (so only the step and the
scoring are timed), side by side in one run, interleaved in rounds:

* ``plain``: forward, per-sample loss, backward, optimizer step;
* ``spider (background)``: the same step plus ``sampler.feedback(ids, losses,
  embeddings)`` with the graph worker scoring off the step (the default);
* ``spider (inline)``: the scoring done inside the step (what pipelining avoids).

``coverage`` is the fraction of served samples the worker scored: 1 with the default
``when_behind="wait"`` (a step waits for the worker instead, and the wait is in the step's
time); with ``--when-behind drop`` the rest were dropped and keep their last score.

    python benchmarks/graph_overhead.py [--data data/fashion-mnist] [--steps 150]
        [--k 500] [--when-behind wait|drop]
"""

from __future__ import annotations

import argparse
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import report  # noqa: E402
from hotset.codecs import decode_sample  # noqa: E402
from hotset.compare import IMAGE_SIZE, load_split  # noqa: E402
from hotset.feedback import per_sample_loss  # noqa: E402
from hotset.models import TinyCNN  # noqa: E402
from hotset.sampling import make_sampler  # noqa: E402


def run(mode: str, x, y, steps: int, batch: int, seed: int, options: dict) -> dict:
    torch.manual_seed(seed)
    model = TinyCNN()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    n = len(x)
    sampler = None
    if mode != "plain":
        sampler = make_sampler(
            "spider", n, labels=y.numpy(), background=(mode == "spider (background)"), **options
        )
    rng = np.random.default_rng(seed)
    times = []
    try:
        for _ in range(steps):
            ids = rng.integers(0, n, batch)
            xb, yb = x[ids], y[ids]
            start = time.perf_counter()
            logits, emb = model.forward_with_embedding(xb)
            losses = per_sample_loss(logits, yb)
            opt.zero_grad(set_to_none=True)
            losses.mean().backward()
            opt.step()
            if sampler is not None:
                sampler.feedback(ids, losses.detach().numpy(), emb.numpy())
            times.append(time.perf_counter() - start)
        if sampler is not None:
            sampler.drain()
    finally:
        if sampler is not None:
            sampler.close()
    served = steps * batch
    return {
        "mode": mode,
        "step_ms": 1e3 * float(np.median(times[10:])),
        "coverage": 1.0 if sampler is None else sampler.scored / served,
        "graph_ms_per_batch": 0.0 if sampler is None else 1e3 * sampler.graph_s / steps,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="data/fashion-mnist")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--ef-construction", type=int, default=None)
    ap.add_argument("--k", type=int, default=None)
    ap.add_argument("--when-behind", choices=("wait", "drop"), default=None)
    ap.add_argument("--name", default="graph_overhead")
    args = ap.parse_args()
    given = (("ef_construction", args.ef_construction), ("k", args.k),
             ("when_behind", args.when_behind))  # fmt: skip
    options = {k: v for k, v in given if v}
    split = load_split(args.data, "train", partial(decode_sample, size=IMAGE_SIZE))
    if split is None:
        sys.exit(f"no prepared data in {args.data}: run `hotset prepare fashion-mnist {args.data}`")
    x, y = split
    modes = ("plain", "spider (background)", "spider (inline)")
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    for r in range(args.rounds):  # interleaved: the machine's noise hits all modes alike
        for m in modes:
            runs[m].append(run(m, x, y, args.steps, args.batch, seed=r, options=options))
    base = np.median([d["step_ms"] for d in runs["plain"]])
    rows = []
    for m in modes:
        step = float(np.median([d["step_ms"] for d in runs[m]]))
        rows.append(
            {
                "mode": m,
                "step_ms": step,
                "overhead": step / base - 1.0,
                "coverage": float(np.mean([d["coverage"] for d in runs[m]])),
                "graph_ms_per_batch": float(np.mean([d["graph_ms_per_batch"] for d in runs[m]])),
            }
        )
    report(
        args.name,
        rows,
        [("mode", "s"), ("step_ms", ".2f"), ("overhead", "+.1%"), ("coverage", ".2f"),
         ("graph_ms_per_batch", ".2f")],
        {"steps": args.steps, "batch": args.batch, "target_overhead": 0.10, "options": options},
    )  # fmt: skip


if __name__ == "__main__":
    main()
