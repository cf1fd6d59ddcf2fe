"""Planner + CachedDataset + HotsetLoader: plans executed by real DataLoader workers."""

from __future__ import annotations

import multiprocessing
import shutil

import numpy as np
import pytest
import torch

import hotset
from hotset import (
    BatchPlan,
    CachedDataset,
    ConfigError,
    CorruptSampleError,
    FileStorage,
    MemoryStore,
    MissingSampleError,
    Planner,
    RedisStore,
    SharedStore,
    decode_image,
    make_loader,
    make_policy,
    make_sampler,
    to_tensor,
)
from hotset.loader import USER_COUNTERS


def expected_inputs(storage, ids):
    return torch.stack([to_tensor(decode_image(storage.read(i))) for i in ids.tolist()])


def run_epoch(loader, storage=None):
    seen = []
    for x, y, ids in loader:
        if storage is not None:  # the cache never returns the wrong bytes
            assert torch.equal(x, expected_inputs(storage, ids))
            assert torch.equal(y, torch.as_tensor(storage.labels[ids.numpy()]))
        seen.append(ids)
    return torch.cat(seen) if seen else torch.empty(0, dtype=torch.int64)


def test_planner_and_store_agree_single_process(fmnist_dir):
    storage = FileStorage(str(fmnist_dir / "train"))
    loader = make_loader(
        storage, batch_size=32, policy="lru", cache_fraction=0.2, store="memory", num_workers=0
    )
    for epoch in range(2):
        loader.set_epoch(epoch)
        served = run_epoch(loader, storage)
        assert sorted(served.tolist()) == list(range(len(storage)))
    store, policy = loader.dataset.store, loader.planner.policy
    cached = [loader.dataset.keys[i] for i in policy.cached_ids().tolist()]
    assert all(store.contains(k) for k in cached) and len(store) == len(cached)
    assert store.used_bytes == policy.used <= store.capacity_bytes
    c = loader.counters()
    assert c["late_misses"] == 0 and c["hits"] + c["misses"] == 2 * len(storage)
    i = c["internal"]
    assert i["bytes_from_storage"] == int(storage.sizes.sum()) * 2 - i["bytes_from_store"]
    # a user's counters at the top, hotset's bookkeeping under one key
    assert set(c) - {"internal"} <= set(USER_COUNTERS)
    assert {"phantoms", "sync_fixes", "wire_bytes", "readahead_staged"} <= set(i)
    assert not set(i) & set(USER_COUNTERS)
    assert c["planning_s"] > 0


def test_two_workers_see_each_others_writes(fmnist_dir):
    """MinIO fills in epoch 1 (each worker admits its own batches); in epoch 2 every
    planned hit is found, whichever worker wrote it: the store is shared."""
    storage = FileStorage(str(fmnist_dir / "train"))
    loader = make_loader(
        storage, batch_size=25, policy="minio", cache_fraction=0.3, store="shared", num_workers=2
    )
    try:
        loader.set_epoch(0)
        run_epoch(loader)
        first = loader.counters()
        loader.set_epoch(1)
        served = run_epoch(loader, storage)
        c = loader.counters()
        hits2 = c["hits"] - first["hits"]
        assert c["late_misses"] == first["late_misses"] == 0
        assert sorted(served.tolist()) == list(range(len(storage)))
        assert hits2 == len(loader.planner.policy)  # every resident sample hit once
        assert abs(hits2 / len(storage) - 0.3) < 0.03
        store = loader.dataset.store
        assert store.used_bytes <= store.capacity_bytes
        assert len(store) == len(loader.planner.policy)
    finally:
        loader.dataset.store.close(destroy=True)


def test_lru_with_workers_keeps_budget_and_bytes(fmnist_dir):
    storage = FileStorage(str(fmnist_dir / "train"))
    loader = make_loader(
        storage,
        batch_size=20,
        policy="lru",
        cache_fraction=0.1,
        store="shared",
        num_workers=2,
        seed=3,
        sampler_options={"replacement": True},
    )
    try:
        for epoch in range(3):
            loader.set_epoch(epoch)
            run_epoch(loader, storage)
        store, policy = loader.dataset.store, loader.planner.policy
        assert store.used_bytes <= store.capacity_bytes
        skeys = loader.dataset.keys
        keys = set(store.get_many([skeys[i] for i in range(len(storage))]))
        held = {i for i in range(len(storage)) if store.contains(skeys[i])}
        assert held <= set(range(len(storage))) and keys
        # the data plane followed the control plane (a rare cross-worker reorder may differ)
        resident = set(policy.cached_ids().tolist())
        assert len(held & resident) >= 0.9 * len(resident)
        c = loader.counters()
        assert c["hits"] > 0
    finally:
        loader.dataset.store.close(destroy=True)


