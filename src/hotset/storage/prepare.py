"""`hotset prepare`: write a dataset as one file per sample plus its manifest."""

from __future__ import annotations

import gzip
import posixpath
from collections.abc import Callable, Iterator
from pathlib import Path

import fsspec
import numpy as np
from tqdm import tqdm

from hotset.codecs import npy_bytes
from hotset.errors import ConfigError
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


FORMATS = ("png", "npy")


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
        for rel, data, label in tqdm(
            samples, total=total, desc=f"prepare {name}", unit="img", disable=None
        ):
            fs.makedirs(posixpath.dirname(posixpath.join(root, rel)), exist_ok=True)
            fs.pipe_file(posixpath.join(root, rel), data)
            yield rel, data, label

    manifest = Manifest.from_samples(written(), classes, name)
    # The manifest is written last: its presence marks a complete split.
    fs.pipe_file(posixpath.join(root, MANIFEST_NAME), manifest.to_json().encode())
    return manifest


def prepare_fashion_mnist(
    out_dir: str, source: str = FASHION_MNIST_DIR, limit: int | None = None, fmt: str = "png"
) -> dict[str, Manifest]:
    """Write Fashion-MNIST (Debian package ``dataset-fashion-mnist``) as one file per
    sample under ``out_dir/train/<label>/<index>.<fmt>`` and ``out_dir/test/...``, each
    with a manifest. ``fmt``: ``png`` (an image, as ImageFolder datasets are) or ``npy``
    (the uint8 array 1 x 28 x 28, decoded by a ``frombuffer``). ``limit`` keeps the
    first N samples of each split (for tests)."""
    if fmt not in FORMATS:
        raise ConfigError(f"format must be one of {FORMATS}, got {fmt!r}")
    encode = png_bytes if fmt == "png" else (lambda img: npy_bytes(img[None]))
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
                yield f"{int(lbl)}/{i:05d}.{fmt}", encode(img), int(lbl)

        result[split] = _write_split(
            posixpath.join(str(out_dir), split),
            samples(),
            FASHION_MNIST_CLASSES,
            f"fashion-mnist-{split}",
            len(images),
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
    labels = np.array([label for _, label in files], dtype=np.int64)
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
        samples = ((rel, fs.cat_file(posixpath.join(root, rel)), label) for rel, label in chosen)
        result[split] = _write_split(
            posixpath.join(str(out_dir), split), samples, classes, f"{name}-{split}", len(chosen)
        )
    return result


PREPARERS: dict[str, Callable[..., dict[str, Manifest]]] = {
    "fashion-mnist": prepare_fashion_mnist,
    "imagefolder": prepare_imagefolder,
}
