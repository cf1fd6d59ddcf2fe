"""A state saved by N ranks loads into a job of M ranks (torch.distributed over gloo, real
processes, a named store that outlives the cut job): the rest of the saved epoch is
served once across the M ranks, every rank the same batch count, the bytes exact, the
scores kept; the next epoch is the M-rank job's (docs/reliability.md)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

import hotset
from hotset.checkpoint import from_safe
from hotset.codecs import decode_sample
from hotset.plan.state import recut
from hotset.storage import FileStorage
from test_distributed import killed, run_ranks

BATCH = 25


def _elastic_rank(rank: int, world: int, init: str, data: str, run: dict, out: str) -> None:
    """Epochs 0-2 of ``run["system"]`` on the named store ``run["store"]`` (a URL), a
    rank a node if ``run["nodes"]``, every served sample checked against its file;
    ``run["cut"] = (epoch, batches)``: the state saved there (``state.pt``, rank 0's) and
    the process gone as a killed job's; ``run["resume"]``: a state to load first (every
    rank loads the same one); ``run["batch"]``: the per-rank batch (default ``BATCH``)."""
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    if run.get("nodes"):  # as torchrun tells each node's agent
        os.environ["GROUP_RANK"] = str(rank)
    storage = FileStorage(data)
    loader = hotset.make_loader(
        storage, batch_size=run.get("batch", BATCH), cache_fraction=0.2, seed=0,
        num_workers=0, store=run["store"], **run["system"],
    )  # fmt: skip
    record: dict = {"served": {}, "len": {}, "batches": {}, "hits": {}, "wrong": 0}
    labels = torch.as_tensor(storage.labels)
    corners = torch.eye(int(labels.max()) + 1)  # (embeddings: a class's corner, a little apart)
    if run.get("resume"):
        saved = torch.load(run["resume"])
        loader.load_state_dict(saved)
        now = from_safe(loader.state_dict())["planner"]
        # the scores the next epoch's importance distribution is drawn from
        scores = from_safe(saved)["planner"]["sampler"].get("board")
        record["scores_kept"] = _same(scores, now["sampler"].get("board"))
        record["scored"] = scores is not None
        record["order"] = now["order"].tolist()
    for epoch in range(loader.epoch, 3):
        loader.set_epoch(epoch)
        record["len"][epoch] = len(loader)
        served = record["served"][epoch] = []  # (a list a batch)
        hits = loader.counters()["hits"]
        for n, (x, y, ids) in enumerate(loader):
            for k, i in enumerate(ids.tolist()):
                image = decode_sample(storage.read(i)).astype(np.float32) / 255
                record["wrong"] += int(not torch.equal(x[k], torch.from_numpy(image)))
                record["wrong"] += int(y[k]) != int(storage.labels[i])
            spread = torch.as_tensor((ids.numpy() * 7919 % 1000) / 1000)
            loader.feedback(ids, spread + epoch, corners[labels[ids]] + spread[:, None] / 100)
            served.append(ids.tolist())
            record["batches"][epoch] = n + 1
            record["hits"][epoch] = loader.counters()["hits"] - hits
            if (epoch, n + 1) == tuple(run.get("cut") or ()):
                if rank == 0:
                    torch.save(loader.state_dict(), f"{out}/state.pt")
                killed(out, rank, record)
    Path(out, f"rank{rank}.json").write_text(json.dumps(record))
    loader.close()
    dist.destroy_process_group()


def _same(a, b) -> bool:
    """Whether two states (dicts, lists, arrays, numbers, objects) hold the same values."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return isinstance(b, list | tuple) and len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, np.ndarray | torch.Tensor):
        return np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True)
    if isinstance(a, np.random.Generator):
        return isinstance(b, np.random.Generator) and _same(
            a.bit_generator.state, b.bit_generator.state
        )
    if hasattr(a, "__dict__"):  # (a state's objects: a score board, a draw)
        return type(a) is type(b) and _same(a.__getstate__(), b.__getstate__())
    return a == b or (a != a and b != b)  # (NaN)


def _served(records: list[dict], epoch: int) -> list[int]:
    return [i for r in records for batch in r["served"].get(str(epoch), []) for i in batch]