def test_late_miss_is_read_from_storage_and_counted(fmnist_dir):
    storage = FileStorage(str(fmnist_dir / "train"))
    store = MemoryStore(10_000)
    ds = CachedDataset(storage, store)
    store.put_many({storage.key(1): storage.read(1)})
    plan = BatchPlan(
        epoch=0,
        index=0,
        ids=np.array([1, 2, 3]),
        hits=np.array([True, True, False]),
        admitted=np.array([3]),
    )
    out = ds.__getitems__(plan)
    assert out["stats"]["hits"] == 1 and out["stats"]["late_misses"] == 1
    assert out["stats"]["misses"] == 1
    assert torch.equal(out["inputs"], expected_inputs(storage, torch.tensor([1, 2, 3])))
    assert store.contains(storage.key(3)) and not store.contains(storage.key(2))


def test_redis_goes_away_mid_epoch(fmnist_dir, redis_server):
    """Training continues from storage, the event is counted, bytes stay right."""
    storage = FileStorage(str(fmnist_dir / "train"))
    store = RedisStore(
        int(storage.sizes.sum()), url=redis_server.url, retry_after_s=0.5, socket_timeout_s=0.5
    )
    loader = make_loader(
        storage, batch_size=50, policy="minio", cache_fraction=1.0, store=store, num_workers=2
    )
    loader.set_epoch(0)
    run_epoch(loader)  # fills the cache
    loader.set_epoch(1)
    served = []
    for n, (x, _y, ids) in enumerate(loader):
        if n == 3:
            redis_server.stop()
        assert torch.equal(x, expected_inputs(storage, ids))
        served.append(ids)
    assert sorted(torch.cat(served).tolist()) == list(range(len(storage)))
    c = loader.counters()
    assert c["store_failures"] > 0
    assert c["late_misses"] > 0  # planned hits read from storage meanwhile
    # epoch 0 filled the cache; in epoch 1 the 4 batches served before the stop all hit
    assert 4 * 50 <= c["hits"] < len(storage)


def test_missing_and_corrupt_samples_through_the_loader(fmnist_dir, tmp_path):
    root = tmp_path / "d"
    shutil.copytree(fmnist_dir / "train", root)
    s = FileStorage(str(root), verify=False)
    (root / s.manifest.paths[5]).unlink()
    (root / s.manifest.paths[9]).write_bytes(b"\x89PNG\r\n\x1a\n garbage")
    loader = make_loader(
        s, batch_size=16, policy="lru", cache_fraction=0.1, store="shared", num_workers=2
    )
    before = set(multiprocessing.active_children())
    try:
        with pytest.raises(MissingSampleError, match=f"sample 5 .*{s.manifest.paths[5]}"):
            run_epoch(loader)
        # the error's traceback still holds the epoch: its workers are stopped all the same
        assert not set(multiprocessing.active_children()) - before
    finally:
        loader.dataset.store.close(destroy=True)
    ds = CachedDataset(s, MemoryStore(0))
    with pytest.raises(CorruptSampleError, match=f"sample 9 .*{s.manifest.paths[9]}.*decode"):
        ds[9]
    # on_error="skip": training continues, the bad samples are dropped and counted
    skip = make_loader(
        s,
        batch_size=16,
        policy="lru",
        cache_fraction=0.1,
        store="memory",
        num_workers=0,
        on_error="skip",
        decode=_lenient_decode,
    )
    served = run_epoch(skip)
    assert 5 not in served.tolist() and len(served) == len(s) - 1
    assert skip.counters()["skipped"] == 1


def test_persistent_workers_stopped_by_an_error_are_made_again(fmnist_dir, tmp_path):
    """An epoch that a missing sample ends stops its persistent workers with it; once the
    sample is back, the next epoch makes new ones and serves every sample."""
    root = tmp_path / "d"
    shutil.copytree(fmnist_dir / "train", root)
    s = FileStorage(str(root), verify=False)
    gone = root / s.manifest.paths[5]
    kept = gone.read_bytes()
    gone.unlink()
    loader = make_loader(
        s, batch_size=50, policy="lru", cache_fraction=0.1, store="shared", num_workers=2,
        persistent_workers=True,
    )  # fmt: skip
    before = set(multiprocessing.active_children())
    try:
        with pytest.raises(MissingSampleError):
            run_epoch(loader)
        assert not set(multiprocessing.active_children()) - before
        gone.write_bytes(kept)
        loader.set_epoch(1)
        assert sorted(run_epoch(loader, s).tolist()) == list(range(len(s)))
    finally:
        loader.dataset.store.close(destroy=True)


