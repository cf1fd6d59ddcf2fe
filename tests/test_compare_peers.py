"""``hotset compare --peers streaming``: MosaicML Streaming trained beside hotset's rows,
in its own Python (``make peers``; ``make test`` builds it), on the same samples and link."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hotset.compare import CompareConfig, run_compare
from hotset.compare_peers import check_peers, peer_python
from hotset.errors import ConfigError


def _peer() -> str | None:
    try:
        return peer_python()
    except ConfigError:
        return None


def test_a_missing_peer_python_or_peer_is_named():
    with pytest.raises(ConfigError, match=r"no Python at '/nowhere/python'.*make peers"):
        peer_python("/nowhere/python")
    with pytest.raises(ConfigError, match="cannot import streaming"):
        peer_python("python3")  # the system's Python: no streaming
    with pytest.raises(ConfigError, match="unknown webdataset; choose from streaming"):
        check_peers(["webdataset"])
    with pytest.raises(ConfigError, match="--peers: unknown"):
        CompareConfig(data="x", policies=["lru"], cache_fractions=[0.1],
                      peers=["webdataset"]).validate()  # fmt: skip


@pytest.mark.skipif(_peer() is None, reason="no peer Python with streaming (make peers)")
def test_streaming_trains_beside_hotset_on_the_same_samples(fmnist_dir, tmp_path, capsys):
    cfg = CompareConfig(
        data=str(fmnist_dir), policies=["lru"], cache_fractions=[1.0], epochs=2,
        num_workers=2, latency_ms=1.0, concurrency=4, progress=False, device="cpu",
        peers=["streaming"],
    )  # fmt: skip
    rows = run_compare(cfg, out_dir=str(tmp_path / "out"))
    lru, peer = rows
    assert peer["policy"] == "streaming" and peer["cache_fraction"] == lru["cache_fraction"]
    n = 1000 - round(1000 / 12)  # the training split less the validation part
    # every sample once an epoch, trained: the same model learns above chance (10 classes)
    assert peer["distinct_per_epoch"] == [n, n]
    assert len(peer["test_accuracy_per_epoch"]) == 2 and peer["test_accuracy"] > 0.3
    assert peer["train_loss_per_epoch"][1] < peer["train_loss_per_epoch"][0]
    # its downloads crossed the link and were counted: the first epoch reads every shard
    shards_bytes = peer["shards"] * peer["shard_bytes"]
    assert peer["storage_bytes_per_epoch"][0] >= 0.99 * shards_bytes
    assert peer["storage_reads_per_epoch"][0] >= peer["shards"]
    # a cache as large as the shards keeps them all: the second epoch reads (almost) none
    assert peer["reads_per_shard_per_epoch"] < 0.5 and peer["tuned"] is True
    out = capsys.readouterr().out
    assert "reads per shard per epoch" in out and "tuned" in out
    written = json.loads((tmp_path / "out" / "compare.json").read_text())
    assert [r["policy"] for r in written] == ["lru", "streaming"]
    assert np.isfinite(peer["steady_epoch_time_s"]) and lru["steady_hit_ratio"] is not None