CASES = {  # name: (system, N, M, options)
    "minio-2-to-3": ({"system": "minio"}, 2, 3, {}),
    "minio-2-to-1": ({"system": "minio"}, 2, 1, {}),
    "minio-3-to-2": ({"system": "minio"}, 3, 2, {}),
    "lru-2-to-3": ({"system": "lru"}, 2, 3, {}),
    "lru-3-to-2": ({"system": "lru"}, 3, 2, {}),
    "lru-2-to-1": ({"system": "lru"}, 2, 1, {}),
    "lru-1-to-2": ({"system": "lru"}, 1, 2, {}),  # (one process, without ranks, and back up)
    "shade-2-to-3": ({"system": "shade"}, 2, 3, {}),
    "icache-3-to-1": ({"system": "icache"}, 3, 1, {}),
    "spider-2-to-3": ({"system": "spider", "epochs": 3, "sampler_options": {"background": False}},
                      2, 3, {}),
    # the same global batch: the per-rank batch of each job (N's, M's)
    "minio-2-to-1-same-global-batch": ({"system": "minio"}, 2, 1, {"batches": (BATCH, 2 * BATCH)}),
    "shade-1-to-2-same-global-batch": ({"system": "shade"}, 1, 2, {"batches": (2 * BATCH, BATCH)}),
    # a job whose ranks span two nodes (a node's copies over one Redis), resumed on one
    "minio-2-nodes-to-1-redis": ({"system": "minio"}, 2, 1, {"redis": True}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_state_of_n_ranks_resumes_on_m_ranks(fmnist_dir, tmp_path, request, name):
    """Epoch 1 cut at a random batch on N ranks, resumed on M: every sample the saved
    draw had left is served once across the M ranks, in the M job's global batches cut
    from it in order (the saved job's own batches where the global batch is kept; uniform
    systems: each sample of the epoch exactly once over both jobs), each rank the same
    batch count (as ``len`` said), the bytes exact; the scores carry over as loaded, and
    a never-evicting cache's residents (MinIO: its hits); epoch 2 is a whole epoch across
    the M ranks. SHADE's resume is made twice: both serve alike."""
    system, n_ranks, m_ranks, options = CASES[name]
    batch_n, batch_m = options.get("batches", (BATCH, BATCH))
    data = str(fmnist_dir / "train")
    n = len(FileStorage(data))
    batches = -(-n // (batch_n * n_ranks))
    cut = int(np.random.default_rng(sum(map(ord, name))).integers(1, batches))
    store = f"/dev/shm/hotset-test-{os.getpid()}-elastic-{name}"
    url = f"shared://{store}"
    if options.get("redis"):  # (the namespace, named, outlives the job)
        url = f"shared+{request.getfixturevalue('redis_server').url}?namespace=elastic"
    resumes = 2 if name.startswith("shade") else 1
    try:  # (the named store outlives each job: the next one finds what it kept)
        (tmp_path / "cut").mkdir()
        spec = {"system": system, "store": url, "batch": batch_n,
                "nodes": options.get("redis", False)}  # fmt: skip
        before = run_ranks(n_ranks, data, {**spec, "cut": (1, cut)}, tmp_path / "cut",
                           target=_elastic_rank)  # fmt: skip
        saved = from_safe(torch.load(tmp_path / "cut" / "state.pt"))["planner"]
        after = []
        for k in range(resumes):
            (tmp_path / f"resumed{k}").mkdir()
            spec = {"system": system, "store": url, "batch": batch_m,
                    "resume": str(tmp_path / "cut/state.pt")}  # fmt: skip
            after.append(run_ranks(m_ranks, data, spec, tmp_path / f"resumed{k}",
                                   target=_elastic_rank))  # fmt: skip
    finally:
        shutil.rmtree(store, ignore_errors=True)
    resumed = after[0]
    assert saved["world"] == n_ranks and saved["consumed"] == cut
    assert all(r["wrong"] == 0 for r in before + resumed)
    # the rest of the saved epoch's draw, in its order (padded by wrapping only where
    # the last batch would leave a rank without a sample), the M ranks' epoch
    order, pad = np.asarray(saved["order"]), saved["padded"]
    rest = order[cut * batch_n * n_ranks : order.size - pad].tolist()
    step = batch_m * m_ranks
    last = len(rest) % step
    rest += rest[: m_ranks - last] if 0 < last < m_ranks else []
    assert all(r["order"] == rest for r in resumed)
    assert all(r["scores_kept"] for r in resumed)
    assert all(r["scored"] for r in resumed) or system["system"] in ("minio", "lru")
    for epoch in ("1", "2"):  # every rank the batches len() announced
        assert len({(r["len"][epoch], r["batches"][epoch]) for r in resumed}) == 1, epoch
        assert all(r["len"][epoch] == r["batches"][epoch] for r in resumed), epoch
    if system["system"] in ("icache", "spider"):  # (they may serve a substitute)
        assert len(_served(resumed, 1)) == len(rest)
    else:  # global batch k: the k-th slice of the rest (the saved job's k-th, if kept)
        together = [sum((r["served"]["1"][k] for r in resumed), [])
                    for k in range(resumed[0]["batches"]["1"])]  # fmt: skip
        assert [sorted(b) for b in together] == [
            sorted(rest[lo : lo + step]) for lo in range(0, len(rest), step)
        ]
    if system["system"] in ("minio", "lru"):  # each sample of epoch 1 once over both jobs
        assert sorted(_served(before, 1) + _served(resumed, 1)) == list(range(n))
        later = _served(resumed, 2)  # every sample, padded to whole ranks by wrapping
        assert set(later) == set(range(n)) and len(later) == n + -n % m_ranks
    if system["system"] == "minio":  # its residents (a fifth of the data) carried over
        assert sum(r["hits"]["1"] for r in resumed) > 0.1 * len(rest)
    for again in after[1:]:  # two resumes of one state agree
        assert [r["served"] for r in again] == [r["served"] for r in resumed]


def test_another_global_batch_is_refused_naming_the_batch_that_keeps_it(fmnist_dir, tmp_path):
    """A state of one process at batch 50 loads into a loader of batch 50 (or, on M
    ranks, of 50 / M); at batch 30 it is refused, naming the batch size that keeps it
    (a state that names no batch size: refused, naming it)."""
    storage = FileStorage(str(fmnist_dir / "train"))
    with hotset.make_loader(storage, batch_size=50, cache_fraction=0.2) as loader:
        next(iter(loader))
        state = loader.state_dict()
    refused = pytest.raises(
        hotset.ConfigError,
        match=r"batch_size: saved 50, this loader 30.*global batch of 50 is batch_size=50 on 1",
    )
    with hotset.make_loader(storage, batch_size=30, cache_fraction=0.2) as loader, refused:
        loader.load_state_dict(state)
    forged = from_safe(state)  # (a state without its batch size: refused, by name)
    del forged["fits"]["batch_size"]
    nameless = pytest.raises(hotset.ConfigError, match="batch_size: saved None")
    with hotset.make_loader(storage, batch_size=30, cache_fraction=0.2) as loader, nameless:
        loader.load_state_dict(forged)


@settings(max_examples=300, deadline=None)
@given(size=st.integers(0, 400), batch=st.integers(1, 30), world=st.integers(1, 8),
       drop_last=st.booleans())  # fmt: skip
def test_the_rest_of_an_epoch_is_cut_for_the_new_ranks(size, batch, world, drop_last):
    """The rest of a saved epoch as the M ranks' order (``plan.state.recut``): in the saved
    order, each id once; with ``drop_last`` cut to whole global batches, else padded (by
    wrapping, fewer than M ids) only where its last batch would leave a rank without a
    sample, so that every rank of every batch serves at least one."""
    rest = np.arange(size, dtype=np.int64) * 7 % 1009  # (distinct ids)
    order, pad = recut(rest, batch, world, drop_last)
    step = batch * world
    if drop_last:
        assert pad == 0 and order.size % step == 0 and rest.size - order.size < step
        assert order.tolist() == rest[: order.size].tolist()
        return
    assert order[: rest.size].tolist() == rest.tolist() and order.size == rest.size + pad
    assert 0 <= pad < world and order[rest.size :].tolist() == np.resize(rest, pad).tolist()
    sizes = [min(step, order.size - lo) for lo in range(0, order.size, step)]
    assert all(s >= world for s in sizes)  # (rank r of a batch of s takes ceil((s-r)/M))
    assert pad == 0 or 0 < rest.size % step < world