def _lenient_decode(data: bytes) -> np.ndarray:
    try:
        return decode_image(data)
    except Exception:  # noqa: BLE001 - the test decodes a corrupt PNG as zeros
        return np.zeros((1, 28, 28), np.uint8)


def test_wrong_configuration_is_named(fmnist_dir):
    storage = FileStorage(str(fmnist_dir / "train"))
    with pytest.raises(ConfigError, match="private to one process"):
        make_loader(storage, batch_size=8, cache_fraction=0.1, store="memory", num_workers=2)
    with pytest.raises(ConfigError, match="cache_fraction"):
        make_loader(storage, batch_size=8, cache_fraction=1.5, store="memory", num_workers=0)
    with pytest.raises(ConfigError, match="shuffle is set by hotset"):
        make_loader(
            storage, batch_size=8, cache_fraction=0.1, store="memory", num_workers=0, shuffle=True
        )
    with pytest.raises(ConfigError, match="on_error"):
        CachedDataset(storage, MemoryStore(1), on_error="ignore")


@pytest.mark.parametrize("wrong,message", [
    ({"cache_fraction": "20%"}, "cache_fraction='20%' is not float | None"),
    ({"batch_size": "32"}, "batch_size='32' is not int"),
    ({"seed": 1.5}, "seed=1.5 is not int"),
    ({"num_workers": True}, "num_workers=True is not int"),
    ({"size": (28, "28")}, r"size=\(28, '28'\) is not \(int, int\) \| None"),
    ({"store": 5}, "store=5 is not str | Store"),
    ({"drop_last": "yes"}, "drop_last='yes' is not bool"),
])  # fmt: skip
def test_arguments_of_the_wrong_type_are_named_before_anything_opens(tmp_path, wrong, message):
    """Checked where they enter (strictly): nothing is opened (the path does not even
    exist), and numpy numbers are numbers."""
    args = {"batch_size": 32, "cache_fraction": 0.2, **wrong}
    with pytest.raises(ConfigError, match=f"^make_loader: {message}$"):
        make_loader(str(tmp_path / "nowhere"), **args)


def test_numpy_numbers_and_lists_are_taken(fmnist_dir):
    with make_loader(str(fmnist_dir / "train"), batch_size=np.int64(50),
                     cache_fraction=np.float32(0.1), seed=np.int32(3), size=[28, 28],
                     store="memory", num_workers=0) as loader:  # fmt: skip
        x, _, _ = next(iter(loader))
        assert x.shape == (50, 1, 28, 28)


def test_plans_travel_through_a_plain_dataloader(fmnist_dir):
    """A user can build the pieces by hand and use torch's DataLoader directly."""
    from torch.utils.data import DataLoader

    storage = FileStorage(str(fmnist_dir / "train"))
    store = SharedStore(int(storage.sizes.sum() * 0.5))
    planner = Planner(
        make_sampler("uniform", len(storage)),
        make_policy("fifo", store.capacity_bytes, sizes=storage.sizes),
        64,
    )
    dl = DataLoader(
        CachedDataset(storage, store),
        batch_sampler=planner,
        num_workers=2,
        collate_fn=lambda b: b,
        persistent_workers=True,
    )
    try:
        for epoch in range(2):
            planner.set_epoch(epoch)
            hits = 0
            for batch in dl:
                assert torch.equal(
                    batch["inputs"], expected_inputs(storage, torch.from_numpy(batch["ids"]))
                )
                hits += batch["stats"]["hits"]
        assert hits > 0.2 * len(storage)
    finally:
        store.close(destroy=True)


@pytest.mark.slow
def test_short_training_run_learns(fmnist_dir):
    """One short end-to-end training run through CachedDataset with workers."""
    from hotset.models import TinyCNN, accuracy

    storage = FileStorage(str(fmnist_dir / "train"))
    test = FileStorage(str(fmnist_dir / "test"))
    xt = expected_inputs(test, torch.arange(len(test)))
    yt = torch.as_tensor(test.labels)
    loader = make_loader(
        storage,
        batch_size=32,
        policy="lru",
        cache_fraction=0.2,
        store="shared",
        num_workers=2,
        persistent_workers=True,
    )
    torch.manual_seed(0)
    model = TinyCNN()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    try:
        for epoch in range(4):
            loader.set_epoch(epoch)
            for x, y, _ids in loader:
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
    finally:
        loader.dataset.store.close(destroy=True)
    assert accuracy(model, xt, yt) > 0.6  # chance is 0.1


