"""Loss oracle, oracle-driven simulation, named systems, `hotset record` and `sweep`."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hotset import ConfigError
from hotset.sim import LossOracle, simulate
from hotset.sim.sweep import sweep
from hotset.systems import SYSTEMS, resolve_system
from test_simulate_cli import hotset


def synthetic_oracle(n=4000, epochs=4, seed=0) -> LossOracle:
    """Per-sample difficulty that persists across epochs, all losses shrinking."""
    rng = np.random.default_rng(seed)
    hard = rng.lognormal(0, 1, n)
    return LossOracle(np.stack([hard * 0.7**e for e in range(epochs)]))


def test_oracle_interpolates_and_fills_gaps():
    losses = np.array([[1.0, np.nan, 3.0], [2.0, 4.0, np.nan]])
    o = LossOracle(losses)
    assert o.at(np.array([0, 1, 2]), 0.5).tolist() == [1.0, 4.0, 3.0]  # gaps filled
    assert o.at(np.array([0]), 1.0).tolist() == [1.5]  # halfway between epoch midpoints
    assert o.at(np.array([0]), 9.0).tolist() == [2.0]  # clamped


def test_oracle_roundtrip(tmp_path):
    o = synthetic_oracle(100, 3)
    o.meta = {"data": "x"}
    o.save(tmp_path / "o.npz")
    back = LossOracle.load(tmp_path / "o.npz")
    assert np.allclose(back.losses, o.losses, rtol=1e-6) and back.meta == {"data": "x"}
    (tmp_path / "bad.npz").write_bytes(b"nope")
    with pytest.raises(ConfigError, match="not a loss oracle"):
        LossOracle.load(tmp_path / "bad.npz")


def test_shade_beats_the_baselines_in_simulation():
    o = synthetic_oracle()
    rows = {
        (r["system"], r["cache_fraction"]): r["hit_ratio"]
        for r in sweep(o, ("lru", "sh_app", "shade"), (0.1, 0.2), epochs=4)
    }
    for f in (0.1, 0.2):
        assert rows[("shade", f)] > 4 * rows[("lru", f)]
        assert rows[("shade", f)] > rows[("sh_app", f)]


def test_importance_sampler_needs_an_oracle_in_simulation():
    with pytest.raises(ConfigError, match="oracle"):
        simulate("app", 100, 2, cache_fraction=0.1, sampler="shade")


def test_systems_resolve():
    assert resolve_system("lru").sampler == "uniform"
    assert resolve_system("shade") is SYSTEMS["shade"]
    with pytest.raises(ConfigError, match="unknown system or policy 'app'"):
        resolve_system("app")  # app needs scores: only as part of a system


def test_cli_record_and_sweep(fmnist_dir, tmp_path):
    oracle = tmp_path / "oracle.npz"
    hotset(
        "record",
        "--data",
        str(fmnist_dir),
        "--epochs",
        "2",
        "--out",
        str(oracle),
        "--num-workers",
        "2",
    )
    o = LossOracle.load(oracle)
    held_out = round(1000 / 12)  # the validation split compare holds out too
    assert o.losses.shape == (2, 1000 - held_out) and np.isfinite(o.losses).all()
    assert o.embeddings.shape == (2, 1000 - held_out, 32)
    assert o.losses[1].mean() < o.losses[0].mean()  # the model learned
    out = hotset(
        "sweep",
        "--oracle",
        str(oracle),
        "--systems",
        "lru,shade",
        "--cache-fractions",
        "0.1,0.5",
        "--epochs",
        "3",
        "--out",
        str(tmp_path),
    )
    assert "shade" in out.stdout
    rows = json.loads((tmp_path / "sweep.json").read_text())
    assert len(rows) == 4 and (tmp_path / "sweep.png").exists()
    doc = json.loads(
        hotset(
            "simulate",
            "--system",
            "shade",
            "--oracle",
            str(oracle),
            "--cache-fraction",
            "0.1",
            "--epochs",
            "3",
            "--json",
        ).stdout
    )
    assert doc["policy"] == "app" and doc["dataset_size"] == 1000 - held_out


def test_without_matplotlib_the_tables_are_written_and_the_picture_says_how(
    tmp_path, monkeypatch, capsys
):
    """matplotlib is the ``[plot]`` extra: without it a sweep's rows are still returned
    and written, its picture is left out with a line naming the extra, and hotset's
    modules import without it."""
    import subprocess
    import sys

    from hotset.plotting import written
    from hotset.sim.sweep import plot_sweep

    rows = sweep(synthetic_oracle(n=500, epochs=2), ["lru", "shade"], [0.2], epochs=2)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # (its import then fails)
    plot_sweep(rows, tmp_path / "sweep.png")
    assert not (tmp_path / "sweep.png").exists()
    assert "pip install 'hotset[plot]'" in capsys.readouterr().err
    (tmp_path / "sweep.json").write_text(json.dumps(rows))
    assert written(tmp_path, "sweep") == f"{tmp_path / 'sweep'}.json"
    code = ("import sys, hotset, hotset.compare, hotset.cli, hotset.sim.sweep; "
            "assert 'matplotlib' not in sys.modules")  # fmt: skip
    subprocess.run([sys.executable, "-c", code], check=True)
