"""The simulator and the `hotset` command's contracts."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import make_imagefolder
from hotset import __version__
from hotset.cli import main
from hotset.sim import simulate, simulate_trace

HOTSET = [sys.executable, "-m", "hotset.cli"]


def hotset(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*HOTSET, *args], capture_output=True, text=True, check=check, timeout=600
    )


def test_minio_hits_its_fill_fraction():
    r = simulate("minio", 20_000, 4, cache_fraction=0.1, seed=1)
    assert r["steady_hit_ratio"] == pytest.approx(0.1, abs=0.005)


def test_lru_thrashes_under_shuffled_epochs_but_not_iid():
    """Under per-epoch permutations LRU keeps the previous epoch's tail, which the next
    epoch mostly misses: steady state ~ f^2/2 (Quiver's "thrashing"). Under i.i.d.
    sampling every sample is equally likely at every step, so LRU hits ~ f."""
    f = 0.1
    shuffled = simulate("lru", 20_000, 4, cache_fraction=f, seed=2)
    assert shuffled["steady_hit_ratio"] == pytest.approx(f * f / 2, rel=0.25)
    iid = simulate(
        "lru", 20_000, 4, cache_fraction=f, seed=2, sampler_options={"replacement": True}
    )
    assert iid["steady_hit_ratio"] == pytest.approx(f, abs=0.02)


def test_belady_bounds_online_policies():
    results = {
        p: simulate(p, 5000, 3, cache_fraction=0.2, seed=4)["hits"]
        for p in ("belady", "lru", "lfu", "fifo", "random", "minio")
    }
    assert results["belady"] == max(results.values())


def test_variable_sizes_by_bytes():
    sizes = np.random.default_rng(0).integers(100, 1000, 3000)
    r = simulate("minio", 3000, 3, cache_fraction=0.25, sizes=sizes)
    assert r["capacity_bytes"] == int(0.25 * sizes.sum())
    assert 0.2 < r["steady_hit_ratio"] < 0.3


def test_cli_simulate_contract():
    out = hotset(
        "simulate",
        "--policy",
        "lru",
        "--sampler",
        "uniform",
        "--dataset-size",
        "5000",
        "--epochs",
        "2",
        "--cache-fraction",
        "0.1",
        "--seed",
        "1",
        "--json",
    )
    doc = json.loads(out.stdout)
    for k in ("policy", "accesses", "hits", "hit_ratio", "accesses_per_s"):
        assert k in doc
    assert doc["policy"] == "lru" and doc["accesses"] == 10_000


def test_cli_simulate_trace(tmp_path):
    trace = np.array([0, 1, 2, 0, 1, 3, 0, 1], dtype=np.int64)
    np.save(tmp_path / "t.npy", trace)
    # capacity 2: LRU and FIFO thrash on this cycle; MIN bypasses 2 and 3 and keeps 0, 1
    for policy, hits in (("belady", 4), ("lru", 0), ("fifo", 0)):
        doc = json.loads(
            hotset(
                "simulate",
                "--trace",
                str(tmp_path / "t.npy"),
                "--policy",
                policy,
                "--capacity-items",
                "2",
                "--json",
            ).stdout
        )
        assert doc["accesses"] == 8
        assert doc["hits"] == hits == simulate_trace(trace, policy, 2)["hits"]


def test_cli_errors_name_the_setting(tmp_path):
    r = hotset(
        "simulate",
        "--policy",
        "nope",
        "--dataset-size",
        "10",
        "--cache-fraction",
        "0.1",
        check=False,
    )
    assert r.returncode == 2 and "unknown policy 'nope'" in r.stderr
    r = hotset("compare", "--data", str(tmp_path), "--epochs", "1", check=False)
    assert r.returncode == 2 and "manifest.json" in r.stderr
    r = hotset("compare", "--data", str(tmp_path), "--cache-fractions", "2", check=False)
    assert r.returncode == 2 and "--cache-fractions: 2.0" in r.stderr


def test_cli_prepare_imagefolder(tmp_path):
    src = make_imagefolder(tmp_path / "src", per_class=10)
    out = hotset(
        "prepare", "imagefolder", str(src), str(tmp_path / "out"), "--test-fraction", "0.2"
    )
    assert "24 samples" in out.stdout and (tmp_path / "out/test/manifest.json").exists()


@pytest.mark.slow
def test_cli_compare_contract(fmnist_dir, tmp_path):
    js = tmp_path / "rows.json"
    hotset(
        "compare",
        "--data",
        str(fmnist_dir),
        "--policies",
        "lru,minio,belady",
        "--cache-fractions",
        "0.1,0.2",
        "--epochs",
        "2",
        "--json",
        str(js),
        "--out",
        str(tmp_path / "out"),
        "--latency-ms",
        "0.5",
        "--no-progress",
    )
    rows = json.loads(js.read_text())
    assert len(rows) == 6
    for r in rows:
        for k in ("policy", "cache_fraction", "hit_ratio", "epoch_time_s", "test_accuracy"):
            assert r[k] is not None
    by = {(r["policy"], r["cache_fraction"]): r for r in rows}
    assert by[("minio", 0.2)]["steady_hit_ratio"] == pytest.approx(0.2, abs=0.03)
    assert by[("belady", 0.2)]["steady_hit_ratio"] >= by[("lru", 0.2)]["steady_hit_ratio"]
    assert (tmp_path / "out/compare.png").stat().st_size > 1000


def test_version_is_shown_and_kept_in_one_place(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"hotset {__version__}"
    assert version("hotset") == __version__  # pyproject reads it from the package


def test_option_values_read_as_json_or_as_python_s_constants():
    """``--policy-option l_in_flight=False`` is False, not the string (which a policy's
    ``bool()`` would take as true)."""
    from hotset.cli import parse_options
    from hotset.errors import HotsetError

    got = parse_options(["a=False", "b=true", "c=None", "d=0.5", "e=[1, 2]", "f=fast"], "--x")
    assert got == {"a": False, "b": True, "c": None, "d": 0.5, "e": [1, 2], "f": "fast"}
    assert got["a"] is False and got["c"] is None
    with pytest.raises(HotsetError, match="--x 'oops': give KEY=VALUE"):
        parse_options(["oops"], "--x")
