"""``hotset compare --peers streaming``: the loader users would pick instead (MosaicML
Streaming) trained beside hotset's rows, on the same samples, model, optimiser and
emulated link, and tuned as its users tune it.

Streaming runs in a Python of its own (``--peer-python``; ``make peers`` builds
``.venv-peers`` with the locked CPU torch) through ``hotset/peers/streaming_run.py``:

* the training split's bytes (the same image bytes hotset reads) are written as MDS
  shards of about hotset's shard size (``PEER_SHARD_BYTES`` where hotset reads a file per
  sample);
* its ``cache_limit`` is hotset's memory (its cache and read-ahead) as a share of the MDS
  shards' bytes;
* its downloads cross ``ThrottledStorage``'s link model with the run's
  ``--latency-ms``, ``--bandwidth-mb-s`` and ``--concurrency``;
* shuffle ``py1e`` with blocks of ``SHUFFLE_BLOCK`` ids (fewer where ``CACHED_BLOCKS``
  would not fit the cache) and ``PREDOWNLOAD`` samples a worker; the same workers and
  batch size;
* the model is hotset's, initialised with the same seed (saved as TorchScript).

A tuned Streaming reads each shard about once an epoch; where it reads more than
``MAX_PEER_READS`` times (its cache thrashed) the row says so and compares no time.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch

from hotset.codecs import RECORD_MAGIC, decode_field, decode_record
from hotset.errors import ConfigError, HotsetError
from hotset.models import resolve_device
from hotset.storage import Storage

#: the peers ``--peers`` knows
PEERS = ("streaming",)
RUNNER = Path(__file__).resolve().parent / "peers" / "streaming_run.py"
#: where the environment names no peer Python: ``make peers``'s venv
DEFAULT_PEER_PYTHON = ".venv-peers/bin/python"
#: MDS shard size where hotset reads a file per sample (Streaming's users size shards to
#: a few hundred per dataset; hotset's tar shards are 128-512 samples)
PEER_SHARD_BYTES = 256 << 10
SHUFFLE_BLOCK, PREDOWNLOAD = 2048, 128
CACHED_SHARDS, MIN_SHARD_BYTES = 48, 16 << 10
#: the cache holds this many shuffle blocks (a block larger than the cache re-reads its
#: shards: Streaming's users shrink the block to their cache)
CACHED_BLOCKS = 4
#: a tuned Streaming reads each shard about once an epoch; more: its cache thrashed
MAX_PEER_READS = 2.0


def peer_python(given: str | None = None) -> str:
    """The Python that runs the peer: ``given``, else ``$HOTSET_PEER_PYTHON``, else
    ``.venv-peers/bin/python``; refused where it cannot import ``streaming``."""
    python = given or os.environ.get("HOTSET_PEER_PYTHON") or DEFAULT_PEER_PYTHON
    found = shutil.which(python)  # a name on PATH, or a path to an executable
    hint = ("`make peers` builds .venv-peers with mosaicml-streaming and the locked CPU "
            "torch; or give --peer-python")  # fmt: skip
    if found is None:
        raise ConfigError(f"--peers streaming: no Python at {python!r}; {hint}")
    probe = subprocess.run([found, "-c", "import importlib.util as u; "
                            "print(bool(u.find_spec('streaming') and u.find_spec('torch')))"],
                           capture_output=True, text=True)  # fmt: skip
    if probe.stdout.strip() != "True":
        raise ConfigError(f"--peers streaming: {found} cannot import streaming and torch; {hint}")
    return found


def check_peers(peers: list[str]) -> None:
    unknown = sorted(set(peers) - set(PEERS))
    if unknown:
        raise ConfigError(f"--peers: unknown {', '.join(unknown)}; choose from {', '.join(PEERS)}")


def _image_and_label(train: Storage, raw: bytes, label: int) -> tuple[bytes, int]:
    """A sample's image (or ``.npy``) bytes and label; a record's (tar, Parquet) from its
    input and target fields."""
    if raw[:4] == RECORD_MAGIC:
        record, field, target = decode_record(raw), train.input_field, train.target_field
        if not isinstance(field, str) or not isinstance(target, str):
            raise ConfigError("--peers streaming: the samples need one input and one target field")
        raw, label = record[field], int(decode_field(target, record[target], None, None))
    if label < 0:
        raise ConfigError("--peers streaming: the training split's samples have no label")
    return raw, label


def write_samples(path: Path, blobs: list[bytes], labels) -> int:
    """Samples' bytes and labels as the file the peers' writers read (``streaming_run.py
    write``: ``blob``, ``offsets``, ``labels``); returns the bytes."""
    offsets = np.concatenate([[0], np.cumsum([len(b) for b in blobs])]).astype(np.int64)
    np.savez(path, blob=np.frombuffer(b"".join(blobs), np.uint8), offsets=offsets,
             labels=np.asarray(labels, np.int64))  # fmt: skip
    return int(offsets[-1])


def _dump_samples(train: Storage, path: Path, chunk: int = 4096) -> int:
    """The split's sample bytes and labels for the MDS writer; returns the bytes."""
    blobs, labels = [], []
    for start in range(0, len(train), chunk):
        ids = range(start, min(start + chunk, len(train)))
        for i, raw in zip(ids, train.read_many(list(ids)), strict=True):
            image, label = _image_and_label(train, raw, int(train.labels[i]))
            blobs.append(image)
            labels.append(label)
    return write_samples(path, blobs, labels)


