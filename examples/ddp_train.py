"""Data-parallel training with hotset under torchrun (one node or several):

    torchrun --nproc-per-node 2 examples/ddp_train.py --data data/fashion-mnist/train

Each rank draws the same global list (every rank's losses are shared), serves its shard
with the same batch count, and all ranks pool one cache: ``--store shared`` on one node,
``--store shared+redis+cluster://host:port`` across nodes (node copies in front of a Redis Cluster).
``--planner-process`` plans in a process of its own per rank (Linux), beside the step;
``--planner-process node`` in one process per node for all of its ranks.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch import nn

import hotset
from hotset.models import TinyCNN


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--store", default="shared")
    ap.add_argument("--system", default="shade", help="shade, icache, spider, lru, minio, ...")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--planner-process", nargs="?", const="rank", choices=("rank", "node"),
                    help="plan in a process of its own, a batch ahead: each rank's, or one "
                    "for the node's ranks (hotset's option)")
    args = ap.parse_args()

    dist.init_process_group("gloo")  # "nccl" on GPUs: hotset keeps a gloo group of its own
    storage = hotset.FileStorage(args.data)
    loader = hotset.make_loader(  # ranks, shards and the shared store come from the group
        storage, batch_size=64, system=args.system,
        cache_fraction=0.2, store=args.store, num_workers=2,
        planner_process={None: False, "rank": True}.get(args.planner_process, "node"),
        epochs=args.epochs,
    )  # fmt: skip
    model = nn.parallel.DistributedDataParallel(TinyCNN())
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        for x, y, ids in loader:
            losses = hotset.per_sample_loss(model(x), y)
            opt.zero_grad()
            losses.mean().backward()
            opt.step()
            loader.feedback(ids, losses)  # on every rank, every step
        c = loader.counters()
        if dist.get_rank() == 0:
            print(f"epoch {epoch}: {len(loader)} batches per rank, hits {c['hits']}, "
                  f"misses {c['misses']}, sync {c['internal']['sync_s']:.2f} s, "
                  f"waited for plans {c['internal'].get('planner_wait_s', 0.0):.2f} s")  # fmt: skip
    dist.barrier()  # every rank done before any tears its process group down
    loader.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