def test_a_loop_that_never_calls_set_epoch_still_gets_new_epochs(fmnist_dir, caplog):
    storage = FileStorage(str(fmnist_dir / "train"))
    with make_loader(storage, batch_size=100, cache_fraction=0.1, store="memory",
                     num_workers=0) as loader:  # fmt: skip
        orders = [torch.cat([ids for _, _, ids in loader]).tolist() for _ in range(3)]
        assert loader.epoch == 2 and len({tuple(o) for o in orders}) == 3
        assert sum("set_epoch was never called" in r.message for r in caplog.records) == 1
        loader.set_epoch(1)  # once the loop chooses, it is obeyed
        again = [torch.cat([ids for _, _, ids in loader]).tolist() for _ in range(2)]
        assert again == [orders[1], orders[1]]


def test_pairs_with_the_ids_on_the_side(fmnist_dir):
    storage = FileStorage(str(fmnist_dir / "train"))
    with make_loader(storage, batch_size=100, sampler="shade", policy="app",
                     cache_fraction=0.1, store="memory", num_workers=0,
                     with_ids=False) as loader:  # fmt: skip
        for x, y in loader:  # what frameworks that unpack two expect
            assert x.shape[0] == y.shape[0] == loader.last_ids.shape[0]
            loader.feedback(losses=torch.full((y.shape[0],), 2.0))
        board = loader.planner.sampler.board
        assert board.seen.sum() == len(storage)  # every served id got its loss


def test_feedback_names_what_is_wrong_with_the_losses(fmnist_dir):
    """A scalar loss, a (B, 1) tensor, too few losses or a NaN are named at the boundary
    (pointing to per-sample losses); losses that still require grad are detached and
    taken, as the README's loop passes them."""
    with make_loader(str(fmnist_dir / "train"), batch_size=16, sampler="shade", policy="app",
                     cache_fraction=0.1, store="memory", num_workers=0) as loader:  # fmt: skip
        x, y, ids = next(iter(loader))
        logits = torch.nn.Linear(784, 10)(x.view(len(x), -1))
        losses = torch.nn.functional.cross_entropy(logits, y, reduction="none")
        cases = [
            (losses.mean(), r"a scalar \(shape \(\)\) for 16 ids.*reduction='none'"),
            (losses[:, None], r"of shape \(16, 1\) for 16 ids.*per_sample_loss"),
            (losses[:15], "15 losses for 16 ids"),
            (torch.where(torch.arange(16) == 3, float("nan"), losses),
             f"1 of 16 losses are NaN or inf \\(first: sample {int(ids[3])}\\)"),
        ]  # fmt: skip
        board = loader.planner.sampler.board
        for bad, message in cases:
            with pytest.raises(ConfigError, match=message):
                loader.feedback(ids, bad)
        loader.planner.drain()
        assert board.seen.sum() == 0  # nothing wrong was taken
        assert losses.requires_grad
        loader.feedback(ids, losses)
        loader.planner.drain()
        assert board.seen[ids.numpy()].all()
        assert np.allclose(board.loss[ids.numpy()], losses.detach().numpy())


def test_one_name_per_system_builds_what_compare_measures(fmnist_dir):
    """``system="shade"`` is the sampler, policy and options ``hotset compare --systems
    shade`` measures (the prototype's repetition), single options overridable; a system
    given as a policy, or with parts beside it, is named."""
    url = str(fmnist_dir / "train")
    common = dict(batch_size=32, cache_fraction=0.2, store="memory", num_workers=0)
    for name in ("shade", "icache", "minio"):
        want = hotset.resolve_system(name)
        with make_loader(url, system=name, **common) as loader:
            smp, pol = loader.planner.sampler, loader.planner.policy
            assert (smp.name, pol.name) == (want.sampler, want.policy)
            for k, v in want.sampler_options.items():
                assert getattr(smp, k) == v, (name, k)
    with make_loader(url, system="shade", sampler_options={"repetition": 2.0}, **common) as ld:
        assert ld.planner.sampler.repetition == 2.0
        assert ld.planner.sampler.repetition_mode == "repeat"  # the system's, kept
    with pytest.raises(ConfigError, match="did you mean system='shade'"):
        make_loader(url, policy="shade", **common)
    with pytest.raises(ConfigError, match="not both"):
        make_loader(url, system="shade", policy="lru", **common)
    with pytest.raises(ConfigError, match="unknown system or policy 'shady'") as err:
        make_loader(url, system="shady", **common)
    named = str(err.value).split("choose from: ")[1].split(", ")
    assert len(named) == len(set(named)) and "icache" in named  # each name once


