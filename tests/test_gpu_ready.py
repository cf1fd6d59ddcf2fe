"""The main job as it runs on a GPU (issue 13), checked on the CPU: models and devices,
the validation split, options passed through `compare`, and honest I/O accounting."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch

from hotset.build import make_loader
from hotset.compare import CompareConfig, split_train
from hotset.errors import ConfigError
from hotset.models import ResNet18, make_model, resolve_device
from hotset.storage import FileStorage, ThrottledStorage
from test_simulate_cli import hotset


def test_resnet18_has_torchvisions_layers_and_a_512d_embedding():
    m = make_model("resnet18", 10)
    # torchvision's resnet18(num_classes=10) with a 1-channel 3x3 conv1: 11,172,810
    assert sum(p.numel() for p in m.parameters()) == 11_172_810
    names = {n for n, _ in m.named_parameters()}
    assert {
        "conv1.weight",
        "layer4.1.bn2.bias",
        "layer2.0.downsample.0.weight",
        "fc.weight",
    } <= names
    logits, emb = m.forward_with_embedding(torch.zeros(3, 1, 28, 28))
    assert logits.shape == (3, 10) and emb.shape == (3, ResNet18.embedding_dim)
    assert not emb.requires_grad
    with pytest.raises(ConfigError, match="unknown model 'vgg'"):
        make_model("vgg", 10)


def test_devices_resolve_and_refuse_what_is_not_there():
    assert resolve_device("cpu").type == "cpu"
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="--device cuda: torch sees no CUDA device"):
            resolve_device("cuda")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-accelerator path")
def test_pin_memory_without_accelerator_warns_and_serves(fmnist_dir):
    storage = FileStorage(str(fmnist_dir / "train"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = make_loader(
            storage, batch_size=100, policy="minio", cache_fraction=0.1, store="memory",
            num_workers=0, pin_memory=True,
        )  # fmt: skip
    assert any("no accelerator" in str(w.message) for w in caught)
    with loader:
        seen = np.concatenate([ids.numpy() for _, _, ids in loader])
    assert np.array_equal(np.sort(seen), np.arange(len(storage)))


def test_validation_is_held_out_of_training(fmnist_dir):
    train, val = split_train(str(fmnist_dir), 1 / 12, seed=0)
    full = FileStorage(str(fmnist_dir / "train"))
    assert len(train) + val.size == len(full) and val.size == round(len(full) / 12)
    assert not set(train.indices.tolist()) & set(val.tolist())
    again, val2 = split_train(str(fmnist_dir), 1 / 12, seed=0)
    assert np.array_equal(val, val2)


def test_compare_routes_options_to_the_systems_that_take_them(fmnist_dir):
    CompareConfig(
        str(fmnist_dir), ["lru", "icache"], [0.2],
        sampler_options={"warmup_epochs": 2}, policy_options={"package_bytes": 4096},
    ).validate()  # fmt: skip
    with pytest.raises(ConfigError, match="--sampler-option: no sampler of lru, minio takes bogus"):
        CompareConfig(
            str(fmnist_dir), ["lru", "minio"], [0.2], sampler_options={"bogus": 1}
        ).validate()
    with pytest.raises(ConfigError, match="--model"):
        CompareConfig(str(fmnist_dir), ["lru"], [0.2], model="vgg").validate()


def test_storage_reads_count_icache_packaging(fmnist_dir):
    """Every request the storage served: iCACHE's packaging thread reads samples, and a
    package loads from the bytes it was written with (a sample is not read twice); both
    are counted beside the misses."""
    storage = ThrottledStorage(FileStorage(str(fmnist_dir / "train")), latency_ms=0.0)
    assert storage.bytes_per_s == 100e6  # bandwidth is charged by default
    loader = make_loader(
        storage, batch_size=100, policy="icache", sampler="iis", cache_fraction=0.3,
        store="memory", num_workers=0, policy_options={"package_threads": False},
    )  # fmt: skip
    with loader:
        for epoch in range(3):
            loader.set_epoch(epoch)
            for _, _, ids in loader:
                loader.feedback(ids, np.random.default_rng(int(ids[0])).random(len(ids)))
        c = loader.counters()
    i = c["internal"]
    assert i["packages_loaded"] > 0 and i["package_storage_reads"] > 0
    assert c["storage_reads"] == (
        c["misses"] + c["late_misses"] + i["prefetched"] + i["package_storage_reads"]
        + i["package_file_reads"]
    )  # fmt: skip
    assert i["package_file_reads"] == 0  # every package loaded as written
    assert c["storage_bytes"] > i["bytes_from_storage"]


@pytest.mark.slow
def test_compare_reports_test_accuracy_and_decides_on_validation(fmnist_dir, tmp_path):
    js = tmp_path / "rows.json"
    out = hotset(
        "compare", "--data", str(fmnist_dir), "--systems", "inmemory,shade",
        "--cache-fractions", "0.2", "--epochs", "2", "--json", str(js), "--out",
        str(tmp_path), "--latency-ms", "0.2", "--no-progress", "--device", "cpu",
        "--sampler-option", "repetition=2", "--seeds", "0,1",
    )  # fmt: skip
    runs = json.loads(js.read_text())
    assert sorted((r["policy"], r["seed"]) for r in runs) == [
        ("inmemory", 0), ("inmemory", 1), ("shade", 0), ("shade", 1)
    ]  # fmt: skip
    rows = {r["policy"]: r for r in runs if r["seed"] == 0}
    assert set(rows) == {"inmemory", "shade"} and "storage" in out.stdout
    target = np.mean([r["test_accuracy"] for r in runs if r["policy"] == "inmemory"]) - 0.005
    for r in runs:
        assert 0.1 < r["test_accuracy"] <= 1 and len(r["val_accuracy_per_epoch"]) == 2
        assert r["test_accuracy_per_epoch"][-1] == r["test_accuracy"]
        assert r["device"] == "cpu" and r["model"] == "tiny"
        assert r["target_accuracy"] == pytest.approx(target)
        reached = [a >= target for a in r["test_accuracy_per_epoch"]]
        if any(reached):  # the training time up to the first epoch that reached it
            first = reached.index(True)
            assert r["time_to_target_s"] == pytest.approx(sum(r["epoch_times_s"][: first + 1]))
        else:
            assert r["time_to_target_s"] is None
    assert "time to target" in out.stdout and "+-" in out.stdout
    shade = rows["shade"]
    assert shade["storage_reads_per_epoch"][0] > 0 and shade["counters"]["storage_reads"] == sum(
        shade["storage_reads_per_epoch"]
    )


def test_time_to_target_is_the_training_time_to_the_first_epoch_that_reaches_it():
    """Three epochs of 10 s: a run that reaches the target in its second epoch took 20 s,
    one that never does is 'never' (not the fastest); seeds give mean +- spread."""
    from hotset.compare import accuracy_target, add_time_to_target, format_summary, summarise

    def run(policy, accs, seed=0):
        return {"policy": policy, "cache_fraction": 0.2, "seed": seed, "epoch_times_s": [10.0] * 3,
                "test_accuracy_per_epoch": accs, "test_accuracy": accs[-1],
                "steady_epoch_time_s": 10.0, "steady_hit_ratio": 0.5}  # fmt: skip

    rows = [
        run("inmemory", [0.80, 0.88, 0.90]),
        run("shade", [0.85, 0.896, 0.90]),
        run("shade", [0.80, 0.85, 0.897], seed=1),
        run("lru", [0.70, 0.80, 0.85]),
    ]
    target, source = accuracy_target(rows)
    assert target == pytest.approx(0.895) and source.startswith("in-memory")
    target_u, source_u = accuracy_target(rows[1:])  # no in-memory run: the uniform baseline's
    assert target_u == pytest.approx(0.845) and source_u.startswith("uniform baseline 0.85")
    assert accuracy_target(rows[1:3])[0] == pytest.approx(0.895)  # else the best run's
    add_time_to_target(rows, target)
    assert [r["time_to_target_s"] for r in rows] == [30.0, 20.0, 30.0, None]
    summary = {r["policy"]: r for r in summarise(rows)}
    assert summary["shade"]["time_to_target_s"] == 25.0
    assert summary["shade"]["time_to_target_s_std"] == 5.0
    assert summary["shade"]["reached_target"] == 2 and summary["lru"]["reached_target"] == 0
    table = format_summary(list(summary.values()), target, source)
    assert "never" in table.splitlines()[-1] and "25.0 +- 5.0" in table


def test_compare_says_when_its_runs_were_not_io_bound():
    """LRU's two workers waited 4.7 worker-seconds of a 176 s epoch: the table says the
    epoch is decoding and training, and what to change; a run that waits says nothing."""
    from hotset.compare import io_bound_note

    def run(policy, wait, epoch):
        return {"policy": policy, "steady_epoch_time_s": epoch,
                "storage_wait_s_per_epoch": [wait] * 3}  # fmt: skip

    note = io_bound_note([run("lru", 4.7, 176.0), run("shade", 1.0, 180.0)], num_workers=2)
    assert note.startswith("not I/O-bound: lru's workers waited on storage 1% of its epoch")
    assert "--latency-ms" in note
    assert io_bound_note([run("lru", 300.0, 176.0)], num_workers=2) is None
