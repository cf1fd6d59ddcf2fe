"""`hotset prepare`: write a dataset as one file per sample plus its manifest, as
WebDataset tar shards, or as Parquet."""

from __future__ import annotations

import gzip
import posixpath
from collections.abc import Callable, Iterator
from pathlib import Path

import fsspec
import numpy as np

from hotset.codecs import npy_bytes
from hotset.errors import ConfigError
from hotset.progress import progress
from hotset.storage.files import list_imagefolder
from hotset.storage.manifest import MANIFEST_NAME, Manifest

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
FASHION_MNIST_CLASSES = [
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
]  # fmt: skip
_IDX_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}


def read_idx(path: Path) -> np.ndarray:
    """Read an IDX file (the MNIST format: big-endian dims after a 4-byte magic)."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    if raw[:2] != b"\x00\x00" or raw[2] != 0x08:
        raise ConfigError(f"{path}: not an unsigned-byte IDX file")
    ndim = raw[3]
    dims = np.frombuffer(raw, dtype=">u4", count=ndim, offset=4).astype(int)
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(dims)):
        raise ConfigError(f"{path}: truncated ({data.size} bytes for dims {dims.tolist()})")
    return data.reshape(dims)


FORMATS = ("png", "npy", "files", "tar", "parquet")  # files: png


def png_bytes(image: np.ndarray) -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="PNG")
    return buf.getvalue()


def _write_split(
    out: str, samples: Iterator[tuple[str, bytes, int]], classes: list[str], name: str, total: int
) -> Manifest:
    fs, root = fsspec.core.url_to_fs(out)
    fs.makedirs(root, exist_ok=True)

    def written():
        for rel, data, label in progress(samples, total, f"prepare {name}", "img"):
            fs.makedirs(posixpath.dirname(posixpath.join(root, rel)), exist_ok=True)
            fs.pipe_file(posixpath.join(root, rel), data)
            yield rel, data, label

    manifest = Manifest.from_samples(written(), classes, name)
    # The manifest is written last: its presence marks a complete split.
    fs.pipe_file(posixpath.join(root, MANIFEST_NAME), manifest.to_json().encode())
    return manifest


def _write_tar_split(
    out: str, samples: Iterator[tuple[str, bytes, int]], name: str, total: int,
    shard_size: int = 4096,
) -> int:
    """Write samples as WebDataset shards ``out/shard-NNNNNN.tar`` of ``shard_size``
    samples: ``<index>.png`` (or ``.npy``) and ``<index>.cls`` per sample."""
    import io
    import itertools
    import tarfile

    fs, root = fsspec.core.url_to_fs(out)
    fs.makedirs(root, exist_ok=True)
    rows = iter(progress(samples, total, f"prepare {name}", "img"))
    n = 0
    while chunk := list(itertools.islice(rows, shard_size)):
        path = posixpath.join(root, f"shard-{n // shard_size:06d}.tar")
        with fs.open(path, "wb") as f, tarfile.open(fileobj=f, mode="w") as tf:
            for rel, data, label in chunk:
                stem, ext = posixpath.splitext(posixpath.basename(rel))
                for member, payload in ((stem + ext, data), (f"{stem}.cls", b"%d" % label)):
                    info = tarfile.TarInfo(member)
                    info.size = len(payload)
                    tf.addfile(info, io.BytesIO(payload))
        n += len(chunk)
    return n


def _write_parquet_split(
    out: str, samples: Iterator[tuple[str, bytes, int]], classes: list[str], name: str,
    total: int, row_group_size: int = 256,
) -> int:
    """Write samples as one Parquet file ``out/data.parquet`` (columns ``image``, bytes,
    and ``label``; the class names in the Hugging Face metadata), in row groups of
    ``row_group_size`` rows."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = list(progress(samples, total, f"prepare {name}", "img"))
    meta = {"info": {"features": {"image": {"_type": "Image"},
                                  "label": {"_type": "ClassLabel", "names": classes}}}}
    table = pa.table(
        {"image": [d for _, d, _ in rows], "label": [lbl for _, _, lbl in rows]},
    ).replace_schema_metadata({"huggingface": json.dumps(meta)})
    fs, root = fsspec.core.url_to_fs(out)
    fs.makedirs(root, exist_ok=True)
    with fs.open(posixpath.join(root, "data.parquet"), "wb") as f:
        pq.write_table(table, f, row_group_size=row_group_size)
    return len(rows)