def test_no_system_named_shuffles_uniformly_over_a_cache_that_never_evicts(fmnist_dir):
    """README: without ``system=`` a loader shuffles uniformly over CoorDL's never-evict
    cache: filled in the first epoch, the same residents after, each hit once an epoch."""
    with make_loader(str(fmnist_dir / "train"), batch_size=100, cache_fraction=0.2,
                     num_workers=0, store="memory") as loader:  # fmt: skip
        planner = loader.planner
        assert (planner.sampler.name, planner.policy.name) == ("uniform", "minio")
        held = []
        for epoch in range(3):
            loader.set_epoch(epoch)
            assert sorted(i for _, _, ids in loader for i in ids.tolist()) == list(range(1000))
            held.append(planner.policy.cached_ids())
        assert held[0].size >= 150 and all(np.array_equal(h, held[0]) for h in held)
        assert [s.hits for s in loader.epoch_stats] == [0, held[0].size, held[0].size]


def test_a_closed_loader_says_so(fmnist_dir):
    loader = make_loader(str(fmnist_dir / "train"), batch_size=100, cache_fraction=0.1,
                         num_workers=0, store="memory")  # fmt: skip
    next(iter(loader))
    loader.close()
    for use in (lambda: next(iter(loader)), lambda: loader.set_epoch(1)):
        with pytest.raises(hotset.LoaderClosed, match="this loader is closed"):
            use()


def test_progress_shows_as_lines_where_there_is_no_terminal(fmnist_dir, capsys):
    loader = make_loader(str(fmnist_dir / "train"), batch_size=250, cache_fraction=0.1,
                         num_workers=0, store="memory", progress=True)  # fmt: skip
    for epoch in range(2):
        loader.set_epoch(epoch)
        for _ in loader:
            pass
    loader.close()
    err = capsys.readouterr().err
    batches = len(loader)
    for epoch in range(2):
        assert f"epoch {epoch}: {batches}/{batches} batches (100%)" in err


def test_a_system_that_schedules_over_the_run_takes_its_length_from_epochs(fmnist_dir):
    """SpiderCache's elastic manager needs the run's length: ``epochs=`` gives it, the same
    way ``hotset compare`` passes ``--epochs``; missing, it is refused naming ``epochs``."""
    pytest.importorskip("hnswlib")
    url = str(fmnist_dir / "train")
    common = dict(batch_size=100, cache_fraction=0.1, num_workers=0, store="memory")
    with pytest.raises(ConfigError, match="give make_loader epochs=N"):
        make_loader(url, system="spider", **common)
    with make_loader(url, system="spider", epochs=7, **common) as loader:
        assert loader.planner.sampler.controller.total == 7.0
    with pytest.raises(ConfigError, match="give one"):
        make_loader(url, system="spider", epochs=7, sampler_options={"total_epochs": 5},
                    **common)  # fmt: skip
    make_loader(url, system="lru", epochs=7, **common).close()  # taken, not needed


def test_each_epoch_has_its_own_counters(fmnist_dir):
    """``epoch_stats``: per epoch what ``counters()`` sums over the run (an epoch left early
    too), so that no user diffs epochs by hand."""
    loader = make_loader(str(fmnist_dir / "train"), batch_size=100, cache_fraction=0.3,
                         policy="minio", num_workers=0, store="memory")  # fmt: skip
    for epoch in range(2):
        loader.set_epoch(epoch)
        for _ in loader:
            pass
    loader.set_epoch(2)
    for k, _ in enumerate(loader):
        if k == 2:
            break
    c = loader.counters()
    loader.close()
    first, second, left = loader.epoch_stats
    assert isinstance(first, hotset.EpochStats)
    assert [s.epoch for s in loader.epoch_stats] == [0, 1, 2]
    assert first.samples == second.samples == 1000 and left.samples == 300
    assert first.hits == 0 and second.hits > 200  # MinIO: filled in epoch 0, hits from 1
    assert second.hit_ratio == pytest.approx(second.hits / 1000)
    assert sum(s.hits for s in loader.epoch_stats) == c["hits"]
    assert sum(s.storage_reads for s in loader.epoch_stats) == c["storage_reads"]