def _shard_bytes(train: Storage, cache_limit: int) -> int:
    """hotset's mean shard size where it reads shards, else ``PEER_SHARD_BYTES``; smaller
    where the cache would hold fewer than ``CACHED_SHARDS`` (Streaming refuses a cache of
    under 4 shards and thrashes near it), as its users size shards to their cache."""
    extents = train.extents
    size = PEER_SHARD_BYTES
    if extents is not None:
        size = int(train.manifest.total_bytes / max(1, np.unique(extents[0]).size))
    return max(MIN_SHARD_BYTES, min(size, cache_limit // CACHED_SHARDS))


def _run(python: str, *args: str) -> list[dict]:
    out = subprocess.run([python, str(RUNNER), *args], capture_output=True, text=True)
    if out.returncode:
        raise HotsetError(f"the peer failed ({args[0]}): {out.stderr[-2000:]}")
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def train_peer(
    cfg, peer: str, memory: float, train: Storage, model: torch.nn.Module,
    val: tuple[torch.Tensor, torch.Tensor] | None,
    test: tuple[torch.Tensor, torch.Tensor] | None, image_size: tuple[int, int] | None,
    python: str,
) -> dict:  # fmt: skip
    """Train ``model`` (fresh, as hotset's rows start) through ``peer`` over ``train``
    with ``memory`` (a share) of its shards' bytes as cache; returns the row of compare's
    table."""
    device = resolve_device(cfg.device)
    with tempfile.TemporaryDirectory(prefix="hotset-peer-") as tmp:
        root = Path(tmp)
        nbytes = _dump_samples(train, root / "samples.npz")
        _run(python, "write", str(root / "samples.npz"), str(root / "mds"),
             "--shard-bytes", str(_shard_bytes(train, int(memory * nbytes))))  # fmt: skip
        shards = sorted((root / "mds").glob("shard.*.mds"))
        mds_bytes = sum(p.stat().st_size for p in shards)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # TorchScript's deprecation notice
            try:
                scripted = torch.jit.script(model.cpu())
            except Exception as exc:  # (TorchScript's errors have no common type)
                raise ConfigError(
                    f"--peers trains the model in the peer's own Python, as TorchScript, and "
                    f"--model {cfg.model} does not script: {str(exc).splitlines()[0]}"
                ) from exc
            torch.jit.save(scripted, str(root / "model.pt"))
        evals = {f"{k}_{part}": t.numpy() for k, xy in (("val", val), ("test", test))
                 if xy is not None for part, t in zip("xy", xy, strict=True)}  # fmt: skip
        np.savez(root / "eval.npz", **evals)
        cache_limit = int(memory * mds_bytes)
        block = min(SHUFFLE_BLOCK, max(cfg.batch_size, cache_limit * len(train)
                                       // max(1, CACHED_BLOCKS * mds_bytes)))  # fmt: skip
        epochs = _run(
            python, "epochs", str(root / "mds"), "--local", str(root / "cache"),
            "--cache-limit", str(cache_limit), "--epochs", str(cfg.epochs),
            "--workers", str(cfg.num_workers), "--batch-size", str(cfg.batch_size),
            "--shuffle-block", str(block), "--predownload", str(PREDOWNLOAD),
            "--seed", str(cfg.seed), "--model", str(root / "model.pt"),
            "--eval", str(root / "eval.npz"), "--device", str(device),
            *(["--size", ",".join(map(str, image_size))] if image_size else []),
            "--link", f"{cfg.latency_ms},{cfg.bandwidth_mb_s},{cfg.concurrency}",
        )  # fmt: skip
    times = [e["seconds"] for e in epochs]
    reads = [e["reads"] for e in epochs]
    steady_from = min(1, len(reads) - 1)
    per_shard = float(np.mean(reads[steady_from:])) / max(1, len(shards))
    return {
        "policy": peer, "sampler": peer, "eviction": None, "cache_fraction": memory,
        "capacity_bytes": cache_limit, "epochs": cfg.epochs,
        "hit_ratio": None, "steady_hit_ratio": None,
        "epoch_time_s": float(np.mean(times)), "epoch_times_s": times,
        "steady_epoch_time_s": float(np.mean(times[min(2, len(times) - 1) :])),
        "storage_reads_per_epoch": reads, "storage_requests_per_epoch": reads,
        "storage_bytes_per_epoch": [e["bytes"] for e in epochs],
        "test_accuracy": epochs[-1].get("test_accuracy"),
        "test_accuracy_per_epoch": [e["test_accuracy"] for e in epochs if "test_accuracy" in e],
        "val_accuracy_per_epoch": [e["val_accuracy"] for e in epochs if "val_accuracy" in e],
        "train_loss_per_epoch": [e["train_loss"] for e in epochs],
        "distinct_per_epoch": [e["distinct"] for e in epochs],
        "seed": cfg.seed, "model": cfg.model, "device": str(device),
        "shards": len(shards), "shard_bytes": mds_bytes / max(1, len(shards)),
        "shuffle_block": block,
        "reads_per_shard_per_epoch": per_shard, "tuned": per_shard <= MAX_PEER_READS,
        "planning_us_per_sample": 0.0, "counters": {},
    }  # fmt: skip


def peer_note(rows: list[dict]) -> str | None:
    """One line per peer row: its reads per shard per epoch and whether it was tuned."""
    lines = []
    for r in rows:
        if r["policy"] not in PEERS:
            continue
        state = ("tuned: each shard read about once an epoch" if r["tuned"] else
                 f"its cache thrashed (over {MAX_PEER_READS:g} reads a shard): no time is "
                 "compared; give a larger --cache-fractions")  # fmt: skip
        lines.append(
            f"{r['policy']} {r['cache_fraction']:.0%} seed {r['seed']}: "
            f"{r['reads_per_shard_per_epoch']:.2f} reads per shard per epoch ({r['shards']} "
            f"MDS shards of {r['shard_bytes'] / 1024:.0f} KiB, cache_limit "
            f"{r['capacity_bytes'] / 1e6:.1f} MB, shuffle block {r['shuffle_block']}); {state}"
        )
    return "\n".join(lines) or None