def prepare_fashion_mnist(
    out_dir: str,
    source: str = FASHION_MNIST_DIR,
    limit: int | None = None,
    fmt: str = "png",
    shard_size: int = 4096,
) -> dict[str, int]:
    """Write Fashion-MNIST (Debian package ``dataset-fashion-mnist``) under
    ``out_dir/train`` and ``out_dir/test``; returns each split's sample count. ``fmt``:
    ``png`` or ``files`` (one PNG per sample, ``<label>/<index>.png``, with a manifest, as
    ImageFolder datasets are), ``npy`` (one uint8 array 1 x 28 x 28 per file, decoded by
    a ``frombuffer``), ``tar`` (WebDataset shards of PNG + ``cls``) or ``parquet`` (one
    file, ``image`` and ``label`` columns). ``limit`` keeps the first N samples of each
    split (for tests); ``shard_size``: samples per tar shard."""
    if fmt not in FORMATS:
        raise ConfigError(f"format must be one of {FORMATS}, got {fmt!r}")
    fmt = "png" if fmt == "files" else fmt
    encode = (lambda img: npy_bytes(img[None])) if fmt == "npy" else png_bytes
    ext = "npy" if fmt == "npy" else "png"
    src = Path(source)
    if not (src / _IDX_FILES["train"][0]).exists():
        raise ConfigError(
            f"Fashion-MNIST not found in {src}: install it with "
            "'apt-get install dataset-fashion-mnist' (Debian/Ubuntu) or pass --source DIR"
        )
    result = {}
    for split, (img_name, lbl_name) in _IDX_FILES.items():
        images, labels = read_idx(src / img_name), read_idx(src / lbl_name)
        if limit is not None:
            images, labels = images[:limit], labels[:limit]

        def samples(images=images, labels=labels):
            for i, (img, lbl) in enumerate(zip(images, labels, strict=True)):
                yield f"{int(lbl)}/{i:05d}.{ext}", encode(img), int(lbl)

        out, name = posixpath.join(str(out_dir), split), f"fashion-mnist-{split}"
        if fmt == "tar":
            result[split] = _write_tar_split(out, samples(), name, len(images), shard_size)
        elif fmt == "parquet":
            result[split] = _write_parquet_split(
                out, samples(), FASHION_MNIST_CLASSES, name, len(images)
            )
        else:
            result[split] = len(
                _write_split(out, samples(), FASHION_MNIST_CLASSES, name, len(images))
            )
    return result


def prepare_imagefolder(
    src: str, out_dir: str, test_fraction: float = 0.1, seed: int = 0
) -> dict[str, Manifest]:
    """Copy an ImageFolder tree (``src/<class>/<image>``) into ``out_dir/train`` and
    ``out_dir/test`` (a stratified ``test_fraction`` held out), each with a manifest."""
    if not 0.0 <= test_fraction < 1.0:
        raise ConfigError(f"test_fraction must be in [0, 1), got {test_fraction}")
    fs, root = fsspec.core.url_to_fs(src)
    if not fs.isdir(root):
        raise ConfigError(f"{src}: not a directory")
    classes, files = list_imagefolder(fs, root)
    labels = np.array([label for _, label, _ in files], dtype=np.int64)
    rng = np.random.default_rng(seed)
    test_mask = np.zeros(len(files), dtype=bool)
    for label in range(len(classes)):
        members = np.flatnonzero(labels == label)
        n_test = int(round(len(members) * test_fraction))
        test_mask[rng.choice(members, size=n_test, replace=False)] = True
    name = posixpath.basename(root.rstrip("/"))
    result = {}
    for split, mask in (("train", ~test_mask), ("test", test_mask)):
        if not mask.any():
            continue
        chosen = [files[i] for i in np.flatnonzero(mask)]
        samples = ((rel, fs.cat_file(posixpath.join(root, rel)), label) for rel, label, _ in chosen)
        result[split] = _write_split(
            posixpath.join(str(out_dir), split), samples, classes, f"{name}-{split}", len(chosen)
        )
    return result


PREPARERS: dict[str, Callable[..., dict[str, Manifest]]] = {
    "fashion-mnist": prepare_fashion_mnist,
    "imagefolder": prepare_imagefolder,
}
