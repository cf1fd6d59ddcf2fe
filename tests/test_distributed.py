"""Data-parallel training across real ranks (torch.distributed, gloo on CPU, DDP): one
global plan on every rank, equal batch counts, each sample once per epoch under uniform
sampling, one pooled cache whose budget holds, and the right bytes."""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
import pickle
import re
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn

import hotset
from hotset.feedback import per_sample_loss
from hotset.models import TinyCNN
from hotset.storage import FileStorage
from hotset.testing import run_processes

CAPACITY_FRACTION = 0.2


class WithEmbedding(nn.Module):
    """``forward`` returns (logits, embedding), so that DDP sees the whole step."""

    def __init__(self) -> None:
        super().__init__()
        self.net = TinyCNN()

    def forward(self, x):
        return self.net.forward_with_embedding(x)


def _rank(rank: int, world: int, init: str, data: str, system: dict, out: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    torch.manual_seed(0)
    system = dict(system)
    kill = system.pop("kill_at", None)  # (epoch, batch, pid): rank 0 kills that process
    per_node = system.pop("ranks_per_node", None)
    if per_node:  # each node's ranks, as torchrun tells each node's agent
        os.environ["GROUP_RANK"] = str(rank // per_node)
    storage = FileStorage(data)
    loader = hotset.make_loader(
        storage, batch_size=25, cache_fraction=CAPACITY_FRACTION, num_workers=1, seed=0,
        **system,
    )  # fmt: skip
    model = nn.parallel.DistributedDataParallel(WithEmbedding())
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    capacity = loader.dataset.store.capacity_bytes
    record = {"epochs": [], "len": len(loader)}
    plans = hashlib.blake2b(digest_size=8)  # the global plans this rank made, served ids
    process = system.get("planner_process", False)
    if not process:  # and hits of each, before it takes its shard
        plan = loader.planner._plan

        def recorded(*args):
            p = plan(*args)
            plans.update(p.ids.tobytes() + p.hits.tobytes() + p.admitted.tobytes())
            return p

        loader.planner._plan = recorded
        sampler = loader.planner.sampler
        if sampler.cache_aware:  # what it is told the cache holds: the RAM tier's alone
            told, set_cached = record.setdefault("told_ram_alone", []), sampler.set_cached_mask

            def telling(mask):
                ram = loader.planner.policy.cached_ids()
                told.append(bool(np.array_equal(np.flatnonzero(mask), np.unique(ram))))
                set_cached(mask)

            sampler.set_cached_mask = telling
    for epoch in range(3):
        loader.set_epoch(epoch)
        announced = len(loader)
        ids_seen, wrong, over, batches = [], 0, 0, 0
        before = loader.counters()
        for x, y, ids in loader:
            if kill and rank == 0 and (epoch, batches) == tuple(kill[:2]):
                os.kill(kill[2], signal.SIGKILL)
            wrong += int((y.numpy() != storage.labels[ids.numpy()]).sum())
            logits, emb = model(x)
            losses = per_sample_loss(logits, y)
            opt.zero_grad()
            losses.mean().backward()
            opt.step()
            loader.feedback(ids, losses.detach(), emb.detach())
            ids_seen += ids.tolist()
            batches += 1
            over += int(loader.dataset.store.used_bytes > capacity)
        c = loader.counters()
        if process:  # the planner's whole state (scores, residents, keys), from its process
            state = loader.planner.state_dict()
            # (less what one rank keeps for all: SpiderCache's graph, the time spent on it,
            # the scores it has yet to hand on)
            mine = {k: v for k, v in state["sampler"].items()
                    if k not in ("graph", "graph_s", "wait_s", "_outbox")}  # fmt: skip
            plans.update(pickle.dumps((mine, state["policy"])))
            order = drawn = np.frombuffer(plans.digest(), np.uint8)
        else:
            order = loader.planner.at.order
            drawn = loader.planner.sampler.global_order(epoch)  # padded to whole shards
            drawn = np.concatenate([drawn, np.resize(drawn, -drawn.size % world)])
        tiers = getattr(loader.dataset.store.inner, "local", None)
        if tiers is not None:  # node-local copies: the node's own LMDB, within the plan
            pooled = set(loader.dataset.store.inner.inner.list_keys())
            copies = set(tiers.list_keys())
            record.setdefault("local", []).append(
                {"path": tiers.path, "copies": len(copies), "stray": len(copies - pooled)}
            )
        record["epochs"].append({
            "ids": ids_seen, "batches": batches, "len": announced, "wrong": wrong,
            "over_budget": over,
            "order": hashlib.blake2b(order.tobytes(), digest_size=8).hexdigest(),
            "order_is_drawn": bool(np.array_equal(order, drawn)),
            "plans": plans.hexdigest(),
            "hits": c["hits"] - before["hits"], "reads": len(ids_seen),
            "corrupt": c["corrupt_hits"], "sync_s": c["internal"]["sync_s"],
            "sync_calls": c["internal"]["sync_calls"] - before["internal"]["sync_calls"],
            "collectives": c["internal"].get("collectives", 0)
            - before["internal"].get("collectives", 0),
            "failures": c["store_failures"] - before["store_failures"],
            "disk_hits": c["disk_hits"] - before["disk_hits"],
            "cached": plans.hexdigest() if process else hashlib.blake2b(
                loader.planner.policy.cached_ids().tobytes(), digest_size=8
            ).hexdigest(),
            "fixes": c["internal"]["sync_fixes"] - before["internal"]["sync_fixes"],
            "package_reads": c["internal"].get("package_storage_reads", 0),
            "graph": _graph_of(state["sampler"] if process else vars(loader.planner.sampler)),
            # the ids in flight the planner counted, and iCACHE's L bytes beside them
            "in_flight": None if process else [
                int(getattr(loader.planner.policy, k, 0)) for k in ("in_flight_ids", "_l_in_flight")
            ],
        })  # fmt: skip
        loader.report_accuracy(0.5 + 0.1 * rank)  # ranks disagree: the mean is used
    if rank == 1 and process:  # a state saved by one rank alone (where it stands)
        record["saved_alone"] = loader.state_dict()["planner"]["epoch"]
    # whether this rank's process plans (its own planner, or its node's), or another's
    record["plans_here"] = not process or loader.planner._proc is not None
    Path(out, f"rank{rank}.json").write_text(json.dumps(record))
    dist.barrier()  # tear down together: gloo aborts a rank whose peer left mid-teardown
    loader.close()
    dist.destroy_process_group()


def _graph_of(sampler: dict) -> list | None:
    """SpiderCache's graph on this rank (whether it has an index, the ids in it) and the
    scores it applied, from the sampler's attributes or state."""
    g = sampler.get("graph")
    return None if g is None else [g.index is not None, int(g.indexed.sum()), sampler["scored"]]


def run_ranks(world: int, data: str, system: dict, tmp: Path, target=None) -> list[dict]:
    ctx = mp.get_context("spawn")
    init = f"file://{tmp}/pg"
    procs = [
        ctx.Process(target=target or _rank, args=(r, world, init, data, system, str(tmp)))
        for r in range(world)
    ]
    assert run_processes(procs, 300) == [0] * world
    return [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(world)]


SYSTEMS = {
    "uniform": {"policy": "minio", "sampler": "uniform"},
    "shade": {"policy": "app", "sampler": "shade"},
    "shade-k4": {"policy": "app", "sampler": "shade", "sync_every": 4},
    "icache": {"policy": "icache", "sampler": "iis"},
    # a first L-cache small enough that the plans in flight size it (``l_in_flight``)
    "icache-in-flight": {"policy": "icache", "sampler": "iis", "policy_options": {"h_share": 0.95}},
    "spider": {"policy": "spider", "sampler": "spider", "epochs": 3},
    # over the node's disk tier (the test's directory): each rank's repetition sees the
    # RAM tier alone, which the ranks agree on
    "shade-disk": {"policy": "app", "sampler": "shade", "disk_dir": "TMP/nvme"},
    # feedback learnt one batch later (as from a GPU), embeddings too
    "spider-deferred": {"policy": "spider", "sampler": "spider", "defer_feedback": True,
                        "epochs": 3},
    # each rank's planner in a process of its own; those processes exchange among them
    "icache-process": {"policy": "icache", "sampler": "iis", "planner_process": True},
    "spider-process": {"policy": "spider", "sampler": "spider", "planner_process": True,
                       "epochs": 3},
}


@pytest.mark.parametrize(
    ("name", "world"),
    [("uniform", 2), ("shade", 2), ("icache", 2), ("spider", 2),
     ("shade-k4", 2), ("shade", 3),  # 3 ranks: 1,000 ids padded to whole shards
     ("spider-deferred", 2),  # (losses and embeddings deferred)
     ("icache-process", 3), ("icache-in-flight", 2), ("spider-process", 2), ("shade-disk", 2)],
)
def test_ranks_share_one_global_plan(fmnist_dir, tmp_path, name, world):
    data = str(fmnist_dir / "train")
    system = {k: v.replace("TMP", str(tmp_path)) if k == "disk_dir" else v
              for k, v in SYSTEMS[name].items()}  # fmt: skip
    records = run_ranks(world, data, system, tmp_path)
    n = len(FileStorage(data))
    assert len({r["len"] for r in records}) == 1  # equal batch counts, announced
    for e in range(3):
        epochs = [r["epochs"][e] for r in records]
        assert len({ep["order"] for ep in epochs}) == 1, (name, e)  # one global list
        assert all(ep["order_is_drawn"] for ep in epochs), (name, e)  # the sampler's, whole
        # and one served global list: every batch's served ids, hits and admissions
        assert len({ep["plans"] for ep in epochs}) == 1, (name, e)
        assert len({ep["batches"] for ep in epochs}) == 1  # and equal counts served
        assert epochs[0]["batches"] == epochs[0]["len"]  # as many as len(loader) said
        for ep in epochs:
            assert ep["wrong"] == 0 and ep["corrupt"] == 0 and ep["over_budget"] == 0
        if name == "uniform":  # each sample exactly once per epoch, over all ranks
            assert sorted(i for ep in epochs for i in ep["ids"]) == list(range(n))
        # the ranks decided alike: one cache, nothing to fix at the epoch's end
        assert len({ep["cached"] for ep in epochs}) == 1, (name, e)
        assert all(ep["fixes"] == 0 for ep in epochs), (name, e, [ep["fixes"] for ep in epochs])
        # reports and feedback travel together: one collective per sync_every steps (and
        # one at each epoch boundary)
        k = SYSTEMS[name].get("sync_every", 1)
        calls = epochs[0]["sync_calls"]
        assert calls <= -(-epochs[0]["batches"] // k) + 2, (name, e, calls)
        # every collective: that exchange and the epoch's boundaries (iCACHE's package
        # loads ride the exchange: rank 0's report says what did not land)
        every = epochs[0]["collectives"]
        assert every <= -(-epochs[0]["batches"] // k) + 6, (name, e, every)
        assert len({str(ep["in_flight"]) for ep in epochs}) == 1  # counted alike
    if name.startswith("spider"):  # one rank keeps the graph and scores for all
        for e in range(3):
            graphs = [r["epochs"][e]["graph"] for r in records]
            assert graphs[0][0] and graphs[0][1] > 0, (e, graphs)
            assert all(g[:2] == [False, 0] for g in graphs[1:]), (e, graphs)
            assert len({g[2] for g in graphs}) == 1  # every rank applied the same scores
        assert graphs[0][2] >= n  # (every sample was scored, epochs 0-1 at least)
    if name == "shade-disk":  # each node's disk tier holds its own samples: the ranks'
        # repetition sees the RAM tier alone (docs/data.md), though the tier holds more
        assert all(r["told_ram_alone"] == [True] * 3 for r in records), records[0]
        assert sum(ep["disk_hits"] for r in records for ep in r["epochs"]) > 0
    if name.startswith("icache"):  # one rank reads and loads the packages
        assert records[0]["epochs"][-1]["package_reads"] > 0
        assert all(r["epochs"][-1]["package_reads"] == 0 for r in records[1:])
    if name == "icache-in-flight":  # two plans of 2 x 25 in flight size the L-cache
        assert records[0]["epochs"][-1]["in_flight"][0] == 100
        assert records[0]["epochs"][-1]["in_flight"][1] > 0


def test_a_pooled_cache_hits_as_one_process_with_the_same_cache(fmnist_dir, tmp_path):
    """Ranks sharing one store of capacity C hit (together) as one process with C."""
    data = str(fmnist_dir / "train")
    records = run_ranks(2, data, SYSTEMS["uniform"], tmp_path)
    ranks = sum(ep["hits"] for r in records for ep in r["epochs"][1:]) / sum(
        ep["reads"] for r in records for ep in r["epochs"][1:]
    )
    storage = FileStorage(data)
    alone = hotset.make_loader(storage, batch_size=25, cache_fraction=CAPACITY_FRACTION,
                               num_workers=1, seed=0, **SYSTEMS["uniform"])  # fmt: skip
    with alone:  # epoch 0 cannot hit (a shuffle reads each sample once): reads of 1-2
        for epoch in range(3):
            alone.set_epoch(epoch)
            for _ in alone:
                pass
        hits, reads = alone.counters()["hits"], 2 * len(storage)
    one = hits / reads
    assert one > 0.15 and abs(ranks - one) <= 0.1 * one, (ranks, one)


def test_learning_samplers_need_a_process_group_to_shard(fmnist_dir):
    storage = FileStorage(str(fmnist_dir / "train"))
    with pytest.raises(hotset.ConfigError, match="initialise torch.distributed"):
        hotset.make_loader(storage, batch_size=25, cache_fraction=0.2, sampler="shade",
                           policy="app", num_replicas=2, rank=0)  # fmt: skip
    assert not os.environ.get("WORLD_SIZE")  # the tests start their own ranks


def test_ranks_pool_a_redis_cluster(fmnist_dir, tmp_path, redis_cluster):
    """Two ranks over a real 3-master Redis Cluster: one plan, entries on every master, a
    rank hits what the other put, the budget holds."""
    data = str(fmnist_dir / "train")
    system = {**SYSTEMS["uniform"], "store": redis_cluster.url}
    records = run_ranks(2, data, system, tmp_path)
    for e in range(3):
        epochs = [r["epochs"][e] for r in records]
        assert len({ep["order"] for ep in epochs}) == 1
        assert all(ep["wrong"] == 0 and ep["over_budget"] == 0 for ep in epochs)
    hits = [sum(ep["hits"] for ep in r["epochs"][1:]) for r in records]
    reads = sum(ep["reads"] for r in records for ep in r["epochs"][1:])
    assert min(hits) > 0 and sum(hits) / reads > 0.15, hits


@pytest.mark.parametrize("victim", [0, 1], ids=["the URL's node", "another master"])
def test_ranks_absorb_a_cluster_master_killed_mid_epoch(
    fmnist_dir, tmp_path, redis_cluster, victim
):
    """A master of the pooled tier dies in epoch 1 under 2 ranks: no hang, equal batches,
    each sample once per epoch with the right labels, and on every rank the live masters
    still hit in the next epoch, even where the master that died is the one the store's
    URL names (a new DataLoader worker must find the others)."""
    data = str(fmnist_dir / "train")
    victim = redis_cluster.procs[redis_cluster.ports[victim]].pid
    system = {**SYSTEMS["uniform"], "store": redis_cluster.url, "kill_at": (1, 5, victim)}
    records = run_ranks(2, data, system, tmp_path)
    n = len(FileStorage(data))
    for e in range(3):
        epochs = [r["epochs"][e] for r in records]
        assert sorted(epochs[0]["ids"] + epochs[1]["ids"]) == list(range(n))
        assert epochs[0]["batches"] == epochs[1]["batches"]
        assert all(ep["wrong"] == 0 and ep["corrupt"] == 0 for ep in epochs)
    assert sum(r["epochs"][1]["failures"] + r["epochs"][2]["failures"] for r in records) > 0
    assert all(r["epochs"][2]["hits"] > 0 for r in records)  # two masters of three still up


def test_two_nodes_keep_local_copies_over_a_pooled_cluster(fmnist_dir, tmp_path, redis_cluster):
    """Two ranks on two nodes (torchrun's node rank): each node makes its own LMDB of
    copies, the pooled Redis Cluster holds the plan's entries under its budget, both
    ranks hit, and after each epoch a node's copies are all still in the plan."""
    data = str(fmnist_dir / "train")
    system = {**SYSTEMS["uniform"], "store": "shared+" + redis_cluster.url, "ranks_per_node": 1}
    records = run_ranks(2, data, system, tmp_path)
    n = len(FileStorage(data))
    for e in range(3):
        epochs = [r["epochs"][e] for r in records]
        assert sorted(epochs[0]["ids"] + epochs[1]["ids"]) == list(range(n))
        assert all(ep["wrong"] == 0 and ep["over_budget"] == 0 for ep in epochs)
    assert records[0]["local"][0]["path"] != records[1]["local"][0]["path"]  # one per node
    assert all(tier["stray"] == 0 for r in records for tier in r["local"])
    assert all(r["local"][-1]["copies"] > 0 for r in records)
    hits = sum(ep["hits"] for r in records for ep in r["epochs"][1:])
    assert abs(hits / (2 * n) - CAPACITY_FRACTION) < 0.02  # MinIO at C over both nodes


def test_one_planner_process_per_node_serves_each_rank_what_its_own_would(
    fmnist_dir, tmp_path, redis_server
):
    """``planner_process="node"``: 3 ranks on 2 nodes (2 + 1, torchrun's node rank) over
    a Redis store pooled across them: the first rank of each node alone plans, for the
    node's ranks, and each rank is served exactly what it is served with a planner
    process of its own (SHADE, feedback exchanged every 2 steps: the same orders, hits
    and admissions); the planners meet as often, and every label is right."""
    import redis

    data = str(fmnist_dir / "train")
    base = {**SYSTEMS["shade"], "sync_every": 2, "store": redis_server.url}
    modes = {"rank": {"planner_process": True},
             "node": {"planner_process": "node", "ranks_per_node": 2}}  # fmt: skip
    runs = {}
    for mode, options in modes.items():
        redis.Redis.from_url(redis_server.url).flushall()  # (each starts from an empty store)
        (tmp_path / mode).mkdir()
        runs[mode] = run_ranks(3, data, {**base, **options}, tmp_path / mode)
    assert [r["plans_here"] for r in runs["rank"]] == [True, True, True]
    assert [r["plans_here"] for r in runs["node"]] == [True, False, True]  # one per node
    n = len(FileStorage(data))
    for e in range(3):
        for rank in range(3):
            mine, theirs = (runs[m][rank]["epochs"][e] for m in ("node", "rank"))
            assert mine["ids"] == theirs["ids"], (e, rank)  # served alike, in one order
            assert mine["plans"] == theirs["plans"]  # the planner's state alike
            assert mine["sync_calls"] == theirs["sync_calls"]
            assert mine["wrong"] == mine["corrupt"] == mine["over_budget"] == 0
        served = [i for r in runs["node"] for i in r["epochs"][e]["ids"]]
        assert len(served) >= n and len(set(served)) > 0.5 * n  # (SHADE repeats some)
    assert runs["node"][1]["saved_alone"] == runs["rank"][1]["saved_alone"] == 3  # (all done)


@pytest.mark.parametrize("options", [[], ["--planner-process"], ["--planner-process", "node"]],
                         ids=["default", "process", "node"])
def test_the_readme_torchrun_example_runs(fmnist_dir, tmp_path, options):
    import re
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--log-dir", str(tmp_path / "torchrun"),  # (not a new directory in /tmp per run)
         str(root / "examples" / "ddp_train.py"), "--data", str(fmnist_dir / "train"),
         "--epochs", "2", *options],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert "epoch 1: 8 batches per rank" in out.stdout
    hits = [int(h) for h in re.findall(r"hits (\d+)", out.stdout)]
    assert len(hits) == 2 and hits[1] > hits[0], out.stdout  # the second epoch hits


def _two_epochs(loader, storage) -> list[dict]:
    """Two epochs of ``loader`` (losses fed back): per epoch the ids served and how many
    came with a label that is not their sample's."""
    epochs = []
    for epoch in range(2):
        loader.set_epoch(epoch)
        ids_seen, wrong = [], 0
        for _, y, ids in loader:
            wrong += int((y.numpy() != storage.labels[ids.numpy()]).sum())
            ids_seen += ids.tolist()
            loader.feedback(ids, torch.ones(len(ids)))
        epochs.append({"ids": ids_seen, "wrong": wrong})
    return epochs


def _service_rank(rank: int, world: int, init: str, address: str, data: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    storage = FileStorage(data)
    client = hotset.connect(address, timeout_s=20)
    loader = client.make_loader(storage, batch_size=25, num_workers=1, name="ddp-job")
    record = {"len": len(loader), "jobs": len(client.stats()["jobs"]),
              "epochs": _two_epochs(loader, storage)}  # fmt: skip
    Path(out, f"rank{rank}.json").write_text(json.dumps(record))
    dist.barrier()  # tear down together: gloo aborts a rank whose peer left mid-teardown
    loader.close()
    dist.destroy_process_group()


def test_a_job_of_several_ranks_registers_once_with_the_service(fmnist_dir, tmp_path):
    from hotset.service.server import start_service

    address = f"ipc://{tmp_path}/svc.sock"
    service = start_service(address, capacity_bytes=400_000)
    ctx = mp.get_context("spawn")
    data = str(fmnist_dir / "train")
    init = f"file://{tmp_path}/pg"
    procs = [ctx.Process(target=_service_rank, args=(r, 2, init, address, data, str(tmp_path)))
             for r in range(2)]  # fmt: skip
    try:
        assert run_processes(procs, 240) == [0, 0]
        stats = hotset.connect(address, timeout_s=20).stats()
    finally:
        service.terminate()
        service.join(10)
    records = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert records[0]["jobs"] == records[1]["jobs"] == 1  # one job for both ranks
    assert stats["removed"] == [["ddp-job", "left"]]
    assert records[0]["len"] == records[1]["len"] == 1000 // 50
    for e in range(2):
        both = records[0]["epochs"][e]["ids"] + records[1]["epochs"][e]["ids"]
        assert sorted(both) == list(range(1000))  # each sample once, over the ranks
        assert all(r["epochs"][e]["wrong"] == 0 for r in records)


def _pooled_service_rank(rank: int, job: str, init: str, address: str, data: str,
                         out: str, local: str) -> None:  # fmt: skip
    """A rank of ``job`` (two ranks, each on a "node" of its own) on a service whose store
    is Redis: two epochs, what it served and read written to ``out``; first, what the
    service at ``local`` (its store on its node) answers such a job."""
    os.environ["GROUP_RANK"] = str(rank)  # as torchrun tells each node's agent
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    storage = FileStorage(data)
    try:
        hotset.connect(local, timeout_s=30).make_loader(storage, batch_size=25, name=job)
        refused = ""
    except hotset.ConfigError as exc:
        refused = str(exc)
    client = hotset.connect(address, timeout_s=30)
    loader = client.make_loader(storage, batch_size=25, num_workers=1, name=job)
    record = {"epochs": _two_epochs(loader, storage), "refused": refused,
              "store": type(loader.dataset.store.inner).__name__}  # fmt: skip
    c = loader.counters()
    record.update(reads=c["storage_reads"], hits=c["hits"], late=c["late_misses"])
    Path(out, f"{job}-{rank}.json").write_text(json.dumps(record))
    dist.barrier()
    loader.close()
    dist.destroy_process_group()


def test_two_jobs_whose_ranks_span_nodes_share_a_service_pooled_in_redis(
    fmnist_dir, tmp_path, redis_server
):
    """docs/service.md: a service started with ``--store-url`` (Redis) takes jobs whose
    ranks run on several nodes: two jobs of two ranks, each rank on a node of its own
    (torchrun's GROUP_RANK), JOADER's dependent sampling: each job reads every sample
    once an epoch, its ranks disjoint, the right bytes; the jobs share what they read."""
    from hotset.service.server import start_service

    address, local = f"ipc://{tmp_path}/svc.sock", f"ipc://{tmp_path}/local.sock"
    service = start_service(address, capacity_bytes=2_000_000, store_url=redis_server.url)
    on_its_node = start_service(local, capacity_bytes=2_000_000)
    ctx = mp.get_context("spawn")
    data = str(fmnist_dir / "train")
    procs = [
        ctx.Process(target=_pooled_service_rank,
                    args=(r, job, f"file://{tmp_path}/pg-{job}", address, data, str(tmp_path),
                          local))
        for job in ("a", "b") for r in range(2)
    ]  # fmt: skip
    try:
        assert run_processes(procs, 300) == [0] * 4
        stats = hotset.connect(address, timeout_s=20).stats()
    finally:
        for s in (service, on_its_node):
            s.terminate()
            s.join(10)
    assert sorted(stats["removed"]) == [["a", "left"], ["b", "left"]]
    records = {(j, r): json.loads((tmp_path / f"{j}-{r}.json").read_text())
               for j in ("a", "b") for r in range(2)}  # fmt: skip
    assert {rec["store"] for rec in records.values()} == {"RedisStore"}
    assert all("node-local store: one node" in rec["refused"] for rec in records.values())
    for job in ("a", "b"):
        for e in range(2):
            ranks = [records[job, r]["epochs"][e] for r in range(2)]
            assert sorted(ranks[0]["ids"] + ranks[1]["ids"]) == list(range(1000))
            assert all(rank["wrong"] == 0 for rank in ranks)
    reads = sum(rec["reads"] for rec in records.values())
    assert reads < 2 * 2 * 1000  # shared: fewer than two jobs' two epochs alone
    assert sum(rec["hits"] for rec in records.values()) > 0


def _hang_or_fail(rank: int, world: int, init: str, data: str, out: str) -> None:
    """Rank 1 stops (as a SIGSTOPped or hung rank) once its loader exists; rank 0 reads
    on, and writes what ended its wait. Rank 0 first makes and closes ten loaders: the
    groups hotset makes are destroyed with them (no sockets left behind)."""
    from datetime import timedelta

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world,
                            timeout=timedelta(seconds=5))  # fmt: skip
    storage = FileStorage(data)
    fds = len(os.listdir("/proc/self/fd"))
    for _ in range(10):
        hotset.make_loader(storage, batch_size=25, cache_fraction=0.2, num_workers=0).close()
    grown = len(os.listdir("/proc/self/fd")) - fds
    loader = hotset.make_loader(storage, batch_size=25, cache_fraction=0.2, num_workers=0)
    if rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
    start = time.monotonic()
    try:
        for _ in loader:
            pass
        ended = "no error"
    except hotset.RankError as exc:
        ended = str(exc)
    Path(out, "rank0.json").write_text(
        json.dumps({"error": ended, "waited": time.monotonic() - start, "fds": grown})
    )
    os._exit(0)  # the peer is stopped: no teardown with it


def _two_ranks(target, fmnist_dir, tmp_path, wait_for: list[int], timeout: float) -> list:
    """``target(rank, 2, init, data, out)`` on two spawned ranks; waits for the ranks
    ``wait_for`` (up to ``timeout`` s each), kills what is left; the processes."""
    ctx = mp.get_context("spawn")
    init, data = f"file://{tmp_path}/pg", str(fmnist_dir / "train")
    procs = [ctx.Process(target=target, args=(r, 2, init, data, str(tmp_path)))
             for r in range(2)]  # fmt: skip
    run_processes(procs, timeout, wait_for)
    return procs


def test_a_hung_rank_ends_the_others_wait_with_the_users_timeout(fmnist_dir, tmp_path):
    procs = _two_ranks(_hang_or_fail, fmnist_dir, tmp_path, wait_for=[0], timeout=180)
    assert procs[0].exitcode == 0
    record = json.loads((tmp_path / "rank0.json").read_text())
    assert "across 2 ranks failed on rank 0 (time-out 0:00:05)" in record["error"]
    assert record["waited"] < 60  # the user's 5 s, not torch's 30 minutes
    assert record["fds"] < 10  # ten loaders' groups: destroyed, not one per loader left


def _one_rank_calls(rank: int, world: int, init: str, data: str, out: str) -> None:
    """Every rank trains a batch; then rank 0 alone calls ``report_accuracy`` while the
    others go on to the next batch (its feedback's exchange): each rank writes what ended
    its call."""
    from datetime import timedelta

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world,
                            timeout=timedelta(seconds=20))  # fmt: skip
    loader = hotset.make_loader(FileStorage(data), batch_size=25, system="shade",
                                cache_fraction=0.2, num_workers=0)  # fmt: skip
    batches = iter(loader)
    _, _, ids = next(batches)
    loader.feedback(ids, torch.rand(len(ids)))
    try:
        if rank == 0:
            loader.report_accuracy(0.5)
        else:
            _, _, ids = next(batches)
            loader.feedback(ids, torch.rand(len(ids)))
            next(batches)
        ended = "no error"
    except Exception as exc:  # noqa: BLE001 - reported to the test
        ended = f"{type(exc).__name__}: {exc}"
    Path(out, f"rank{rank}.txt").write_text(ended)
    os._exit(0)


def test_a_call_made_on_one_rank_only_is_a_rank_error_naming_it(fmnist_dir, tmp_path):
    _two_ranks(_one_rank_calls, fmnist_dir, tmp_path, wait_for=[0, 1], timeout=120)
    ended = [(tmp_path / f"rank{r}.txt").read_text() for r in range(2)]
    assert ended[0].startswith("RankError: hotset's collectives differ across 2 ranks: "
                               "rank 0 called report_accuracy"), ended[0]  # fmt: skip
    assert ended[1].startswith("RankError: hotset's collectives differ"), ended[1]
    assert "report_accuracy" in ended[1] and "feedback sync" in ended[1]
    assert "distributed=False" in ended[0]  # what a loader one rank makes alone takes


def _node_ranks_go_astray(rank: int, world: int, init: str, data: str, out: str) -> None:
    """Two ranks on one node's planner process: both train a batch; then rank 0 alone
    calls ``report_accuracy`` (``differ`` in ``out``) or kills the node's planner
    (``kill``), and both read on; each rank writes what ended its epoch."""
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    loader = hotset.make_loader(FileStorage(data), batch_size=25, system="shade",
                                cache_fraction=0.2, num_workers=0, planner_process="node")
    batches = iter(loader)
    _, _, ids = next(batches)
    loader.feedback(ids, torch.rand(len(ids)))
    try:
        if rank == 0 and Path(out, "differ").exists():
            loader.report_accuracy(0.5)
        elif rank == 0:
            os.kill(loader.planner._proc.pid, signal.SIGKILL)
        for _, _, ids in batches:
            loader.feedback(ids, torch.rand(len(ids)))
        ended = "no error"
    except Exception as exc:  # noqa: BLE001 - reported to the test
        ended = f"{type(exc).__name__}: {exc}"
    Path(out, f"rank{rank}.txt").write_text(ended)
    os._exit(0)


@pytest.mark.parametrize("astray", ["differ", "kill"])
def test_a_nodes_ranks_that_differ_or_lose_its_planner_are_told(fmnist_dir, tmp_path, astray):
    """``planner_process="node"``: ranks of one node whose calls differ get a RankError
    naming each one's call; where the node's planner process dies, every rank of the node
    gets a PlannerGone (not a wait), rank 0's naming its pid and exit code."""
    (tmp_path / astray).touch()
    _two_ranks(_node_ranks_go_astray, fmnist_dir, tmp_path, wait_for=[0, 1], timeout=120)
    ended = [(tmp_path / f"rank{r}.txt").read_text() for r in range(2)]
    if astray == "differ":
        for text in ended:
            assert text.startswith("RankError: the ranks of this node made different calls"), text
            assert "rank 0 report_accuracy" in text and "rank 1 " in text
    else:
        assert re.match(r"PlannerGone: hotset's planner process \(pid \d+\) ended \(exit "
                        r"code -9\)", ended[0]), ended[0]  # fmt: skip
        assert ended[1].startswith("PlannerGone: this node's planner process"), ended[1]


def _resuming_rank(rank: int, world: int, init: str, data: str, run: dict, out: str) -> None:
    """Three epochs of ``run["system"]`` on a named store, feedback a function of the ids
    (embeddings too: its class's corner, a little apart per id); ``run["cut"] = (epoch,
    batches)``: the state saved there and the process gone as a killed job's (its store
    kept); ``run["resume"]``: the states to load first."""
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    storage = FileStorage(data)
    loader = hotset.make_loader(
        storage, batch_size=25, cache_fraction=CAPACITY_FRACTION, seed=0,
        store=f"shared://{run['store']}", **{"num_workers": 0, **run["system"]},
    )  # fmt: skip
    labels = torch.as_tensor(storage.labels)
    corners = torch.eye(int(labels.max()) + 1)
    if run.get("resume"):
        loader.load_state_dict(torch.load(f"{run['resume']}/state{rank}.pt"))
    served: dict[int, list] = {}
    for epoch in range(loader.epoch, 3):
        loader.set_epoch(epoch)
        served[epoch] = []
        for n, (_, _, ids) in enumerate(loader):
            i = ids.numpy()
            emb = corners[labels[ids]] + torch.as_tensor((i * 7919 % 1000) / 1e5)[:, None]
            loader.feedback(ids, torch.as_tensor((i * 7919 % 1000) / 1000 + epoch / 10), emb)
            served[epoch] += i.tolist()
            if (epoch, n + 1) == tuple(run.get("cut") or ()):
                torch.save(loader.state_dict(), f"{out}/state{rank}.pt")
                killed(out, rank, served)
    Path(out, f"rank{rank}.json").write_text(json.dumps(served))
    loader.close()
    dist.destroy_process_group()


def killed(out: str, rank: int, record) -> None:
    """``record`` written as this rank's (``OUT/rankR.json``), then the process gone as a
    killed job's once every rank is here: its store and entries stay."""
    Path(out, f"rank{rank}.json").write_text(json.dumps(record))
    dist.barrier()
    os._exit(0)


RESUMED = {
    "shade": {"system": "shade"},
    # its workers' plans made ahead (admitting, and loading packages) when it is killed
    "icache-workers": {"system": "icache", "num_workers": 2, "persistent_workers": True},
    "icache": {"system": "icache"},
    # its graph scored in the planner's thread: the background thread decides when scores
    # reach the plans (docs/reliability.md)
    "spider": {"system": "spider", "epochs": 3, "sampler_options": {"background": False}},
}


@pytest.mark.parametrize("name", list(RESUMED))
def test_three_ranks_resume_to_what_the_uninterrupted_run_serves(fmnist_dir, tmp_path, name):
    """Killed mid-epoch with its store kept, a 3-rank job resumes each rank to exactly what
    the uninterrupted run serves, that epoch and the next. SHADE orders each epoch by what
    the cache holds: a put refused while a slower rank had yet to delete the plan's
    victims made that depend on the ranks' timing, so two uninterrupted runs differed.
    iCACHE serves substitutes from what its packages loaded (rank 0's puts, committed on
    every rank), SpiderCache from its Homophily Cache."""
    data, system = str(fmnist_dir / "train"), RESUMED[name]
    runs = {}
    for run in ("whole", "cut", "resumed"):
        (tmp_path / run).mkdir()
        store = f"/dev/shm/hotset-test-{os.getpid()}-{name}-{'whole' if run == 'whole' else 'cut'}"
        spec = {"system": system, "store": store, "cut": (1, 5) if run == "cut" else None,
                "resume": str(tmp_path / "cut") if run == "resumed" else None}  # fmt: skip
        runs[run] = run_ranks(3, data, spec, tmp_path / run, target=_resuming_rank)
    for r in range(3):
        whole, cut, resumed = (runs[k][r] for k in ("whole", "cut", "resumed"))
        assert cut["1"] + resumed["1"] == whole["1"], (name, r)
        assert resumed["2"] == whole["2"], (name, r)
